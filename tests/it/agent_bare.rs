//! A root with no shell at all: mcqemu-agent as its PID 1 and one static program (busybox,
//! without its links, so there is no /bin/sh), built by `tests/guest/build_guest.py
//! --agent-mode bare`. The guest_* tools work on it without a shell: guest_exec with env, cwd,
//! stdin and live output (the agent takes them natively), guest_list_dir (the agent reads the
//! folder), files both ways, copies both ways over the data channel (the agent packs and
//! unpacks: no tar, dd or sh), a background process read and killed, the agent's identity;
//! and stop_vm's graceful path powers it off through the agent's power button. The same root
//! for aarch64 (the agent cross-built for it, Debian's arm64 kernel) runs the same checks
//! under qemu-system-aarch64.

use std::time::Duration;

use crate::common::*;
use serde_json::json;

const STEP: Duration = Duration::from_secs(60);

#[test]
fn a_root_without_a_shell_runs_programs_with_env_cwd_and_live_output() {
    let guest = try_test_guest_with(Some("bare")).unwrap_or_else(|e| panic!("{e}"));
    let mut lab = Lab::new("bare");
    lab.boot_guest_sandbox("bare", &guest, "");
    smoke(&mut lab);
}

/// The same root and checks on an aarch64 guest (QEMU's virt board, TCG), one at a time.
#[test]
fn an_aarch64_root_without_a_shell_does_the_same() {
    let guest = try_test_guest_arm64_with("bare").unwrap_or_else(|e| panic!("{e}"));
    let mut lab = Lab::with_slots("bare-a64", QEMU_SLOTS);
    let base = lab.srv().tmp.join("bare-base.img");
    std::fs::File::create(&base)
        .and_then(|f| f.set_len(1 << 20))
        .expect("create the base image");
    let r = lab.srv().call_tool_within(
        "sandbox_vm",
        json!({"base_image": base, "name": "bare", "arch": "aarch64", "memory_mb": 256,
               "cpus": 1, "wait_agent_s": 150, "kernel": guest.kernel,
               "initrd": guest.initrd, "append": guest.append}),
        Duration::from_secs(240),
    );
    lab.track(&r);
    let sb = tool_ok(&r, "sandbox_vm aarch64");
    assert_eq!(sb["agent_ready"], json!(true), "agent never answered: {sb}");
    let u = lab.srv().call_ok_within(
        "guest_exec",
        json!({"name": "bare", "command": "/bin/busybox", "args": ["uname", "-m"]}),
        STEP,
    );
    assert_eq!(u["stdout"], json!("aarch64\n"), "{u}");
    smoke(&mut lab);
}

