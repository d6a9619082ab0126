//! guest_copy_in and guest_copy_out over mcqemu's data channel when things go wrong part-way,
//! against the built binary, the real QEMU (TCG) and the test guest (256 MiB, busybox): the
//! guest's reader or writer killed, the call cancelled, the VM killed. Each ends in a clear
//! error (or, cancelled, no answer), nothing partial on either side, and the next copy works.
//! And a tree larger than the guest's free /tmp copies out whole (nothing is packed in the
//! guest first).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{json, Value};

const SLOW: Duration = Duration::from_secs(300);
const MIB: usize = 1 << 20;

#[test]
fn copies_cut_short_leave_nothing_behind() {
    test_guest();
    let mut e = Lab::new("copy-faults");
    let vm = "cf";
    let launched = e.boot_test_guest(vm, 256);
    let pid = launched["pid"].as_i64().expect("launch_vm's pid");

    larger_than_free_tmp(&mut e, vm);

    let big = e.dir.join("big");
    std::fs::write(&big, pseudo_random(64 * MIB, 11)).unwrap();
    let r = e.srv().call_ok_within(
        "guest_copy_in",
        json!({"name": vm, "host_path": big, "guest_path": "/tmp/big"}),
        SLOW,
    );
    assert_eq!(r["via"], json!("channel"), "{r}");

    guest_writer_killed(&mut e, vm);
    guest_reader_killed(&mut e, vm, &big);
    cancelled_in(&mut e, vm, &big);
    cancelled_out(&mut e, vm);
    vm_killed(&mut e, vm, pid);
}

/// A 72 MiB tree in a guest whose /tmp (a tmpfs) has 29 MiB free: out whole, every byte.
fn larger_than_free_tmp(e: &mut Lab, vm: &str) {
    let src = e.dir.subdir("large");
    for i in 0..3 {
        std::fs::write(
            src.join(format!("part{i}.bin")),
            pseudo_random(24 * MIB, i + 1),
        )
        .unwrap();
    }
    std::fs::create_dir_all(src.join("small")).unwrap();
    for i in 0..20 {
        std::fs::write(
            src.join(format!("small/f{i}")),
            pseudo_random(1000 + i, 50 + i as u64),
        )
        .unwrap();
    }
    let r = e.srv().call_ok_within(
        "guest_copy_in",
        json!({"name": vm, "host_path": src, "guest_path": "/tmp/large"}),
        SLOW,
    );
    assert_eq!(r["via"], json!("channel"), "{r}");
    let free_k = |e: &mut Lab| -> u64 {
        let out = e.guest_sh(vm, "df -k /tmp | tail -n 1");
        let cols: Vec<&str> = out.split_whitespace().collect();
        cols.get(3).and_then(|c| c.parse().ok()).unwrap_or_else(|| {
            panic!("df -k /tmp printed {out:?}");
        })
    };
    let free = free_k(e);
    if free > 29 * 1024 {
        e.guest_sh(
            vm,
            &format!(
                "dd if=/dev/zero of=/tmp/filler bs=1024 count={} 2>/dev/null",
                free - 29 * 1024
            ),
        );
    }
    let free = free_k(e);
    assert!(free <= 29 * 1024 + 64, "/tmp has {free} KiB free");
    let back = e.dir.join("large.out");
    let r = e.srv().call_ok_within(
        "guest_copy_out",
        json!({"name": vm, "guest_path": "/tmp/large", "host_path": back}),
        SLOW,
    );
    assert_eq!(r["via"], json!("channel"), "{r}");
    assert_eq!(r["files"], json!(23), "{r}");
    assert_same_tree(&src, &back);
    e.guest_sh(vm, "rm -rf /tmp/large /tmp/filler");
}

/// Every file under `a` is in `b` with the same bytes, and `b` holds nothing else.
fn assert_same_tree(a: &Path, b: &Path) {
    let list = |root: &Path| -> Vec<String> {
        let mut v = Vec::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(d) = stack.pop() {
            for ent in std::fs::read_dir(&d).unwrap() {
                let p = ent.unwrap().path();
                if p.is_dir() {
                    stack.push(p.clone());
                }
                v.push(p.strip_prefix(root).unwrap().display().to_string());
            }
        }
        v.sort();
        v
    };
    let (la, lb) = (list(a), list(b));
    assert_eq!(la, lb, "the trees hold different names");
    for rel in la {
        let (pa, pb) = (a.join(&rel), b.join(&rel));
        if pa.is_file() {
            assert!(
                std::fs::read(&pa).unwrap() == std::fs::read(&pb).unwrap(),
                "{rel} differs"
            );
        }
    }
}

