//! The command line: tools, call, doctor, --version, --help, and exit codes.

use std::time::Duration;

use crate::common::*;
use serde_json::{json, Value};

#[test]
fn tools_lists_one_line_per_tool() {
    let tmp = TempDir::new("cli");
    let out = run_cli(&tmp, &["tools"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    // Same tools, same order, as the MCP server lists.
    let mut s = Server::ready();
    let listed = s.result("tools/list", json!({}));
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(lines.len(), names.len(), "{}", out.stdout);
    for (line, name) in lines.iter().zip(&names) {
        assert_eq!(line.split_whitespace().next(), Some(*name), "{line}");
        assert!(
            line.len() > name.len() + 2,
            "a title follows the name: {line:?}"
        );
    }
}

#[test]
fn tools_json_gives_full_definitions() {
    let tmp = TempDir::new("cli");
    let out = run_cli(&tmp, &["tools", "--json"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let defs: Value = serde_json::from_str(&out.stdout).expect("JSON on stdout");
    let defs = defs.as_array().expect("an array");
    let mut s = Server::ready();
    let listed = s.result("tools/list", json!({}));
    assert_eq!(
        defs,
        listed["tools"].as_array().unwrap(),
        "same as tools/list"
    );
    for d in defs {
        assert!(
            d["inputSchema"].is_object() && d["annotations"].is_object(),
            "{d}"
        );
    }
    let out = run_cli(&tmp, &["tools", "--yaml"]);
    assert_eq!(out.code, Some(2), "{out:?}");
}

#[test]
fn call_success_prints_json_and_exits_zero() {
    let tmp = TempDir::new("cli");
    let path = tmp.file("cli disk.qcow2");
    let args = json!({"path": path, "size": "2M"}).to_string();
    let out = run_cli(&tmp, &["call", "image_create", &args]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let v: Value = serde_json::from_str(&out.stdout).expect("JSON on stdout");
    assert_eq!(v["path"], path);
    assert_eq!(v["format"], "qcow2");
    assert_eq!(v["virtual_size"], 2 << 20);
    assert!(tmp.join("cli disk.qcow2").is_file());
    let info = qemu_img_info(&tmp.join("cli disk.qcow2"));
    assert_eq!(info["virtual-size"], 2 << 20);

    let out = run_cli(
        &tmp,
        &["call", "image_info", &json!({"path": path}).to_string()],
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["format"], "qcow2");
}

#[test]
fn call_tool_error_exits_by_its_kind() {
    let tmp = TempDir::new("cli");
    let args = json!({"path": tmp.file("missing.qcow2")}).to_string();
    let out = run_cli(&tmp, &["call", "image_info", &args]);
    assert_eq!(out.code, Some(3), "not_found: {out:?}");
    assert!(out.stderr.starts_with("[not_found] "), "{out:?}");
    assert!(out.stderr.contains("missing.qcow2"), "{out:?}");
    assert!(out.stdout.trim().is_empty(), "nothing on stdout: {out:?}");
    // Refusing to clobber is a tool error too.
    let existing = tmp.join("exists.img");
    std::fs::write(&existing, b"keep").unwrap();
    let args = json!({"path": existing.to_str().unwrap(), "size": "1M"}).to_string();
    let out = run_cli(&tmp, &["call", "image_create", &args]);
    assert_eq!(out.code, Some(6), "invalid_argument: {out:?}");
    assert!(out.stderr.starts_with("[invalid_argument] "), "{out:?}");
    assert_eq!(std::fs::read(&existing).unwrap(), b"keep");
    // Outside the roots: refused by policy.
    let args = json!({"path": "/etc/passwd"}).to_string();
    let out = run_cli(&tmp, &["call", "image_info", &args]);
    assert_eq!(out.code, Some(5), "refused: {out:?}");
}

#[test]
fn call_usage_errors_exit_two() {
    let tmp = TempDir::new("cli");
    let cases: &[&[&str]] = &[
        &["call", "no_such_tool", "{}"],
        &["call", "image_info", "{not json"],
        &["call", "image_info", "[1, 2]"],
        &["call", "image_info", "{\"path\": \"/x\", \"bogus\": 1}"],
        &["call", "image_info", "{\"path\": 5}"],
        &["call"],
        &["call", "image_info", "{}", "extra"],
        &["call", "image_info", "--out"],
        &["frobnicate"],
    ];
    for args in cases {
        let out = run_cli(&tmp, args);
        assert_eq!(out.code, Some(2), "{args:?}: {out:?}");
        assert!(!out.stderr.is_empty(), "{args:?}: says why on stderr");
        assert!(
            out.stdout.is_empty(),
            "{args:?}: nothing on stdout: {out:?}"
        );
    }
    let out = run_cli(&tmp, &["call", "no_such_tool", "{}"]);
    assert!(out.stderr.contains("no_such_tool"), "{out:?}");
}

#[test]
fn call_reads_arguments_from_stdin() {
    let tmp = TempDir::new("cli");
    let path = tmp.file("stdin.raw");
    let args = json!({"path": path, "size": "1M", "format": "raw"}).to_string();
    let out = run_cli_with(
        &tmp,
        &["call", "image_create", "-"],
        Some(args.as_bytes()),
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["format"], "raw");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 1 << 20);
    // Bad JSON on stdin is a usage error.
    let out = run_cli_with(
        &tmp,
        &["call", "image_info", "-"],
        Some(b"nope"),
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(2), "{out:?}");
}

#[test]
fn doctor_prints_the_table() {
    let tmp = TempDir::new("cli");
    let out = run_cli(&tmp, &["doctor"]);
    let mut lines = out.stdout.lines();
    let header = lines.next().expect("a header line");
    assert!(
        header.starts_with("CHECK") && header.contains("STATUS"),
        "{header:?}"
    );
    let rows: Vec<Vec<&str>> = lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    let status_of = |name: &str| {
        rows.iter()
            .find(|r| r.first() == Some(&name))
            .and_then(|r| r.get(1).copied())
    };
    let img = status_of("qemu-img").unwrap_or_else(|| panic!("no qemu-img row:\n{}", out.stdout));
    assert!(matches!(img, "ok" | "warn" | "FAIL"), "{img}");
    let system_ok = rows
        .iter()
        .any(|r| r[0].starts_with("qemu-system-") && r.get(1) == Some(&"ok"));
    if img == "ok" && system_ok {
        assert_eq!(
            out.code,
            Some(0),
            "everything essential is there:\n{}",
            out.stdout
        );
    } else {
        assert!(matches!(out.code, Some(0) | Some(1)), "{out:?}");
    }
    // Doctor looked at the folders we gave it, and only those.
    assert!(
        out.stdout.contains(tmp.join("state").to_str().unwrap()),
        "{}",
        out.stdout
    );
}

#[test]
fn version_and_help() {
    let tmp = TempDir::new("cli");
    let out = run_cli(&tmp, &["--version"]);
    assert_eq!(out.code, Some(0));
    assert_eq!(
        out.stdout.trim(),
        format!("mcqemu {}", env!("CARGO_PKG_VERSION"))
    );
    let out = run_cli(&tmp, &["--help"]);
    assert_eq!(out.code, Some(0));
    for word in ["USAGE", "tools", "call", "doctor", "EXIT STATUS"] {
        assert!(out.stdout.contains(word), "{word} missing from help");
    }
    let short = run_cli(&tmp, &["-h"]);
    assert_eq!(short.code, Some(0));
    assert_eq!(short.stdout, out.stdout);
}
