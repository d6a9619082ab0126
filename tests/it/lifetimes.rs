//! Sandboxes that end on time, over the built binary, real QEMU (TCG) and the test guest: TTL
//! and idle limits with each `on_idle`, carried out by the watcher process after the process
//! that made them exited; a held VM not ended; a call longer than the idle limit, and traffic
//! through a forward (one open connection, or many short ones), deferring the idle end; one
//! watcher per state folder, a killed one replaced when a server starts; the reasons VMs ended
//! (a kill -9 of QEMU, a guest poweroff, even one looked at before its supervisor wrote it, a
//! TTL); and the metrics following a busy guest and its writes.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{json, Value};

/// Bound for a sandbox's boot and its agent (TCG on a loaded 2-core machine).
const BOOT: Duration = Duration::from_secs(240);

/// `mcqemu ARGS` on the lab's folders, as a person or a short-lived client runs it; must
/// succeed; returns its standard output parsed as JSON (Null when it is not).
fn cli(lab: &Lab, args: &[&str]) -> Value {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env("MCQEMU_STATE_DIR", lab.state())
        .env("MCQEMU_RUNTIME_DIR", lab.runtime())
        .env("MCQEMU_ROOTS", test_roots());
    let done = try_run_command(&mut cmd, None, BOOT).unwrap_or_else(|e| panic!("{e}"));
    let stdout = String::from_utf8_lossy(&done.stdout).into_owned();
    assert!(
        done.status.success(),
        "mcqemu {args:?}: {:?}\n{stdout}\n{}",
        done.status,
        String::from_utf8_lossy(&done.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or(Value::Null)
}

/// A sandbox of the test guest made by `mcqemu call sandbox_vm` (a process that exits at
/// once), with `extra` arguments (the lifetime). Tracked for killing.
fn sandbox(lab: &Lab, name: &str, extra: Value) -> Value {
    let g = test_guest();
    let base = lab.dir.join(&format!("{name}-base.img"));
    std::fs::File::create(&base)
        .and_then(|f| f.set_len(1 << 20))
        .unwrap();
    let mut args = json!({
        "name": name, "base_image": base, "kernel": g.kernel, "initrd": g.initrd,
        "append": g.append, "memory_mb": 128, "cpus": 1, "port_forwards": [],
        "wait_agent_s": 180
    });
    for (k, v) in extra.as_object().unwrap() {
        args[k] = v.clone();
    }
    let out = cli(lab, &["call", "sandbox_vm", &args.to_string()]);
    lab.track(&json!({ "structuredContent": out }));
    assert_eq!(out["agent_ready"], json!(true), "{out}");
    out
}

/// list_vms's entry for `name` (None: no such VM), asked by a process of its own.
fn listed(lab: &Lab, name: &str) -> Option<Value> {
    let list = cli(lab, &["call", "list_vms", "{}"]);
    list["vms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == json!(name))
        .cloned()
}

/// Polls list_vms until `pred` holds for `name`'s entry (None when it is gone), within
/// `limit`; returns the entry.
fn wait_for(
    lab: &Lab,
    name: &str,
    limit: Duration,
    what: &str,
    pred: impl Fn(&Option<Value>) -> bool,
) -> Option<Value> {
    let deadline = Instant::now() + limit;
    loop {
        let v = listed(lab, name);
        if pred(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never became {what} within {limit:?}: {v:?}\nwatcher log:\n{}",
            std::fs::read_to_string(lab.state().join("watcher.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn status_is(want: &'static str) -> impl Fn(&Option<Value>) -> bool {
    move |v| v.as_ref().is_some_and(|v| v["status"] == json!(want))
}

/// The PID in the state folder's `watcher.pid`, when that process is alive.
fn watcher_pid(state: &Path) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(state.join("watcher.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    pid_alive(pid).then_some(pid)
}

/// Seconds since the epoch.
fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn ttl_and_idle_end_sandboxes_with_no_server_running() {
    test_guest();
    let lab = Lab::without_server("lt-ends", 2);
    // Each made by a process that exits as soon as the sandbox is ready.
    let idle = 20;
    for (name, on_idle) in [
        ("i-suspend", "suspend"),
        ("i-stop", "stop"),
        ("i-destroy", "destroy"),
    ] {
        sandbox(
            &lab,
            name,
            json!({"idle_s": idle, "on_idle": on_idle, "ttl_s": 0}),
        );
    }
    // Suspended when idle, then destroyed, asleep, by its deadline.
    sandbox(
        &lab,
        "t-asleep",
        json!({"idle_s": 6, "on_idle": "suspend", "ttl_s": 25, "on_ttl": "destroy"}),
    );
    let made_ttl = now_s();
    sandbox(&lab, "t-ttl", json!({"ttl_s": 30, "idle_s": 0}));
    let watcher = watcher_pid(&lab.state()).expect("a watcher runs for the lab's folder");
    // Nothing of the lab's runs but the VMs, their supervisors and the watcher.
    let listed_ttl = listed(&lab, "t-ttl").unwrap();
    assert_eq!(listed_ttl["lifetime"]["ttl_s"], json!(30), "{listed_ttl}");
    assert!(listed_ttl["lifetime"]["expires_in_s"].as_i64().unwrap() <= 30);

    let bound = Duration::from_secs(idle + 60);
    let v = wait_for(
        &lab,
        "i-suspend",
        bound,
        "suspended",
        status_is("suspended"),
    )
    .unwrap();
    let end = &v["end"];
    assert_eq!(
        (&end["reason"], &end["tool"]),
        (&json!("idle"), &json!("watcher")),
        "{v}"
    );
    let v = wait_for(&lab, "i-stop", bound, "stopped", status_is("stopped")).unwrap();
    assert_eq!(v["end"]["reason"], json!("idle"), "{v}");
    wait_for(&lab, "i-destroy", bound, "destroyed", |v| v.is_none());
    assert!(!lab.vm_dir("i-destroy").exists(), "its files went with it");
    wait_for(&lab, "t-asleep", bound, "suspended", status_is("suspended"));
    wait_for(&lab, "t-asleep", bound, "destroyed asleep", |v| v.is_none());
    assert!(
        !lab.vm_dir("t-asleep").exists(),
        "its saved state went with it"
    );
    let v = wait_for(&lab, "t-ttl", bound, "stopped", status_is("stopped")).unwrap();
    assert_eq!(v["end"]["reason"], json!("ttl"), "{v}");
    let ended_at = v["end"]["at"].as_f64().unwrap();
    assert!(
        ended_at >= made_ttl + 29.0,
        "ended {} s after it was made, before its 30 s",
        ended_at - made_ttl
    );
    // Every end is in the state folder's log.
    let log = std::fs::read_to_string(lab.state().join("ends.log")).unwrap();
    for name in ["i-suspend", "i-stop", "i-destroy", "t-asleep", "t-ttl"] {
        assert!(
            log.contains(&format!("\"name\":\"{name}\"")),
            "{name}: {log}"
        );
    }

    // The suspended one comes back when the next tool names it.
    let r = cli(
        &lab,
        &[
            "call",
            "guest_exec",
            &json!({"name": "i-suspend", "command": "sh", "args": ["-c", "echo back"]}).to_string(),
        ],
    );
    assert_eq!(r["stdout"], json!("back\n"), "{r}");
    let v = listed(&lab, "i-suspend").unwrap();
    assert_eq!(v["status"], json!("running"), "{v}");
    assert!(v["end"].is_null(), "a running VM shows no end: {v}");
    // The watcher watches it again (it has its idle limit still), then, once it is gone,
    // exits by itself.
    assert!(watcher_pid(&lab.state()).is_some());
    cli(
        &lab,
        &["call", "sandbox_destroy", r#"{"name": "i-suspend"}"#],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while pid_alive(watcher) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        watcher_pid(&lab.state()).is_none(),
        "the watcher exits once nothing is left to watch"
    );
}

#[test]
fn a_held_vm_is_not_ended_and_long_calls_and_forward_traffic_defer_idleness() {
    test_guest();
    let mut lab = Lab::with_slots("lt-busy", 2);
    let idle = 8;
    // A person holds one.
    let _ = sandbox(&lab, "held", json!({"idle_s": idle, "on_idle": "stop"}));
    let hold = lab.srv().call_ok("vm_takeover", json!({"name": "held"}))["hold"]
        .as_str()
        .unwrap()
        .to_string();
    // The other gets traffic through a forward: a connection to a listener in the guest, a
    // line every second.
    let fwd = sandbox(
        &lab,
        "fwd",
        json!({"idle_s": idle, "on_idle": "stop", "port_forwards": ["auto:7000"]}),
    );
    let port = fwd["port_forwards"][0]["host"].as_u64().unwrap() as u16;
    // A call longer than the idle limit is activity to its end.
    let slept = sh(lab.srv(), "fwd", &format!("sleep {}; echo slept", idle + 4));
    assert_eq!(slept.trim(), "slept");
    sh(
        lab.srv(),
        "fwd",
        "(sleep 1000 </dev/null 2>/dev/null | nc -l -p 7000 >/dev/null 2>&1 &) ; sleep 0.5",
    );
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let busy_until = Instant::now() + Duration::from_secs(idle * 2 + 4);
    while Instant::now() < busy_until {
        conn.write_all(b"still here\n").unwrap();
        std::thread::sleep(Duration::from_secs(1));
    }
    for name in ["held", "fwd"] {
        let v = listed(&lab, name).unwrap();
        assert_eq!(
            v["status"],
            json!("running"),
            "{name} ended while busy: {v}"
        );
    }
    let v = listed(&lab, "fwd").unwrap();
    assert_eq!(
        v["lifetime"]["last_activity_by"],
        json!("port forward"),
        "{v}"
    );
    assert_eq!(
        listed(&lab, "held").unwrap()["lifetime"]["busy"]
            .as_str()
            .map(|b| b.contains("holds")),
        Some(true)
    );
    // Handed back: the held one ends.
    drop(conn);
    lab.srv().call_ok(
        "vm_takeover",
        json!({"name": "held", "release": true, "hold": hold}),
    );
    // Short connections, each a request and its answer on a connection of its own, every 2 s:
    // every byte restarts the idle clock, however short the connection (only an open one did).
    sh(
        lab.srv(),
        "fwd",
        "(while :; do echo ok | nc -l -p 7000 >/dev/null; done) </dev/null >/dev/null 2>&1 & \
         sleep 0.5",
    );
    let mut last_byte = now_s();
    let busy_until = Instant::now() + Duration::from_secs(idle * 2);
    let mut answered = 0;
    while Instant::now() < busy_until {
        if let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            let _ = c.set_read_timeout(Some(Duration::from_secs(1)));
            let _ = c.write_all(b"hi\n");
            let mut got = [0u8; 3];
            if std::io::Read::read_exact(&mut c, &mut got).is_ok() && &got == b"ok\n" {
                answered += 1;
            }
            last_byte = now_s();
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    assert!(answered >= 4, "the guest answered {answered} requests");
    let v = listed(&lab, "fwd").unwrap();
    assert_eq!(
        v["status"],
        json!("running"),
        "ended amid short requests: {v}"
    );
    assert_eq!(
        v["lifetime"]["last_activity_by"],
        json!("port forward"),
        "{v}"
    );
    // Quiet: both end, the forwarded one no sooner than idle_s after its last byte.
    let bound = Duration::from_secs(idle + 30);
    for name in ["held", "fwd"] {
        let v = wait_for(&lab, name, bound, "stopped", status_is("stopped")).unwrap();
        assert_eq!(v["end"]["reason"], json!("idle"), "{v}");
        if name == "fwd" {
            let ended = v["end"]["at"].as_f64().unwrap();
            assert!(
                ended >= last_byte + idle as f64 - 1.0,
                "ended {} s after its last byte (idle_s {idle})",
                ended - last_byte
            );
        }
    }
}

#[test]
fn each_state_folder_has_its_own_watcher_and_a_killed_one_is_replaced() {
    test_guest();
    let a = Lab::without_server("lt-wa", 1);
    let b = Lab::without_server("lt-wb", 1);
    sandbox(&a, "a", json!({"idle_s": 600}));
    sandbox(&b, "b", json!({"idle_s": 600}));
    let (wa, wb) = (
        watcher_pid(&a.state()).expect("a's watcher"),
        watcher_pid(&b.state()).expect("b's watcher"),
    );
    assert_ne!(wa, wb, "one watcher per state folder");
    // SIGKILL: no chance to tidy up. The next server on that folder starts another.
    assert!(Command::new("kill")
        .args(["-9", &wa.to_string()])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while pid_alive(wa) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(watcher_pid(&a.state()).is_none());
    let mut s = a.spawn_server();
    let deadline = Instant::now() + Duration::from_secs(20);
    let replaced = loop {
        if let Some(p) = watcher_pid(&a.state()) {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "no watcher after a server started"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_ne!(replaced, wa);
    assert_eq!(
        watcher_pid(&b.state()),
        Some(wb),
        "b's watcher is untouched"
    );
    // A second server does not start a second watcher.
    let s2 = a.spawn_server();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(watcher_pid(&a.state()), Some(replaced));
    drop(s2);
    let _ = s.try_close();
}

/// A process stopped with SIGSTOP, continued when dropped (a failing test leaves none).
struct Stopped(i32);

impl Stopped {
    /// Stops the parent of `pid` (a QEMU's supervisor).
    fn parent_of(pid: i32) -> Stopped {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let ppid: i32 = stat[stat.rfind(')').unwrap() + 1..]
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        assert!(kill(ppid, "-STOP"));
        Stopped(ppid)
    }

    /// Continues it after `after`, from another thread.
    fn resume_after(self, after: Duration) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            std::thread::sleep(after);
            drop(self);
        })
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        kill(self.0, "-CONT");
    }
}

fn kill(pid: i32, signal: &str) -> bool {
    Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn end_reasons_kill_9_and_guest_poweroff_are_recorded() {
    test_guest();
    let mut lab = Lab::new("lt-reasons");
    // A guest that powers itself off, looked at between QEMU's exit and its supervisor's write
    // of why (held there by stopping the supervisor): vm_info waits for the end rather than
    // call it unknown, as it did once on a loaded host.
    let launched = lab.boot_test_guest("pw", 128);
    let qemu = launched["pid"].as_i64().unwrap() as i32;
    let supervisor = Stopped::parent_of(qemu);
    let r = lab.srv().call_tool_within(
        "guest_exec",
        json!({"name": "pw", "command": "sh", "args": ["-c", "(sleep 0.5; poweroff -f) >/dev/null 2>&1 &"]}),
        Duration::from_secs(60),
    );
    tool_ok(&r, "guest_exec");
    let deadline = Instant::now() + Duration::from_secs(60);
    while pid_state(qemu) != Some('Z') {
        assert!(Instant::now() < deadline, "QEMU never exited");
        std::thread::sleep(Duration::from_millis(100));
    }
    let vms: Value =
        serde_json::from_slice(&std::fs::read(lab.state().join("vms.json")).unwrap()).unwrap();
    assert!(vms["vms"]["pw"]["end"].is_null(), "{}", vms["vms"]["pw"]);
    let resumed = supervisor.resume_after(Duration::from_millis(500));
    let info = lab.srv().call_ok("vm_info", json!({"name": "pw"}));
    resumed.join().unwrap();
    assert_eq!(info["status"], json!("stopped"), "{info}");
    assert_eq!(info["end"]["reason"], json!("guest_poweroff"), "{info}");
    assert_eq!(info["end"]["exit_code"], json!(0), "{info}");
    lab.srv().call_ok("forget_vm", json!({"name": "pw"}));

    // QEMU killed from outside.
    let launched = lab.boot_test_guest("k9", 128);
    let pid = launched["pid"].as_i64().unwrap();
    assert!(kill(pid as i32, "-9"));
    let deadline = Instant::now() + Duration::from_secs(30);
    let listed = loop {
        let l = lab.srv().call_ok("list_vms", json!({}));
        let v = l["vms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == json!("k9"))
            .cloned()
            .unwrap();
        if !v["end"]["reason"].is_null() && v["end"]["reason"] != json!("unknown") {
            break v;
        }
        assert!(Instant::now() < deadline, "no end recorded: {v}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(listed["status"], json!("stopped"), "{listed}");
    assert_eq!(listed["end"]["reason"], json!("killed"), "{listed}");
    assert_eq!(listed["end"]["signal"], json!(9), "{listed}");
    // And stop_vm's own end says who asked.
    lab.boot_test_guest("asked", 128);
    lab.srv().call_ok_within(
        "stop_vm",
        json!({"name": "asked", "force": true}),
        Duration::from_secs(60),
    );
    let i = lab.srv().call_ok("vm_info", json!({"name": "asked"}));
    assert_eq!(
        (&i["end"]["reason"], &i["end"]["tool"]),
        (&json!("asked"), &json!("stop_vm")),
        "{i}"
    );
    // Each end is a line of the state folder's log, written by QEMU's supervisor as it sees
    // QEMU go (a moment after stop_vm has seen it).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ends = std::fs::read_to_string(lab.state().join("ends.log")).unwrap_or_default();
        if ends.lines().count() == 3 {
            assert!(ends.contains(r#""tool":"stop_vm""#), "{ends}");
            break;
        }
        assert!(Instant::now() < deadline, "{ends}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn metrics_follow_a_busy_guest_and_its_writes() {
    test_guest();
    // Both guest slots: its guest burns its vCPU, which must not starve another test's guest.
    let mut lab = Lab::with_slots("lt-metrics", 2);
    sandbox(&lab, "m", json!({"disk_size": "64M", "memory_mb": 256}));
    let look =
        |lab: &mut Lab| lab.srv().call_ok("vm_info", json!({"name": "m"}))["metrics"].clone();
    look(&mut lab);
    std::thread::sleep(Duration::from_secs(2));
    let quiet = look(&mut lab);
    // A loop that burns the guest's one vCPU.
    sh(
        lab.srv(),
        "m",
        "(while :; do :; done) </dev/null >/dev/null 2>&1 & echo $! > /tmp/burn",
    );
    look(&mut lab);
    std::thread::sleep(Duration::from_secs(2));
    let busy = look(&mut lab);
    let pct = |m: &Value| m["cpu_pct"].as_f64().unwrap();
    assert!(
        pct(&busy) > pct(&quiet) + 25.0 && pct(&busy) > 50.0,
        "CPU did not rise: quiet {quiet}, busy {busy}"
    );
    sh(lab.srv(), "m", "kill $(cat /tmp/burn)");
    // 32 MiB into the guest's memory and 16 MiB onto its disk.
    let before = look(&mut lab);
    sh(
        lab.srv(),
        "m",
        "mkdir -p /mnt/t && mount -t tmpfs -o size=64m t /mnt/t && \
         head -c 33554432 /dev/urandom > /mnt/t/fill && \
         dd if=/dev/urandom of=/dev/vda bs=1M count=16 conv=fsync 2>/dev/null",
    );
    let after = look(&mut lab);
    let n = |m: &Value, k: &str| m[k].as_u64().unwrap_or_else(|| panic!("{k} in {m}"));
    assert!(
        n(&after, "pss_bytes") >= n(&before, "pss_bytes") + (16 << 20),
        "Pss did not grow: {before} -> {after}"
    );
    let used = |m: &Value| m["guest_memory"]["used_bytes"].as_u64().unwrap();
    assert!(
        used(&after) >= used(&before) + (24 << 20),
        "{before} -> {after}"
    );
    assert!(
        n(&after, "disk_written_bytes") >= n(&before, "disk_written_bytes") + (16 << 20),
        "{before} -> {after}"
    );
    assert!(
        n(&after, "disk_allocated_bytes") >= n(&before, "disk_allocated_bytes") + (8 << 20),
        "the overlay took the writes: {before} -> {after}"
    );
    assert!(n(&after, "uptime_s") >= 4);
    // The same figures, cheaper, in list_vms; and in `mcqemu ps` for a person.
    let l = lab.srv().call_ok("list_vms", json!({}));
    let m = &l["vms"][0]["metrics"];
    assert!(m["rss_bytes"].as_u64().unwrap() > 64 << 20, "{l}");
    assert!(m["disk_written_bytes"].as_u64().unwrap() >= 16 << 20, "{l}");
    let mut cmd = Command::new(BIN);
    cmd.arg("ps")
        .env("MCQEMU_STATE_DIR", lab.state())
        .env("MCQEMU_RUNTIME_DIR", lab.runtime());
    let out = try_run_command(&mut cmd, None, Duration::from_secs(30)).unwrap();
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(table.starts_with("NAME"), "{table}");
    let row = table.lines().find(|l| l.starts_with("m ")).expect(&table);
    assert!(row.contains("running"), "{table}");
}