/// Everything a shell-less root must do, on the sandbox `bare` of `lab`.
fn smoke(lab: &mut Lab) {
    let s = lab.srv();

    assert!(our_agent_answers(s, "bare"), "qemu-ga answered");
    // No shell: qemu-ga's way (a /bin/sh wrapper) could not run env and cwd here.
    let r = s.call_ok(
        "guest_file_read",
        json!({"name": "bare", "path": "/etc/hostname"}),
    );
    assert_eq!(r["content"], json!("mcqemu-bare\n"), "{r}");
    let no_sh = s.call_err_within(
        "guest_exec",
        json!({"name": "bare", "command": "/bin/sh", "args": ["-c", "true"]}),
        STEP,
    );
    assert!(no_sh.contains("/bin/sh"), "{no_sh}");

    let r = s.call_ok_within(
        "guest_exec",
        json!({"name": "bare", "command": "/bin/busybox", "args": ["env"],
               "env": {"GREETING": "hello there"}, "cwd": "/etc"}),
        STEP,
    );
    let out = r["stdout"].as_str().unwrap_or_default();
    assert!(out.contains("GREETING=hello there"), "{r}");
    assert!(
        out.contains("PATH="),
        "the agent's own environment stays: {r}"
    );
    let r = s.call_ok_within(
        "guest_exec",
        json!({"name": "bare", "command": "/bin/busybox", "args": ["pwd"], "cwd": "/etc"}),
        STEP,
    );
    assert_eq!(r["stdout"], json!("/etc\n"), "{r}");
    let r = s.call_ok_within(
        "guest_exec",
        json!({"name": "bare", "command": "/bin/busybox", "args": ["cat"],
               "stdin": "fed in\n"}),
        STEP,
    );
    assert_eq!(r["stdout"], json!("fed in\n"), "{r}");

    // Live output with a progress token, with no spool file and no shell.
    let (r, took, progress) = s
        .try_call_with_token(
            "guest_exec",
            json!({"name": "bare", "command": "/bin/busybox", "live": true,
                   "args": ["ping", "-c", "4", "-i", "0.5", "127.0.0.1"]}),
            STEP,
        )
        .unwrap();
    let out = tool_ok(&r, "live ping");
    eprintln!(
        "live output without a shell: {took:?}, {} notifications",
        progress.len()
    );
    assert_eq!(out["exitcode"], json!(0), "{out}");
    assert!(
        progress.iter().any(|p| p["params"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("bytes from 127.0.0.1"))),
        "{progress:?}"
    );
    assert!(!out.to_string().contains(".mcqemu-exec"), "{out}");

    // A folder listed by the agent itself (no sh, no stat in this root).
    let l = s.call_ok("guest_list_dir", json!({"name": "bare", "path": "/etc"}));
    let names: Vec<&str> = l["entries"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["name"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        names.contains(&"hostname") && names.contains(&"mcqemu-agent"),
        "{l}"
    );
    let err = s.call_err(
        "guest_list_dir",
        json!({"name": "bare", "path": "/etc/hostname"}),
    );
    assert!(err.contains("not a folder"), "{err}");

    // Files both ways through the agent.
    s.call_ok(
        "guest_file_write",
        json!({"name": "bare", "path": "/tmp/note", "content": "written\n"}),
    );
    let r = s.call_ok(
        "guest_file_read",
        json!({"name": "bare", "path": "/tmp/note"}),
    );
    assert_eq!(r["content"], json!("written\n"));

    copies_both_ways(lab);
    background_run_and_kill(lab.srv());
    let s = lab.srv();

    // The power button reaches PID 1: a graceful stop, no acpid, no force.
    let r = s.call_ok_within(
        "stop_vm",
        json!({"name": "bare", "timeout": 60}),
        Duration::from_secs(90),
    );
    assert_eq!(
        (r["status"].clone(), r["method"].clone()),
        (json!("stopped"), json!("acpi")),
        "{r}"
    );
}

/// A tree and a single file in and back out over the data channel, the guest's side played
/// by the agent itself (this root has no tar, dd or sh).
fn copies_both_ways(lab: &mut Lab) {
    let src = lab.dir.join("tree");
    std::fs::create_dir_all(src.join("a/b")).unwrap();
    let big = pseudo_random(3 << 20, 7);
    std::fs::write(src.join("a/b/big.bin"), &big).unwrap();
    std::fs::write(src.join("a/note.txt"), "note\n").unwrap();
    std::os::unix::fs::symlink("b/big.bin", src.join("a/link")).unwrap();
    let r = lab.srv().call_ok_within(
        "guest_copy_in",
        json!({"name": "bare", "host_path": src, "guest_path": "/tmp/tree"}),
        STEP,
    );
    assert_eq!(r["via"], json!("channel"), "{r}");
    assert_eq!(
        (r["files"].clone(), r["symlinks"].clone()),
        (json!(2), json!(1)),
        "{r}"
    );
    // A second copy over it needs overwrite, then replaces it.
    let err = lab.srv().call_err_within(
        "guest_copy_in",
        json!({"name": "bare", "host_path": src, "guest_path": "/tmp/tree"}),
        STEP,
    );
    assert!(err.contains("already exists"), "{err}");
    lab.srv().call_ok_within(
        "guest_copy_in",
        json!({"name": "bare", "host_path": src, "guest_path": "/tmp/tree", "overwrite": true}),
        STEP,
    );
    let l = lab
        .srv()
        .call_ok("guest_list_dir", json!({"name": "bare", "path": "/tmp"}));
    assert!(
        !l.to_string().contains(".mcq-copy"),
        "a temporary was left: {l}"
    );

    let back = lab.dir.join("back");
    let r = lab.srv().call_ok_within(
        "guest_copy_out",
        json!({"name": "bare", "guest_path": "/tmp/tree", "host_path": back}),
        STEP,
    );
    assert_eq!(r["via"], json!("channel"), "{r}");
    assert_eq!(std::fs::read(back.join("a/b/big.bin")).unwrap(), big);
    assert_eq!(
        std::fs::read_to_string(back.join("a/note.txt")).unwrap(),
        "note\n"
    );
    assert_eq!(
        std::fs::read_link(back.join("a/link")).unwrap(),
        std::path::Path::new("b/big.bin")
    );

    // One file each way; a missing guest path is named.
    let one = lab.dir.join("one.txt");
    std::fs::write(&one, "single\n").unwrap();
    lab.srv().call_ok_within(
        "guest_copy_in",
        json!({"name": "bare", "host_path": one, "guest_path": "/tmp/one.txt"}),
        STEP,
    );
    let r = lab.srv().call_ok(
        "guest_file_read",
        json!({"name": "bare", "path": "/tmp/one.txt"}),
    );
    assert_eq!(r["content"], json!("single\n"), "{r}");
    let none = lab.dir.join("none");
    let err = lab.srv().call_err_within(
        "guest_copy_out",
        json!({"name": "bare", "guest_path": "/tmp/none", "host_path": none}),
        STEP,
    );
    assert!(err.contains("nothing is at /tmp/none"), "{err}");
}

/// A background program (kept by the agent, output and all), read while it runs, then
/// killed through its group.
fn background_run_and_kill(s: &mut Server) {
    let r = s.call_ok_within(
        "guest_exec",
        json!({"name": "bare", "command": "/bin/busybox", "background": true,
               "args": ["ping", "-i", "0.2", "127.0.0.1"]}),
        STEP,
    );
    let handle = r["handle"].as_str().unwrap_or_default().to_string();
    let st = s.call_ok_within(
        "guest_exec_status",
        json!({"name": "bare", "handle": handle, "wait_s": 5}),
        STEP,
    );
    assert_eq!(st["running"], json!(true), "{st}");
    assert!(
        st["stdout"]
            .as_str()
            .is_some_and(|o| o.contains("bytes from")),
        "{st}"
    );
    let next = st["stdout_next_offset"].as_u64().unwrap_or(0);
    let st = s.call_ok_within(
        "guest_exec_status",
        json!({"name": "bare", "handle": handle, "stdout_offset": next, "wait_s": 5}),
        STEP,
    );
    assert!(
        st["stdout"]
            .as_str()
            .is_some_and(|o| !o.is_empty() && !o.contains("PING")),
        "only what came after the offset: {st}"
    );
    let k = s.call_ok_within(
        "guest_exec_kill",
        json!({"name": "bare", "handle": handle}),
        STEP,
    );
    assert_eq!(k["signalled"], json!(true), "{k}");
    let done = s.call_ok_within(
        "guest_exec_status",
        json!({"name": "bare", "handle": handle}),
        STEP,
    );
    assert_eq!(done["running"], json!(false), "{done}");
    assert!(
        done["signal"] == json!(15) || done["exitcode"].is_number(),
        "{done}"
    );
}
