//! Sandboxes that branch and sleep, over MCP against the built binary, real QEMU (TCG) and the
//! test guest: sandbox_fork makes live copies of a running sandbox (its tmpfs, its disk and a
//! counting process in each, changes kept apart, the parent running on, randomness apart,
//! forks of forks, quotas); sandbox_suspend saves one to disk and ends its QEMU, and
//! sandbox_resume brings it back after a server restart with its processes and forwards;
//! template_delete refuses while a fork of one of its clones stands on its disk.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{json, Value};

/// Bound for a sandbox's boot and its agent (TCG on a loaded 2-core machine).
const BOOT: Duration = Duration::from_secs(240);
/// Bound for a fork, a suspend or a resume.
const STEP: Duration = Duration::from_secs(180);
/// Guest memory of every sandbox here.
const MEMORY_MB: u64 = 256;

/// The counting process (its file replaced whole, so a reader never sees it half-written),
/// the tmpfs value, the disk's first sector and a web server on 8080 serving the tmpfs.
const SETUP: &str = "mkdir -p /t && mount -t tmpfs t /t && echo VALUE > /t/v && chmod 755 /t && chmod 644 /t/v && \
    head -c 512 /dev/zero | tr '\\000' D | dd of=/dev/vda bs=512 count=1 conv=fsync 2>/dev/null || exit 1; \
    (i=0; while :; do i=$((i+1)); echo $i > /t/c.new && mv /t/c.new /t/count; sleep 0.1; done) </dev/null >/dev/null 2>&1 & \
    busybox httpd -p 8080 -h /t </dev/null >/dev/null 2>&1; sleep 0.5; cat /t/count";

/// One fork test at a time: each runs up to seven TCG guests, too many at once for two cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn lab_with_base(label: &str) -> (Lab, std::path::PathBuf) {
    test_guest();
    let lab = Lab::new(label);
    let base = lab.dir.join("base.qcow2");
    let (ok, out, err) = run_tool(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", base.to_str().unwrap(), "32M"],
    );
    assert!(ok, "qemu-img create failed: {out}{err}");
    (lab, base)
}

/// sandbox_vm of the test guest on `base`, set up with [`SETUP`].
fn sandbox(lab: &mut Lab, name: &str, base: &Path) -> Value {
    let g = test_guest();
    let args = json!({
        "name": name, "base_image": base, "kernel": g.kernel, "initrd": g.initrd,
        "append": g.append, "memory_mb": MEMORY_MB, "cpus": 1, "wait_agent_s": 180,
        "port_forwards": ["auto:8080"]
    });
    let r = lab.srv().call_tool_within("sandbox_vm", args, BOOT);
    lab.track(&r);
    let sb = tool_ok(&r, "sandbox_vm");
    sh_trimmed(lab.srv(), name, SETUP);
    sb
}

/// `sh -c SCRIPT` in the guest; must exit 0; returns stdout trimmed.
/// A file into VM `name` and back out over its data channel (`via: channel` both ways).
fn channel_copy(lab: &mut Lab, name: &str) {
    let src = lab.dir.join(&format!("in-{name}"));
    std::fs::write(&src, format!("for {name}\n")).unwrap();
    let dest = lab.dir.join(&format!("out-{name}"));
    let _ = std::fs::remove_file(&dest);
    let r = lab.srv().call_ok_within(
        "guest_copy_in",
        json!({"name": name, "host_path": src, "guest_path": "/tmp/cc", "overwrite": true}),
        STEP,
    );
    assert_eq!(r["via"], json!("channel"), "{name}: {r}");
    let r = lab.srv().call_ok_within(
        "guest_copy_out",
        json!({"name": name, "guest_path": "/tmp/cc", "host_path": dest}),
        STEP,
    );
    assert_eq!(r["via"], json!("channel"), "{name}: {r}");
    assert_eq!(
        std::fs::read_to_string(&dest).unwrap(),
        format!("for {name}\n")
    );
}

/// [`sh`], its output trimmed.
fn sh_trimmed(s: &mut Server, name: &str, script: &str) -> String {
    sh(s, name, script).trim().to_string()
}

/// The counter now and a second later.
fn counts(s: &mut Server, name: &str) -> (u64, u64) {
    let out = sh_trimmed(s, name, "cat /t/count; sleep 1; cat /t/count");
    let v: Vec<u64> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert_eq!(v.len(), 2, "{name}: {out:?}");
    (v[0], v[1])
}

