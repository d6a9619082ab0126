//! Fixtures of the Arm test binaries (`arm64`, `arm64_screen`): a lab holding every guest slot,
//! the aarch64 test guest's launch arguments, its boot and agent wait, and guest commands.
#![allow(dead_code)] // each Arm test binary uses a part

use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::*;

/// Bound for calls that boot or wait on a guest, or move a VM's whole RAM.
pub const SLOW: Duration = Duration::from_secs(240);
/// Bound for one ordinary step.
pub const STEP: Duration = Duration::from_secs(60);
/// How long a launched guest may take until its agent answers.
pub const AGENT_WAIT: Duration = Duration::from_secs(120);
/// The guest's serial console on the virt board (a PL011).
pub const SERIAL: &str = "/dev/ttyAMA0";

/// A lab holding every guest slot of this binary (so one Arm guest runs at a time) and a
/// server of its own. The guest is built first, never while holding the slots.
pub fn arm_lab(label: &str) -> (Lab, Server) {
    test_guest_arm64();
    let lab = Lab::without_server(label, QEMU_SLOTS);
    let server = lab.spawn_server();
    (lab, server)
}

/// launch_vm-style arguments for the aarch64 test guest: 256 MiB, one vCPU, the kernel booted
/// directly, plus `extra` (which may override any of them).
pub fn arm_args(extra: Value) -> Map<String, Value> {
    let g = test_guest_arm64();
    let mut m = Map::new();
    m.insert("arch".into(), json!("aarch64"));
    m.insert("kernel".into(), json!(g.kernel));
    m.insert("initrd".into(), json!(g.initrd));
    m.insert("append".into(), json!(g.append));
    m.insert("memory_mb".into(), json!(256));
    m.insert("cpus".into(), json!(1));
    for (k, v) in extra.as_object().expect("extra is an object") {
        m.insert(k.clone(), v.clone());
    }
    m
}

/// Polls guest_ping until the agent answers; returns the time since `since`.
pub fn wait_agent(s: &mut Server, name: &str, since: Instant) -> Duration {
    let deadline = Instant::now() + AGENT_WAIT;
    loop {
        let r = s.call_tool_within("guest_ping", json!({"name": name}), STEP);
        if r["isError"] == json!(false) {
            return since.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "the agent of {name} did not answer within {AGENT_WAIT:?}: {}",
            r["content"]
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// launch_vm of the aarch64 test guest named `name` with `extra` arguments, tracked for
/// killing; waits for its agent. Returns the launch result and the time to the agent.
pub fn boot(lab: &Lab, s: &mut Server, name: &str, extra: Value) -> (Value, Duration) {
    let mut args = arm_args(extra);
    args.insert("name".into(), json!(name));
    let t = Instant::now();
    let launched = lab.launch_on(s, Value::Object(args), SLOW);
    let ready = wait_agent(s, name, t);
    eprintln!("{name}: launch_vm to agent in {ready:?}");
    (launched, ready)
}

pub fn write_text(s: &mut Server, name: &str, path: &str, text: &str) {
    let r = s.call_ok(
        "guest_file_write",
        json!({"name": name, "path": path, "content": text}),
    );
    assert_eq!(r["bytes_written"], json!(text.len()), "{r}");
}

pub fn read_text(s: &mut Server, name: &str, path: &str) -> String {
    let r = s.call_ok("guest_file_read", json!({"name": name, "path": path}));
    assert_eq!(r["truncated"], json!(false), "{r}");
    r["content"].as_str().expect("content").to_string()
}

/// QEMU's own argv, read from /proc.
pub fn qemu_argv(launched: &Value) -> Vec<String> {
    let pid = launched["pid"].as_i64().expect("pid") as i32;
    cmdline(pid).unwrap_or_else(|| panic!("QEMU {pid} is gone"))
}

/// The value following `opt` in an argv.
pub fn opt_value<'a>(argv: &'a [String], opt: &str) -> Option<&'a str> {
    argv.iter()
        .position(|a| a == opt)
        .and_then(|i| argv.get(i + 1))
        .map(String::as_str)
}

pub fn stop(s: &mut Server, name: &str) {
    let r = s.call_ok_within("stop_vm", json!({"name": name, "force": true}), STEP);
    assert_eq!(r["status"], json!("stopped"), "{r}");
}
