//! Templates and their clones over MCP, against the built binary, the real QEMU (TCG here) and
//! the real test guest (tests/guest/build_guest.py): template_create saves a booted guest once,
//! sandbox_vm {template} starts clones of it without booting, template_list and
//! template_delete manage them; and the faults: damaged template files, a guest without an
//! agent, a server killed in the middle of template_create.
//!
//! Each test boots its template guest while holding a [`QEMU_SLOTS`] slot; clones do not boot
//! (they resume the saved guest), so a test runs several of them at once under its slot. Every
//! QEMU (the template's `template-NAME` VM included, by its pidfile) is SIGKILLed on the way
//! out, pass or fail ([`VmKiller`], through [`Lab`]).

use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::*;
use mcqemu::b64;
use mcqemu::qemu::qmp;
use serde_json::{json, Value};

/// Bound for template_create: a boot of the test guest, its setup and the save, on a loaded
/// 2-core machine without KVM.
const CREATE: Duration = Duration::from_secs(240);
/// Bound for sandbox_vm from a template (well under a second when the machine is idle).
const CLONE: Duration = Duration::from_secs(120);
/// Bound for sandbox_destroy and guest_exec round trips.
const STEP: Duration = Duration::from_secs(60);
/// What the templates' setup command leaves in /root/marker (the initramfs: guest RAM).
const MARKER: &str = "made-by-the-template-setup";
/// The HTTP body served to guests on the host's loopback.
const NET_BODY: &str = "mcqemu-template-net-ok";
/// Guest memory of every template here.
const MEMORY_MB: u64 = 256;

// ---------------------------------------------------------------------------------------------
// Helpers

/// A lab with `slots` guest slots and a server of its own. The test guest is built first,
/// never while holding a slot.
fn lab(label: &str, slots: usize) -> (Lab, Server) {
    test_guest();
    let lab = Lab::without_server(label, slots);
    let server = lab.spawn_server();
    (lab, server)
}

/// template_create arguments for the test guest (256 MiB, 1 vCPU) with `setup`, plus `extra`.
fn template_args(name: &str, setup: Value, extra: Value) -> Value {
    let g = test_guest();
    let mut a = json!({
        "name": name, "kernel": g.kernel, "initrd": g.initrd, "append": g.append,
        "memory_mb": MEMORY_MB, "cpus": 1, "setup": setup, "wait_agent_s": 120
    });
    for (k, v) in extra.as_object().expect("extra is an object") {
        a[k] = v.clone();
    }
    a
}

/// The setup that leaves [`MARKER`] in /root/marker.
fn marker_setup() -> Value {
    json!([{"command": "/bin/sh", "args": ["-c", format!("echo {MARKER} > /root/marker")],
            "timeout": 60}])
}

fn template_dir(lab: &Lab, name: &str) -> PathBuf {
    lab.state().join("templates").join(name)
}