/// What the guest sees: the tmpfs value and the first byte of its disk (page cache dropped).
/// A failed read shows as its error in place of the value.
fn seen(s: &mut Server, name: &str) -> String {
    sh_trimmed(
        s,
        name,
        "echo 3 > /proc/sys/vm/drop_caches; cat /t/v 2>&1; dd if=/dev/vda bs=1 count=1 2>/dev/null",
    )
}

/// Asserts what `name` sees ([`seen`]); a mismatch also shows the guest's tmpfs and its
/// kernel's last words.
fn assert_seen(s: &mut Server, name: &str, want: &str) {
    let got = seen(s, name);
    if got != want {
        let why = sh_trimmed(
            s,
            name,
            "ls -la /t; grep ' /t ' /proc/mounts; dmesg | tail -n 20",
        );
        let serial = s.call_ok("vm_serial_read", json!({"name": name, "tail_lines": 120}));
        panic!(
            "{name} sees {got:?}, not {want:?}\n{why}\nits serial console:\n{}",
            serial["text"].as_str().unwrap_or_default()
        );
    }
}

fn vm_status(s: &mut Server, name: &str) -> Option<String> {
    let l = s.call_ok("list_vms", json!({}));
    l["vms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .map(|v| v["status"].as_str().unwrap_or_default().to_string())
}

fn forks_left(lab: &Lab) -> Vec<String> {
    list_dir(&lab.state().join("forks"))
}

#[test]
fn a_running_sandbox_forks_four_ways_and_each_copy_goes_its_own_way() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (mut lab, base) = lab_with_base("fork");
    sandbox(&mut lab, "p", &base);
    // A copy over the data channel before the fork: the copies get the same port.
    channel_copy(&mut lab, "p");
    let before = counts(lab.srv(), "p").1;
    let t = Instant::now();
    let f = lab
        .srv()
        .call_ok_within("sandbox_fork", json!({"name": "p", "count": 4}), STEP);
    eprintln!(
        "sandbox_fork x4 of a {MEMORY_MB} MiB sandbox: {:?} round trip, parent paused {} ms, \
         capture {} ms ({}), first ready {} ms, all ready {} ms, ram {} bytes, state {} bytes",
        t.elapsed(),
        f["parent_paused_ms"],
        f["capture_ms"],
        f["capture_steps_ms"],
        f["first_ready_ms"],
        f["all_ready_ms"],
        f["ram_bytes"],
        f["state_bytes"]
    );
    let copies: Vec<String> = f["copies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            lab.killer.track(c);
            c["name"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(
        copies,
        ["p-fork-1", "p-fork-2", "p-fork-3", "p-fork-4"],
        "{f}"
    );
    assert!(f["parent_paused_ms"].as_u64().is_some(), "{f}");
    for c in &copies {
        assert_eq!(vm_status(lab.srv(), c).as_deref(), Some("running"), "{c}");
        assert_seen(lab.srv(), c, "VALUE\nD");
        let (a, b) = counts(lab.srv(), c);
        assert!(
            a >= before && b > a,
            "{c}: the counter went {a} -> {b} (parent had {before})"
        );
    }
    channel_copy(&mut lab, "p-fork-2");
    channel_copy(&mut lab, "p");
    // The parent runs on.
    let (a, b) = counts(lab.srv(), "p");
    assert!(b > a && a > before, "parent counter {before} -> {a} -> {b}");
    // A change in one copy is seen nowhere else.
    sh_trimmed(
        lab.srv(),
        "p-fork-1",
        "echo ONE > /t/v && head -c 512 /dev/zero | tr '\\000' 1 | dd of=/dev/vda bs=512 \
         count=1 conv=fsync 2>/dev/null",
    );
    assert_seen(lab.srv(), "p-fork-1", "ONE\n1");
    for other in ["p", "p-fork-2", "p-fork-3", "p-fork-4"] {
        assert_seen(lab.srv(), other, "VALUE\nD");
    }
    // Each copy draws its own randomness.
    let mut draws: Vec<String> = copies
        .iter()
        .map(|c| sh_trimmed(lab.srv(), c, "head -c 16 /dev/urandom | od -An -tx1"))
        .collect();
    draws.sort();
    draws.dedup();
    assert_eq!(
        draws.len(),
        4,
        "copies read the same random bytes: {draws:?}"
    );
    // A fork of a fork.
    let ff = lab.srv().call_ok_within(
        "sandbox_fork",
        json!({"name": "p-fork-1", "names": ["grandchild"]}),
        STEP,
    );
    lab.killer.track(&ff["copies"][0]);
    assert_seen(lab.srv(), "grandchild", "ONE\n1");
    let (a, b) = counts(lab.srv(), "grandchild");
    assert!(b > a, "grandchild counter {a} -> {b}");
    // The parent forked again, on top of its first fork: the copy has what the parent wrote
    // to its disk since.
    sh_trimmed(
        lab.srv(),
        "p",
        "head -c 512 /dev/zero | tr '\\000' Q | dd of=/dev/vda bs=512 count=1 conv=fsync \
         2>/dev/null",
    );
    let again = lab.srv().call_ok_within(
        "sandbox_fork",
        json!({"name": "p", "names": ["second"]}),
        STEP,
    );
    lab.killer.track(&again["copies"][0]);
    assert_seen(lab.srv(), "second", "VALUE\nQ");
    let d = lab
        .srv()
        .call_ok_within("sandbox_destroy", json!({"name": "second"}), STEP);
    assert_eq!(d["destroyed"], json!(true), "{d}");
    // The parent's record follows its disk onto the overlay each fork gave it: suspended and
    // resumed (which starts a QEMU from the record), it has what it wrote after the forks.
    sh_trimmed(
        lab.srv(),
        "p",
        "head -c 512 /dev/zero | tr '\\000' P | dd of=/dev/vda bs=512 count=1 conv=fsync \
         2>/dev/null",
    );
    lab.srv()
        .call_ok_within("sandbox_suspend", json!({"name": "p"}), STEP);
    let r = lab
        .srv()
        .call_ok_within("sandbox_resume", json!({"name": "p"}), STEP);
    lab.killer.track(&r);
    assert_seen(lab.srv(), "p", "VALUE\nP");
    channel_copy(&mut lab, "p");
    refusals(&mut lab);
    // Destroying everything leaves no frozen state behind.
    for n in [
        "p",
        "p-fork-1",
        "p-fork-2",
        "p-fork-3",
        "p-fork-4",
        "grandchild",
    ] {
        let d = lab
            .srv()
            .call_ok_within("sandbox_destroy", json!({"name": n}), STEP);
        assert_eq!(d["destroyed"], json!(true), "{d}");
    }
    assert_eq!(forks_left(&lab), Vec::<String>::new());
}

/// A writer that checks its own work: one awk process (no exec, so no address-space switch
/// between its writes) rewrites the 256 KiB file /w/f in tmpfs with lines "N" round after
/// round, and first reads back the previous round, noting in /w/log any line it did not
/// write and stopping. In a copy whose memory missed some of the parent's writes, the first
/// read-back after the start finds the stale pages.
const WRITER: &str = r#"mkdir -p /w && mount -t tmpfs w /w || exit 1
awk 'BEGIN { f = "/w/f"; for (i = 1; ; i++) {
  if (i > 1) { n = 0; bad = 0
    while ((getline l < f) > 0) { n++; if (l + 0 != i - 1) bad++ }
    close(f)
    if (bad || n != 64) { print "round " i ": " bad " of " n " lines unlike what was written" > "/w/log"; close("/w/log"); exit 1 } }
  for (k = 0; k < 64; k++) printf "%4095d\n", i > f
  close(f) } }' </dev/null >/dev/null 2>&1 &
