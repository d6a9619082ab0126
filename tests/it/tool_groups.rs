//! Tool groups: `MCQEMU_TOOLS` (or `--tools`) serves only the named groups, with the
//! instructions that fit them; an unknown group stops the server with a usage error naming the
//! groups; the default is every tool.

use std::process::Command;

use crate::common::*;
use serde_json::json;

#[test]
fn a_server_of_two_groups_lists_and_calls_only_theirs() {
    let mut all = Server::ready();
    let every = tool_names(&all.result("tools/list", json!({})));
    let mut s = Server::start_with_env(&[("MCQEMU_TOOLS", "sandbox,guest")]);
    let init = s.initialize(NEWEST);
    let served = tool_names(&s.result("tools/list", json!({})));
    for t in [
        "sandbox_vm",
        "template_create",
        "guest_exec",
        "guest_copy_in",
        "list_vms",
    ] {
        assert!(
            served.iter().any(|n| n == t),
            "{t} is not served: {served:?}"
        );
    }
    for t in ["launch_vm", "vm_click", "image_pull", "vm_serial_wait"] {
        assert!(!served.iter().any(|n| n == t), "{t} is served: {served:?}");
    }
    assert!(
        served.len() < every.len() / 2,
        "{} of {}",
        served.len(),
        every.len()
    );
    assert!(served.iter().all(|n| every.contains(n)));
    // The instructions keep the sandbox journey and name no tool that is not served.
    let text = init["instructions"].as_str().unwrap_or_default();
    assert!(text.contains("sandbox_vm {"), "{text}");
    for t in every.iter().filter(|t| !served.contains(t)) {
        assert!(
            !text
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .any(|w| w == t),
            "the instructions name {t}, which is not served:\n{text}"
        );
    }
    assert!(text.contains("tool groups sandbox, guest only"), "{text}");
    // A tool of another group is unknown here.
    let resp = s.call_tool_response("launch_vm", json!({}));
    assert_eq!(error_code(&resp), -32602, "{resp}");
    s.assert_alive();
    // The ones served work.
    assert!(s.call_ok("list_vms", json!({}))["vms"].is_array());
}

#[test]
fn an_unknown_group_is_a_usage_error_naming_the_groups() {
    let out = Command::new(server_bin())
        .args(["--tools", "sandbox,rockets"])
        .env(
            "MCQEMU_STATE_DIR",
            std::env::temp_dir().join("mcq-groups-unused"),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"rockets\"") && err.contains("sandbox, guest, screen, images, vm"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "stdout carries protocol only");
    let groups = Command::new(server_bin())
        .args(["tools", "--groups"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&groups.stdout);
    assert!(text.lines().any(|l| l.starts_with("sandbox ")), "{text}");
}

/// What every session of every agent pays before its first call, counted with a real
/// tokenizer (cl100k_base) on what a host shows the model: each tool's name, description and
/// inputSchema. Goals: every tool within 12,000 tokens, the sandbox group within 4,000.
#[test]
fn the_tool_list_is_one_an_agent_can_afford() {
    let list = |env: &[(&str, &str)]| {
        let mut s = Server::start_with_env(env);
        s.initialize(NEWEST);
        s.result("tools/list", json!({}))["tools"].clone()
    };
    let count = |tools: &serde_json::Value| {
        crate::common::tokens::tool_tokens(tools).unwrap_or_else(|e| panic!("{e}"))
    };
    let (all, per) = count(&list(&[]));
    let top: Vec<String> = per
        .iter()
        .take(5)
        .map(|(n, k)| format!("{n} {k}"))
        .collect();
    println!(
        "all {} tools: {all} tokens (largest: {})",
        per.len(),
        top.join(", ")
    );
    assert!(
        all <= 12_000,
        "every tool costs {all} tokens, over 12,000: {per:?}"
    );
    for group in ["sandbox", "guest", "screen", "images", "vm"] {
        let (n, per) = count(&list(&[("MCQEMU_TOOLS", group)]));
        println!("group {group}: {} tools, {n} tokens", per.len());
        if group == "sandbox" {
            assert!(
                n <= 4_000,
                "the sandbox group costs {n} tokens, over 4,000: {per:?}"
            );
        }
    }
}
