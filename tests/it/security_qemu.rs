//! Untrusted agents, the launched QEMU: what extra_args may name, the seccomp sandbox, an
//! explicit format on every drive, and the quotas.
//!
//! - extra_args: a `-sandbox` is refused, a `-drive` is a disk like any other (its image is
//!   checked and its format given), and a relative folder such as slirp's `tftp=.` is a host
//!   path too.
//! - The launched QEMU runs under seccomp with a format on every drive; its screenshots stay
//!   inside the roots.
//! - Quotas: MCQEMU_MAX_VMS and MCQEMU_MAX_MEMORY_MB.
//!
//! Paths are in `security_paths.rs`, untrusted images in `security_images.rs`. Every test runs
//! in a [`Lab`], so a QEMU started by mistake is killed.

use std::path::Path;
use std::time::Duration;

use crate::common::*;
use serde_json::{json, Value};

/// Bound for a stop_vm call.
const STOP: Duration = Duration::from_secs(60);
/// QEMU's seccomp policy as mcqemu must pass it.
const SECCOMP: &str = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";

// ---------------------------------------------------------------------------------------------
// Fixtures

fn pid_of(v: &Value) -> i32 {
    v["pid"].as_i64().unwrap_or_else(|| panic!("no pid in {v}")) as i32
}

/// Force-stops `name` and checks its QEMU is gone.
fn force_stop(s: &mut Server, name: &str, pid: i32) {
    let r = s.call_ok_within("stop_vm", json!({"name": name, "force": true}), STOP);
    assert_eq!(r["status"], "stopped", "{r}");
    assert!(
        wait_pid_dead(pid, Duration::from_secs(10)),
        "QEMU {pid} survived a forced stop_vm"
    );
}

// ---------------------------------------------------------------------------------------------
// extra_args, the sandbox, drive formats

#[test]
fn extra_args_cannot_change_the_seccomp_sandbox() {
    let lab = Lab::without_server("sec-sbx", 1);
    let mut s = lab.spawn_server();
    for extra in [
        vec!["-sandbox", "off"],
        vec!["--sandbox", "on,spawn=allow"],
        vec!["-sandbox=off"],
        vec!["-name", "x", "-sandbox", "off"],
    ] {
        let r = s.call_tool_within(
            "launch_vm",
            vm_args("sbx", json!({"extra_args": extra})),
            LAUNCH,
        );
        lab.track(&r);
        let err = tool_err(&r, &format!("launch_vm extra_args {extra:?}"));
        assert!(
            err.contains("sandbox") && err.contains("not allowed"),
            "{extra:?}: {err}"
        );
        assert!(qemu_pids_mentioning(&lab.runtime()).is_empty());
    }
    assert!(vm_names(&mut s).is_empty());
}

