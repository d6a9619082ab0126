//! Untrusted agents, images: an image is untrusted data, so a backing file or a qcow2 external
//! data file outside the roots (absolute, relative with `..`, through a symlink, `json:` or
//! `nbd://`) is refused with nothing read, copied, changed or started.
//!
//! - Through every image tool: image_info's backing chain, image_convert, image_resize, image
//!   snapshots, and image_create's backing_file.
//! - At launch: launch_vm disks (and every other host file it is given: iso, kernel, initrd,
//!   files named in extra_args) and sandbox_vm's base image, kernel and initrd.
//!
//! Paths as such are in `security_paths.rs`; QEMU's own command line and the quotas in
//! `security_qemu.rs`.
//!
//! The tests run a server whose only operator root is `<folder>/root`, with `<folder>/out`
//! beside it as the outside world ([`Fence`]). The launch test runs in a [`Lab`], so a QEMU
//! started by mistake is killed.

use std::path::PathBuf;

use crate::common::*;
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Images are untrusted data

#[test]
fn a_backing_file_outside_the_roots_is_refused() {
    let dir = TempDir::new("sec-backing");
    let f = Fence::in_folder(dir.path());
    let base = f.o("base.qcow2");
    qcow2(&base, "1M");
    let base_before = std::fs::read(&base).unwrap();
    // Absolute, relative with `..`, and through a symlink inside the root.
    overlay(&f.r("abs.qcow2"), st(&base), "qcow2");
    overlay(&f.r("rel.qcow2"), "../out/base.qcow2", "qcow2");
    symlink(&base, &f.r("blink.qcow2"));
    overlay(&f.r("sym.qcow2"), st(&f.r("blink.qcow2")), "qcow2");
    // Two levels: the top image's backing file is inside, the next one is not.
    overlay(&f.r("top.qcow2"), st(&f.r("abs.qcow2")), "qcow2");
    let mut s = server_rooted_at(&f.root);

    for img in ["abs.qcow2", "rel.qcow2", "sym.qcow2", "top.qcow2"] {
        let p = st(&f.r(img)).to_string();
        let size_before = qemu_img_info(&f.r(img))["virtual-size"].clone();
        let err = s.call_err("image_info", json!({"path": p, "backing_chain": true}));
        assert_refused(&err, &base, &f.root);
        assert!(err.contains("backing file"), "{img}: {err}");
        let dest = f.r(&format!("flat-{img}"));
        let err = s.call_err("image_convert", json!({"source": p, "dest": st(&dest)}));
        assert_refused(&err, &base, &f.root);
        assert!(
            !dest.exists(),
            "{img}: image_convert copied the outside image"
        );
        let err = s.call_err("image_resize", json!({"path": p, "size": "+1M"}));
        assert_refused(&err, &base, &f.root);
        assert_eq!(qemu_img_info(&f.r(img))["virtual-size"], size_before);
        for tool in ["image_snapshot_create", "image_snapshot_apply"] {
            let err = s.call_err(tool, json!({"path": p, "tag": "s1"}));
            assert_refused(&err, &base, &f.root);
        }
        let err = s.call_err("image_snapshot_list", json!({"path": p}));
        assert_refused(&err, &base, &f.root);
        let over = f.r(&format!("over-{img}"));
        let err = s.call_err(
            "image_create",
            json!({"path": st(&over), "size": "1M", "backing_file": p}),
        );
        assert_refused(&err, &base, &f.root);
        assert!(!over.exists(), "{img}: an overlay on it was created");
    }
    // A backing file inside the root but hidden.
    qcow2(&f.r(".base.qcow2"), "1M");
    overlay(&f.r("onhidden.qcow2"), st(&f.r(".base.qcow2")), "qcow2");
    let err = s.call_err(
        "image_info",
        json!({"path": st(&f.r("onhidden.qcow2")), "backing_chain": true}),
    );
    assert_refused(&err, &f.r(".base.qcow2"), &f.root);
    std::fs::remove_file(f.r("onhidden.qcow2")).unwrap();
    std::fs::remove_file(f.r(".base.qcow2")).unwrap();
    // A backing file named directly, outside the roots.
    let err = s.call_err(
        "image_create",
        json!({"path": st(&f.r("direct.qcow2")), "size": "1M", "backing_file": st(&base)}),
    );
    assert_refused(&err, &base, &f.root);
    assert_eq!(
        std::fs::read(&base).unwrap(),
        base_before,
        "the outside base changed"
    );
    assert_eq!(list_dir(&f.out), vec!["base.qcow2"]);
    assert_eq!(
        list_dir(&f.root),
        vec![
            "abs.qcow2",
            "blink.qcow2",
            "rel.qcow2",
            "sym.qcow2",
            "top.qcow2"
        ]
    );
}

