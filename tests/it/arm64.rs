//! Arm guests, end to end over MCP: `launch_vm {arch: "aarch64"}` on QEMU's `virt` board under
//! TCG with the aarch64 test guest (tests/guest/build_guest.py --arch aarch64: Debian's arm64
//! kernel, busybox and qemu-guest-agent in a self-made initramfs).
//!
//! What the issue "Arm guests and Arm hosts" asks of such a guest: the agent answers and runs
//! programs, files travel both ways byte for byte, a live snapshot brings the guest's state
//! back, the screen (virtio-gpu: the virt board has no VGA) shows what the guest draws, text
//! typed on the USB keyboard arrives exactly, a click lands on the tablet, a sandbox and a
//! template clone become ready, UEFI firmware boots the kernel, and `firmware: "bios"` without
//! a kernel is refused before anything starts.
//!
//! Arm guests are emulated instruction by instruction on an x86 host (about 6 s from QEMU's
//! start to the agent here), so every test takes all of this binary's guest slots: one guest
//! at a time, one vCPU each. Every QEMU is SIGKILLed on the way out, pass or fail.

use std::time::Instant;

use crate::common::*;
use mcqemu::b64;
use serde_json::{json, Value};

use crate::common::arm64::*;

// ---------------------------------------------------------------------------------------------
// Refused before anything starts

/// The virt board has no BIOS: `firmware: "bios"` without a kernel would run nothing, so it is
/// a clear error, and no QEMU, record or socket is left.
#[test]
fn aarch64_bios_without_kernel_is_refused_with_nothing_started() {
    let lab = Lab::without_server("a64bios", 0);
    let mut s = lab.spawn_server();
    let name = "nobios";
    let r = s.call_tool_within(
        "launch_vm",
        json!({"name": name, "arch": "aarch64", "firmware": "bios", "memory_mb": 128,
               "cpus": 1, "no_net": true}),
        STEP,
    );
    lab.track(&r);
    let err = tool_err(&r, "launch_vm aarch64 firmware=bios without a kernel");
    let lower = err.to_lowercase();
    assert!(
        lower.contains("bios") && lower.contains("kernel") && lower.contains("uefi"),
        "the error names the BIOS, the kernel and the way out (uefi): {err}"
    );
    let l = s.call_ok("list_vms", json!({}));
    assert!(
        !l["vms"]
            .as_array()
            .expect("vms")
            .iter()
            .any(|v| v["name"] == name),
        "a refused launch left a record: {l}"
    );
    let left = qemu_pids_mentioning(lab.dir.path());
    assert!(left.is_empty(), "a refused launch started QEMU {left:?}");
    assert!(
        !lab.runtime().join(name).exists(),
        "a refused launch left its runtime folder"
    );
    assert!(
        !lab.vm_dir(name).join("uefi-vars.fd").exists(),
        "a refused launch copied a UEFI variable store"
    );
}

// ---------------------------------------------------------------------------------------------
// The agent, files and a live snapshot