echo $! > /w/pid; sleep 1; kill -0 $(cat /w/pid)"#;

/// After a second: the writer's log (empty when every read-back matched) and whether it
/// still runs.
const CHECK: &str = "sleep 1; cat /w/log 2>/dev/null; kill -0 $(cat /w/pid) && echo writing; \
    dmesg | grep -E 'Oops|BUG:|general protection' | head -n 3; true";

/// A busy sandbox forked three times over: every copy holds each write its parent made, even
/// those made while the copy was being taken, and its writer runs on. (The lost writes of a
/// live copy under TCG before QEMU 9.0 depend on timing: this test did not meet them in 18
/// forced live copies, so the guard against them is the capture's choice of a stopped copy there, not this.)
#[test]
fn a_busy_sandbox_is_copied_whole() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (mut lab, base) = lab_with_base("busy");
    sandbox(&mut lab, "b", &base);
    sh_trimmed(lab.srv(), "b", WRITER);
    for round in 0..3 {
        let names: Vec<String> = (1..=2).map(|i| format!("b-{round}-{i}")).collect();
        let f =
            lab.srv()
                .call_ok_within("sandbox_fork", json!({"name": "b", "names": names}), STEP);
        eprintln!(
            "busy fork {round}: copied {}, parent paused {} ms",
            f["copied"], f["parent_paused_ms"]
        );
        for c in f["copies"].as_array().unwrap() {
            lab.killer.track(c);
        }
        for n in &names {
            let out = sh_trimmed(lab.srv(), n, CHECK);
            assert_eq!(
                out, "writing",
                "{n} (copied {}) lost writes its parent made",
                f["copied"]
            );
            let d = lab
                .srv()
                .call_ok_within("sandbox_destroy", json!({"name": n}), STEP);
            assert_eq!(d["destroyed"], json!(true), "{d}");
        }
    }
    let out = sh_trimmed(lab.srv(), "b", CHECK);
    assert_eq!(out, "writing", "the parent's own writer");
    let d = lab
        .srv()
        .call_ok_within("sandbox_destroy", json!({"name": "b"}), STEP);
    assert_eq!(d["destroyed"], json!(true), "{d}");
    assert_eq!(forks_left(&lab), Vec::<String>::new());
}