/// Starts, in the background, a guest loop that kills the first `program` (its process name)
/// that reads or writes a virtio port (the copy's, not a probe), within a bound; `/tmp/killed`
/// says it did. Only sh builtins in the loop (busybox here has no pkill).
fn kill_when_seen(e: &mut Lab, vm: &str, program: &str) {
    e.guest_sh(vm, "rm -f /tmp/killed");
    let script = format!(
        r#"i=0; while [ $i -lt 20000 ]; do for c in /proc/[0-9]*/comm; do
  read -r n < "$c" 2>/dev/null || continue; [ "$n" = {program} ] || continue
  p=${{c%/comm}}; case "$(readlink $p/fd/0) $(readlink $p/fd/1)" in *vport*) ;; *) continue;; esac
  kill -9 "${{p#/proc/}}" && {{ touch /tmp/killed; exit 0; }}
done; i=$((i+1)); done; exit 1"#
    );
    let r = e.srv().call_ok_within(
        "guest_exec",
        json!({"name": vm, "command": "sh", "args": ["-c", script], "background": true}),
        SLOW,
    );
    assert!(r["pid"].as_i64().is_some(), "{r}");
}

/// Names in the guest folder `dir` that a copy's temporary would have (none may be left).
fn guest_leftovers(e: &mut Lab, vm: &str, dir: &str) -> String {
    e.guest_sh(vm, &format!("ls -a {dir} | grep mcq-copy || true"))
}

/// The names in a host folder.
fn host_names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The guest's tar killed while it sends: an error, nothing on the host, the next copy works.
fn guest_writer_killed(e: &mut Lab, vm: &str) {
    let out = e.dir.subdir("writer-killed");
    kill_when_seen(e, vm, "tar");
    let dest = out.join("big");
    let t = Instant::now();
    let msg = e.srv().call_err_within(
        "guest_copy_out",
        json!({"name": vm, "guest_path": "/tmp/big", "host_path": dest}),
        SLOW,
    );
    eprintln!("writer killed: {:?}: {msg}", t.elapsed());
    assert_eq!(e.guest_sh(vm, "ls /tmp/killed"), "/tmp/killed\n");
    assert!(msg.contains("guest"), "{msg}");
    assert!(host_names(&out).is_empty(), "left: {:?}", host_names(&out));
    next_copy_out_works(e, vm, &out);
}

/// The guest's dd killed while it receives: an error, nothing in the guest, next copy works.
fn guest_reader_killed(e: &mut Lab, vm: &str, big: &Path) {
    kill_when_seen(e, vm, "dd");
    let t = Instant::now();
    let msg = e.srv().call_err_within(
        "guest_copy_in",
        json!({"name": vm, "host_path": big, "guest_path": "/tmp/victim"}),
        SLOW,
    );
    eprintln!("reader killed: {:?}: {msg}", t.elapsed());
    assert_eq!(e.guest_sh(vm, "ls /tmp/killed"), "/tmp/killed\n");
    assert!(msg.contains("unpacked"), "{msg}");
    assert_eq!(guest_leftovers(e, vm, "/tmp"), "");
    assert_eq!(e.guest_sh(vm, "[ -e /tmp/victim ] || echo gone"), "gone\n");
    next_copy_in_works(e, vm);
}

/// A copy in cancelled part-way: no answer, nothing left in the guest, the next copy works.
fn cancelled_in(e: &mut Lab, vm: &str, big: &Path) {
    let id = json!("cancel-in");
    let args = json!({"name": vm, "host_path": big, "guest_path": "/tmp/cancelled"});
    e.srv().send_request(
        &id,
        "tools/call",
        json!({"name": "guest_copy_in", "arguments": args}),
    );
    // 64 MiB in takes about 3 s here: 1.2 s in, the transfer is under way.
    std::thread::sleep(Duration::from_millis(1200));
    e.srv().notify(
        "notifications/cancelled",
        json!({"requestId": id, "reason": "test"}),
    );
    wait_for_guest_clean(e, vm, "/tmp", "/tmp/cancelled");
    next_copy_in_works(e, vm);
}