/// launch_vm arch aarch64 with a kernel: the QEMU is an aarch64 `virt` machine with `-cpu
/// max` under TCG; the agent answers, guest_exec runs programs on an aarch64 kernel, text and
/// a binary file make the round trip byte for byte, and a live snapshot restores the guest's
/// memory and disk.
#[test]
fn aarch64_agent_files_and_live_snapshot() {
    let (lab, mut s) = arm_lab("a64agent");
    let vm = "arm";
    let disk = s.tmp.join("disk.qcow2");
    qcow2(&disk, "16M");
    let (launched, _) = boot(
        &lab,
        &mut s,
        vm,
        json!({"disks": [disk.to_str().unwrap()], "no_net": true}),
    );
    assert_eq!(launched["arch"], json!("aarch64"), "{launched}");
    assert!(
        launched["machine"]
            .as_str()
            .is_some_and(|m| m.starts_with("virt")),
        "{launched}"
    );
    let argv = qemu_argv(&launched);
    assert!(
        argv[0].ends_with("qemu-system-aarch64"),
        "QEMU binary: {argv:?}"
    );
    // `max` (its options may follow: pauth-impdef=on makes TCG much faster on QEMU 7.2).
    assert!(
        opt_value(&argv, "-cpu").is_some_and(|c| c == "max" || c.starts_with("max,")),
        "-cpu max under TCG: {argv:?}"
    );
    let info = s.call_ok("vm_info", json!({"name": vm}));
    assert_eq!(info["status"], json!("running"), "{info}");
    assert_eq!(info["record"]["arch"], json!("aarch64"), "{info}");

    // The agent and programs.
    let p = s.call_ok("guest_ping", json!({"name": vm}));
    assert_eq!(p["ok"], json!(true), "{p}");
    assert_eq!(sh(&mut s, vm, "uname -m"), "aarch64\n");
    let r = s.call_ok_within(
        "guest_exec",
        json!({"name": vm, "command": "sh", "args": ["-c", "echo out; echo err >&2; exit 3"],
               "timeout": 30}),
        SLOW,
    );
    assert_eq!(r["exitcode"], json!(3), "{r}");
    assert_eq!(r["stdout"], json!("out\n"), "{r}");
    assert_eq!(r["stderr"], json!("err\n"), "{r}");

    // Files: text (with an append) and 1 MiB of binary, byte-exact both ways.
    let text = "hello from the x86 host\nline two ✓\n";
    write_text(&mut s, vm, "/tmp/hello.txt", text);
    assert_eq!(read_text(&mut s, vm, "/tmp/hello.txt"), text);
    let r = s.call_ok(
        "guest_file_write",
        json!({"name": vm, "path": "/tmp/hello.txt", "content": "appended\n", "append": true}),
    );
    assert_eq!(r["bytes_written"], json!(9), "{r}");
    assert_eq!(
        read_text(&mut s, vm, "/tmp/hello.txt"),
        format!("{text}appended\n")
    );
    let data = pseudo_random(1 << 20, 0xa64_0001);
    let t = Instant::now();
    let w = s.call_ok_within(
        "guest_file_write",
        json!({"name": vm, "path": "/tmp/blob.bin", "content": b64::encode(&data),
               "encoding": "base64"}),
        SLOW,
    );
    assert_eq!(w["bytes_written"], json!(data.len()), "{w}");
    let sum = sh(&mut s, vm, "sha256sum /tmp/blob.bin");
    assert!(sum.starts_with(&sha256_hex(&data)), "{sum}");
    let r = s.call_ok_within(
        "guest_file_read",
        json!({"name": vm, "path": "/tmp/blob.bin", "max_bytes": 2 << 20, "encoding": "base64"}),
        SLOW,
    );
    let back = b64::decode(r["content"].as_str().expect("content")).expect("base64");
    assert!(back == data, "the 1 MiB file came back different");
    eprintln!("1 MiB file round trip: {:?}", t.elapsed());
    channel_copies(&mut s, vm, &data);

    // A live snapshot: a tmpfs file (guest RAM) and the first sector of the virtio disk.
    write_text(&mut s, vm, "/tmp/state.txt", "before the snapshot\n");
    let fill = |ch: char| {
        format!(
            "head -c 512 /dev/zero | tr '\\000' '{ch}' | dd of=/dev/vda bs=512 count=1 \
             conv=fsync 2>/dev/null"
        )
    };
    let sector = "echo 3 > /proc/sys/vm/drop_caches; head -c 512 /dev/vda | tr -d B | wc -c";
    sh(&mut s, vm, &fill('B'));
    assert_eq!(sh(&mut s, vm, sector).trim(), "0", "the sector is all B");
    let t = Instant::now();
    let c = s.call_ok_within("vm_snapshot_create", json!({"name": vm, "tag": "s1"}), SLOW);
    eprintln!("vm_snapshot_create took {:?}", t.elapsed());
    assert_eq!(c["action"], json!("created"), "{c}");
    assert_eq!(c["status"], json!("running"), "{c}");
    write_text(&mut s, vm, "/tmp/state.txt", "after the snapshot\n");
    sh(&mut s, vm, &fill('C'));
    assert_eq!(sh(&mut s, vm, sector).trim(), "512", "the sector is all C");
    let t = Instant::now();
    let r = s.call_ok_within(
        "vm_snapshot_restore",
        json!({"name": vm, "tag": "s1"}),
        SLOW,
    );
    eprintln!("vm_snapshot_restore took {:?}", t.elapsed());
    assert_eq!(r["action"], json!("restored"), "{r}");
    assert_eq!(r["status"], json!("running"), "{r}");
    wait_agent(&mut s, vm, Instant::now());
    assert_eq!(
        read_text(&mut s, vm, "/tmp/state.txt"),
        "before the snapshot\n"
    );
    assert_eq!(
        sh(&mut s, vm, sector).trim(),
        "0",
        "the sector is all B again"
    );
    channel_copies(&mut s, vm, &data);
    stop(&mut s, vm);
}

