//! Warm pools of template clones over MCP, against the built binary, real QEMU (TCG) and the
//! test guest: template_create {pool: 2} keeps two clones ready; sandbox_vm {template} hands
//! them out renamed, with the template's state, distinct generation ids and a clock within
//! 2 s; the pool refills; two takes at once never get the same clone; a pooled clone whose
//! QEMU was killed is never handed out; a restarted server adopts the pool; the quotas count
//! pooled clones; template_delete ends the pool.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::*;
use mcqemu::qemu::qmp;
use serde_json::{json, Value};

const CREATE: Duration = Duration::from_secs(240);
const CALL: Duration = Duration::from_secs(120);
const MARKER: &str = "made-for-the-pool";

fn template_args(name: &str, pool: u64) -> Value {
    let g = test_guest();
    json!({
        "name": name, "kernel": g.kernel, "initrd": g.initrd, "append": g.append,
        "memory_mb": 256, "cpus": 1, "wait_agent_s": 120, "pool": pool,
        "setup": [{"command": "/bin/sh", "args": ["-c", format!("echo {MARKER} > /root/marker")]}]
    })
}

fn listed(s: &mut Server, name: &str) -> Value {
    let l = s.call_ok("template_list", json!({}));
    l["templates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("{name} not in {l}"))
}

/// Waits (bounded) until the pool of `t` has `n` clones ready.
fn wait_ready(s: &mut Server, t: &str, n: u64) -> Duration {
    let t0 = Instant::now();
    loop {
        let e = listed(s, t);
        if e["pool_ready"] == json!(n) {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "pool never reached {n}: {e}; server stderr:\n{}",
            s.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The pooled records in the registry file: (name, pid).
fn pooled(lab: &Lab) -> Vec<(String, i32)> {
    let reg: Value = serde_json::from_slice(&std::fs::read(lab.registry()).unwrap()).unwrap();
    reg["vms"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, r)| r.get("pooled").is_some())
        .map(|(n, r)| (n.clone(), r["pid"].as_i64().unwrap_or(0) as i32))
        .collect()
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn genid(c: &Value) -> String {
    let sock = PathBuf::from(c["qmp_socket"].as_str().unwrap());
    let r = qmp::with_session(&sock, |q| q.execute("query-vm-generation-id", None))
        .unwrap_or_else(|e| panic!("query-vm-generation-id: {e}"));
    r["guid"].as_str().unwrap().to_string()
}

fn take(lab: &Lab, s: &mut Server, name: &str, template: &str) -> Value {
    let r = s.call_tool_within(
        "sandbox_vm",
        json!({"name": name, "template": template}),
        CALL,
    );
    lab.track(&r);
    tool_ok(&r, &format!("sandbox_vm {name} from {template}"))
}

#[test]
fn a_warm_pool_hands_out_ready_clones_refills_and_survives_a_restart() {
    test_guest();
    let lab = Lab::without_server("pool", 1);
    let mut s = lab.spawn_server();
    let r = s.call_tool_within("template_create", template_args("tp", 2), CREATE);
    lab.track(&r);
    let out = tool_ok(&r, "template_create {pool: 2}");
    assert_eq!(out["pool"], json!(2), "{out}");
    let filled = wait_ready(&mut s, "tp", 2);
    eprintln!("pool of 2 ready {filled:?} after template_create");
    for (_, pid) in pooled(&lab) {
        lab.killer.track(&json!({"pid": pid}));
    }
    // Pooled clones are not the caller's VMs.
    let vms = s.call_ok("list_vms", json!({}));
    assert_eq!(vms["vms"], json!([]), "{vms}");
    assert_eq!(listed(&mut s, "tp")["clones"], json!([]));

    // Two takes: the names asked for, the template's state, distinct ids, the clock right.
    let t0 = Instant::now();
    let a = take(&lab, &mut s, "wa", "tp");
    let took = t0.elapsed();
    let b = take(&lab, &mut s, "wb", "tp");
    eprintln!(
        "take from the pool: {took:?} round trip, ready_ms {} and {}",
        a["ready_ms"], b["ready_ms"]
    );
    for c in [&a, &b] {
        assert_eq!(c["pooled"], json!(true), "{c}");
        assert_eq!(c["agent_ready"], json!(true), "{c}");
    }
    assert_eq!(a["name"], "wa");
    assert_ne!(a["pid"], b["pid"]);
    assert_ne!(
        genid(&a),
        genid(&b),
        "two pooled clones share a VM generation ID"
    );
    for vm in ["wa", "wb"] {
        assert_eq!(sh(&mut s, vm, "cat /root/marker"), format!("{MARKER}\n"));
        let before = now_secs();
        let g: u64 = sh(&mut s, vm, "date +%s").trim().parse().unwrap();
        assert!(
            g + 2 >= before && g <= now_secs() + 2,
            "{vm}'s clock {g} vs {before}"
        );
    }
    let names: Vec<String> = s.call_ok("list_vms", json!({}))["vms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, vec!["wa".to_string(), "wb".to_string()]);
    // The taken clones are destroyed like any sandbox (their folders moved with them).
    for vm in ["wa", "wb"] {
        let d = s.call_ok_within("sandbox_destroy", json!({"name": vm}), CALL);
        assert_eq!(d["destroyed"], json!(true), "{d}");
    }

    // The pool refills; two takes at once never get the same clone.
    wait_ready(&mut s, "tp", 2);
    for (_, pid) in pooled(&lab) {
        lab.killer.track(&json!({"pid": pid}));
    }
    let i3 = s.start_call("sandbox_vm", json!({"name": "w3", "template": "tp"}));
    let i4 = s.start_call("sandbox_vm", json!({"name": "w4", "template": "tp"}));
    let c3 = tool_ok(&s.finish_call(&i3, CALL), "w3");
    let c4 = tool_ok(&s.finish_call(&i4, CALL), "w4");
    lab.track(&c3);
    lab.track(&c4);
    assert_ne!(c3["pid"], c4["pid"], "two takes got one clone: {c3} {c4}");
    for vm in ["w3", "w4"] {
        assert_eq!(sh(&mut s, vm, "cat /root/marker"), format!("{MARKER}\n"));
        s.call_ok_within("sandbox_destroy", json!({"name": vm}), CALL);
    }

    // Pooled clones whose QEMUs were just killed are never handed out, even when the take
    // comes at once (before the processes are gone, before the keeper's next round): the
    // take gets a fresh clone, and the dead ones' records and folders go.
    wait_ready(&mut s, "tp", 2);
    let victims = pooled(&lab);
    for (_, pid) in &victims {
        lab.killer.track(&json!({"pid": pid}));
    }
    for (_, pid) in &victims {
        // SAFETY: kill(2) on a QEMU this test's server started.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    let live = take(&lab, &mut s, "w5", "tp");
    for (_, pid) in &victims {
        assert_ne!(
            live["pid"],
            json!(pid),
            "a dead pooled clone was handed out: {live}"
        );
    }
    assert_eq!(sh(&mut s, "w5", "cat /root/marker"), format!("{MARKER}\n"));
    let gone = Instant::now();
    loop {
        let names: Vec<String> = pooled(&lab).into_iter().map(|(n, _)| n).collect();
        let left: Vec<&String> = victims
            .iter()
            .map(|(n, _)| n)
            .filter(|n| names.contains(n) || lab.vm_dir(n).exists())
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            gone.elapsed() < Duration::from_secs(20),
            "the dead pooled clones {left:?} kept their records or folders"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    s.call_ok_within("sandbox_destroy", json!({"name": "w5"}), CALL);

    // A restarted server adopts the pool: the same clones, no more started. (The keeper may
    // not have removed the record of the killed clone yet: wait until only live ones are left.)
    wait_ready(&mut s, "tp", 2);
    let settled = Instant::now();
    let before: Vec<i32> = loop {
        let pids: Vec<i32> = pooled(&lab).into_iter().map(|(_, p)| p).collect();
        if pids.len() == 2 && pids.iter().all(|p| pid_alive(*p)) {
            break pids;
        }
        assert!(
            settled.elapsed() < Duration::from_secs(20),
            "the pool's records never settled to its 2 live clones: {:?}",
            pooled(&lab)
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    for p in &before {
        lab.killer.track(&json!({"pid": p}));
    }
    s.try_close().unwrap();
    let mut s = lab.spawn_server();
    std::thread::sleep(Duration::from_secs(3));
    let mut after: Vec<i32> = pooled(&lab).into_iter().map(|(_, p)| p).collect();
    let mut b2 = before.clone();
    after.sort();
    b2.sort();
    assert_eq!(
        after, b2,
        "the restarted server did not adopt the pool as it was"
    );
    assert_eq!(listed(&mut s, "tp")["pool_ready"], json!(2));

    // A pool no server keeps ends by itself: its clones are destroyed idle_s after the last
    // server went (the watcher's doing).
    let r = s.call_ok(
        "template_pool",
        json!({"name": "tp", "size": 2, "idle_s": 5}),
    );
    assert_eq!(r["idle_s"], json!(5), "{r}");
    s.try_close().unwrap();
    let gone = Instant::now();
    while !pooled(&lab).is_empty() || before.iter().any(|p| pid_alive(*p)) {
        assert!(
            gone.elapsed() < Duration::from_secs(40),
            "the unkept pool outlived its idle_s: {:?}",
            pooled(&lab)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("an unkept pool ended {:?} after its server", gone.elapsed());
    assert!(
        gone.elapsed() >= Duration::from_millis(1500),
        "ended before its idle_s"
    );
    let mut s = lab.spawn_server();

    // template_delete ends the pool first (the new server has started it again).
    wait_ready(&mut s, "tp", 2);
    let before: Vec<i32> = pooled(&lab).into_iter().map(|(_, p)| p).collect();
    for p in &before {
        lab.killer.track(&json!({"pid": p}));
    }
    let d = s.call_ok_within("template_delete", json!({"name": "tp"}), CALL);
    assert_eq!(d["deleted"], json!(true), "{d}");
    for p in before {
        assert!(
            wait_pid_dead(p, Duration::from_secs(10)),
            "pooled QEMU {p} outlived its template"
        );
    }
    assert!(pooled(&lab).is_empty());
}

#[test]
fn a_pool_past_the_quota_is_refused_and_pooled_clones_count() {
    test_guest();
    let lab = Lab::without_server("poolq", 1);
    let mut s = lab.spawn_server_with(&[("MCQEMU_MAX_VMS", "2")]);
    let r = s.call_tool_within("template_create", template_args("tq", 0), CREATE);
    lab.track(&r);
    tool_ok(&r, "template_create");
    let err = s.call_err_kind("template_pool", json!({"name": "tq", "size": 3}), "refused");
    assert!(err.contains("MCQEMU_MAX_VMS"), "{err}");
    let ok = s.call_ok("template_pool", json!({"name": "tq", "size": 2}));
    assert_eq!(ok["pool"], json!(2), "{ok}");
    wait_ready(&mut s, "tq", 2);
    for (_, pid) in pooled(&lab) {
        lab.killer.track(&json!({"pid": pid}));
    }
    // Both slots are the pool's: a fresh sandbox of another kind does not fit.
    let g = test_guest();
    let err = s.call_err_within(
        "sandbox_vm",
        json!({"name": "extra", "base_image": g.initrd, "kernel": g.kernel, "initrd": g.initrd,
               "append": g.append, "memory_mb": 128, "cpus": 1}),
        CALL,
    );
    assert!(err.contains("MCQEMU_MAX_VMS"), "{err}");
    // A fresh clone (allow_network does not fit the pool) is refused by the quota only after
    // its overlay was made: it leaves no state folder behind.
    let err = s.call_err_within(
        "sandbox_vm",
        json!({"name": "over", "template": "tq", "allow_network": true}),
        CALL,
    );
    assert!(err.contains("MCQEMU_MAX_VMS"), "{err}");
    assert!(
        !lab.vm_dir("over").exists(),
        "the refused clone left {:?}",
        std::fs::read_dir(lab.vm_dir("over"))
            .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );
    // What a clone refuses is refused the same with a ready pool and without one, and no
    // pooled clone is handed out or lost.
    let before = pooled(&lab);
    let with_pool = refusals(&lab, &mut s, "tq");
    let after: Vec<(String, i32)> = pooled(&lab);
    assert_eq!(before, after, "a refused call touched the pool");
    assert!(after.iter().all(|(_, p)| pid_alive(*p)), "{after:?}");
    let off = s.call_ok("template_pool", json!({"name": "tq", "size": 0}));
    assert_eq!(off["pool"], json!(0), "{off}");
    assert!(pooled(&lab).is_empty(), "{:?}", pooled(&lab));
    let without_pool = refusals(&lab, &mut s, "tq");
    assert_eq!(with_pool, without_pool);
}

/// sandbox_vm {template} with each thing a clone cannot change: the errors, in order, each
/// checked to name its parameter and to have left no VM or folder behind.
fn refusals(lab: &Lab, s: &mut Server, template: &str) -> Vec<String> {
    let g = test_guest();
    let cases = [
        ("memory_mb", json!(512)),
        ("cpus", json!(2)),
        ("disk_size", json!("4G")),
        ("extra_args", json!(["-device", "virtio-rng-pci"])),
        ("kernel", json!(g.kernel)),
    ];
    let mut errs = Vec::new();
    for (key, value) in cases {
        let mut args = json!({"name": "m1", "template": template});
        args[key] = value;
        let r = s.call_tool_within("sandbox_vm", args, CALL);
        lab.track(&r);
        assert_eq!(r["isError"], json!(true), "{key} was honoured: {r}");
        let err = r["content"][0]["text"].as_str().unwrap().to_string();
        assert!(err.contains(key), "{key}: {err}");
        assert!(
            !lab.vm_dir("m1").exists(),
            "{key} left {:?}",
            lab.vm_dir("m1")
        );
        errs.push(err);
    }
    let vms = s.call_ok("list_vms", json!({}));
    assert_eq!(vms["vms"], json!([]), "{vms}");
    errs
}
