//! The guest-agent tools, live snapshots and sandboxes over MCP, against the built binary, the
//! real QEMU (TCG here) and the real test guest (tests/guest/build_guest.py); and the agent
//! client's fault handling against a fake agent socket the test controls.
//!
//! Guests are expensive under TCG on a 2-core CI machine, so each test boots one guest at a
//! time and checks many things in it, at most [`QEMU_SLOTS`] guests run at once in this
//! binary, and every guest is SIGKILLed on the way out, pass or fail ([`VmKiller`]).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::*;
use mcqemu::b64;
use mcqemu::qemu::qga::{Qga, QgaError};
use serde_json::{json, Value};

/// Bound for calls that boot or wait on a guest, or move a VM's whole RAM (snapshots).
const SLOW: Duration = Duration::from_secs(240);
/// How long a launched guest may take until its agent answers.
const AGENT_WAIT: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------------------------------------
// The test guest in a [`Lab`]: one server, one guest slot, and a kill-on-drop guard

/// A lab for these tests. The test guest is built first, never while holding a slot.
fn guest_lab(label: &str) -> Lab {
    test_guest();
    Lab::new(label)
}

/// What these tests do with test guests, through the lab's own server.
trait GuestLab {
    /// The direct-kernel-boot arguments for a small test guest.
    fn boot_args(&self) -> serde_json::Map<String, Value>;
    /// launch_vm of the test guest with `disks`, then waits until its agent answers.
    /// Returns the launch result and how long the agent took to answer.
    fn boot(&mut self, name: &str, disks: &[&Path], memory_mb: u64) -> (Value, Duration);
    /// sandbox_vm of the test guest on `base` with extra arguments; returns its result.
    fn sandbox(&mut self, base: &Path, extra: Value) -> Value;
    /// Polls guest_ping until the agent answers; returns the time since `since`.
    fn wait_agent(&mut self, name: &str, since: Instant) -> Duration;
    /// guest_exec that must succeed as a tool call.
    fn exec(&mut self, name: &str, command: &str, args: &[&str]) -> Value;
    /// `sh -c SCRIPT` in the guest; must exit 0; returns stdout.
    fn sh(&mut self, name: &str, script: &str) -> String;
    /// Fills the first sector of the guest's /dev/vda with `ch` and flushes it to the disk.
    fn fill_vda(&mut self, name: &str, ch: char);
    /// The first sector of the guest's /dev/vda, read from the device (page cache dropped).
    fn read_vda(&mut self, name: &str) -> Vec<u8>;
    fn write_text(&mut self, name: &str, path: &str, text: &str);
    fn read_text(&mut self, name: &str, path: &str) -> String;
    /// The status list_vms measures for `name` (None when it has no record).
    fn listed_status(&mut self, name: &str) -> Option<String>;
    fn stop(&mut self, name: &str);
}

impl GuestLab for Lab {
    fn boot_args(&self) -> serde_json::Map<String, Value> {
        let guest = test_guest();
        let mut m = serde_json::Map::new();
        m.insert("kernel".into(), json!(guest.kernel));
        m.insert("initrd".into(), json!(guest.initrd));
        m.insert("append".into(), json!(guest.append));
        m.insert("memory_mb".into(), json!(128));
        m.insert("cpus".into(), json!(1));
        m
    }

    fn boot(&mut self, name: &str, disks: &[&Path], memory_mb: u64) -> (Value, Duration) {
        let mut args = self.boot_args();
        args.insert("memory_mb".into(), json!(memory_mb));
        args.insert("name".into(), json!(name));
        args.insert(
            "disks".into(),
            json!(disks
                .iter()
                .map(|d| d.to_str().unwrap())
                .collect::<Vec<_>>()),
        );
        let t = Instant::now();
        let launched = self.launch(Value::Object(args), SLOW);
        let ready = self.wait_agent(name, t);
        (launched, ready)
    }

    fn sandbox(&mut self, base: &Path, extra: Value) -> Value {
        let mut args = self.boot_args();
        args.insert("base_image".into(), json!(base.to_str().unwrap()));
        args.insert("wait_agent_s".into(), json!(AGENT_WAIT.as_secs()));
        for (k, v) in extra.as_object().unwrap() {
            args.insert(k.clone(), v.clone());
        }
        let r = self
            .srv()
            .call_tool_within("sandbox_vm", Value::Object(args), SLOW);
        self.track(&r);
        let sb = tool_ok(&r, "sandbox_vm");
        assert_eq!(sb["agent_ready"], json!(true), "agent not ready: {sb}");
        sb
    }