#[test]
fn a_json_or_nbd_backing_name_is_refused_without_being_opened() {
    let dir = TempDir::new("sec-jsonback");
    let f = Fence::in_folder(dir.path());
    let wire = Tripwire::new();
    qcow2(&f.r("inside.qcow2"), "1M");
    let json_backing = format!(
        r#"json:{{"driver":"qcow2","file":{{"driver":"file","filename":"{}"}}}}"#,
        f.r("inside.qcow2").display()
    );
    let nbd_backing = format!("nbd://127.0.0.1:{}/x", wire.port());
    overlay(&f.r("json.qcow2"), &json_backing, "qcow2");
    overlay(&f.r("nbd.qcow2"), &nbd_backing, "raw");
    let mut s = server_rooted_at(&f.root);
    for (img, scheme) in [("json.qcow2", "json:"), ("nbd.qcow2", "nbd")] {
        let p = st(&f.r(img)).to_string();
        let err = s.call_err("image_info", json!({"path": p, "backing_chain": true}));
        assert!(
            err.contains(scheme) && err.contains("backing file"),
            "{err}"
        );
        assert!(err.contains(&p), "{err}");
        let err = s.call_err(
            "image_convert",
            json!({"source": p, "dest": st(&f.r("flat.qcow2"))}),
        );
        assert!(err.contains(scheme), "{err}");
        let err = s.call_err("image_resize", json!({"path": p, "size": "2M"}));
        assert!(err.contains(scheme), "{err}");
        let err = s.call_err("image_snapshot_create", json!({"path": p, "tag": "t"}));
        assert!(err.contains(scheme), "{err}");
        assert!(!f.r("flat.qcow2").exists());
    }
    wire.assert_untouched("an nbd:// backing file");
}

#[test]
fn an_external_data_file_outside_the_roots_is_refused() {
    let dir = TempDir::new("sec-datafile");
    let f = Fence::in_folder(dir.path());
    let data = f.o("data.raw");
    let ext = f.r("ext.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        &format!("data_file={}", data.display()),
        st(&ext),
        "1M",
    ]);
    assert!(data.exists(), "qemu-img did not make the data file");
    let data_before = std::fs::read(&data).unwrap();
    let mut s = server_rooted_at(&f.root);
    let p = st(&ext).to_string();

    let err = s.call_err("image_info", json!({"path": p, "backing_chain": true}));
    assert_refused(&err, &data, &f.root);
    assert!(err.contains("external data file"), "{err}");
    let err = s.call_err(
        "image_convert",
        json!({"source": p, "dest": st(&f.r("flat.raw")), "format": "raw"}),
    );
    assert_refused(&err, &data, &f.root);
    assert!(
        !f.r("flat.raw").exists(),
        "image_convert copied the data out"
    );
    let err = s.call_err("image_resize", json!({"path": p, "size": "+1M"}));
    assert_refused(&err, &data, &f.root);
    let err = s.call_err("image_snapshot_create", json!({"path": p, "tag": "s1"}));
    assert_refused(&err, &data, &f.root);
    let err = s.call_err(
        "image_create",
        json!({"path": st(&f.r("over.qcow2")), "size": "1M", "backing_file": p}),
    );
    assert_refused(&err, &data, &f.root);
    assert!(!f.r("over.qcow2").exists());
    assert_eq!(
        std::fs::read(&data).unwrap(),
        data_before,
        "the data file changed"
    );
    assert_eq!(list_dir(&f.root), vec!["ext.qcow2"]);
}

// ---------------------------------------------------------------------------------------------
// Launching: disks, sandbox bases and every other host file

