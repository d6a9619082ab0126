//! VM lifecycle end to end over MCP, against the built binary and a real QEMU under TCG:
//! launch, list, inspect, pause, resume, stop (graceful and forced), forget, attach, the
//! registry shared by several servers, registry corruption and compatibility, and the launch
//! policy (disk paths with commas, extra_args, port forwards).
//!
//! Each test runs in a [`Lab`] without a server of its own: it starts its servers (sometimes
//! several at once, on one registry) on the lab's folders. At most [`QEMU_SLOTS`] QEMUs run at
//! once per test binary; every test kills its QEMUs on drop, even when it fails.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{json, Value};

/// Bound for a launch_vm call (QEMU start-up plus the first QMP session) on a loaded machine.
const LAUNCH: Duration = Duration::from_secs(120);
/// Bound for a stop_vm call.
const STOP: Duration = Duration::from_secs(60);

/// launch_vm arguments for a small diskless BIOS VM under TCG, plus `extra` fields.
fn vm_args(name: &str, extra: Value) -> Value {
    let mut a = json!({"name": name, "memory_mb": 64, "cpus": 1, "accel": "tcg"});
    if let Value::Object(m) = extra {
        for (k, v) in m {
            a[k] = v;
        }
    }
    a
}

fn pid_of(v: &Value) -> i32 {
    v["pid"].as_i64().unwrap_or_else(|| panic!("no pid in {v}")) as i32
}

/// list_vms, checked for shape.
fn list(s: &mut Server) -> Value {
    let l = s.call_ok("list_vms", json!({}));
    assert!(l["vms"].is_array(), "{l}");
    assert!(l["registry_warnings"].is_array(), "{l}");
    l
}

