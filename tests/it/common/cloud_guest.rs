//! Helpers of the cloud-init tests: a lab on the cloud image's roots, guest commands through
//! the agent, host-side readers (isoinfo, bsdtar, PyYAML), and the quoting cases.
#![allow(dead_code)] // each cloud test binary uses a part

use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, Instant};

use super::*;
use mcqemu::b64;
use serde_json::{json, Value};

pub const CLOUD_CALL: Duration = Duration::from_secs(15 * 60);
/// Bound for guest_exec round trips, stop_vm and sandbox_destroy.
pub const STEP: Duration = Duration::from_secs(120);
/// A public key for the test user (never used to log in: the guests run no SSH server).
pub const TEST_KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMcqemuTestKeyNotARealKey0123456789abcdefABCD mcqemu-test@host: #1";

// ---------------------------------------------------------------------------------------------
// Helpers

/// A lab with one guest slot and a server whose roots also hold the cloud image cache. Build
/// the cloud image (if needed) before calling this, never while holding the slot.
pub fn cloud_lab(label: &str) -> (Lab, Server) {
    let lab = Lab::without_server(label, 1);
    let tmp = TempDir::new("srv");
    let roots = cloud_roots();
    let mut s = Server::try_start_with(
        tmp,
        &lab.state(),
        &lab.runtime(),
        &[("MCQEMU_ROOTS", roots.as_str())],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    s.initialize(NEWEST);
    (lab, s)
}

/// guest_exec that must succeed as a tool call.
pub fn exec(s: &mut Server, vm: &str, command: &str, args: &[&str]) -> Value {
    s.call_ok_within(
        "guest_exec",
        json!({"name": vm, "command": command, "args": args, "timeout": 90}),
        STEP,
    )
}

/// A guest file's bytes, exactly (base64 through the agent).
pub fn guest_bytes(s: &mut Server, vm: &str, path: &str) -> Vec<u8> {
    let r = s.call_ok_within(
        "guest_file_read",
        json!({"name": vm, "path": path, "encoding": "base64"}),
        STEP,
    );
    assert_eq!(r["truncated"], json!(false), "{r}");
    b64::decode(r["content"].as_str().unwrap()).unwrap()
}

/// The instance-id the server recorded for `vm`'s current launch (vm_info's record).
pub fn recorded_instance_id(s: &mut Server, vm: &str) -> String {
    let info = s.call_ok("vm_info", json!({"name": vm}));
    info["record"]["cloud_init"]["instance_id"]
        .as_str()
        .unwrap_or_else(|| panic!("vm_info of {vm} has no cloud_init.instance_id: {info}"))
        .to_string()
}

/// The last `n` bytes of `text` or a little fewer (whole characters).
pub fn tail(text: &str, n: usize) -> &str {
    let mut start = text.len().saturating_sub(n);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// The names list_vms shows.
pub fn vm_names(s: &mut Server) -> Vec<String> {
    let l = s.call_ok("list_vms", json!({}));
    l["vms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect()
}

pub fn stop(s: &mut Server, vm: &str) {
    let r = s.call_ok_within("stop_vm", json!({"name": vm, "force": true}), STEP);
    assert_eq!(r["status"], json!("stopped"), "{r}");
}

pub fn destroy(s: &mut Server, vm: &str) {
    let r = s.call_ok_within("sandbox_destroy", json!({"name": vm}), STEP);
    assert_eq!(r["destroyed"], json!(true), "{r}");
}

/// A host program's stdout, bytes exactly; it must exit 0.
pub fn host(program: &str, args: &[&str]) -> Vec<u8> {
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    try_run(program, &args, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"))
}

pub fn host_text(program: &str, args: &[&str]) -> String {
    String::from_utf8(host(program, args)).expect("utf-8 output")
}

pub fn have(program: &str) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok()
}

/// True when the host's python3 can import PyYAML.
pub fn host_has_pyyaml() -> bool {
    std::process::Command::new("python3")
        .args(["-c", "import yaml"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Parses YAML with PyYAML's safe loader on the host and returns it as JSON.
pub fn host_yaml(text: &[u8]) -> Value {
    let done = try_run_command(
        std::process::Command::new("python3").args([
            "-c",
            "import sys, yaml, json; print(json.dumps(yaml.safe_load(sys.stdin)))",
        ]),
        Some(text),
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        done.status.success(),
        "PyYAML refused the document: {}\n{}",
        String::from_utf8_lossy(&done.stderr),
        String::from_utf8_lossy(text)
    );
    serde_json::from_slice(&done.stdout).expect("json.dumps output")
}

/// The sandbox_vm arguments for the cloud image (`base` defaults to the image's own disk).
pub fn cloud_sandbox_args(image: &CloudImage, name: &str, base: &Path, cloud_init: Value) -> Value {
    json!({
        "name": name,
        "base_image": base,
        "kernel": image.kernel,
        "initrd": image.initrd,
        "append": image.append,
        "memory_mb": 1024,
        "cpus": 2,
        "wait_agent_s": 300,
        "wait_cloud_init": true,
        "wait_cloud_init_s": 600,
        "cloud_init": cloud_init,
    })
}

/// Boots a cloud-image sandbox and waits for cloud-init; returns its result (its QEMU is
/// tracked for killing before anything is checked).
pub fn cloud_sandbox(lab: &Lab, s: &mut Server, args: Value) -> Value {
    let t = Instant::now();
    let r = s.call_tool_within("sandbox_vm", args.clone(), CLOUD_CALL);
    lab.track(&r);
    let sb = tool_ok(&r, &format!("sandbox_vm {args}"));
    eprintln!(
        "sandbox_vm {}: agent after {} ms, cloud-init finished {} ms later (status {}), {:?} in all",
        sb["name"],
        sb["agent_wait_ms"],
        sb["cloud_init"]["wait_ms"],
        sb["cloud_init"]["status"],
        t.elapsed()
    );
    assert_eq!(sb["agent_ready"], json!(true), "agent not ready: {sb}");
    assert_eq!(sb["cloud_init"]["finished"], json!(true), "{sb}");
    sb
}

/// Strings that hand-written YAML gets wrong: indicators, comments, both quote kinds, line
/// breaks, YAML 1.1 booleans, numbers and null, document markers, control and non-BMP
/// characters.
pub const TRICKY: &[&str] = &[
    "a: b",
    "key: value # not a comment",
    "# leading hash",
    "trailing #",
    "it's",
    "say \"hi\"",
    "both ' and \"",
    "line1\nline2\n",
    "\n",
    "*star",
    "&anchor",
    "!tag",
    "!!str x",
    "- dash",
    "-",
    "? question",
    "yes",
    "off",
    "on",
    "no",
    "y",
    "N",
    "True",
    "null",
    "~",
    "",
    " leading space",
    "trailing space ",
    "0640",
    "010",
    "0x1f",
    "1e3",
    "12:30:45",
    ".inf",
    ".NaN",
    "1_000",
    "---",
    "...",
    "%TAG !",
    "@at",
    "`tick",
    "{flow: map}",
    "[flow, seq]",
    "| block",
    "> folded",
    "tab\there",
    "back\\slash\\n",
    "cr\r\nlf",
    "é ü ñ 日本",
    "emoji 😀",
    "nel\u{85}",
    "ls\u{2028}ps\u{2029}",
    "bom\u{feff}",
    "ctrl\u{1}\u{7f}",
    "=",
    "<<",
    "#cloud-config",
];