/// count 0 or 17, an unknown VM, a taken name, and a fork past MCQEMU_MAX_VMS: refused
/// before anything starts.
fn refusals(lab: &mut Lab) {
    for count in [0, 17] {
        let e = lab
            .srv()
            .call_err("sandbox_fork", json!({"name": "p", "count": count}));
        assert!(e.contains("count"), "count {count}: {e}");
    }
    let e = lab
        .srv()
        .call_err("sandbox_fork", json!({"name": "nobody"}));
    assert!(e.contains("no VM named \"nobody\""), "{e}");
    let e = lab
        .srv()
        .call_err("sandbox_fork", json!({"name": "p", "names": ["p-fork-2"]}));
    assert!(e.contains("already exists"), "{e}");
    let frozen = forks_left(lab);
    let running = 6;
    let mut s = lab.spawn_server_with(&[("MCQEMU_MAX_VMS", &(running + 1).to_string())]);
    let e = s.call_err("sandbox_fork", json!({"name": "p", "count": 2}));
    assert!(e.contains("MCQEMU_MAX_VMS"), "{e}");
    assert_eq!(
        forks_left(lab),
        frozen,
        "a refused fork left a frozen state"
    );
    let l = s.call_ok("list_vms", json!({}));
    assert_eq!(l["vms"].as_array().unwrap().len(), running, "{l}");
}