#[test]
fn launch_refuses_host_files_outside_the_roots_and_starts_nothing() {
    let lab = Lab::without_server("sec-launch", 1);
    let f = Fence::in_folder(lab.dir.path());
    let wire = Tripwire::new();
    let outside_disk = f.o("d.qcow2");
    qcow2(&outside_disk, "1M");
    let base = f.o("base.qcow2");
    qcow2(&base, "1M");
    overlay(&f.r("over.qcow2"), st(&base), "qcow2");
    overlay(
        &f.r("nbd.qcow2"),
        &format!("nbd://127.0.0.1:{}/x", wire.port()),
        "raw",
    );
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
    qcow2(&f.r(".hidden.qcow2"), "1M");
    symlink(&f.out, &f.r("sub"));
    for name in ["vmlinuz", "initrd", "cd.iso"] {
        std::fs::write(f.o(name), b"not really").unwrap();
    }
    std::fs::write(f.r("vmlinuz"), b"not really").unwrap();
    let var_log = PathBuf::from(format!("/var/tmp/mcq-sec-{}-D.log", std::process::id()));
    let _ = std::fs::remove_file(&var_log);
    let out_before = list_dir(&f.out);
    let mut s = lab_server(&lab, &[("MCQEMU_ROOTS", st(&f.root))]);

    let o = |rel: &str| st(&f.o(rel)).to_string();
    let r = |rel: &str| st(&f.r(rel)).to_string();
    // (launch_vm fields, the file the refusal must name: None for pseudo-filenames)
    let cases: Vec<(Value, Option<PathBuf>)> = vec![
        (json!({"disks": [o("d.qcow2")]}), Some(outside_disk.clone())),
        (
            json!({"disks": [format!("{}/../out/d.qcow2", f.root.display())]}),
            Some(outside_disk.clone()),
        ),
        (
            json!({"disks": [r("sub/d.qcow2")]}),
            Some(outside_disk.clone()),
        ),
        (json!({"disks": [r("over.qcow2")]}), Some(base.clone())),
        (json!({"disks": [r("ext.qcow2")]}), Some(data.clone())),
        (
            json!({"disks": [r(".hidden.qcow2")]}),
            Some(f.r(".hidden.qcow2")),
        ),
        (json!({"disks": [r("nbd.qcow2")]}), None),
        (
            json!({"disks": [format!(r#"json:{{"driver":"file","filename":"{}"}}"#, o("d.qcow2"))]}),
            None,
        ),
        (json!({"iso": o("cd.iso")}), Some(f.o("cd.iso"))),
        (json!({"kernel": o("vmlinuz")}), Some(f.o("vmlinuz"))),
        (
            json!({"kernel": r("vmlinuz"), "initrd": o("initrd")}),
            Some(f.o("initrd")),
        ),
        (
            json!({"extra_args": ["-D", st(&var_log)]}),
            Some(var_log.clone()),
        ),
        (
            json!({"extra_args": ["-chardev", format!("file,id=c1,path={}", o("chr.log"))]}),
            Some(f.o("chr.log")),
        ),
        (
            json!({"extra_args": ["-kernel", o("vmlinuz")]}),
            Some(f.o("vmlinuz")),
        ),
        (
            json!({"extra_args": ["-drive", format!("file={},format=qcow2,if=virtio", o("d.qcow2"))]}),
            Some(outside_disk.clone()),
        ),
        (
            json!({"extra_args": ["-object",
                format!("memory-backend-file,id=m1,size=64M,mem-path={}", o("mem"))]}),
            Some(f.o("mem")),
        ),
    ];
    for (i, (fields, target)) in cases.iter().enumerate() {
        let name = format!("esc{i}");
        let r = s.call_tool_within("launch_vm", vm_args(&name, fields.clone()), LAUNCH);
        lab.track(&r);
        let err = tool_err(&r, &format!("launch_vm {fields}"));
        match target {
            Some(t) => assert_refused(&err, t, &f.root),
            None => assert!(err.contains("refused"), "{fields}: {err}"),
        }
        assert!(
            qemu_pids_mentioning(&lab.runtime()).is_empty(),
            "{fields}: a QEMU was started"
        );
        assert!(
            !lab.runtime().join(&name).exists(),
            "{fields}: a runtime folder was made"
        );
    }
    // sandbox_vm checks its base image the same way.
    for (base_image, target) in [
        (o("d.qcow2"), &outside_disk),
        (r("over.qcow2"), &base),
        (r("ext.qcow2"), &data),
    ] {
        let r = s.call_tool_within(
            "sandbox_vm",
            json!({"base_image": base_image, "name": "sbx", "memory_mb": 64, "cpus": 1,
                   "wait_agent_s": 0}),
            LAUNCH,
        );
        lab.track(&r);
        let err = tool_err(&r, &format!("sandbox_vm {base_image}"));
        assert_refused(&err, target, &f.root);
        assert!(qemu_pids_mentioning(&lab.runtime()).is_empty());
    }
    // ... and its kernel and initrd.
    qcow2(&f.r("sbase.qcow2"), "1M");
    for (fields, target) in [
        (json!({"kernel": o("vmlinuz")}), f.o("vmlinuz")),
        (
            json!({"kernel": r("vmlinuz"), "initrd": o("initrd")}),
            f.o("initrd"),
        ),
    ] {
        let mut args = json!({"base_image": r("sbase.qcow2"), "name": "sbk", "memory_mb": 64,
                              "cpus": 1, "wait_agent_s": 0, "port_forwards": []});
        for (k, v) in fields.as_object().unwrap() {
            args[k] = v.clone();
        }
        let r = s.call_tool_within("sandbox_vm", args, LAUNCH);
        lab.track(&r);
        let err = tool_err(&r, &format!("sandbox_vm {fields}"));
        assert_refused(&err, &target, &f.root);
        assert!(qemu_pids_mentioning(&lab.runtime()).is_empty());
        let leftovers = match std::fs::read_dir(lab.vm_dir("sbk")) {
            Ok(_) => list_dir(&lab.vm_dir("sbk")),
            Err(_) => Vec::new(),
        };
        assert!(leftovers.is_empty(), "a refused sandbox left {leftovers:?}");
    }
    wire.assert_untouched("an nbd:// backing file of a disk");
    assert!(!var_log.exists(), "QEMU's -D log was created outside");
    assert_eq!(
        list_dir(&f.out),
        out_before,
        "something was created outside"
    );
    assert!(vm_names(&mut s).is_empty(), "refused launches left records");
}

/// A raw disk a guest fills with a qcow2 header (one naming a backing file outside the roots)
/// keeps the format recorded at its first launch: the next launch opens it as raw, and the
/// image tools read it as raw too, instead of probing a format the guest chose.
#[test]
fn a_guest_written_header_does_not_change_a_recorded_format() {
    let lab = Lab::without_server("sec-pin", 1);
    let f = Fence::in_folder(lab.dir.path());
    let mut s = lab_server(&lab, &[("MCQEMU_ROOTS", st(&f.root))]);
    let disk = f.r("disk.raw");
    qemu_img(&["create", "-q", "-f", "raw", st(&disk), "4M"]);
    let args = vm_args("pin", json!({"disks": [st(&disk)]}));
    let r = s.call_tool_within("launch_vm", args.clone(), LAUNCH);
    lab.track(&r);
    tool_ok(&r, "launch_vm with a raw disk");
    s.call_ok("stop_vm", json!({"name": "pin", "force": true}));
    // What a guest could write: the header of a qcow2 whose backing file is outside the roots.
    let outside = f.o("secret.qcow2");
    qcow2(&outside, "1M");
    let evil = f.r("evil.qcow2");
    overlay(&evil, st(&outside), "qcow2");
    let header = std::fs::read(&evil).unwrap();
    let mut raw = std::fs::read(&disk).unwrap();
    raw[..header.len()].copy_from_slice(&header);
    std::fs::write(&disk, &raw).unwrap();
    // The image tools read it as the raw disk it was recorded as.
    let info = s.call_ok("image_info", json!({"path": st(&disk)}));
    assert_eq!(info["format"], "raw", "{info}");
    s.call_ok("image_resize", json!({"path": st(&disk), "size": "+1M"}));
    // And the next launch opens it as raw, never following the planted backing file.
    let r = s.call_tool_within("launch_vm", args, LAUNCH);
    lab.track(&r);
    let out = tool_ok(&r, "relaunch with the guest-written header");
    let pid = out["pid"].as_i64().unwrap() as i32;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(cmdline.contains("disk.raw,format=raw"), "{cmdline}");
    s.call_ok("stop_vm", json!({"name": "pin", "force": true}));
}