/// guest_copy_in then guest_copy_out of `data` over the data channel (on virt's virtio-serial).
fn channel_copies(s: &mut Server, vm: &str, data: &[u8]) {
    let src = s.tmp.join("copy-in.bin");
    std::fs::write(&src, data).unwrap();
    let t = Instant::now();
    let r = s.call_ok_within(
        "guest_copy_in",
        json!({"name": vm, "host_path": src, "guest_path": "/tmp/copied.bin", "overwrite": true}),
        SLOW,
    );
    assert_eq!(r["via"], json!("channel"), "{r}");
    let back = s.tmp.join("copy-out.bin");
    let _ = std::fs::remove_file(&back);
    let r = s.call_ok_within(
        "guest_copy_out",
        json!({"name": vm, "guest_path": "/tmp/copied.bin", "host_path": back}),
        SLOW,
    );
    assert_eq!(r["via"], json!("channel"), "{r}");
    assert!(
        std::fs::read(&back).unwrap() == data,
        "the copy came back different"
    );
    eprintln!("channel copy in and out: {:?}", t.elapsed());
}

// ---------------------------------------------------------------------------------------------
// UEFI

/// The firmware the virt board boots by default starts the kernel (its EFI stub) itself: the
/// guest sees EFI, and its agent answers.
#[test]
fn aarch64_uefi_firmware_boots_the_kernel() {
    let (lab, mut s) = arm_lab("a64uefi");
    let vm = "armefi";
    let (launched, ready) = boot(&lab, &mut s, vm, json!({"firmware": "uefi"}));
    let argv = qemu_argv(&launched);
    assert!(
        argv.iter().any(|a| a.contains("if=pflash")),
        "UEFI firmware on pflash: {argv:?}"
    );
    assert!(
        lab.vm_dir(vm).join("uefi-vars.fd").is_file(),
        "the VM's own variable store"
    );
    let efi = sh(
        &mut s,
        vm,
        "[ -d /sys/firmware/efi ] && echo efi || echo none",
    );
    assert_eq!(efi, "efi\n", "the kernel was started by UEFI firmware");
    assert_eq!(sh(&mut s, vm, "uname -m"), "aarch64\n");
    eprintln!("UEFI boot to agent: {ready:?}");
    stop(&mut s, vm);
}

// ---------------------------------------------------------------------------------------------
// Sandboxes and templates

const MARKER: &str = "made-by-the-arm64-template-setup";

/// A sandbox of the aarch64 guest becomes ready and goes away cleanly; a template saved from a
/// booted aarch64 guest clones into a sandbox that is ready without booting and has the
/// template's state.
#[test]
fn aarch64_sandbox_and_template_clone() {
    let (lab, mut s) = arm_lab("a64tpl");

    // A sandbox on a small base image.
    let base = s.tmp.join("base.qcow2");
    qcow2(&base, "16M");
    let mut args = arm_args(json!({"wait_agent_s": AGENT_WAIT.as_secs()}));
    args.insert("base_image".into(), json!(base.to_str().unwrap()));
    args.insert("name".into(), json!("armsb"));
    let t = Instant::now();
    let r = s.call_tool_within("sandbox_vm", Value::Object(args), SLOW);
    lab.track(&r);
    let sb = tool_ok(&r, "sandbox_vm aarch64");
    assert_eq!(sb["agent_ready"], json!(true), "agent not ready: {sb}");
    eprintln!("aarch64 sandbox ready in {:?}", t.elapsed());
    assert_eq!(sh(&mut s, "armsb", "uname -m"), "aarch64\n");
    let d = s.call_ok_within("sandbox_destroy", json!({"name": "armsb"}), STEP);
    assert_eq!(d["destroyed"], json!(true), "{d}");

    // A template and a clone of it.
    let mut args = arm_args(json!({
        "wait_agent_s": AGENT_WAIT.as_secs(),
        "setup": [{"command": "/bin/sh", "args": ["-c", format!("echo {MARKER} > /root/marker")],
                   "timeout": 60}],
    }));
    args.insert("name".into(), json!("armtpl"));
    let t = Instant::now();
    let tpl = s.call_ok_within("template_create", Value::Object(args), SLOW);
    eprintln!(
        "aarch64 template_create: {:?}, save_ms {}",
        t.elapsed(),
        tpl["save_ms"]
    );
    assert_eq!(tpl["name"], json!("armtpl"), "{tpl}");
    let t = Instant::now();
    let r = s.call_tool_within(
        "sandbox_vm",
        json!({"template": "armtpl", "name": "armclone"}),
        SLOW,
    );
    lab.track(&r);
    let c = tool_ok(&r, "sandbox_vm from the aarch64 template");
    assert_eq!(c["agent_ready"], json!(true), "clone not ready: {c}");
    eprintln!(
        "aarch64 clone ready in {:?} (ready_ms {})",
        t.elapsed(),
        c["ready_ms"]
    );
    assert_eq!(
        sh(&mut s, "armclone", "cat /root/marker"),
        format!("{MARKER}\n")
    );
    assert_eq!(sh(&mut s, "armclone", "uname -m"), "aarch64\n");
    let d = s.call_ok_within("sandbox_destroy", json!({"name": "armclone"}), STEP);
    assert_eq!(d["destroyed"], json!(true), "{d}");
    let del = s.call_ok_within("template_delete", json!({"name": "armtpl"}), STEP);
    assert!(del.is_object(), "{del}");
}