/// The names of the VMs list_vms shows.
fn vm_names(s: &mut Server) -> Vec<String> {
    let l = s.call_ok("list_vms", json!({}));
    l["vms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect()
}

/// template_list's entry for `name`, if any.
fn listed(s: &mut Server, name: &str) -> Option<Value> {
    let l = s.call_ok("template_list", json!({}));
    l["templates"]
        .as_array()
        .unwrap_or_else(|| panic!("template_list gave no array: {l}"))
        .iter()
        .find(|t| t["name"] == name)
        .cloned()
}

/// template_create of the test guest with the marker setup, which must succeed; checks its
/// result and the files it leaves, and that the template's own VM is gone.
fn make_template(lab: &Lab, s: &mut Server, name: &str) -> Value {
    let t = Instant::now();
    let out = s.call_ok_within(
        "template_create",
        template_args(name, marker_setup(), json!({})),
        CREATE,
    );
    eprintln!(
        "template_create {name}: {:?} round trip, duration_ms {}, save_ms {}, state_bytes {}",
        t.elapsed(),
        out["duration_ms"],
        out["save_ms"],
        out["state_bytes"]
    );
    let dir = template_dir(lab, name);
    assert_eq!(out["name"], json!(name), "{out}");
    assert_eq!(
        std::fs::canonicalize(out["path"].as_str().unwrap()).unwrap(),
        std::fs::canonicalize(&dir).unwrap(),
        "{out}"
    );
    assert_eq!(out["memory_mb"], json!(MEMORY_MB), "{out}");
    assert!(out["save_ms"].as_u64().is_some(), "{out}");
    assert!(out["duration_ms"].as_u64().is_some(), "{out}");
    assert_eq!(out["setup"].as_array().map(Vec::len), Some(1), "{out}");
    let ram = std::fs::metadata(dir.join("ram")).expect("the template's RAM file");
    assert_eq!(ram.len(), MEMORY_MB << 20);
    let state = std::fs::metadata(dir.join("state")).expect("the template's state");
    assert!(state.len() > 0);
    assert_eq!(out["state_bytes"], json!(state.len()), "{out}");
    assert!(dir.join("disk.qcow2").is_file());
    assert!(dir.join("template.json").is_file());
    // The template's own VM is stopped and forgotten.
    assert!(
        !vm_names(s).contains(&format!("template-{name}")),
        "the template VM is still listed"
    );
    let left = qemu_pids_mentioning(&dir);
    assert!(left.is_empty(), "QEMU {left:?} still runs on the template");
    let entry = listed(s, name).expect("the new template is listed");
    assert_eq!(entry["usable"], json!(true), "{entry}");
    assert_eq!(entry["memory_mb"], json!(MEMORY_MB), "{entry}");
    assert_eq!(entry["cpus"], json!(1), "{entry}");
    assert_eq!(entry["clones"], json!([]), "{entry}");
    out
}

/// sandbox_vm of a clone of `template` named `name` with `extra` arguments; must succeed with
/// the agent ready. The QEMU is tracked for killing before anything is checked.
fn clone(lab: &Lab, s: &mut Server, template: &str, name: &str, extra: Value) -> Value {
    let mut args = json!({"template": template, "name": name});
    for (k, v) in extra.as_object().expect("extra is an object") {
        args[k] = v.clone();
    }
    let t = Instant::now();
    let r = s.call_tool_within("sandbox_vm", args.clone(), CLONE);
    let took = t.elapsed();
    lab.track(&r);
    let out = tool_ok(&r, &format!("sandbox_vm {args}"));
    check_clone(&out, template, name);
    eprintln!(
        "clone {name}: round trip {took:?}, ready_ms {}",
        out["ready_ms"]
    );
    out
}

/// The checks every clone's sandbox_vm result passes.
fn check_clone(out: &Value, template: &str, name: &str) {
    assert_eq!(out["name"], json!(name), "{out}");
    assert_eq!(out["template"], json!(template), "{out}");
    assert_eq!(out["agent_ready"], json!(true), "agent not ready: {out}");
    assert!(out["ready_ms"].as_u64().is_some(), "no ready_ms: {out}");
    assert!(out["pid"].as_i64().is_some(), "no pid: {out}");
    assert!(
        Path::new(out["overlay"].as_str().unwrap()).is_file(),
        "no overlay: {out}"
    );
}

fn destroy(s: &mut Server, vm: &str) {
    let d = s.call_ok_within("sandbox_destroy", json!({"name": vm}), STEP);
    assert_eq!(d["destroyed"], json!(true), "{d}");
    assert_eq!(d["errors"], json!([]), "{d}");
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The first sector of the guest's /dev/vda, read from the device (page cache dropped).
fn read_vda(s: &mut Server, vm: &str) -> Vec<u8> {
    sh(s, vm, "echo 3 > /proc/sys/vm/drop_caches");
    let r = s.call_ok(
        "guest_file_read",
        json!({"name": vm, "path": "/dev/vda", "max_bytes": 512, "encoding": "base64"}),
    );
    assert_eq!(r["size"], json!(512), "{r}");
    b64::decode(r["content"].as_str().unwrap()).unwrap()
}

/// A clone's leftovers after a failed sandbox_vm: no record, no state folder, no QEMU.
fn assert_no_clone_left(lab: &Lab, s: &mut Server, name: &str) {
    assert!(
        !vm_names(s).contains(&name.to_string()),
        "a failed clone {name} is still listed"
    );
    assert!(
        !lab.vm_dir(name).exists(),
        "a failed clone left {}",
        lab.vm_dir(name).display()
    );
    let left = qemu_pids_mentioning(&lab.runtime().join(name));
    assert!(left.is_empty(), "a failed clone left QEMU {left:?}");
}

// ---------------------------------------------------------------------------------------------
// One template, several clones

#[test]
fn template_clones_journey() {
    let (lab, mut s) = lab("tpl", 1);
    let http = HttpServer::start(vec![("/", Route::body(NET_BODY.as_bytes().to_vec()))]);
    let port = http
        .url("/")
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .parse::<u16>()
        .unwrap();
    let wget = format!("timeout 5 wget -q -O - http://10.0.2.2:{port}/");

    let name = "journey";
    make_template(&lab, &mut s, name);
    let saved = Instant::now();
    let tdir = template_dir(&lab, name);

    // What the template fixes cannot be changed for a clone, and a template made without
    // cloud_init has no seed to carry one: clear refusals, nothing started.
    for (extra, says) in [
        (json!({"memory_mb": 512}), "memory_mb"),
        (json!({"cloud_init": {"hostname": "other"}}), "cloud_init"),
    ] {
        let mut args = json!({"template": name, "name": "refused"});
        for (k, v) in extra.as_object().unwrap() {
            args[k] = v.clone();
        }
        let msg = s.call_err_within("sandbox_vm", args, CLONE);
        assert!(msg.contains(says), "{says}: {msg}");
        assert_no_clone_left(&lab, &mut s, "refused");
    }

    // A default clone (allow_network false) cannot reach a service on the host's loopback.
    let closed = clone(&lab, &mut s, name, "closed", json!({"port_forwards": []}));
    assert_eq!(closed["port_forwards"], json!([]), "{closed}");
    let r = s.call_ok_within(
        "guest_exec",
        json!({"name": "closed", "command": "sh", "args": ["-c", wget], "timeout": 30}),
        STEP,
    );
    assert!(
        r["exitcode"] != json!(0) || !r["signal"].is_null(),
        "a restricted clone reached the host: {r}"
    );
    assert!(!r["stdout"].as_str().unwrap().contains(NET_BODY), "{r}");
    assert!(http.hits().is_empty(), "the host saw {:?}", http.hits());
    destroy(&mut s, "closed");
    // The same request from a clone with allow_network gets through: the check above is not
    // vacuous.
    clone(
        &lab,
        &mut s,
        name,
        "open",
        json!({"port_forwards": [], "allow_network": true}),
    );
    let r = s.call_ok_within(
        "guest_exec",
        json!({"name": "open", "command": "sh", "args": ["-c", wget], "timeout": 30}),
        STEP,
    );
    assert_eq!(
        r["exitcode"],
        json!(0),
        "an open clone could not reach the host: {r}"
    );
    assert_eq!(r["stdout"], json!(NET_BODY), "{r}");
    assert_eq!(http.hits(), vec!["/".to_string()]);
    destroy(&mut s, "open");

    // Clones resume with the template's clock unless the server sets it: let the template
    // age first, so that a clock left alone would be off by far more than the 2 s allowed.
    let age = Duration::from_secs(10);
    if let Some(rest) = age.checked_sub(saved.elapsed()) {
        std::thread::sleep(rest);
    }

    // Two clones, each with its own forward of guest port 22.
    let a = clone(
        &lab,
        &mut s,
        name,
        "a",
        json!({"port_forwards": ["auto:22"]}),
    );
    // Its first command already sees the host's time, not the template's save time (the
    // server sets the clock in the background and the command waits for it).
    check_clock(&mut s, "a", &saved);
    // The agent answers at once (no retry), and the setup's marker is there.
    assert_eq!(sh(&mut s, "a", "cat /root/marker"), format!("{MARKER}\n"));
    let b = clone(
        &lab,
        &mut s,
        name,
        "b",
        json!({"port_forwards": ["auto:22"]}),
    );
    check_clock(&mut s, "b", &saved);
    assert_eq!(sh(&mut s, "b", "cat /root/marker"), format!("{MARKER}\n"));
    assert_ne!(a["pid"], b["pid"]);
    assert_ne!(a["overlay"], b["overlay"]);

    // Distinct host ports, each reaching its own clone.
    let fw = |c: &Value| -> u16 {
        let f = &c["port_forwards"];
        assert_eq!(f.as_array().map(Vec::len), Some(1), "{c}");
        assert_eq!(f[0]["guest"], json!(22), "{c}");
        f[0]["host"]
            .as_u64()
            .unwrap_or_else(|| panic!("no host port: {c}")) as u16
    };
    let (pa, pb) = (fw(&a), fw(&b));
    assert!(pa > 0 && pb > 0);
    assert_ne!(pa, pb, "two clones got the same host port");
    for (vm, port) in [("a", pa), ("b", pb)] {
        sh(
            &mut s,
            vm,
            &format!("(echo hello-from-{vm} | nc -l -p 22) </dev/null >/dev/null 2>&1 &"),
        );
        let want = format!("hello-from-{vm}\n");
        let deadline = Instant::now() + Duration::from_secs(30);
        let got = loop {
            let mut got = String::new();
            if let Ok(mut c) = TcpStream::connect(("127.0.0.1", port)) {
                let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
                let _ = c.read_to_string(&mut got);
            }
            if got == want || Instant::now() >= deadline {
                break got;
            }
            std::thread::sleep(Duration::from_millis(300));
        };
        assert_eq!(got, want, "host port {port} of clone {vm}");
    }

    // The same file, different content in each clone: each reads back its own.
    for vm in ["a", "b"] {
        let w = s.call_ok(
            "guest_file_write",
            json!({"name": vm, "path": "/root/shared.txt", "content": format!("written by {vm}\n")}),
        );
        assert_eq!(w["bytes_written"], json!(13), "{w}");
    }
    for vm in ["a", "b"] {
        let r = s.call_ok(
            "guest_file_read",
            json!({"name": vm, "path": "/root/shared.txt"}),
        );
        assert_eq!(r["content"], json!(format!("written by {vm}\n")), "{r}");
    }

    // Random numbers differ between clones resumed from the same saved state.
    let uuids: Vec<String> = ["a", "b"]
        .iter()
        .map(|vm| {
            sh(&mut s, vm, "cat /proc/sys/kernel/random/uuid")
                .trim()
                .to_string()
        })
        .collect();
    eprintln!("uuids: {uuids:?}");
    assert!(uuids.iter().all(|u| u.len() == 36), "{uuids:?}");
    assert_ne!(uuids[0], uuids[1], "two clones drew the same random UUID");
    // That alone does not show the fresh vmgenid (this guest's random numbers drift apart
    // from interrupt timing anyway); QEMU's own answer does.
    let genid = |c: &Value| -> String {
        let sock = PathBuf::from(c["qmp_socket"].as_str().unwrap());
        let r = qmp::with_session(&sock, |q| q.execute("query-vm-generation-id", None))
            .unwrap_or_else(|e| panic!("query-vm-generation-id: {e}"));
        r["guid"]
            .as_str()
            .unwrap_or_else(|| panic!("{r}"))
            .to_string()
    };
    let (ga, gb) = (genid(&a), genid(&b));
    eprintln!("vmgenids: {ga} {gb}");
    assert_ne!(ga, gb, "two clones share a VM generation ID");

    // template_delete is refused while a clone lives, and the refusal names the clones.
    let listed_now = listed(&mut s, name).expect("listed");
    let mut clones: Vec<String> = listed_now["clones"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    clones.sort();
    assert_eq!(clones, ["a", "b"], "{listed_now}");
    let msg = s.call_err("template_delete", json!({"name": name}));
    assert!(msg.contains("\"a\"") && msg.contains("\"b\""), "{msg}");
    assert!(
        tdir.join("template.json").is_file(),
        "refused, yet files went"
    );
    // Destroying a clone removes its overlay and folder, never the template.
    let a_dir = Path::new(a["overlay"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    destroy(&mut s, "a");
    assert!(!a_dir.exists(), "clone a's folder is still there");
    for f in ["ram", "state", "disk.qcow2", "template.json"] {
        assert!(
            tdir.join(f).is_file(),
            "destroying a clone removed the template's {f}"
        );
    }
    assert_eq!(listed(&mut s, name).unwrap()["clones"], json!(["b"]));
    let msg = s.call_err("template_delete", json!({"name": name}));
    assert!(msg.contains("\"b\""), "{msg}");
    // The other clone is unharmed.
    assert_eq!(sh(&mut s, "b", "cat /root/shared.txt"), "written by b\n");
    destroy(&mut s, "b");

    let d = s.call_ok("template_delete", json!({"name": name}));
    assert_eq!(d["deleted"], json!(true), "{d}");
    assert_eq!(d["errors"], json!([]), "{d}");
    assert!(!tdir.exists(), "the template folder is still there: {d}");
    assert_eq!(listed(&mut s, name), None);

    // A sandbox from the deleted template is a clear error, and leaves nothing behind.
    let msg = s.call_err_within(
        "sandbox_vm",
        json!({"template": name, "name": "late"}),
        CLONE,
    );
    assert!(
        msg.contains(&format!("no template named \"{name}\"")),
        "{msg}"
    );
    assert_no_clone_left(&lab, &mut s, "late");

    // The clone's sandbox_vm result says what the clone is: running (it was "inmigrate", the
    // status before the saved state was loaded).
    for (vm, out) in [("a", &a), ("b", &b)] {
        assert_eq!(out["status"], json!("running"), "clone {vm}: {out}");
    }
}

// ---------------------------------------------------------------------------------------------
// Concurrent clones

/// A guest whose agent cannot set the time its way (no /sbin/hwclock: qemu-ga's guest-set-time
/// refuses) still gets the host's clock in a clone, through date(1) run by the agent; one that
/// has no date(1) either gets a clock_warning in its record (vm_info) that says so.
#[test]
fn a_clone_of_a_guest_without_hwclock_still_gets_the_hosts_clock() {
    let (lab, mut s) = lab("nohw", 1);
    for (name, remove) in [
        ("nohw", "/sbin/hwclock"),
        ("nodate", "/sbin/hwclock /bin/date"),
    ] {
        let setup = json!([{"command": "/bin/sh", "args": ["-c", format!("rm {remove}")],
                            "timeout": 60}]);
        let t = s.call_ok_within(
            "template_create",
            template_args(name, setup, json!({})),
            CREATE,
        );
        assert_eq!(t["name"], json!(name), "{t}");
    }
    let saved = Instant::now();
    // Old enough that a clock left alone would be off by more than the 2 s allowed.
    std::thread::sleep(Duration::from_secs(5));
    clone(&lab, &mut s, "nohw", "nohw-a", json!({"port_forwards": []}));
    check_clock(&mut s, "nohw-a", &saved);
    assert_eq!(
        sh(&mut s, "nohw-a", "test -e /sbin/hwclock || echo gone"),
        "gone\n"
    );
    let info = s.call_ok("vm_info", json!({"name": "nohw-a"}));
    assert!(info["record"].get("clock_warning").is_none(), "{info}");
    destroy(&mut s, "nohw-a");

    clone(
        &lab,
        &mut s,
        "nodate",
        "nodate-a",
        json!({"port_forwards": []}),
    );
    // The first agent call waits for the clock's setting to end.
    assert_eq!(sh(&mut s, "nodate-a", "echo up"), "up\n");
    let info = s.call_ok("vm_info", json!({"name": "nodate-a"}));
    if agent_variant().unwrap().is_some() {
        // mcqemu-agent sets the clock itself (clock_settime): no hwclock or date needed.
        check_clock(&mut s, "nodate-a", &saved);
        assert!(info["record"].get("clock_warning").is_none(), "{info}");
    } else {
        let warning = info["record"]["clock_warning"].as_str().unwrap_or_default();
        for word in ["clock was not set", "date", "guest_exec"] {
            assert!(warning.contains(word), "{word}: {info}");
        }
    }
    destroy(&mut s, "nodate-a");
    for name in ["nohw", "nodate"] {
        s.call_ok_within("template_delete", json!({ "name": name }), STEP);
    }
}

#[test]
fn concurrent_clones_all_ready_and_isolated() {
    // Both slots: nothing else of this binary boots while the clones start together.
    let (lab, mut s) = lab("conc", 2);
    let name = "conc";
    make_template(&lab, &mut s, name);
    let tdir = template_dir(&lab, name);
    let ram_sum = sha256_hex(&std::fs::read(tdir.join("ram")).unwrap());
    let disk_sum = sha256_hex(&std::fs::read(tdir.join("disk.qcow2")).unwrap());

    // Four sandbox_vm calls pipelined on one server.
    let names = ["c1", "c2", "c3", "c4"];
    let t = Instant::now();
    let ids: Vec<Value> = names
        .iter()
        .map(|n| {
            s.start_call(
                "sandbox_vm",
                json!({"template": name, "name": n, "port_forwards": []}),
            )
        })
        .collect();
    let mut outs = Vec::new();
    for (id, n) in ids.iter().zip(names) {
        let r = s.finish_call(id, CLONE);
        lab.track(&r);
        let out = tool_ok(&r, &format!("sandbox_vm {n}"));
        check_clone(&out, name, n);
        outs.push(out);
    }
    eprintln!(
        "4 concurrent clones ready after {:?}; ready_ms {:?}",
        t.elapsed(),
        outs.iter()
            .map(|o| o["ready_ms"].clone())
            .collect::<Vec<_>>()
    );
    let mut pids: Vec<i64> = outs.iter().map(|o| o["pid"].as_i64().unwrap()).collect();
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(pids.len(), 4, "{outs:?}");

    // Each answers at once and sees the template's state; then each changes it, in RAM and on
    // its disk.
    for (i, n) in names.iter().enumerate() {
        assert_eq!(
            sh(&mut s, n, "cat /root/marker"),
            format!("{MARKER}\n"),
            "{n}"
        );
        let ch = (b'1' + i as u8) as char;
        sh(
            &mut s,
            n,
            &format!(
                "echo written-by-{n} > /root/marker && head -c 512 /dev/zero | tr '\\000' '{ch}' \
                 | dd of=/dev/vda bs=512 count=1 conv=fsync 2>/dev/null"
            ),
        );
    }
    for (i, n) in names.iter().enumerate() {
        assert_eq!(
            sh(&mut s, n, "cat /root/marker"),
            format!("written-by-{n}\n")
        );
        assert_eq!(read_vda(&mut s, n), vec![b'1' + i as u8; 512], "{n}");
    }

    // A later clone sees the template's state, not the earlier clones' writes.
    let late = clone(&lab, &mut s, name, "c5", json!({"port_forwards": []}));
    assert_eq!(sh(&mut s, "c5", "cat /root/marker"), format!("{MARKER}\n"));
    assert_eq!(read_vda(&mut s, "c5"), vec![0u8; 512]);
    eprintln!(
        "a fifth clone, with four running: ready_ms {}",
        late["ready_ms"]
    );

    for n in names.iter().chain(["c5"].iter()) {
        destroy(&mut s, n);
    }
    // The template's RAM and disk are exactly what they were.
    assert_eq!(
        sha256_hex(&std::fs::read(tdir.join("ram")).unwrap()),
        ram_sum
    );
    assert_eq!(
        sha256_hex(&std::fs::read(tdir.join("disk.qcow2")).unwrap()),
        disk_sum
    );
    let d = s.call_ok("template_delete", json!({"name": name}));
    assert_eq!(d["deleted"], json!(true), "{d}");
}

// ---------------------------------------------------------------------------------------------
// Faults

/// One damage to a template's files: what to do, and what sandbox_vm's error must mention.
struct Damage {
    what: &'static str,
    file: &'static str,
    /// None: delete the file; Some(f): truncate it to f(len).
    truncate: Option<fn(u64) -> u64>,
    /// Words the sandbox_vm error must contain (besides the template name).
    says: &'static [&'static str],
}

#[test]
fn damaged_templates_and_failed_setup_are_clear_errors() {
    let (lab, mut s) = lab("dmg", 1);

    // A failing setup command: an error with its output, nothing saved.
    let bad = "badsetup";
    let t = Instant::now();
    let msg = s.call_err_within(
        "template_create",
        template_args(
            bad,
            json!([
                {"command": "true"},
                {"command": "sh", "args": ["-c", "echo oops-out; echo oops-err >&2; exit 3"]},
                {"command": "sh", "args": ["-c", "echo never > /root/never"]}
            ]),
            json!({}),
        ),
        CREATE,
    );
    eprintln!("failed setup answered after {:?}: {msg}", t.elapsed());
    for word in ["setup[1]", "oops-out", "oops-err", "3", "nothing was saved"] {
        assert!(msg.contains(word), "{word:?} missing from: {msg}");
    }
    assert!(
        !template_dir(&lab, bad).exists(),
        "a failed create left its folder"
    );
    assert_eq!(listed(&mut s, bad), None);
    assert!(!vm_names(&mut s).contains(&format!("template-{bad}")));
    let left = qemu_pids_mentioning(&lab.runtime().join(format!("template-{bad}")));
    assert!(
        left.is_empty(),
        "the failed template's QEMU {left:?} still runs"
    );

    let name = "dmg";
    make_template(&lab, &mut s, name);
    let dir = template_dir(&lab, name);
    let half: fn(u64) -> u64 = |n| n / 2;
    let zero: fn(u64) -> u64 = |_| 0;
    let damages = [
        Damage {
            what: "RAM file deleted",
            file: "ram",
            truncate: None,
            says: &["RAM"],
        },
        Damage {
            what: "RAM file truncated",
            file: "ram",
            truncate: Some(half),
            says: &["RAM", "134217728", "256 MiB"],
        },
        Damage {
            what: "saved state deleted",
            file: "state",
            truncate: None,
            says: &["state"],
        },
        Damage {
            what: "saved state emptied",
            file: "state",
            truncate: Some(zero),
            says: &["state"],
        },
        Damage {
            what: "template.json truncated",
            file: "template.json",
            truncate: Some(half),
            says: &["damaged", "template.json"],
        },
        Damage {
            what: "disk deleted",
            file: "disk.qcow2",
            truncate: None,
            says: &["disk"],
        },
        // Last: only a check of the state's size against the state_bytes of template.json finds
        // this before a clone tries to load it.
        Damage {
            what: "saved state truncated",
            file: "state",
            truncate: Some(half),
            says: &["state"],
        },
    ];
    for (i, d) in damages.iter().enumerate() {
        let f = dir.join(d.file);
        let keep = dir.join(format!("{}.keep", d.file));
        std::fs::rename(&f, &keep).unwrap();
        if let Some(cut) = d.truncate {
            std::fs::copy(&keep, &f).unwrap();
            let len = std::fs::metadata(&f).unwrap().len();
            let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
            file.set_len(cut(len)).unwrap();
        }
        let vm = format!("d{i}");
        let t = Instant::now();
        let r = s.call_tool_within("sandbox_vm", json!({"template": name, "name": vm}), CLONE);
        lab.track(&r);
        let msg = tool_err(&r, &format!("sandbox_vm of a template with its {}", d.what));
        eprintln!("{}: answered after {:?}: {msg}", d.what, t.elapsed());
        assert!(msg.contains(&format!("\"{name}\"")), "{}: {msg}", d.what);
        for word in d.says {
            assert!(
                msg.contains(word),
                "{}: {word:?} missing from: {msg}",
                d.what
            );
        }
        assert_no_clone_left(&lab, &mut s, &vm);
        let entry = listed(&mut s, name)
            .unwrap_or_else(|| panic!("{}: the damaged template is not listed", d.what));
        assert_eq!(entry["usable"], json!(false), "{}: {entry}", d.what);
        assert!(
            entry["problem"].as_str().is_some_and(|p| !p.is_empty()),
            "{}: {entry}",
            d.what
        );
        std::fs::rename(&keep, &f).unwrap();
        assert_eq!(
            listed(&mut s, name).unwrap()["usable"],
            json!(true),
            "{}",
            d.what
        );
    }

    // Without template.json the folder is no template at all: not listed, and sandbox_vm says
    // there is no such template.
    let meta = dir.join("template.json");
    let keep = dir.join("template.json.keep");
    std::fs::rename(&meta, &keep).unwrap();
    let msg = s.call_err_within("sandbox_vm", json!({"template": name, "name": "dj"}), CLONE);
    assert!(
        msg.contains(&format!("no template named \"{name}\"")),
        "{msg}"
    );
    assert_no_clone_left(&lab, &mut s, "dj");
    let entry = listed(&mut s, name);
    assert!(
        entry.as_ref().is_none_or(|e| e["usable"] == json!(false)),
        "a template without template.json is listed as usable: {entry:?}"
    );
    std::fs::rename(&keep, &meta).unwrap();

    // Repaired, it works again.
    clone(&lab, &mut s, name, "fixed", json!({"port_forwards": []}));
    assert_eq!(
        sh(&mut s, "fixed", "cat /root/marker"),
        format!("{MARKER}\n")
    );
    destroy(&mut s, "fixed");
    let d = s.call_ok("template_delete", json!({"name": name}));
    assert_eq!(d["deleted"], json!(true), "{d}");
}

#[test]
fn template_of_a_guest_without_agent_is_a_clear_error() {
    let (lab, mut s) = lab("noga", 1);
    let name = "noagent";
    // The test guest's init starts qemu-ga only on the agent's virtio port; with the
    // virtio_console module blacklisted the port never appears, so the agent never answers.
    let g = test_guest();
    let t = Instant::now();
    let msg = s.call_err_within(
        "template_create",
        template_args(
            name,
            marker_setup(),
            json!({"append": format!("{} module_blacklist=virtio_console", g.append),
                   "wait_agent_s": 5}),
        ),
        CREATE,
    );
    let took = t.elapsed();
    eprintln!("template_create without an agent failed after {took:?}: {msg}");
    assert!(msg.contains("agent"), "{msg}");
    assert!(msg.contains("5 s"), "{msg}");
    assert!(msg.contains("nothing was saved"), "{msg}");
    assert!(took >= Duration::from_secs(5), "{took:?}");
    assert!(took < Duration::from_secs(90), "{took:?}");
    assert!(
        !template_dir(&lab, name).exists(),
        "a failed create left {}",
        template_dir(&lab, name).display()
    );
    assert_eq!(listed(&mut s, name), None);
    assert!(!vm_names(&mut s).contains(&format!("template-{name}")));
    let left = qemu_pids_mentioning(&lab.runtime().join(format!("template-{name}")));
    assert!(left.is_empty(), "the template's QEMU {left:?} still runs");
    let msg = s.call_err("sandbox_vm", json!({"template": name, "name": "x"}));
    assert!(msg.contains("no template named"), "{msg}");
}

/// Starts template_create `name` whose setup announces itself on the serial console and then
/// sleeps, waits until the setup step runs, then SIGKILLs the server. The template's QEMU keeps
/// running.
///
/// The serial log, not progress notifications, tells when the setup runs: template_create's
/// "setup N" progress comes after the agent wait's, whose progress counts seconds, so it is
/// dropped as not increasing whenever the boot took over a second.
fn kill_server_during_setup(lab: &Lab, s: &mut Server, name: &str) {
    const SAYS: &str = "mcqemu-setup-running";
    let id = s.start_call(
        "template_create",
        template_args(
            name,
            json!([{"command": "sh", "args": ["-c", format!("echo {SAYS} > /dev/ttyS0; sleep 60")],
                    "timeout": 120}]),
            json!({}),
        ),
    );
    let log = lab.vm_dir(&format!("template-{name}")).join("serial.log");
    let deadline = Instant::now() + CREATE;
    loop {
        let text = std::fs::read(&log).unwrap_or_default();
        if String::from_utf8_lossy(&text).contains(SAYS) {
            break;
        }
        if let Some(m) = s.recv(Duration::from_millis(100)) {
            assert!(
                m.get("id") != Some(&id),
                "template_create ended before its setup step: {m}"
            );
        }
        assert!(
            Instant::now() < deadline,
            "template_create never reached its setup step ({} has no {SAYS})",
            log.display()
        );
    }
    // Well inside the 60 s sleep.
    std::thread::sleep(Duration::from_secs(1));
    // SAFETY: kill(2) on the server process this test started.
    unsafe { libc::kill(s.pid() as i32, libc::SIGKILL) };
    assert!(
        s.wait_exit(Duration::from_secs(10)).is_some(),
        "the server survived SIGKILL"
    );
}

#[test]
fn server_killed_during_template_create_leaves_nothing_usable() {
    let (lab, mut s) = lab("kill", 1);
    let name = "killed";
    kill_server_during_setup(&lab, &mut s, name);
    drop(s);

    let mut s = lab.spawn_server();
    let entry = listed(&mut s, name);
    assert!(
        entry.as_ref().is_none_or(|e| e["usable"] == json!(false)),
        "an interrupted template is listed as usable: {entry:?}"
    );
    let msg = s.call_err_within("sandbox_vm", json!({"template": name, "name": "k1"}), CLONE);
    assert!(msg.contains(&format!("\"{name}\"")), "{msg}");
    assert_no_clone_left(&lab, &mut s, "k1");

    // The interrupted create's VM outlives the server (VMs do); the operator stops it as its
    // refusal says, and the same template is made again.
    let build_vm = format!("template-{name}");
    assert!(
        vm_names(&mut s).contains(&build_vm),
        "{:?}",
        vm_names(&mut s)
    );
    let st = s.call_ok_within("stop_vm", json!({"name": build_vm, "force": true}), STEP);
    assert_eq!(st["status"], json!("stopped"), "{st}");
    make_template(&lab, &mut s, name);
    clone(&lab, &mut s, name, "k2", json!({"port_forwards": []}));
    assert_eq!(sh(&mut s, "k2", "cat /root/marker"), format!("{MARKER}\n"));
    destroy(&mut s, "k2");
    let d = s.call_ok("template_delete", json!({"name": name}));
    assert_eq!(d["deleted"], json!(true), "{d}");
}

#[test]
fn template_create_after_a_killed_server_replaces_its_stale_build_vm() {
    let (lab, mut s) = lab("stale", 1);
    let name = "stale";
    kill_server_during_setup(&lab, &mut s, name);
    drop(s);
    let build_pid = read_pidfile(
        &lab.runtime()
            .join(format!("template-{name}"))
            .join("qemu.pid"),
        Duration::from_secs(5),
    );
    assert!(pid_alive(build_pid), "the build VM died with the server");

    // A new server makes the same template again at once: the build VM left by the killed
    // server is its own garbage, not a VM of the user's to protect.
    let mut s = lab.spawn_server();
    make_template(&lab, &mut s, name);
    assert!(
        wait_pid_dead(build_pid, Duration::from_secs(10)),
        "the stale build VM {build_pid} still runs"
    );
    clone(&lab, &mut s, name, "s1", json!({"port_forwards": []}));
    assert_eq!(sh(&mut s, "s1", "cat /root/marker"), format!("{MARKER}\n"));
    destroy(&mut s, "s1");
}

/// The clock of clone `vm`, read by `date +%s` in the guest, is the host's within 2 s.
fn check_clock(s: &mut Server, vm: &str, saved: &Instant) {
    let before = now_secs();
    let out = sh(s, vm, "date +%s");
    let after = now_secs();
    let guest: u64 = out
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("date +%s in {vm} gave {out:?}"));
    assert!(
        guest + 2 >= before && guest <= after + 2,
        "clone {vm}'s clock is {guest}, the host's {before}..{after} (template saved {:?} ago)",
        saved.elapsed()
    );
}