/// A copy out cancelled once its temporary exists on the host: no answer, the temporary gone.
fn cancelled_out(e: &mut Lab, vm: &str) {
    let out = e.dir.subdir("cancelled-out");
    let id = copy_out_under_way(e, vm, &out, "cancel-out");
    e.srv().notify(
        "notifications/cancelled",
        json!({"requestId": id, "reason": "test"}),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !host_names(&out).is_empty() {
        assert!(Instant::now() < deadline, "left: {:?}", host_names(&out));
        std::thread::sleep(Duration::from_millis(100));
    }
    next_copy_out_works(e, vm, &out);
}

/// The VM's QEMU killed during a copy out: a clear error, nothing left on the host.
fn vm_killed(e: &mut Lab, vm: &str, pid: i64) {
    let out = e.dir.subdir("vm-killed");
    let id = copy_out_under_way(e, vm, &out, "vm-killed");
    assert!(e.killer.kill(pid as i32), "QEMU {pid} was not running");
    let (resp, _) = e.srv().read_until_id(&id, Duration::from_secs(120));
    let result = &resp["result"];
    assert_eq!(result["isError"], json!(true), "{resp}");
    let msg = result["content"][0]["text"].as_str().unwrap_or_default();
    eprintln!("VM killed: {msg}");
    assert!(msg.len() > 20, "{msg}");
    assert!(host_names(&out).is_empty(), "left: {:?}", host_names(&out));
    e.srv().assert_alive();
}

/// Sends a guest_copy_out of /tmp/big into `dir` as request `id` (not awaited) and waits
/// (bounded) until its temporary shows there: the transfer is under way. Returns the id.
fn copy_out_under_way(e: &mut Lab, vm: &str, dir: &Path, id: &str) -> Value {
    let id = json!(id);
    let args = json!({"name": vm, "guest_path": "/tmp/big", "host_path": dir.join("big")});
    e.srv().send_request(
        &id,
        "tools/call",
        json!({"name": "guest_copy_out", "arguments": args}),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while host_names(dir).is_empty() {
        assert!(Instant::now() < deadline, "no copy began in {dir:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    id
}

/// Waits (bounded) until the guest folder `dir` holds no copy temporary and `dst` is absent;
/// no answer came to the cancelled call meanwhile.
fn wait_for_guest_clean(e: &mut Lab, vm: &str, dir: &str, dst: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = e.srv().call_ok_within(
            "guest_exec",
            json!({"name": vm, "command": "sh", "args": ["-c",
                format!("ls -a {dir} | grep mcq-copy; [ -e {dst} ] && echo {dst}; true")]}),
            SLOW,
        );
        if r["stdout"] == json!("") {
            return;
        }
        assert!(Instant::now() < deadline, "left in the guest: {r}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn next_copy_in_works(e: &mut Lab, vm: &str) {
    let f = e.dir.join("next-in");
    std::fs::write(&f, b"next copy in\n").unwrap();
    let r = e.srv().call_ok_within(
        "guest_copy_in",
        json!({"name": vm, "host_path": f, "guest_path": "/tmp/next-in", "overwrite": true}),
        SLOW,
    );
    assert_eq!(r["via"], json!("channel"), "{r}");
    assert_eq!(e.guest_sh(vm, "cat /tmp/next-in"), "next copy in\n");
}

fn next_copy_out_works(e: &mut Lab, vm: &str, dir: &Path) {
    e.guest_sh(vm, "echo next copy out > /tmp/next-out");
    let dest = dir.join("next");
    let r: Value = e.srv().call_ok_within(
        "guest_copy_out",
        json!({"name": vm, "guest_path": "/tmp/next-out", "host_path": dest}),
        SLOW,
    );
    assert_eq!(r["via"], json!("channel"), "{r}");
    assert_eq!(std::fs::read_to_string(&dest).unwrap(), "next copy out\n");
    std::fs::remove_file(&dest).unwrap();
}