/// The list_vms entry for `name`, if any.
fn entry(listing: &Value, name: &str) -> Option<Value> {
    listing["vms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .cloned()
}

fn names(listing: &Value) -> Vec<String> {
    let mut n: Vec<String> = listing["vms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    n.sort();
    n
}

/// The installed QEMU's version, e.g. "7.2.22".
/// The QEMU the server runs: `MCQEMU_QEMU_DIR`'s when set (the suite runs again under QEMU 10
/// that way), else the one on PATH.
fn qemu_bin() -> String {
    match std::env::var("MCQEMU_QEMU_DIR") {
        Ok(d) if !d.is_empty() => format!("{d}/qemu-system-x86_64"),
        _ => "qemu-system-x86_64".to_string(),
    }
}

/// That QEMU's version.
fn installed_qemu_version() -> String {
    let (ok, out, err) = run_tool(&qemu_bin(), &["--version"]);
    assert!(ok, "qemu-system-x86_64 --version failed: {err}");
    out.split_whitespace()
        .skip_while(|w| *w != "version")
        .nth(1)
        .unwrap_or_else(|| panic!("no version in {out:?}"))
        .to_string()
}

/// Force-stops `name` through MCP and checks the QEMU really went.
fn force_stop(s: &mut Server, name: &str, pid: i32) -> Value {
    let r = s.call_ok_within("stop_vm", json!({"name": name, "force": true}), STOP);
    assert_eq!(r["status"], "stopped", "{r}");
    assert!(
        wait_pid_dead(pid, Duration::from_secs(10)),
        "QEMU {pid} survived a forced stop_vm: state {:?}",
        pid_state(pid)
    );
    r
}

/// A child process killed and reaped on drop.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sleeper() -> ChildGuard {
    ChildGuard(
        Command::new("sleep")
            .arg("600")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn sleep"),
    )
}

fn sigkill(pid: i32) {
    // SAFETY: plain kill(2); the PID belongs to a QEMU this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

// ---------------------------------------------------------------------------------------------
// The whole life of a VM

#[test]
fn bios_vm_lifecycle_over_mcp() {
    let lab = Lab::without_server("life", 1);
    let mut s = lab.spawn_server();

    let l = lab.launch_on(&mut s, vm_args("life", json!({})), LAUNCH);
    let pid = pid_of(&l);
    assert_eq!(l["name"], "life");
    assert_eq!(l["status"], "running", "{l}");
    assert_eq!(l["accel"], "tcg", "{l}");
    // The alias is pinned to the concrete machine type this QEMU means by it.
    let machine = l["machine"].as_str().unwrap();
    assert!(
        machine.starts_with("pc-q35-") && machine != "pc-q35-",
        "{l}"
    );
    assert!(pid_alive(pid), "launched QEMU {pid} is not alive");
    let qmp_sock = PathBuf::from(l["qmp_socket"].as_str().unwrap());
    assert!(qmp_sock.starts_with(lab.runtime()), "{l}");
    assert!(l["serial_log"]
        .as_str()
        .unwrap()
        .starts_with(lab.state().to_str().unwrap()));

    let listing = list(&mut s);
    let e = entry(&listing, "life").expect("life in list_vms");
    assert_eq!(e["status"], "running", "{listing}");
    assert_eq!(e["source"], "spawned");
    assert_eq!(e["pid"], pid);
    assert_eq!(e["arch"], "x86_64");
    assert_eq!(e["accel"], "tcg");

    let info = s.call_ok("vm_info", json!({"name": "life"}));
    assert_eq!(info["status"], "running", "{info}");
    assert_eq!(info["vcpus"], 1, "{info}");
    assert_eq!(info["accel"], "tcg", "{info}");
    assert_eq!(info["qemu_version"], installed_qemu_version(), "{info}");
    assert_eq!(info["memory_mb"], 64, "{info}");
    assert_eq!(info["record"]["pid"], pid);
    // No agent has ever answered this VM (a BIOS with no OS): vm_info does not wait for one
    // (it waited 1.5 s for /proc/meminfo on every call; its ~10 ms is in the bench).
    for _ in 0..3 {
        let t0 = Instant::now();
        let info = s.call_ok("vm_info", json!({"name": "life"}));
        let took = t0.elapsed();
        assert!(took < Duration::from_millis(700), "vm_info took {took:?}");
        assert!(info["metrics"]["guest_memory"].is_null(), "{info}");
    }

    let p = s.call_ok("pause_vm", json!({"name": "life"}));
    assert_eq!(p, json!({"name": "life", "status": "paused"}));
    let e = entry(&list(&mut s), "life").unwrap();
    assert_eq!(e["status"], "paused", "{e}");
    assert_eq!(
        s.call_ok("vm_info", json!({"name": "life"}))["status"],
        "paused"
    );
    let r = s.call_ok("resume_vm", json!({"name": "life"}));
    assert_eq!(r, json!({"name": "life", "status": "running"}));

    // A BIOS without an OS ignores ACPI power-down: a clear timeout that points at force.
    let t0 = Instant::now();
    let err = s.call_err("stop_vm", json!({"name": "life", "timeout": 1.5}));
    let took = t0.elapsed();
    assert!(err.contains("force"), "{err}");
    assert!(err.contains("did not power off"), "{err}");
    assert!(!err.contains("has exited"), "{err}");
    assert!(
        took >= Duration::from_millis(1400),
        "returned early: {took:?}"
    );
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(pid_alive(pid), "a timed-out graceful stop killed QEMU");
    assert_eq!(entry(&list(&mut s), "life").unwrap()["status"], "running");

    let st = force_stop(&mut s, "life", pid);
    assert!(
        ["quit", "SIGTERM", "SIGKILL"].contains(&st["method"].as_str().unwrap()),
        "{st}"
    );
    assert_eq!(st["cleanup_errors"], json!([]), "{st}");
    match pid_state(pid) {
        None | Some('Z') => {}
        other => panic!("QEMU {pid} still there after stop_vm force: state {other:?}"),
    }
    assert!(!qmp_sock.exists(), "stale QMP socket left behind");

    // Stopping again is a no-op; pausing a stopped VM is a clear error.
    let again = s.call_ok("stop_vm", json!({"name": "life", "force": true}));
    assert_eq!(again["method"], "already stopped", "{again}");
    let err = s.call_err("pause_vm", json!({"name": "life"}));
    assert!(err.contains("not running"), "{err}");

    let e = entry(&list(&mut s), "life").expect("a stopped VM stays listed");
    assert_eq!(e["status"], "stopped", "{e}");

    let f = s.call_ok("forget_vm", json!({"name": "life"}));
    assert_eq!(
        f,
        json!({"name": "life", "forgotten": true, "was_running": false})
    );
    assert!(entry(&list(&mut s), "life").is_none());
    let err = s.call_err("vm_info", json!({"name": "life"}));
    assert!(err.contains("no VM named"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// attach_vm

#[test]
fn attach_adopts_a_foreign_qemu_and_forget_leaves_it_running() {
    let lab = Lab::without_server("att", 1);
    let own = lab.runtime().join("other");
    std::fs::create_dir_all(&own).unwrap();
    let sock = own.join("qmp.sock");
    let pidfile = own.join("qemu.pid"); // where the VmKiller looks
    let qmp_arg = format!("unix:{},server=on,wait=off", sock.display());
    let (ok, out, err) = run_tool(
        &qemu_bin(),
        &[
            "-name",
            "other-name",
            "-display",
            "none",
            "-machine",
            "q35",
            "-accel",
            "tcg",
            "-m",
            "64",
            "-qmp",
            &qmp_arg,
            "-daemonize",
            "-pidfile",
            pidfile.to_str().unwrap(),
        ],
    );
    assert!(ok, "starting QEMU by hand failed: {out}{err}");
    let pid = read_pidfile(&pidfile, Duration::from_secs(10));
    lab.killer.track(&json!({"pid": pid}));
    assert!(pid_alive(pid));

    let mut s = lab.spawn_server();
    let a = s.call_ok(
        "attach_vm",
        json!({"name": "adopted", "qmp_socket": sock.to_str().unwrap(), "pid": pid}),
    );
    assert_eq!(a["name"], "adopted");
    assert_eq!(a["status"], "running", "{a}");
    assert_eq!(a["qmp_socket"], sock.to_str().unwrap());
    assert_eq!(a["pid"], pid);
    assert_eq!(a["qemu_version"], installed_qemu_version());

    let e = entry(&list(&mut s), "adopted").expect("adopted in list_vms");
    assert_eq!(e["status"], "running", "{e}");
    assert_eq!(e["source"], "attached");
    let info = s.call_ok("vm_info", json!({"name": "adopted"}));
    assert_eq!(info["status"], "running", "{info}");
    assert_eq!(info["vcpus"], 1);
    assert_eq!(info["accel"], "tcg");

    // The name is taken while that VM is alive.
    let err = s.call_err(
        "attach_vm",
        json!({"name": "adopted", "qmp_socket": sock.to_str().unwrap()}),
    );
    assert!(err.contains("already registered"), "{err}");

    let f = s.call_ok("forget_vm", json!({"name": "adopted"}));
    assert_eq!(f["was_running"], true, "{f}");
    assert!(entry(&list(&mut s), "adopted").is_none());
    assert!(pid_alive(pid), "forget_vm killed an attached QEMU");
    assert!(sock.exists(), "forget_vm removed an attached VM's socket");
    let q = mcqemu::qemu::qmp::Qmp::connect(&sock, Duration::from_secs(10))
        .expect("the forgotten QEMU still answers QMP");
    drop(q);

    // A regular file is not a socket.
    let plain = lab.dir.join("plain.sock");
    std::fs::write(&plain, b"not a socket").unwrap();
    let err = s.call_err(
        "attach_vm",
        json!({"name": "plain", "qmp_socket": plain.to_str().unwrap()}),
    );
    assert!(err.contains("not a unix socket"), "{err}");

    // A socket file nobody listens on any more.
    let dead = lab.dir.join("dead.sock");
    drop(UnixListener::bind(&dead).unwrap());
    assert!(dead.exists());
    let t0 = Instant::now();
    let err = s.call_err(
        "attach_vm",
        json!({"name": "dead", "qmp_socket": dead.to_str().unwrap()}),
    );
    assert!(err.contains("does not answer QMP"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(10));

    // A missing path, and a dead PID next to a live socket.
    let err = s.call_err(
        "attach_vm",
        json!({"name": "missing", "qmp_socket": lab.dir.file("nothing.sock")}),
    );
    assert!(err.contains("nothing.sock"), "{err}");
    let err = s.call_err(
        "attach_vm",
        json!({"name": "badpid", "qmp_socket": sock.to_str().unwrap(), "pid": i32::MAX - 1}),
    );
    assert!(err.contains("not running"), "{err}");

    assert!(list(&mut s)["vms"].as_array().unwrap().is_empty());

    sigkill(pid);
    assert!(wait_pid_dead(pid, Duration::from_secs(10)));
}

// ---------------------------------------------------------------------------------------------
// A live QMP socket guards its name

#[test]
fn live_qmp_socket_blocks_relaunch_until_that_qemu_dies() {
    let lab = Lab::without_server("relaunch", 1);
    let mut s = lab.spawn_server();
    let first = lab.launch_on(&mut s, vm_args("x", json!({"no_net": true})), LAUNCH);
    let pid1 = pid_of(&first);

    let err = s.call_err("forget_vm", json!({"name": "x"}));
    assert!(err.contains("force=true"), "{err}");
    let f = s.call_ok("forget_vm", json!({"name": "x", "force": true}));
    assert_eq!(f["was_running"], true, "{f}");
    assert!(entry(&list(&mut s), "x").is_none());
    assert!(pid_alive(pid1), "forget_vm force killed QEMU");

    let err = s.call_err_within("launch_vm", vm_args("x", json!({"no_net": true})), LAUNCH);
    assert!(err.contains("still listening"), "{err}");
    assert!(err.contains("attach_vm"), "{err}");
    assert!(
        entry(&list(&mut s), "x").is_none(),
        "failed launch left a record"
    );
    assert!(
        pid_alive(pid1),
        "the refused launch touched the running QEMU"
    );
    assert_eq!(qemu_pids_mentioning(&lab.runtime()), vec![pid1]);

    sigkill(pid1);
    assert!(wait_pid_dead(pid1, Duration::from_secs(10)));

    let second = lab.launch_on(&mut s, vm_args("x", json!({"no_net": true})), LAUNCH);
    let pid2 = pid_of(&second);
    assert_ne!(pid1, pid2);
    assert_eq!(second["status"], "running", "{second}");
    assert_eq!(entry(&list(&mut s), "x").unwrap()["status"], "running");
    force_stop(&mut s, "x", pid2);
}

// ---------------------------------------------------------------------------------------------
// Several servers, one registry

#[test]
fn two_servers_share_one_registry() {
    let lab = Lab::without_server("two", 2);
    let mut a = lab.spawn_server();
    let mut b = lab.spawn_server();

    // Different names at the same time: both land in the registry.
    let barrier = Barrier::new(2);
    let (ra, rb) = std::thread::scope(|sc| {
        let ha = sc.spawn(|| {
            barrier.wait();
            a.call_tool_within("launch_vm", vm_args("va", json!({"no_net": true})), LAUNCH)
        });
        let hb = sc.spawn(|| {
            barrier.wait();
            b.call_tool_within("launch_vm", vm_args("vb", json!({"no_net": true})), LAUNCH)
        });
        (ha.join().unwrap(), hb.join().unwrap())
    });
    for r in [&ra, &rb] {
        if let Some(sc) = r.get("structuredContent") {
            lab.killer.track(sc);
        }
    }
    let la = tool_ok(&ra, "launch_vm va");
    let lb = tool_ok(&rb, "launch_vm vb");
    for srv in [&mut a, &mut b] {
        let l = list(srv);
        assert_eq!(names(&l), vec!["va", "vb"], "{l}");
        for n in ["va", "vb"] {
            assert_eq!(entry(&l, n).unwrap()["status"], "running", "{l}");
        }
    }
    let file: Value = serde_json::from_slice(&std::fs::read(lab.registry()).unwrap()).unwrap();
    assert_eq!(file["version"], 1);
    assert!(file["vms"]["va"].is_object() && file["vms"]["vb"].is_object());
    // Either server drives either VM.
    force_stop(&mut a, "vb", pid_of(&lb));
    force_stop(&mut b, "va", pid_of(&la));

    // One name at the same time: exactly one wins.
    let barrier = Barrier::new(2);
    let (ra, rb) = std::thread::scope(|sc| {
        let ha = sc.spawn(|| {
            barrier.wait();
            a.call_tool_within(
                "launch_vm",
                vm_args("same", json!({"no_net": true})),
                LAUNCH,
            )
        });
        let hb = sc.spawn(|| {
            barrier.wait();
            b.call_tool_within(
                "launch_vm",
                vm_args("same", json!({"no_net": true})),
                LAUNCH,
            )
        });
        (ha.join().unwrap(), hb.join().unwrap())
    });
    for r in [&ra, &rb] {
        if let Some(sc) = r.get("structuredContent") {
            lab.killer.track(sc);
        }
    }
    let oks: Vec<&Value> = [&ra, &rb]
        .into_iter()
        .filter(|r| r["isError"] == false)
        .collect();
    assert_eq!(oks.len(), 1, "exactly one launch must win: {ra} / {rb}");
    let loser = if ra["isError"] == true { &ra } else { &rb };
    let text = tool_err(loser, "the losing launch_vm same");
    assert!(text.contains("\"same\""), "{text}");
    assert!(text.contains("already"), "{text}");
    let winner = tool_ok(oks[0], "the winning launch_vm same");
    assert_eq!(qemu_pids_mentioning(&lab.runtime()), vec![pid_of(&winner)]);
    for srv in [&mut a, &mut b] {
        let l = list(srv);
        assert_eq!(names(&l), vec!["same", "va", "vb"], "{l}");
        assert_eq!(entry(&l, "same").unwrap()["status"], "running");
    }
    force_stop(&mut b, "same", pid_of(&winner));
}

// ---------------------------------------------------------------------------------------------
// The registry file

#[test]
fn corrupt_registry_is_quarantined_and_reported_once() {
    let lab = Lab::without_server("corrupt", 1);
    let garbage = b"{\"version\": 1, \"vms\": {\"a\": {\x00\xff garbage";
    std::fs::write(lab.registry(), garbage).unwrap();
    let mut s = lab.spawn_server();

    let l1 = list(&mut s);
    assert_eq!(l1["vms"], json!([]), "{l1}");
    let w = l1["registry_warnings"].as_array().unwrap();
    assert_eq!(w.len(), 1, "{l1}");
    let w = w[0].as_str().unwrap();
    assert!(w.contains("moved aside"), "{w}");
    assert!(w.contains("vms.json.corrupt-"), "{w}");
    let l2 = list(&mut s);
    assert_eq!(l2["registry_warnings"], json!([]), "warning repeated: {l2}");

    let aside: Vec<String> = list_dir(&lab.state())
        .into_iter()
        .filter(|n| n.starts_with("vms.json.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "{:?}", list_dir(&lab.state()));
    assert_eq!(
        std::fs::read(lab.state().join(&aside[0])).unwrap(),
        garbage.to_vec(),
        "the quarantined file must keep the original bytes"
    );

    let l = lab.launch_on(&mut s, vm_args("fresh", json!({"no_net": true})), LAUNCH);
    let l3 = list(&mut s);
    assert_eq!(names(&l3), vec!["fresh"]);
    assert_eq!(entry(&l3, "fresh").unwrap()["status"], "running");
    assert_eq!(l3["registry_warnings"], json!([]));
    let file: Value = serde_json::from_slice(&std::fs::read(lab.registry()).unwrap()).unwrap();
    assert_eq!(file["version"], 1);
    assert!(file["vms"]["fresh"].is_object(), "{file}");
    force_stop(&mut s, "fresh", pid_of(&l));
}

fn old_record() -> Value {
    json!({"qmp_socket": "/nonexistent/sock", "pid": null, "arch": "x86_64", "custom_field": {"k": [1, 2]}})
}

/// Loads a registry written in some layout, writes it (forgetting "other"), and checks the
/// record "old" came through untouched in the versioned layout.
fn registry_round_trip(label: &str, content: Value) {
    let dir = short_runtime_dir(label);
    let state = dir.subdir("s");
    let runtime = dir.subdir("r");
    std::fs::write(
        state.join("vms.json"),
        serde_json::to_vec_pretty(&content).unwrap(),
    )
    .unwrap();
    let mut s = Server::ready_in(&state, &runtime);

    let l = list(&mut s);
    assert_eq!(l["registry_warnings"], json!([]), "{l}");
    assert_eq!(names(&l), vec!["old", "other"], "{l}");
    let e = entry(&l, "old").unwrap();
    assert_eq!(e["status"], "stopped", "{e}");
    assert_eq!(e["arch"], "x86_64");
    let info = s.call_ok("vm_info", json!({"name": "old"}));
    assert_eq!(info["status"], "stopped");
    assert_eq!(info["record"]["custom_field"], json!({"k": [1, 2]}));

    let f = s.call_ok("forget_vm", json!({"name": "other"}));
    assert_eq!(f["forgotten"], true);
    let file: Value = serde_json::from_slice(&std::fs::read(state.join("vms.json")).unwrap())
        .expect("the rewritten registry is JSON");
    assert_eq!(file["version"], 1, "{file}");
    let vms = file["vms"].as_object().expect("vms mapping");
    assert_eq!(vms.len(), 1, "{file}");
    assert_eq!(vms["old"], old_record(), "the record changed on rewrite");
    assert_eq!(names(&list(&mut s)), vec!["old"]);
    // A second server reads what the first wrote.
    let mut s2 = Server::ready_in(&state, &runtime);
    assert_eq!(names(&list(&mut s2)), vec!["old"]);
}

#[test]
fn python_registry_layout_loads_and_keeps_unknown_fields() {
    registry_round_trip(
        "py",
        json!({"version": 1, "vms": {
            "old": old_record(),
            "other": {"qmp_socket": "/nonexistent/other.sock", "pid": null, "arch": "x86_64"}
        }}),
    );
}

#[test]
fn legacy_bare_mapping_registry_loads_and_keeps_unknown_fields() {
    registry_round_trip(
        "bare",
        json!({
            "old": old_record(),
            "other": {"qmp_socket": "/nonexistent/other.sock", "pid": null}
        }),
    );
}

#[test]
fn stop_and_pause_refuse_a_vm_that_is_still_being_launched() {
    // A reservation another live server holds (owner_pid alive, fresh): the VM is "starting".
    let dir = short_runtime_dir("starting");
    let state = dir.subdir("s");
    let runtime = dir.subdir("r");
    let owner = sleeper();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let sock = runtime.join("busy").join("qmp.sock");
    let reg = json!({"version": 1, "vms": {"busy": {
        "name": "busy",
        "qmp_socket": sock.to_str().unwrap(),
        "launching": {"owner_pid": owner.0.id(), "since": now}
    }}});
    std::fs::write(state.join("vms.json"), reg.to_string()).unwrap();
    let mut s = Server::ready_in(&state, &runtime);

    assert_eq!(entry(&list(&mut s), "busy").unwrap()["status"], "starting");
    for args in [
        json!({"name": "busy", "force": true}),
        json!({"name": "busy", "timeout": 1}),
    ] {
        let err = s.call_err("stop_vm", args);
        assert!(err.contains("being launched"), "{err}");
    }
    for tool in ["pause_vm", "resume_vm"] {
        let err = s.call_err(tool, json!({"name": "busy"}));
        assert!(err.contains("being launched"), "{tool}: {err}");
        assert!(!err.contains("has exited"), "{tool}: {err}");
    }
    assert_eq!(entry(&list(&mut s), "busy").unwrap()["status"], "starting");
    assert!(
        pid_alive(owner.0.id() as i32),
        "stop_vm signalled the launching server"
    );
}

// ---------------------------------------------------------------------------------------------
// What launch_vm puts on QEMU's command line

#[test]
fn disk_path_with_a_comma_is_one_writable_file() {
    let lab = Lab::without_server("comma", 1);
    let disk = lab.dir.join("data,readonly=on.qcow2");
    let (ok, _, err) = run_tool(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", disk.to_str().unwrap(), "16M"],
    );
    assert!(ok, "qemu-img create failed: {err}");
    let mut s = lab.spawn_server();
    let l = lab.launch_on(
        &mut s,
        vm_args(
            "comma",
            json!({"disks": [disk.to_str().unwrap()], "no_net": true}),
        ),
        LAUNCH,
    );
    let info = s.call_ok("vm_info", json!({"name": "comma"}));
    let devs = info["block_devices"].as_array().unwrap();
    let with_files: Vec<&Value> = devs.iter().filter(|d| !d["file"].is_null()).collect();
    assert_eq!(
        with_files.len(),
        1,
        "exactly one image must be open: {info}"
    );
    let d = with_files[0];
    assert_eq!(d["file"], disk.to_str().unwrap(), "{info}");
    assert_eq!(d["format"], "qcow2", "{info}");
    assert_eq!(
        d["read_only"], false,
        "the comma must not smuggle in readonly=on: {info}"
    );
    // The record keeps the disks once, in its launch config, each with its pinned format.
    assert_eq!(
        info["record"]["spec"]["disks"],
        json!([[disk.to_str().unwrap(), "qcow2"]])
    );
    assert_eq!(info["record"].get("disks"), None, "{info}");
    // Nothing else named after a piece of the path was created beside it.
    assert_eq!(
        list_dir(lab.dir.path()),
        vec!["data,readonly=on.qcow2", "r", "s"]
    );
    force_stop(&mut s, "comma", pid_of(&l));
}

#[test]
fn denied_extra_args_are_refused_before_qemu_starts() {
    let lab = Lab::without_server("deny", 1);
    let mut s = lab.spawn_server();
    let cases: &[&[&str]] = &[
        &["-virtfs", "local,path=/,mount_tag=host,security_model=none"],
        &[
            "--virtfs",
            "local,path=/,mount_tag=host,security_model=none",
        ],
        &["-virtfs=local,path=/,mount_tag=host,security_model=none"],
        &["-fsdev", "local,id=f,path=/,security_model=none"],
        &["-device", "virtio-9p-pci,fsdev=f,mount_tag=host"],
        &["-drive", "file=/dev/sda"],
        &["-drive", "file=/dev/sda,format=raw,if=virtio"],
        &["--drive=file=/dev/sda,format=raw"],
        &[
            "-blockdev",
            "driver=host_device,filename=/dev/sda,node-name=h",
        ],
        &["-hda", "/dev/sda"],
        &["-chardev", "pipe,id=p,path=/tmp/mcq-pipe"],
        &[
            "-netdev",
            "user,id=n,guestfwd=tcp:10.0.2.100:80-cmd:nc 127.0.0.1 80",
        ],
        &["-netdev", "tap,id=t,script=/bin/true"],
        &["-incoming", "exec:cat /etc/shadow"],
        &["-runas", "nobody"],
        &["-chroot", "/"],
        &["-monitor", "stdio"],
        &["-qmp", "tcp:127.0.0.1:4444,server=on,wait=off"],
        &["-mon", "chardev=x"],
        &["-serial", "stdio"],
        &["-pidfile", "/tmp/mcq-other.pid"],
        &["-daemonize"],
        &["-plugin", "/tmp/evil.so"],
        &["-readconfig", "/tmp/evil.cfg"],
        &[
            "-chardev",
            "socket,id=mcq-qga,path=/tmp/x,server=on,wait=off",
        ],
        &[
            "-usb",
            "-virtfs",
            "local,path=/,mount_tag=h,security_model=none",
        ],
    ];
    for (i, extra) in cases.iter().enumerate() {
        let name = format!("deny{i}");
        let err = s.call_err_within(
            "launch_vm",
            vm_args(&name, json!({"extra_args": extra})),
            LAUNCH,
        );
        assert!(
            err.contains("extra_args") && err.contains("not allowed"),
            "{extra:?}: {err}"
        );
        assert!(
            !lab.runtime().join(&name).exists(),
            "{extra:?}: a runtime folder was made"
        );
        assert!(
            qemu_pids_mentioning(&lab.runtime()).is_empty(),
            "{extra:?}: a QEMU was started"
        );
    }
    let l = list(&mut s);
    assert_eq!(l["vms"], json!([]), "refused launches left records: {l}");
}

#[test]
fn extra_args_cannot_smuggle_a_denied_option_past_the_parser() {
    // Each of these reaches a host device or program in QEMU 7.2 if it is accepted.
    let lab = Lab::without_server("smuggle", 1);
    let mut s = lab.spawn_server();
    let cases: &[&[&str]] = &[
        // A bare argument is QEMU's first hard disk image (like -hda).
        &["/dev/sda"],
        &["-name", "-x", "/dev/sda"],
        // An option without a value not listed as such must not hide the next one.
        &[
            "-no-fd-bootchk",
            "-virtfs",
            "local,path=/,mount_tag=h,security_model=none",
        ],
        &["-win2k-hack", "-hda", "/dev/sda"],
        // Implied keys may also be given by name, anywhere.
        &["-chardev", "backend=pipe,id=p,path=/tmp/mcq-pipe"],
        &["-chardev", "id=p,backend=pipe,path=/tmp/mcq-pipe"],
        &["-device", "id=f,driver=virtio-9p-pci,fsdev=f,mount_tag=h"],
        // Character-device shorthands of other options.
        &["-parallel", "pipe:/tmp/mcq-pipe"],
        // -set rewrites options after the check: here mcqemu's own serial log file.
        &["-set", "chardev.mcq-serial.logfile=/tmp/mcq-overwritten"],
    ];
    for (i, extra) in cases.iter().enumerate() {
        let name = format!("smuggle{i}");
        let r = s.call_tool_within(
            "launch_vm",
            vm_args(&name, json!({"extra_args": extra, "no_net": true})),
            LAUNCH,
        );
        if let Some(sc) = r.get("structuredContent") {
            lab.killer.track(sc);
            lab.killer.kill_all();
        }
        let err = tool_err(&r, &format!("launch_vm with extra_args {extra:?}"));
        assert!(err.contains("extra_args"), "{extra:?}: {err}");
        assert!(
            qemu_pids_mentioning(&lab.runtime()).is_empty(),
            "{extra:?}: a QEMU was started"
        );
    }
}

#[test]
fn duplicate_host_ports_are_refused() {
    let lab = Lab::without_server("dup", 1);
    let mut s = lab.spawn_server();
    let err = s.call_err_within(
        "launch_vm",
        vm_args("dup", json!({"port_forwards": ["2222:22", "2222:80"]})),
        LAUNCH,
    );
    assert!(err.contains("2222") && err.contains("twice"), "{err}");
    let err = s.call_err_within(
        "launch_vm",
        vm_args("dup", json!({"port_forwards": ["22"], "no_net": true})),
        LAUNCH,
    );
    assert!(err.contains("no_net"), "{err}");
    assert!(qemu_pids_mentioning(&lab.runtime()).is_empty());
    assert_eq!(list(&mut s)["vms"], json!([]));
}

/// The machine's outbound non-loopback IPv4 address, if it has one (no packet is sent).
fn non_loopback_ipv4() -> Option<Ipv4Addr> {
    let u = UdpSocket::bind("0.0.0.0:0").ok()?;
    u.connect("192.0.2.1:9").ok()?;
    match u.local_addr().ok()?.ip() {
        IpAddr::V4(ip) if !ip.is_loopback() && !ip.is_unspecified() => Some(ip),
        _ => None,
    }
}

#[test]
fn auto_port_forward_is_bound_on_loopback_only() {
    let lab = Lab::without_server("port", 1);
    let mut s = lab.spawn_server();
    let l = lab.launch_on(
        &mut s,
        vm_args("port", json!({"port_forwards": ["auto:22"]})),
        LAUNCH,
    );
    let fw = l["port_forwards"].as_array().unwrap();
    assert_eq!(fw.len(), 1, "{l}");
    assert_eq!(fw[0]["addr"], "127.0.0.1");
    assert_eq!(fw[0]["guest"], 22);
    assert_eq!(fw[0]["auto"], true);
    let port = fw[0]["host"].as_u64().unwrap() as u16;
    assert!(port > 0);
    let info = s.call_ok("vm_info", json!({"name": "port"}));
    assert_eq!(info["port_forwards"], l["port_forwards"]);

    // QEMU holds the port: slirp accepts the connection although nothing listens in the guest.
    let lo = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let c = TcpStream::connect_timeout(&lo, Duration::from_secs(10));
    assert!(c.is_ok(), "connect to {lo} failed: {c:?}");
    drop(c);
    assert!(
        TcpListener::bind(lo).is_err(),
        "port {port} is free: QEMU did not bind it"
    );
    match non_loopback_ipv4() {
        Some(ip) => {
            let other = SocketAddr::from((ip, port));
            let c = TcpStream::connect_timeout(&other, Duration::from_secs(5));
            assert!(c.is_err(), "port {port} answers on {ip}: not loopback-only");
        }
        None => eprintln!("no non-loopback IPv4 address here; skipped that half"),
    }

    force_stop(&mut s, "port", pid_of(&l));
    // The port is free again once QEMU is gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpListener::bind(lo).is_err() {
        assert!(
            Instant::now() < deadline,
            "port {port} still bound after stop"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::io::stderr().flush();
}

// ---------------------------------------------------------------------------------------------
// Liveness

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[test]
fn a_zombie_leader_whose_threads_still_run_is_alive() {
    use mcqemu::qemu::process;
    // The main thread leaves with exit(2) (SYS_exit = 60), not exit_group: the leader reads as
    // a zombie while the other thread, which still holds the process's files, sleeps on. This
    // is how a SIGKILLed QEMU looks for a few milliseconds, with its QMP socket still open.
    let script = "import ctypes, threading, time\n\
                  threading.Thread(target=time.sleep, args=(4,)).start()\n\
                  ctypes.CDLL(None).syscall(60, 0)\n";
    let child = ChildGuard(
        Command::new("python3")
            .args(["-c", script])
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn python3"),
    );
    let pid = child.0.id() as i32;
    let deadline = Instant::now() + Duration::from_secs(10);
    while pid_state(pid) != Some('Z') {
        assert!(Instant::now() < deadline, "the leader never exited");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        process::alive(pid),
        "a zombie leader with a running thread read as dead"
    );
    assert!(
        process::wait_dead(pid, Duration::from_secs(30)),
        "the process never ended"
    );
    assert_eq!(pid_state(pid), Some('Z'), "our unreaped child is a zombie");
    assert!(!process::alive(pid));
}