/// sandbox_vm from template `tpl` named `name`, ready; then the first 32 bytes its
/// /dev/urandom gives, in hex, read at once.
fn clone_and_read_urandom(lab: &Lab, s: &mut Server, tpl: &str, name: &str) -> String {
    let t = Instant::now();
    let r = s.call_tool_within("sandbox_vm", json!({"template": tpl, "name": name}), SLOW);
    lab.track(&r);
    let c = tool_ok(&r, "sandbox_vm from the aarch64 template");
    assert_eq!(c["agent_ready"], json!(true), "clone not ready: {c}");
    let bytes = sh(s, name, "head -c 32 /dev/urandom | od -An -tx1");
    eprintln!(
        "{name}: ready in {:?} (ready_ms {}, steps {}), uptime {}, urandom {}",
        t.elapsed(),
        c["ready_ms"],
        c["steps_ms"],
        sh(s, name, "cat /proc/uptime").trim(),
        bytes.split_whitespace().collect::<String>()
    );
    bytes.split_whitespace().collect()
}

/// Issue 25: the virt board has no vmgenid, so nothing tells a clone's kernel it was forked;
/// two clones of one aarch64 template must still read different bytes from /dev/urandom the
/// moment they are handed out (each is reseeded from the host first).
#[test]
fn aarch64_clones_of_one_template_read_different_random_bytes() {
    let (lab, mut s) = arm_lab("a64rng");
    // The template's CRNG is used just before it is saved, so its state is fresh then: a clone
    // resumed from it does not reach the kernel's own reseed interval before its first read.
    let mut args = arm_args(json!({
        "wait_agent_s": AGENT_WAIT.as_secs(),
        "setup": [{"command": "/bin/sh", "args": ["-c", "head -c 64 /dev/urandom >/dev/null; cat /proc/uptime"],
                   "timeout": 60}],
    }));
    args.insert("name".into(), json!("rngtpl"));
    s.call_ok_within("template_create", Value::Object(args), SLOW);
    let a = clone_and_read_urandom(&lab, &mut s, "rngtpl", "rng1");
    let d = s.call_ok_within("sandbox_destroy", json!({"name": "rng1"}), STEP);
    assert_eq!(d["destroyed"], json!(true), "{d}");
    let b = clone_and_read_urandom(&lab, &mut s, "rngtpl", "rng2");
    assert_eq!((a.len(), b.len()), (64, 64), "32 bytes each: {a} / {b}");
    assert_ne!(
        a, b,
        "two clones of one template read the same /dev/urandom bytes"
    );
    let d = s.call_ok_within("sandbox_destroy", json!({"name": "rng2"}), STEP);
    assert_eq!(d["destroyed"], json!(true), "{d}");
    s.call_ok_within("template_delete", json!({"name": "rngtpl"}), STEP);
}