#[test]
fn a_launched_qemu_is_sandboxed_and_every_drive_has_a_format() {
    let lab = Lab::without_server("sec-run", 1);
    let f = Fence::in_folder(lab.dir.path());
    let qdisk = f.r("disk.qcow2");
    qcow2(&qdisk, "16M");
    let rdisk = f.r("disk.raw");
    qemu_img(&["create", "-q", "-f", "raw", st(&rdisk), "1M"]);
    let chr = f.r("chr.log");
    let mut s = lab_server(&lab, &[("MCQEMU_ROOTS", st(&f.root))]);
    let l = lab.launch_on(
        &mut s,
        vm_args(
            "inside",
            json!({"disks": [st(&qdisk), st(&rdisk)],
                   "extra_args": ["-chardev", format!("file,id=c1,path={}", chr.display())]}),
        ),
        LAUNCH,
    );
    let pid = pid_of(&l);

    let argv = cmdline(pid).expect("QEMU's command line");
    let sandbox: Vec<&String> = argv
        .windows(2)
        .filter(|w| w[0] == "-sandbox")
        .map(|w| &w[1])
        .collect();
    assert_eq!(sandbox, vec![SECCOMP], "-sandbox in {argv:?}");
    let drives: Vec<&String> = argv
        .windows(2)
        .filter(|w| w[0] == "-drive")
        .map(|w| &w[1])
        .collect();
    assert!(drives.len() >= 2, "the disks are missing: {argv:?}");
    for d in &drives {
        assert!(d.contains("format="), "a -drive without format=: {d}");
    }
    let with = |file: &Path, fmt: &str| {
        drives
            .iter()
            .any(|d| d.contains(st(file)) && d.contains(&format!("format={fmt}")))
    };
    assert!(with(&qdisk, "qcow2"), "{drives:?}");
    assert!(with(&rdisk, "raw"), "{drives:?}");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let mode = status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .map(str::trim);
    assert_eq!(mode, Some("2"), "the kernel enforces no seccomp filter");
    let info = s.call_ok("vm_info", json!({"name": "inside"}));
    assert_eq!(info["seccomp"], "filter", "{info}");
    assert_eq!(info["status"], "running", "{info}");
    assert!(
        chr.is_file(),
        "the chardev file inside the root was not opened"
    );

    // Screenshots: inside the root they are saved, outside they are refused.
    let shot = f.r("shot.png");
    let out = s.call_ok(
        "vm_screenshot",
        json!({"name": "inside", "path": st(&shot)}),
    );
    assert_eq!(out["path"], st(&shot), "{out}");
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    std::fs::create_dir_all(f.r(".shots")).unwrap();
    symlink(&f.out, &f.r("sub"));
    for (path, target) in [
        (st(&f.o("shot.png")).to_string(), f.o("shot.png")),
        (
            format!("{}/../out/shot.png", f.root.display()),
            f.o("shot.png"),
        ),
        (st(&f.r("sub/shot.png")).to_string(), f.o("shot.png")),
        (st(&f.r(".shots/s.png")).to_string(), f.r(".shots/s.png")),
    ] {
        let err = s.call_err("vm_screenshot", json!({"name": "inside", "path": path}));
        assert_refused(&err, &target, &f.root);
        assert!(!target.exists(), "{path}: saved anyway");
    }
    assert!(list_dir(&f.out).is_empty(), "{:?}", list_dir(&f.out));
    assert!(list_dir(&f.r(".shots")).is_empty());
    force_stop(&mut s, "inside", pid);
}