#[test]
fn a_suspended_sandbox_survives_a_server_restart_and_resumes_where_it_was() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (mut lab, base) = lab_with_base("susp");
    let sb = sandbox(&mut lab, "s", &base);
    let port = sb["port_forwards"][0]["host"].as_u64().unwrap();
    assert_eq!(http_get(port, "/v"), "VALUE\n");
    let pid = sb["pid"].as_i64().unwrap() as i32;
    let before = counts(lab.srv(), "s").1;
    let r = lab
        .srv()
        .call_ok_within("sandbox_suspend", json!({"name": "s"}), STEP);
    eprintln!(
        "sandbox_suspend of a {MEMORY_MB} MiB sandbox: {} ms, ram {} bytes on disk, state {} \
         bytes",
        r["suspend_ms"], r["ram_bytes"], r["state_bytes"]
    );
    assert_eq!(r["status"], json!("suspended"), "{r}");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "QEMU {pid} still runs after suspend"
    );
    assert!(r["ram_bytes"].as_u64().unwrap() < MEMORY_MB << 20, "{r}");
    assert_eq!(vm_status(lab.srv(), "s").as_deref(), Some("suspended"));
    let e = lab.srv().call_err("sandbox_suspend", json!({"name": "s"}));
    assert!(e.contains("already suspended"), "{e}");
    let e = lab
        .srv()
        .call_err("guest_exec", json!({"name": "s", "command": "true"}));
    assert!(e.contains("suspended"), "{e}");
    // A new server finds it suspended and resumes it, some seconds later.
    std::thread::sleep(Duration::from_secs(5));
    let mut s = lab.spawn_server();
    assert_eq!(vm_status(&mut s, "s").as_deref(), Some("suspended"));
    let r = s.call_ok_within("sandbox_resume", json!({"name": "s"}), STEP);
    lab.killer.track(&r);
    eprintln!("sandbox_resume: {} ms ({})", r["resume_ms"], r["steps_ms"]);
    assert_eq!(r["status"], json!("running"), "{r}");
    assert_eq!(r["port_forwards"][0]["host"].as_u64(), Some(port), "{r}");
    // Its clock is the host's, though it slept through the restart and the wait above: the
    // first guest call (which waits for the clock to be set) reads it.
    let guest_now: u64 = sh_trimmed(&mut s, "s", "date +%s").parse().unwrap_or(0);
    let host_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        guest_now.abs_diff(host_now) <= 2,
        "the resumed guest's clock says {guest_now}, the host's {host_now}"
    );
    assert_seen(&mut s, "s", "VALUE\nD");
    let (a, b) = counts(&mut s, "s");
    assert!(a >= before && b > a, "counter {before} -> {a} -> {b}");
    assert_eq!(http_get(port, "/v"), "VALUE\n");
    let e = s.call_err("sandbox_resume", json!({"name": "s"}));
    assert!(e.contains("not suspended"), "{e}");
    // Suspended again, it is destroyed with its saved state.
    s.call_ok_within("sandbox_suspend", json!({"name": "s"}), STEP);
    let d = s.call_ok_within("sandbox_destroy", json!({"name": "s"}), STEP);
    assert_eq!(d["destroyed"], json!(true), "{d}");
    assert!(!lab.vm_dir("s").exists());
}

#[test]
fn template_delete_is_refused_while_a_fork_of_its_clone_stands_on_its_disk() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (mut lab, _base) = lab_with_base("tfork");
    let g = test_guest();
    let t = lab.srv().call_ok_within(
        "template_create",
        json!({"name": "t", "kernel": g.kernel, "initrd": g.initrd, "append": g.append,
               "memory_mb": MEMORY_MB, "cpus": 1, "wait_agent_s": 180}),
        BOOT,
    );
    assert_eq!(t["name"], json!("t"), "{t}");
    let c = lab.srv().call_tool_within(
        "sandbox_vm",
        json!({"name": "clone", "template": "t", "wait_agent_s": 120}),
        STEP,
    );
    lab.track(&c);
    tool_ok(&c, "sandbox_vm from the template");
    sh_trimmed(lab.srv(), "clone", SETUP);
    let f = lab.srv().call_ok_within(
        "sandbox_fork",
        json!({"name": "clone", "names": ["forked"]}),
        STEP,
    );
    lab.killer.track(&f["copies"][0]);
    assert_seen(lab.srv(), "forked", "VALUE\nD");
    let d = lab
        .srv()
        .call_ok_within("sandbox_destroy", json!({"name": "clone"}), STEP);
    assert_eq!(d["destroyed"], json!(true), "{d}");
    // The fork still runs on the clone's frozen disk, over the template's.
    let (a, b) = counts(lab.srv(), "forked");
    assert!(b > a, "{a} -> {b}");
    let e = lab.srv().call_err("template_delete", json!({"name": "t"}));
    assert!(e.contains("forked"), "{e}");
    // Suspended, it still stands on the template's disk.
    lab.srv()
        .call_ok_within("sandbox_suspend", json!({"name": "forked"}), STEP);
    let e = lab.srv().call_err("template_delete", json!({"name": "t"}));
    assert!(e.contains("forked"), "{e}");
    let d = lab
        .srv()
        .call_ok_within("sandbox_destroy", json!({"name": "forked"}), STEP);
    assert_eq!(d["destroyed"], json!(true), "{d}");
    assert_eq!(forks_left(&lab), Vec::<String>::new());
    let r = lab.srv().call_ok("template_delete", json!({"name": "t"}));
    assert_eq!(r["deleted"], json!(true), "{r}");
}