    fn wait_agent(&mut self, name: &str, since: Instant) -> Duration {
        let deadline = Instant::now() + AGENT_WAIT;
        loop {
            let r = self.srv().call_tool("guest_ping", json!({"name": name}));
            if r["isError"] == json!(false) {
                return since.elapsed();
            }
            assert!(
                Instant::now() < deadline,
                "the agent of {name} did not answer within {AGENT_WAIT:?}: {}",
                r["content"]
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn exec(&mut self, name: &str, command: &str, args: &[&str]) -> Value {
        self.srv().call_ok_within(
            "guest_exec",
            json!({"name": name, "command": command, "args": args, "timeout": 60}),
            SLOW,
        )
    }

    fn sh(&mut self, name: &str, script: &str) -> String {
        let r = self.exec(name, "sh", &["-c", script]);
        assert_eq!(r["exitcode"], json!(0), "sh -c {script:?} failed: {r}");
        r["stdout"].as_str().unwrap().to_string()
    }

    fn fill_vda(&mut self, name: &str, ch: char) {
        self.sh(
            name,
            &format!("head -c 512 /dev/zero | tr '\\000' '{ch}' | dd of=/dev/vda bs=512 count=1 conv=fsync 2>/dev/null"),
        );
    }

    fn read_vda(&mut self, name: &str) -> Vec<u8> {
        self.sh(name, "echo 3 > /proc/sys/vm/drop_caches");
        let r = self.srv().call_ok(
            "guest_file_read",
            json!({"name": name, "path": "/dev/vda", "max_bytes": 512, "encoding": "base64"}),
        );
        assert_eq!(r["size"], json!(512), "{r}");
        b64::decode(r["content"].as_str().unwrap()).unwrap()
    }

    fn write_text(&mut self, name: &str, path: &str, text: &str) {
        let r = self.srv().call_ok(
            "guest_file_write",
            json!({"name": name, "path": path, "content": text}),
        );
        assert_eq!(r["bytes_written"], json!(text.len()), "{r}");
    }

    fn read_text(&mut self, name: &str, path: &str) -> String {
        let r = self
            .srv()
            .call_ok("guest_file_read", json!({"name": name, "path": path}));
        assert_eq!(r["truncated"], json!(false), "{r}");
        r["content"].as_str().unwrap().to_string()
    }

    fn listed_status(&mut self, name: &str) -> Option<String> {
        let l = self.srv().call_ok("list_vms", json!({}));
        l["vms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .map(|v| v["status"].as_str().unwrap_or("").to_string())
    }

    fn stop(&mut self, name: &str) {
        let r = self.srv().call_ok_within(
            "stop_vm",
            json!({"name": name, "force": true}),
            Duration::from_secs(60),
        );
        assert_eq!(r["status"], json!("stopped"), "{r}");
    }
}

/// A fresh qcow2 image of `size` made with qemu-img directly.
fn qcow2(path: &Path, size: &str) {
    let (ok, out, err) = run_tool(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", path.to_str().unwrap(), size],
    );
    assert!(ok, "qemu-img create failed: {out}{err}");
}

fn have(program: &str) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok()
}

// ---------------------------------------------------------------------------------------------
// Agent tools against one guest

#[test]
fn guest_agent_exec_and_files() {
    let mut e = guest_lab("exec");
    let vm = "ga";
    // 256 MiB, not 128: the agent holds a 16 MiB capture and its base64 copy in memory for
    // the 20 MB output check, and a 128 MiB guest (78 MiB usable) OOM-kills it.
    let (_, ready) = e.boot(vm, &[], 256);
    eprintln!("guest_agent_exec_and_files: agent ready {ready:?} after launch_vm began");

    // guest_ping
    let p = e.srv().call_ok("guest_ping", json!({"name": vm}));
    assert_eq!(p["ok"], json!(true));
    eprintln!("guest_ping latency {} ms", p["latency_ms"]);

    // guest_info
    let info = e.srv().call_ok("guest_info", json!({"name": vm}));
    assert!(
        !info["version"].as_str().unwrap().is_empty(),
        "no version: {info}"
    );
    let enabled: Vec<&str> = info["enabled_commands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert!(enabled.contains(&"guest-exec"), "{enabled:?}");
    assert!(enabled.contains(&"guest-file-read"), "{enabled:?}");
    // The agent the guest was built with answers (MCQEMU_TEST_AGENT: qemu-ga or ours).
    let ours = info["version"]
        .as_str()
        .is_some_and(|v| v.starts_with("mcqemu-agent"));
    assert_eq!(
        ours,
        agent_variant().unwrap().is_some(),
        "the wrong agent answered: {info}"
    );

    // A plain program with arguments.
    let t = Instant::now();
    let r = e.exec(vm, "uname", &["-a"]);
    eprintln!("guest_exec uname -a round trip {:?}", t.elapsed());
    assert_eq!(r["exitcode"], json!(0), "{r}");
    assert!(r["stdout"].as_str().unwrap().contains("Linux"), "{r}");
    assert_eq!(r["stdout_truncated"], json!(false));
    assert!(r["pid"].as_i64().unwrap() > 0);

    // stdin is fed to the program.
    let input = "fed through stdin\nsecond line ✓\n";
    let r = e.srv().call_ok(
        "guest_exec",
        json!({"name": vm, "command": "cat", "stdin": input}),
    );
    assert_eq!(r["exitcode"], json!(0), "{r}");
    assert_eq!(r["stdout"], json!(input));

    // A non-zero exit, and stderr kept apart from stdout.
    let r = e.exec(vm, "sh", &["-c", "echo out; echo err >&2; exit 3"]);
    assert_eq!(r["exitcode"], json!(3), "{r}");
    assert_eq!(r["stdout"], json!("out\n"));
    assert_eq!(r["stderr"], json!("err\n"));

    // Death by a signal.
    let r = e.exec(vm, "sh", &["-c", "kill -9 $$"]);
    assert_eq!(r["signal"], json!(9), "{r}");

    // A program that outlives its timeout: an error naming its guest PID, on time.
    let t = Instant::now();
    let msg = e.srv().call_err(
        "guest_exec",
        json!({"name": vm, "command": "sleep", "args": ["30"], "timeout": 2}),
    );
    let took = t.elapsed();
    eprintln!("guest_exec sleep 30 with timeout 2 answered after {took:?}");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(5),
        "{took:?}"
    );
    let pid: i64 = msg
        .split("pid ")
        .nth(1)
        .and_then(|s| {
            s.split(|c: char| !c.is_ascii_digit())
                .next()
                .map(str::to_string)
        })
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no guest pid in {msg:?}"));
    assert!(msg.contains("still running"), "{msg}");
    // The PID is real: it can be killed.
    let r = e.exec(vm, "kill", &[&pid.to_string()]);
    assert_eq!(r["exitcode"], json!(0), "kill {pid}: {r}");

    // 20 MB of output: the agent caps what it captures, and says so.
    let t = Instant::now();
    let r = e.srv().call_ok_within(
        "guest_exec",
        json!({"name": vm, "command": "sh", "args": ["-c", "yes aaaaaaaaaaaaaaa | head -c 20000000"], "timeout": 180}),
        SLOW,
    );
    eprintln!(
        "guest_exec of 20 MB output took {:?} ({} bytes of stdout returned)",
        t.elapsed(),
        r["stdout"].as_str().unwrap().len()
    );
    assert_eq!(
        r["stdout_truncated"],
        json!(true),
        "exitcode {}",
        r["exitcode"]
    );
    assert!(r["stdout"].as_str().unwrap().starts_with("aaaa"));

    // Text round trip.
    let text = "hello from the host\nline two ✓\n";
    e.write_text(vm, "/tmp/hello.txt", text);
    assert_eq!(e.read_text(vm, "/tmp/hello.txt"), text);
    let r = e.srv().call_ok(
        "guest_file_write",
        json!({"name": vm, "path": "/tmp/hello.txt", "content": "appended\n", "append": true}),
    );
    assert_eq!(r["bytes_written"], json!(9));
    assert_eq!(
        e.read_text(vm, "/tmp/hello.txt"),
        format!("{text}appended\n")
    );

    // A 3 MiB binary file, byte-exact both ways.
    let data = pseudo_random(3 << 20, 0x5eed_1234);
    let t = Instant::now();
    let w = e.srv().call_ok_within(
        "guest_file_write",
        json!({"name": vm, "path": "/tmp/blob.bin", "content": b64::encode(&data), "encoding": "base64"}),
        SLOW,
    );
    let write_took = t.elapsed();
    assert_eq!(w["bytes_written"], json!(data.len()));
    let sum = e.sh(vm, "sha256sum /tmp/blob.bin");
    assert!(sum.starts_with(&sha256_hex(&data)), "{sum}");
    let t = Instant::now();
    let r = e.srv().call_ok_within(
        "guest_file_read",
        json!({"name": vm, "path": "/tmp/blob.bin", "max_bytes": 4 << 20, "encoding": "base64"}),
        SLOW,
    );
    eprintln!("3 MiB file: write {write_took:?}, read {:?}", t.elapsed());
    assert_eq!(r["size"], json!(data.len()));
    assert_eq!(r["truncated"], json!(false));
    assert!(b64::decode(r["content"].as_str().unwrap()).unwrap() == data);
    // Exactly max_bytes is not truncation.
    let r = e.srv().call_ok_within(
        "guest_file_read",
        json!({"name": vm, "path": "/tmp/blob.bin", "max_bytes": data.len(), "encoding": "base64"}),
        SLOW,
    );
    assert_eq!(r["truncated"], json!(false));
    assert_eq!(r["size"], json!(data.len()));

    // max_bytes cuts the read short, and says so.
    let r = e.srv().call_ok(
        "guest_file_read",
        json!({"name": vm, "path": "/tmp/blob.bin", "max_bytes": 1000, "encoding": "base64"}),
    );
    assert_eq!(r["truncated"], json!(true));
    assert_eq!(r["size"], json!(1000));
    assert!(b64::decode(r["content"].as_str().unwrap()).unwrap() == data[..1000]);

    // An empty file reads as empty, within the declared schema (the harness checks every
    // result against it: a null file_size broke the official TypeScript client).
    e.sh(vm, ": > /tmp/empty");
    let r = e
        .srv()
        .call_ok("guest_file_read", json!({"name": vm, "path": "/tmp/empty"}));
    assert_eq!(r["content"], json!(""), "{r}");
    assert_eq!((&r["size"], &r["truncated"]), (&json!(0), &json!(false)));
    assert!(r.get("file_size").is_none_or(|s| s == 0), "{r}");

    // Binary content read as UTF-8 is refused with a hint.
    let msg = e.srv().call_err(
        "guest_file_read",
        json!({"name": vm, "path": "/tmp/blob.bin", "max_bytes": 1000}),
    );
    assert!(msg.contains("base64"), "{msg}");

    // A missing file and a directory are clear errors.
    let msg = e.srv().call_err(
        "guest_file_read",
        json!({"name": vm, "path": "/tmp/no-such-file"}),
    );
    assert!(
        msg.contains("/tmp/no-such-file") && msg.contains("No such file"),
        "{msg}"
    );
    let msg = e
        .srv()
        .call_err("guest_file_read", json!({"name": vm, "path": "/tmp"}));
    assert!(msg.to_lowercase().contains("directory"), "{msg}");

    // The agent does not answer in a paused VM, and the error says why.
    let p = e.srv().call_ok("pause_vm", json!({"name": vm}));
    assert_eq!(p["status"], json!("paused"));
    let t = Instant::now();
    let msg = e.srv().call_err("guest_ping", json!({"name": vm}));
    eprintln!("guest_ping of a paused VM failed after {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(msg.contains("paused"), "{msg}");
    let p = e.srv().call_ok("resume_vm", json!({"name": vm}));
    assert_eq!(p["status"], json!("running"));
    let r = e.exec(vm, "echo", &["back"]);
    assert_eq!(r["stdout"], json!("back\n"));

    // stop_vm's graceful path: the ACPI power button powers the guest off (acpid with qemu-ga;
    // mcqemu-agent watches the button itself, as PID 1 too), no force needed.
    let r = e.srv().call_ok_within(
        "stop_vm",
        json!({"name": vm, "timeout": 60}),
        Duration::from_secs(90),
    );
    eprintln!("graceful stop: {r}");
    assert_eq!(
        (r["status"].clone(), r["method"].clone()),
        (json!("stopped"), json!("acpi")),
        "{r}"
    );
}

// ---------------------------------------------------------------------------------------------
// Live snapshots

#[test]
fn live_snapshot_round_trip() {
    let mut e = guest_lab("snap");
    let vm = "snap";
    let disk = e.srv().tmp.join("disk.qcow2");
    qcow2(&disk, "16M");
    let (_, ready) = e.boot(vm, &[&disk], 128);
    eprintln!("live_snapshot_round_trip: agent ready after {ready:?}");

    // The state to keep: a tmpfs file and the first sector of the virtio disk.
    e.write_text(vm, "/tmp/state.txt", "before the snapshot\n");
    e.fill_vda(vm, 'B');
    assert_eq!(e.read_vda(vm), vec![b'B'; 512]);

    let t = Instant::now();
    let c = e
        .srv()
        .call_ok_within("vm_snapshot_create", json!({"name": vm, "tag": "s1"}), SLOW);
    eprintln!("vm_snapshot_create took {:?}", t.elapsed());
    assert_eq!(c["action"], json!("created"));
    assert_eq!(c["status"], json!("running"));
    let l = e.srv().call_ok("vm_snapshot_list", json!({"name": vm}));
    let snaps = l["snapshots"].as_array().unwrap();
    assert_eq!(snaps.len(), 1, "{l}");
    assert_eq!(snaps[0]["tag"], json!("s1"));
    assert!(snaps[0]["vm_state_size"].as_u64().unwrap() > 0, "{l}");
    let msg = e
        .srv()
        .call_err("vm_snapshot_create", json!({"name": vm, "tag": "s1"}));
    assert!(msg.contains("already exists"), "{msg}");

    // Change both.
    e.write_text(vm, "/tmp/state.txt", "after the snapshot\n");
    e.fill_vda(vm, 'C');
    assert_eq!(e.read_text(vm, "/tmp/state.txt"), "after the snapshot\n");
    assert_eq!(e.read_vda(vm), vec![b'C'; 512]);

    // Roll back: both come back.
    let t = Instant::now();
    let r = e.srv().call_ok_within(
        "vm_snapshot_restore",
        json!({"name": vm, "tag": "s1"}),
        SLOW,
    );
    eprintln!("vm_snapshot_restore took {:?}", t.elapsed());
    assert_eq!(r["action"], json!("restored"));
    assert_eq!(r["status"], json!("running"));
    let t = Instant::now();
    e.wait_agent(vm, t);
    eprintln!("agent answered {:?} after the restore", t.elapsed());
    assert_eq!(e.read_text(vm, "/tmp/state.txt"), "before the snapshot\n");
    assert_eq!(e.read_vda(vm), vec![b'B'; 512]);

    // A missing tag is an error, and the VM keeps running.
    let msg = e.srv().call_err_within(
        "vm_snapshot_restore",
        json!({"name": vm, "tag": "nope"}),
        SLOW,
    );
    assert!(msg.contains("nope"), "{msg}");
    let info = e.srv().call_ok("vm_info", json!({"name": vm}));
    assert_eq!(info["status"], json!("running"), "{info}");
    assert_eq!(e.listed_status(vm).as_deref(), Some("running"));
    let p = e.srv().call_ok("guest_ping", json!({"name": vm}));
    assert_eq!(p["ok"], json!(true));

    // Delete: the list is empty again.
    let d = e
        .srv()
        .call_ok_within("vm_snapshot_delete", json!({"name": vm, "tag": "s1"}), SLOW);
    assert_eq!(d["action"], json!("deleted"));
    let l = e.srv().call_ok("vm_snapshot_list", json!({"name": vm}));
    assert_eq!(l["snapshots"], json!([]), "{l}");
    let msg = e
        .srv()
        .call_err("vm_snapshot_delete", json!({"name": vm, "tag": "s1"}));
    assert!(msg.contains("s1"), "{msg}");

    e.stop(vm);
}

// ---------------------------------------------------------------------------------------------
// Sandboxes

#[test]
fn sandbox_journey() {
    let mut e = guest_lab("sbx");
    let vm = "sbx";
    let base = e.srv().tmp.join("base.qcow2");
    qcow2(&base, "32M");
    let patterned = have("qemu-io");
    if patterned {
        let (ok, out, err) = run_tool(
            "qemu-io",
            &[
                "-f",
                "qcow2",
                "-c",
                "write -P 0x5a 0 1M",
                base.to_str().unwrap(),
            ],
        );
        assert!(ok, "qemu-io failed: {out}{err}");
    }
    let base_sum = sha256_hex(&std::fs::read(&base).unwrap());

    let sb = e.sandbox(
        &base,
        json!({"name": vm, "port_forwards": [], "wait_agent_s": AGENT_WAIT.as_secs()}),
    );
    eprintln!("sandbox_journey: agent_wait_ms {}", sb["agent_wait_ms"]);
    let overlay = PathBuf::from(sb["overlay"].as_str().unwrap());
    assert!(overlay.is_file(), "{sb}");
    assert_ne!(overlay, base);
    let folder = overlay.parent().unwrap().to_path_buf();
    assert_eq!(folder.file_name().unwrap(), vm);
    assert_eq!(
        std::fs::canonicalize(sb["base_image"].as_str().unwrap()).unwrap(),
        std::fs::canonicalize(&base).unwrap()
    );

    // The guest runs programs and sees the base image's data through the overlay.
    let r = e.exec(vm, "uname", &["-s"]);
    assert_eq!(r["stdout"], json!("Linux\n"), "{r}");
    if patterned {
        assert_eq!(e.read_vda(vm), vec![0x5a; 512]);
    }

    // A file round trip.
    e.write_text(vm, "/tmp/sb.txt", "sandboxed\n");
    assert_eq!(e.read_text(vm, "/tmp/sb.txt"), "sandboxed\n");

    // Snapshot, change, restore.
    let c = e.srv().call_ok_within(
        "vm_snapshot_create",
        json!({"name": vm, "tag": "clean"}),
        SLOW,
    );
    assert_eq!(c["action"], json!("created"));
    e.write_text(vm, "/tmp/sb.txt", "changed\n");
    e.fill_vda(vm, 'X');
    assert_eq!(e.read_vda(vm), vec![b'X'; 512]);
    let r = e.srv().call_ok_within(
        "vm_snapshot_restore",
        json!({"name": vm, "tag": "clean"}),
        SLOW,
    );
    assert_eq!(r["action"], json!("restored"));
    let t = Instant::now();
    e.wait_agent(vm, t);
    assert_eq!(e.read_text(vm, "/tmp/sb.txt"), "sandboxed\n");
    if patterned {
        assert_eq!(e.read_vda(vm), vec![0x5a; 512]);
    }
    // Write to the disk for real before destroying: the base must not see it.
    e.fill_vda(vm, 'Y');

    // Destroy: stopped, files gone, record gone.
    let d = e
        .srv()
        .call_ok_within("sandbox_destroy", json!({"name": vm}), SLOW);
    assert_eq!(d["destroyed"], json!(true), "{d}");
    assert_eq!(d["errors"], json!([]), "{d}");
    assert!(!overlay.exists(), "overlay left behind: {d}");
    assert!(!folder.exists(), "sandbox folder left behind: {d}");
    assert_eq!(e.listed_status(vm), None, "the record is still there");
    let msg = e.srv().call_err("vm_info", json!({"name": vm}));
    assert!(msg.contains("no VM named"), "{msg}");
    if let Some(pid) = sb["pid"].as_i64() {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .map(|s| s.contains(") Z"))
                    .unwrap_or(true),
            "QEMU {pid} still alive"
        );
    }

    // The base image is byte-for-byte what it was.
    assert_eq!(sha256_hex(&std::fs::read(&base).unwrap()), base_sum);
    let info = qemu_img_info(&base);
    assert!(info.get("snapshots").is_none(), "{info}");
    if patterned {
        let (ok, out, _) = run_tool(
            "qemu-io",
            &[
                "-f",
                "qcow2",
                "-c",
                "read -P 0x5a 0 1M",
                base.to_str().unwrap(),
            ],
        );
        assert!(ok && !out.contains("fail"), "{out}");
    }
}

/// The HTTP body served to guests on the host's loopback.
const NET_BODY: &str = "mcqemu-net-ok";

#[test]
fn sandbox_network_isolation_and_forwards() {
    let mut e = guest_lab("net");
    let http = HttpServer::start(vec![("/", Route::body(NET_BODY.as_bytes().to_vec()))]);
    let port: u16 = http
        .url("/")
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let url = format!("http://10.0.2.2:{port}/");
    let base = e.srv().tmp.join("base.qcow2");
    qcow2(&base, "8M");
    let wget = format!("timeout 5 wget -q -O - {url}");

    // A default sandbox cannot reach the host, but a port forward reaches into it.
    let sb = e.sandbox(
        &base,
        json!({"name": "closed", "port_forwards": ["auto:8080"]}),
    );
    let r = e.exec("closed", "sh", &["-c", &wget]);
    assert!(
        r["exitcode"] != json!(0) || !r["signal"].is_null(),
        "restricted guest reached the host: {r}"
    );
    assert!(!r["stdout"].as_str().unwrap().contains(NET_BODY), "{r}");
    assert!(http.hits().is_empty(), "the host saw {:?}", http.hits());

    let fw = &sb["port_forwards"][0];
    assert_eq!(fw["guest"], json!(8080), "{sb}");
    let host_port = fw["host"].as_u64().unwrap() as u16;
    e.sh(
        "closed",
        "(echo hello | nc -l -p 8080) </dev/null >/dev/null 2>&1 &",
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let got = loop {
        let mut got = String::new();
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", host_port)) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = s.read_to_string(&mut got);
        }
        if got.contains("hello") || Instant::now() >= deadline {
            break got;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(got, "hello\n");
    let d = e
        .srv()
        .call_ok_within("sandbox_destroy", json!({"name": "closed"}), SLOW);
    assert_eq!(d["destroyed"], json!(true), "{d}");

    // allow_network=true: the same request gets through.
    e.sandbox(
        &base,
        json!({"name": "open", "port_forwards": [], "allow_network": true}),
    );
    let r = e.exec("open", "sh", &["-c", &wget]);
    assert_eq!(r["exitcode"], json!(0), "{r}");
    assert_eq!(r["stdout"], json!(NET_BODY));
    assert_eq!(http.hits(), vec!["/".to_string()]);
    let d = e
        .srv()
        .call_ok_within("sandbox_destroy", json!({"name": "open"}), SLOW);
    assert_eq!(d["destroyed"], json!(true), "{d}");
}

// ---------------------------------------------------------------------------------------------
// Agent faults against a fake agent socket (the library client, no QEMU)

/// A fake agent: a listener whose one accepted connection is handed to `behave`.
struct FakeAgent {
    path: PathBuf,
    _dir: TempDir,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeAgent {
    fn start(behave: impl FnOnce(UnixStream) + Send + 'static) -> FakeAgent {
        let dir = short_runtime_dir("fake");
        let path = dir.join("qga.sock");
        let listener = UnixListener::bind(&path).expect("bind fake agent");
        let thread = std::thread::spawn(move || {
            if let Ok((conn, _)) = listener.accept() {
                behave(conn);
            }
        });
        FakeAgent {
            path,
            _dir: dir,
            thread: Some(thread),
        }
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads one request line (0xFF bytes dropped) from the client; None at EOF or after 10 s.
fn read_request(conn: &mut UnixStream) -> Option<Value> {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    loop {
        match conn.read(&mut b) {
            Ok(1) if b[0] == b'\n' => break,
            Ok(1) if b[0] == 0xFF => {}
            Ok(1) => line.push(b[0]),
            _ => return None,
        }
    }
    serde_json::from_slice(&line).ok()
}

/// Reads the sync request and returns its id.
fn sync_id(conn: &mut UnixStream) -> u64 {
    let req = read_request(conn).expect("a sync request");
    assert_eq!(req["execute"], json!("guest-sync-delimited"), "{req}");
    req["arguments"]["id"].as_u64().expect("sync id")
}

/// Keeps reading (and dropping) what the client sends until it hangs up or `hold` passes.
fn drain(conn: &mut UnixStream, hold: Duration) {
    let until = Instant::now() + hold;
    let _ = conn.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = [0u8; 4096];
    while Instant::now() < until {
        match conn.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

#[test]
fn fake_agent_silence_is_no_agent_within_the_bound() {
    let fake = FakeAgent::start(|mut c| drain(&mut c, Duration::from_secs(5)));
    let t = Instant::now();
    let r = Qga::connect(&fake.path, Duration::from_secs(1));
    let took = t.elapsed();
    assert!(matches!(r, Err(QgaError::NoAgent)), "{:?}", r.err());
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(2),
        "{took:?}"
    );
}

#[test]
fn fake_agent_stale_sync_reply_is_discarded() {
    let fake = FakeAgent::start(|mut c| {
        let id = sync_id(&mut c);
        // A reply to an earlier session's sync, an earlier command's late reply, then ours
        // (the real agent puts 0xFF before a guest-sync-delimited reply).
        let stale = json!({"return": id ^ 0x5555}).to_string();
        let late = json!({"return": {"stale": true}}).to_string();
        let right = json!({"return": id}).to_string();
        c.write_all(&[0xFF]).unwrap();
        c.write_all(format!("{stale}\n{late}\n").as_bytes())
            .unwrap();
        c.write_all(&[0xFF]).unwrap();
        c.write_all(format!("{right}\n").as_bytes()).unwrap();
        let req = read_request(&mut c).expect("a command");
        assert_eq!(req["execute"], json!("guest-ping"));
        c.write_all(b"{\"return\": {\"fresh\": true}}\n").unwrap();
        drain(&mut c, Duration::from_secs(2));
    });
    let mut q = Qga::connect(&fake.path, Duration::from_secs(2)).expect("sync succeeds");
    let r = q
        .execute_within("guest-ping", None, Duration::from_secs(2))
        .expect("ping");
    assert_eq!(r, json!({"fresh": true}));
}

#[test]
fn fake_agent_zero_byte_reads_and_immediate_close_are_bounded() {
    // The peer shuts down its side but keeps the connection: every read returns 0 bytes.
    let fake = FakeAgent::start(|mut c| {
        let _ = c.shutdown(std::net::Shutdown::Write);
        drain(&mut c, Duration::from_secs(3));
    });
    let t = Instant::now();
    let r = Qga::connect(&fake.path, Duration::from_secs(2));
    assert!(
        matches!(r, Err(QgaError::Closed) | Err(QgaError::NoAgent)),
        "{:?}",
        r.err()
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    drop(fake);

    // The peer accepts and closes at once.
    let fake = FakeAgent::start(drop);
    let t = Instant::now();
    let r = Qga::connect(&fake.path, Duration::from_secs(2));
    assert!(
        matches!(r, Err(QgaError::Closed) | Err(QgaError::NoAgent)),
        "{:?}",
        r.err()
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    drop(fake);

    // The same through from_stream on a socket pair whose other end is gone.
    let (a, b) = UnixStream::pair().unwrap();
    drop(b);
    let t = Instant::now();
    let r = Qga::from_stream(a, Duration::from_secs(2));
    assert!(
        matches!(r, Err(QgaError::Closed) | Err(QgaError::NoAgent)),
        "{:?}",
        r.err()
    );
    assert!(t.elapsed() < Duration::from_secs(3));
}

#[test]
fn fake_agent_disconnect_mid_reply_is_a_bounded_error() {
    // Half a reply, then the connection closes.
    let fake = FakeAgent::start(|mut c| {
        let id = sync_id(&mut c);
        c.write_all(&[0xFF]).unwrap();
        c.write_all(format!("{{\"return\": {id}}}\n").as_bytes())
            .unwrap();
        let _ = read_request(&mut c);
        c.write_all(b"{\"return\": {\"partial").unwrap();
    });
    let mut q = Qga::connect(&fake.path, Duration::from_secs(2)).expect("sync");
    let t = Instant::now();
    let r = q.execute_within("guest-info", None, Duration::from_secs(5));
    assert!(matches!(r, Err(QgaError::Closed)), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    drop(fake);

    // Half a reply, then silence with the connection open: the command's bound holds.
    let fake = FakeAgent::start(|mut c| {
        let id = sync_id(&mut c);
        c.write_all(format!("{{\"return\": {id}}}\n").as_bytes())
            .unwrap();
        let _ = read_request(&mut c);
        c.write_all(b"{\"return\": {\"partial").unwrap();
        drain(&mut c, Duration::from_secs(5));
    });
    let mut q = Qga::from_stream(
        UnixStream::connect(&fake.path).unwrap(),
        Duration::from_secs(2),
    )
    .expect("sync");
    let t = Instant::now();
    let r = q.execute_within("guest-info", None, Duration::from_secs(1));
    let took = t.elapsed();
    assert!(matches!(r, Err(QgaError::Timeout(_))), "{r:?}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "{took:?}"
    );
    drop(q);
}