#[test]
fn extra_args_drives_are_checked_like_disks() {
    // A -drive in extra_args is a disk like any other: its image is untrusted data (backing
    // chain and external data file inside the roots) and QEMU is told its format.
    let lab = Lab::without_server("sec-xdrive", 1);
    let f = Fence::in_folder(lab.dir.path());
    let base = f.o("base.qcow2");
    qcow2(&base, "1M");
    overlay(&f.r("over.qcow2"), st(&base), "qcow2");
    let data = f.o("data.raw");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        &format!("data_file={}", data.display()),
        st(&f.r("ext.qcow2")),
        "1M",
    ]);
    let mut s = lab_server(&lab, &[("MCQEMU_ROOTS", st(&f.root))]);
    // Every case runs; the failures are reported together.
    let mut problems = Vec::new();
    for (i, (img, outside)) in [("over.qcow2", &base), ("ext.qcow2", &data)]
        .into_iter()
        .enumerate()
    {
        let drive = format!("file={},format=qcow2,if=virtio", f.r(img).display());
        let r = s.call_tool_within(
            "launch_vm",
            vm_args(&format!("xd{i}"), json!({"extra_args": ["-drive", drive]})),
            LAUNCH,
        );
        lab.track(&r);
        let started = qemu_pids_mentioning(&lab.runtime());
        lab.killer.kill_all();
        if r["isError"] != true || !started.is_empty() {
            problems.push(format!(
                "extra_args -drive {drive} was accepted (QEMU {started:?} started) although the \
                 image reaches {} outside the roots",
                outside.display()
            ));
        }
    }
    // A -drive without format= would have QEMU probe a guest-writable image: refused, or
    // launched with an explicit format.
    let raw = f.r("plain.raw");
    qemu_img(&["create", "-q", "-f", "raw", st(&raw), "1M"]);
    let drive = format!("file={},if=virtio", raw.display());
    let r = s.call_tool_within(
        "launch_vm",
        vm_args("xdfmt", json!({"extra_args": ["-drive", drive]})),
        LAUNCH,
    );
    lab.track(&r);
    if r["isError"] == false {
        let pid = pid_of(&r["structuredContent"]);
        let argv = cmdline(pid).unwrap_or_default();
        lab.killer.kill_all();
        let bare: Vec<&String> = argv
            .windows(2)
            .filter(|w| w[0] == "-drive" && !w[1].contains("format="))
            .map(|w| &w[1])
            .collect();
        if !bare.is_empty() {
            problems.push(format!(
                "QEMU was started with a -drive without format= (QEMU probes it): {bare:?}"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn extra_args_cannot_serve_host_folders_by_relative_name() {
    // slirp's tftp= serves a host folder to the guest; "." or ".." has no "/" to give it away,
    // and names mcqemu's working folder (QEMU's too), which is outside the roots here.
    let lab = Lab::without_server("sec-tftp", 1);
    let f = Fence::in_folder(lab.dir.path());
    let mut s = lab_server(&lab, &[("MCQEMU_ROOTS", st(&f.root))]);
    for dir in [".", ".."] {
        let netdev = format!("user,id=n9,tftp={dir}");
        let r = s.call_tool_within(
            "launch_vm",
            json!({"name": "tftp", "memory_mb": 64, "cpus": 1, "accel": "tcg",
                   "extra_args": ["-netdev", netdev, "-device", "virtio-net-pci,netdev=n9"]}),
            LAUNCH,
        );
        lab.track(&r);
        let started = qemu_pids_mentioning(&lab.runtime());
        lab.killer.kill_all();
        assert_eq!(
            r["isError"],
            true,
            "extra_args -netdev {netdev} was accepted: the guest can read {} over TFTP: {r}",
            std::env::current_dir().unwrap().display()
        );
        assert!(started.is_empty(), "{netdev}: a QEMU was started");
    }
}

// ---------------------------------------------------------------------------------------------
// Quotas

#[test]
fn max_vms_refuses_the_vm_over_the_limit_and_starts_nothing() {
    let lab = Lab::without_server("sec-maxvms", 1);
    let mut s = lab_server(&lab, &[("MCQEMU_MAX_VMS", "1")]);
    let first = lab.launch_on(&mut s, vm_args("one", json!({})), LAUNCH);
    let pid = pid_of(&first);

    // UEFI: the refused launch copies no variable store (nor makes a state folder for one).
    let r = s.call_tool_within(
        "launch_vm",
        vm_args("two", json!({"firmware": "uefi"})),
        LAUNCH,
    );
    lab.track(&r);
    let err = tool_err(&r, "launch_vm two over MCQEMU_MAX_VMS=1");
    assert!(err.contains("MCQEMU_MAX_VMS"), "{err}");
    assert_eq!(qemu_pids_mentioning(&lab.runtime()), vec![pid]);
    assert!(
        !lab.runtime().join("two").exists(),
        "a runtime folder was made"
    );
    assert!(
        !lab.vm_dir("two").exists(),
        "the refused launch left {:?}",
        std::fs::read_dir(lab.vm_dir("two")).map(|d| d.count())
    );
    assert_eq!(vm_names(&mut s), vec!["one"], "the refused VM was recorded");

    // Stopped VMs do not count.
    force_stop(&mut s, "one", pid);
    let second = lab.launch_on(&mut s, vm_args("two", json!({})), LAUNCH);
    force_stop(&mut s, "two", pid_of(&second));
}

#[test]
fn max_memory_refuses_the_vm_that_does_not_fit_and_starts_nothing() {
    let lab = Lab::without_server("sec-maxmem", 2);
    let mut s = lab_server(&lab, &[("MCQEMU_MAX_MEMORY_MB", "100")]);
    let first = lab.launch_on(&mut s, vm_args("m1", json!({})), LAUNCH);
    let pid = pid_of(&first);

    let r = s.call_tool_within("launch_vm", vm_args("m2", json!({})), LAUNCH);
    lab.track(&r);
    let err = tool_err(&r, "launch_vm m2 over MCQEMU_MAX_MEMORY_MB=100");
    assert!(err.contains("MCQEMU_MAX_MEMORY_MB"), "{err}");
    assert!(err.contains("64"), "{err}");
    assert_eq!(qemu_pids_mentioning(&lab.runtime()), vec![pid]);
    assert!(
        !lab.runtime().join("m2").exists(),
        "a runtime folder was made"
    );
    assert_eq!(vm_names(&mut s), vec!["m1"], "the refused VM was recorded");

    // What still fits starts: 64 + 32 <= 100.
    let small = lab.launch_on(&mut s, vm_args("m3", json!({"memory_mb": 32})), LAUNCH);
    force_stop(&mut s, "m3", pid_of(&small));
    force_stop(&mut s, "m1", pid);
}
