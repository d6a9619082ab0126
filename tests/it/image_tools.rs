//! The disk-image tools over MCP against the real qemu-img (and qemu-io to put data in images
//! and check it comes back).

use std::path::Path;

use crate::common::*;
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;

/// Writes `pattern` over `len` bytes at `offset` with qemu-io.
fn qemu_io_write(path: &Path, format: &str, pattern: u8, offset: u64, len: u64) {
    let cmd = format!("write -P {pattern:#04x} {offset} {len}");
    let (ok, out, err) = run_tool(
        "qemu-io",
        &["-f", format, "-c", &cmd, path.to_str().unwrap()],
    );
    assert!(ok, "qemu-io {cmd} failed: {out}{err}");
}

/// True when `len` bytes at `offset` all equal `pattern` (qemu-io exits non-zero otherwise).
fn qemu_io_reads(path: &Path, format: &str, pattern: u8, offset: u64, len: u64) -> bool {
    let cmd = format!("read -P {pattern:#04x} {offset} {len}");
    let (ok, out, _) = run_tool(
        "qemu-io",
        &["-f", format, "-c", &cmd, path.to_str().unwrap()],
    );
    ok && !out.contains("verification failed")
}

/// `qemu-img compare`: true when both images have the same guest-visible content.
fn same_content(a: &Path, b: &Path) -> bool {
    let (ok, _, _) = run_tool(
        "qemu-img",
        &["compare", "-U", a.to_str().unwrap(), b.to_str().unwrap()],
    );
    ok
}

fn tags(v: &Value) -> Vec<String> {
    v["snapshots"]
        .as_array()
        .expect("snapshots array")
        .iter()
        .map(|s| s["tag"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn create_qcow2() {
    let mut s = Server::ready();
    let path = s.tmp.join("disk.qcow2");
    let out = s.call_ok(
        "image_create",
        json!({"path": path.to_str().unwrap(), "size": "64M"}),
    );
    assert_eq!(out["path"], path.to_str().unwrap());
    assert_eq!(out["format"], "qcow2");
    assert_eq!(out["virtual_size"], 64 * MIB);
    assert!(out["backing_file"].is_null(), "{out}");
    let info = qemu_img_info(&path);
    assert_eq!(info["format"], "qcow2");
    assert_eq!(info["virtual-size"], 64 * MIB);
}

#[test]
fn create_raw() {
    let mut s = Server::ready();
    let path = s.tmp.join("disk.raw");
    let out = s.call_ok(
        "image_create",
        json!({"path": path.to_str().unwrap(), "size": "3M", "format": "raw"}),
    );
    assert_eq!(out["format"], "raw");
    assert_eq!(out["virtual_size"], 3 * MIB);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 3 * MIB);
    assert_eq!(qemu_img_info(&path)["format"], "raw");
    // Sizes in bytes and with binary suffixes.
    let p2 = s.tmp.join("bytes.raw");
    let out = s.call_ok(
        "image_create",
        json!({"path": p2.to_str().unwrap(), "size": "65536", "format": "raw"}),
    );
    assert_eq!(out["virtual_size"], 65536);
}

#[test]
fn create_refuses_bad_sizes_and_missing_folders() {
    let mut s = Server::ready();
    let path = s.tmp.file("d.qcow2");
    for size in ["0", "ten gigs", "-1G", "1X"] {
        let err = s.call_err("image_create", json!({"path": path, "size": size}));
        assert!(err.contains("size"), "{size}: {err}");
    }
    let err = s.call_err(
        "image_create",
        json!({"path": s.tmp.file("no/such/folder/d.qcow2"), "size": "1M"}),
    );
    assert!(err.contains("does not exist"), "{err}");
    assert!(!s.tmp.join("d.qcow2").exists());
    assert!(!s.tmp.join("no").exists());
}

#[test]
fn info_describes_image_and_snapshots() {
    let mut s = Server::ready();
    let path = s.tmp.join("i.qcow2");
    s.call_ok(
        "image_create",
        json!({"path": path.to_str().unwrap(), "size": "16M"}),
    );
    let out = s.call_ok("image_info", json!({"path": path.to_str().unwrap()}));
    assert_eq!(out["format"], "qcow2");
    assert_eq!(out["virtual_size"], 16 * MIB);
    assert!(out["actual_size"].as_u64().unwrap() > 0);
    assert_eq!(out["snapshots"], json!([]));
    assert_eq!(
        out["info"]["format"], "qcow2",
        "raw qemu-img JSON is included"
    );
    assert!(out.get("chain").is_none(), "no chain unless asked: {out}");
    let err = s.call_err("image_info", json!({"path": s.tmp.file("missing.qcow2")}));
    assert!(err.contains("missing.qcow2"), "{err}");
    let err = s.call_err(
        "image_info",
        json!({"path": s.tmp.path().to_str().unwrap()}),
    );
    assert!(err.contains("not a regular file"), "{err}");
}

#[test]
fn backing_chain_records_format_and_lists_both() {
    let mut s = Server::ready();
    let base = s.tmp.join("base.qcow2");
    let overlay = s.tmp.join("overlay.qcow2");
    s.call_ok(
        "image_create",
        json!({"path": base.to_str().unwrap(), "size": "32M"}),
    );
    let out = s.call_ok(
        "image_create",
        json!({"path": overlay.to_str().unwrap(), "size": "32M",
               "backing_file": base.to_str().unwrap()}),
    );
    assert_eq!(out["backing_file"], base.to_str().unwrap(), "{out}");
    assert_eq!(out["backing_format"], "qcow2", "{out}");
    let info = qemu_img_info(&overlay);
    assert_eq!(
        info["backing-filename-format"], "qcow2",
        "-F recorded: {info}"
    );

    let out = s.call_ok(
        "image_info",
        json!({"path": overlay.to_str().unwrap(), "backing_chain": true}),
    );
    let chain = out["chain"].as_array().expect("chain");
    assert_eq!(chain.len(), 2, "{out}");
    assert!(chain[0]["filename"]
        .as_str()
        .unwrap()
        .ends_with("overlay.qcow2"));
    assert!(chain[1]["filename"]
        .as_str()
        .unwrap()
        .ends_with("base.qcow2"));
    assert_eq!(out["backing_format"], "qcow2");

    // A raw base: the probed format ("raw") is recorded, not assumed.
    let raw_base = s.tmp.join("base.raw");
    let raw_overlay = s.tmp.join("raw-overlay.qcow2");
    s.call_ok(
        "image_create",
        json!({"path": raw_base.to_str().unwrap(), "size": "4M", "format": "raw"}),
    );
    let out = s.call_ok(
        "image_create",
        json!({"path": raw_overlay.to_str().unwrap(), "size": "4M",
               "backing_file": raw_base.to_str().unwrap()}),
    );
    assert_eq!(out["backing_format"], "raw", "{out}");
    assert_eq!(
        qemu_img_info(&raw_overlay)["backing-filename-format"],
        "raw"
    );

    // Data written to the base shows through the overlay; writes to the overlay leave the base alone.
    qemu_io_write(&base, "qcow2", 0x5a, 0, MIB);
    assert!(qemu_io_reads(&overlay, "qcow2", 0x5a, 0, MIB));
    qemu_io_write(&overlay, "qcow2", 0x11, 0, MIB);
    assert!(qemu_io_reads(&base, "qcow2", 0x5a, 0, MIB));

    // Missing backing file, and an image backing itself, are refused.
    let err = s.call_err(
        "image_create",
        json!({"path": s.tmp.file("o2.qcow2"), "size": "1M",
               "backing_file": s.tmp.file("nope.qcow2")}),
    );
    assert!(err.contains("nope.qcow2"), "{err}");
    let err = s.call_err(
        "image_create",
        json!({"path": s.tmp.file("self.qcow2"), "size": "1M",
               "backing_file": s.tmp.file("self.qcow2")}),
    );
    assert!(err.contains("same file"), "{err}");
    assert!(!s.tmp.join("o2.qcow2").exists() && !s.tmp.join("self.qcow2").exists());
}

#[test]
fn convert_qcow2_to_raw_and_back_with_compression() {
    let mut s = Server::ready();
    let src = s.tmp.join("src.qcow2");
    s.call_ok(
        "image_create",
        json!({"path": src.to_str().unwrap(), "size": "8M"}),
    );
    qemu_io_write(&src, "qcow2", 0xab, 0, 2 * MIB);
    qemu_io_write(&src, "qcow2", 0xcd, 5 * MIB, MIB);

    let raw = s.tmp.join("out.raw");
    let out = s.call_ok(
        "image_convert",
        json!({"source": src.to_str().unwrap(), "dest": raw.to_str().unwrap(), "format": "raw"}),
    );
    assert_eq!(out["format"], "raw");
    assert_eq!(out["source_format"], "qcow2");
    assert_eq!(out["compressed"], false);
    assert_eq!(out["virtual_size"], 8 * MIB);
    assert_eq!(qemu_img_info(&raw)["format"], "raw");
    let bytes = std::fs::read(&raw).unwrap();
    assert_eq!(bytes.len() as u64, 8 * MIB);
    assert!(bytes[..2 * MIB as usize].iter().all(|b| *b == 0xab));
    assert!(bytes[5 * MIB as usize..6 * MIB as usize]
        .iter()
        .all(|b| *b == 0xcd));
    assert!(same_content(&src, &raw));

    let back = s.tmp.join("back.qcow2");
    let out = s.call_ok(
        "image_convert",
        json!({"source": raw.to_str().unwrap(), "dest": back.to_str().unwrap()}),
    );
    assert_eq!(out["format"], "qcow2", "qcow2 is the default");
    assert_eq!(out["source_format"], "raw", "probed");
    assert!(same_content(&raw, &back));

    let packed = s.tmp.join("packed.qcow2");
    let out = s.call_ok(
        "image_convert",
        json!({"source": raw.to_str().unwrap(), "dest": packed.to_str().unwrap(),
               "compress": true}),
    );
    assert_eq!(out["compressed"], true);
    assert_eq!(qemu_img_info(&packed)["format"], "qcow2");
    assert!(same_content(&src, &packed));

    // compress needs qcow2; same source and dest refused; a missing source refused.
    let err = s.call_err(
        "image_convert",
        json!({"source": src.to_str().unwrap(), "dest": s.tmp.file("c.raw"),
               "format": "raw", "compress": true}),
    );
    assert!(err.contains("qcow2"), "{err}");
    let err = s.call_err(
        "image_convert",
        json!({"source": src.to_str().unwrap(), "dest": src.to_str().unwrap(), "overwrite": true}),
    );
    assert!(err.contains("same file"), "{err}");
    let err = s.call_err(
        "image_convert",
        json!({"source": s.tmp.file("nothing.qcow2"), "dest": s.tmp.file("x.qcow2")}),
    );
    assert!(err.contains("nothing.qcow2"), "{err}");

    // Nothing temporary is left beside the outputs.
    assert_eq!(
        list_dir(s.tmp.path()),
        vec![
            "back.qcow2",
            "out.raw",
            "packed.qcow2",
            "runtime",
            "src.qcow2",
            "state"
        ]
    );
}

#[test]
fn resize_grow_relative_and_guarded_shrink() {
    let mut s = Server::ready();
    let path = s.tmp.join("r.qcow2");
    let p = path.to_str().unwrap();
    s.call_ok("image_create", json!({"path": p, "size": "64M"}));

    let out = s.call_ok("image_resize", json!({"path": p, "size": "128M"}));
    assert_eq!(out["old_size"], 64 * MIB);
    assert_eq!(out["new_size"], 128 * MIB);
    assert_eq!(qemu_img_info(&path)["virtual-size"], 128 * MIB);

    let out = s.call_ok("image_resize", json!({"path": p, "size": "+1G"}));
    assert_eq!(out["old_size"], 128 * MIB);
    assert_eq!(out["new_size"], 1024 * MIB + 128 * MIB);
    assert_eq!(qemu_img_info(&path)["virtual-size"], 1152 * MIB);

    let err = s.call_err("image_resize", json!({"path": p, "size": "32M"}));
    assert!(err.contains("shrink=true"), "{err}");
    let err = s.call_err("image_resize", json!({"path": p, "size": "-1G"}));
    assert!(err.contains("shrink=true"), "{err}");
    assert_eq!(
        qemu_img_info(&path)["virtual-size"],
        1152 * MIB,
        "a refused shrink changes nothing"
    );

    let out = s.call_ok(
        "image_resize",
        json!({"path": p, "size": "32M", "shrink": true}),
    );
    assert_eq!(out["old_size"], 1152 * MIB);
    assert_eq!(out["new_size"], 32 * MIB);
    assert_eq!(qemu_img_info(&path)["virtual-size"], 32 * MIB);

    let out = s.call_ok(
        "image_resize",
        json!({"path": p, "size": "-16M", "shrink": true}),
    );
    assert_eq!(out["new_size"], 16 * MIB);

    // Same size: a no-op success.
    let out = s.call_ok("image_resize", json!({"path": p, "size": "16M"}));
    assert_eq!(out["old_size"], out["new_size"]);

    let err = s.call_err(
        "image_resize",
        json!({"path": p, "size": "-1G", "shrink": true}),
    );
    assert!(err.contains("only"), "{err}");
    assert_eq!(qemu_img_info(&path)["virtual-size"], 16 * MIB);

    // Raw images resize too.
    let raw = s.tmp.join("r.raw");
    s.call_ok(
        "image_create",
        json!({"path": raw.to_str().unwrap(), "size": "1M", "format": "raw"}),
    );
    s.call_ok(
        "image_resize",
        json!({"path": raw.to_str().unwrap(), "size": "+1M"}),
    );
    assert_eq!(std::fs::metadata(&raw).unwrap().len(), 2 * MIB);
}

#[test]
fn snapshots_create_list_apply_delete() {
    let mut s = Server::ready();
    let path = s.tmp.join("snap.qcow2");
    let p = path.to_str().unwrap();
    s.call_ok("image_create", json!({"path": p, "size": "8M"}));
    let out = s.call_ok("image_snapshot_list", json!({"path": p}));
    assert_eq!(out["snapshots"], json!([]));

    qemu_io_write(&path, "qcow2", 0xab, 0, MIB);
    let out = s.call_ok("image_snapshot_create", json!({"path": p, "tag": "clean"}));
    assert_eq!(out["action"], "created");
    assert_eq!(out["tag"], "clean");
    assert_eq!(tags(&out), vec!["clean"]);

    let out = s.call_ok("image_snapshot_list", json!({"path": p}));
    assert_eq!(tags(&out), vec!["clean"]);
    let snap = &out["snapshots"][0];
    assert!(snap["id"].as_str().is_some_and(|i| !i.is_empty()), "{snap}");
    assert!(
        snap["date"].as_str().is_some_and(|d| !d.is_empty()),
        "{snap}"
    );
    assert_eq!(snap["vm_state_size"], 0);

    // image_info shows the snapshot as well.
    let info = s.call_ok("image_info", json!({"path": p}));
    assert_eq!(tags(&info), vec!["clean"]);

    // A duplicate tag is refused and adds nothing.
    let err = s.call_err("image_snapshot_create", json!({"path": p, "tag": "clean"}));
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(
        tags(&s.call_ok("image_snapshot_list", json!({"path": p}))),
        vec!["clean"]
    );

    // Missing tags are refused, naming what exists.
    let err = s.call_err("image_snapshot_apply", json!({"path": p, "tag": "nope"}));
    assert!(err.contains("nope") && err.contains("clean"), "{err}");
    let err = s.call_err("image_snapshot_delete", json!({"path": p, "tag": "nope"}));
    assert!(err.contains("nope") && err.contains("clean"), "{err}");

    // Change the data, then apply: the old data is really back.
    qemu_io_write(&path, "qcow2", 0xcd, 0, MIB);
    assert!(qemu_io_reads(&path, "qcow2", 0xcd, 0, MIB));
    let out = s.call_ok("image_snapshot_create", json!({"path": p, "tag": "dirty"}));
    assert_eq!(tags(&out), vec!["clean", "dirty"]);
    let out = s.call_ok("image_snapshot_apply", json!({"path": p, "tag": "clean"}));
    assert_eq!(out["action"], "applied");
    assert!(
        qemu_io_reads(&path, "qcow2", 0xab, 0, MIB),
        "applying the snapshot did not revert the data"
    );
    s.call_ok("image_snapshot_apply", json!({"path": p, "tag": "dirty"}));
    assert!(qemu_io_reads(&path, "qcow2", 0xcd, 0, MIB));

    let out = s.call_ok("image_snapshot_delete", json!({"path": p, "tag": "clean"}));
    assert_eq!(out["action"], "deleted");
    assert_eq!(tags(&out), vec!["dirty"]);
    s.call_ok("image_snapshot_delete", json!({"path": p, "tag": "dirty"}));
    assert_eq!(
        s.call_ok("image_snapshot_list", json!({"path": p}))["snapshots"],
        json!([])
    );
    assert!(qemu_img_info(&path).get("snapshots").is_none_or_empty());
}

trait NoneOrEmpty {
    fn is_none_or_empty(&self) -> bool;
}

impl NoneOrEmpty for Option<&Value> {
    fn is_none_or_empty(&self) -> bool {
        match self {
            None => true,
            Some(v) => v.as_array().is_some_and(|a| a.is_empty()),
        }
    }
}

#[test]
fn snapshot_tags_are_validated() {
    let mut s = Server::ready();
    let path = s.tmp.join("t.qcow2");
    let p = path.to_str().unwrap();
    s.call_ok("image_create", json!({"path": p, "size": "1M"}));
    for bad in ["-lead", "has space", "a/b", "x;rm", ".dot"] {
        let err = s.call_err("image_snapshot_create", json!({"path": p, "tag": bad}));
        assert!(err.contains("tag"), "{bad}: {err}");
    }
    let long = "a".repeat(65);
    let err = s.call_err("image_snapshot_create", json!({"path": p, "tag": long}));
    assert!(err.contains("tag"), "{err}");
    let ok64 = "b".repeat(64);
    s.call_ok("image_snapshot_create", json!({"path": p, "tag": ok64}));
    assert_eq!(
        tags(&s.call_ok("image_snapshot_list", json!({"path": p}))),
        vec![ok64]
    );
    // Snapshots on a raw image are refused by qemu-img, surfacing as a tool error.
    let raw = s.tmp.join("t.raw");
    s.call_ok(
        "image_create",
        json!({"path": raw.to_str().unwrap(), "size": "1M", "format": "raw"}),
    );
    s.call_err(
        "image_snapshot_create",
        json!({"path": raw.to_str().unwrap(), "tag": "x"}),
    );
}

#[test]
fn overwrite_false_never_clobbers() {
    let mut s = Server::ready();
    let precious = s.tmp.join("precious.img");
    std::fs::write(&precious, b"precious data, not an image").unwrap();
    let p = precious.to_str().unwrap();

    let err = s.call_err("image_create", json!({"path": p, "size": "1M"}));
    assert!(
        err.contains("already exists") && err.contains("overwrite"),
        "{err}"
    );
    let err = s.call_err(
        "image_create",
        json!({"path": p, "size": "1M", "format": "raw", "overwrite": false}),
    );
    assert!(err.contains("already exists"), "{err}");

    let src = s.tmp.join("src.qcow2");
    s.call_ok(
        "image_create",
        json!({"path": src.to_str().unwrap(), "size": "1M"}),
    );
    let err = s.call_err(
        "image_convert",
        json!({"source": src.to_str().unwrap(), "dest": p}),
    );
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(
        std::fs::read(&precious).unwrap(),
        b"precious data, not an image"
    );

    // A dangling symlink counts as existing too, and is left alone.
    let link = s.tmp.join("link.qcow2");
    std::os::unix::fs::symlink(s.tmp.join("elsewhere"), &link).unwrap();
    s.call_err(
        "image_create",
        json!({"path": link.to_str().unwrap(), "size": "1M"}),
    );
    assert!(!s.tmp.join("elsewhere").exists());
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());

    // With overwrite=true it is replaced, by an image.
    let out = s.call_ok(
        "image_create",
        json!({"path": p, "size": "2M", "overwrite": true}),
    );
    assert_eq!(out["virtual_size"], 2 * MIB);
    assert_eq!(qemu_img_info(&precious)["format"], "qcow2");
    std::fs::write(&precious, b"precious again").unwrap();
    s.call_ok(
        "image_convert",
        json!({"source": src.to_str().unwrap(), "dest": p, "overwrite": true}),
    );
    assert_eq!(qemu_img_info(&precious)["format"], "qcow2");
    // No temporary files left.
    assert_eq!(
        list_dir(s.tmp.path()),
        vec![
            "link.qcow2",
            "precious.img",
            "runtime",
            "src.qcow2",
            "state"
        ]
    );
}

#[test]
fn path_with_comma_and_space_is_exactly_that_file() {
    let mut s = Server::ready();
    let dir = s.tmp.subdir("odd");
    let name = "my disk,readonly=on.qcow2";
    let path = dir.join(name);
    let p = path.to_str().unwrap();
    let out = s.call_ok("image_create", json!({"path": p, "size": "4M"}));
    assert_eq!(out["path"], p);
    assert_eq!(
        list_dir(&dir),
        vec![name.to_string()],
        "exactly that file, nothing else"
    );
    assert_eq!(qemu_img_info(&path)["format"], "qcow2");
    let out = s.call_ok("image_info", json!({"path": p}));
    assert_eq!(out["virtual_size"], 4 * MIB);

    // It works as a backing file, a conversion source and destination, and for snapshots.
    let overlay = dir.join("over lay,file=x.qcow2");
    let out = s.call_ok(
        "image_create",
        json!({"path": overlay.to_str().unwrap(), "size": "4M", "backing_file": p}),
    );
    assert_eq!(out["backing_file"], p);
    let chain = s.call_ok(
        "image_info",
        json!({"path": overlay.to_str().unwrap(), "backing_chain": true}),
    );
    assert_eq!(chain["chain"].as_array().unwrap().len(), 2);
    let conv = dir.join("conv, copy.raw");
    s.call_ok(
        "image_convert",
        json!({"source": p, "dest": conv.to_str().unwrap(), "format": "raw"}),
    );
    s.call_ok("image_snapshot_create", json!({"path": p, "tag": "s1"}));
    s.call_ok("image_resize", json!({"path": p, "size": "+1M"}));
    assert_eq!(
        list_dir(&dir),
        vec![
            "conv, copy.raw".to_string(),
            name.to_string(),
            "over lay,file=x.qcow2".to_string()
        ]
    );
}

#[test]
fn dot_segments_in_paths_are_resolved() {
    let mut s = Server::ready();
    let nested = s.tmp.subdir("a/b");
    let dotted = format!("{}/../b/./dot.qcow2", nested.to_str().unwrap());
    let out = s.call_ok("image_create", json!({"path": dotted, "size": "1M"}));
    assert_eq!(out["path"], nested.join("dot.qcow2").to_str().unwrap());
    assert!(nested.join("dot.qcow2").is_file());
}

/// Regression: qemu-img leaves an empty file behind when it refuses to create an image, which
/// then blocked every retry with "already exists".
#[test]
fn failed_create_leaves_no_file() {
    let mut s = Server::ready();
    let dir = s.tmp.subdir("fail");
    let path = dir.join("big.vpc");
    let err = s.call_err(
        "image_create",
        json!({"path": path.to_str().unwrap(), "size": "3000G", "format": "vpc"}),
    );
    assert!(err.contains("too large"), "{err}");
    assert!(
        err.contains("big.vpc") && !err.contains("mcqemu-tmp"),
        "names the real path: {err}"
    );
    assert!(
        list_dir(&dir).is_empty(),
        "left behind: {:?}",
        list_dir(&dir)
    );
    // The retry with a size the format accepts now works.
    let out = s.call_ok(
        "image_create",
        json!({"path": path.to_str().unwrap(), "size": "16M", "format": "vpc"}),
    );
    assert_eq!(out["format"], "vpc");
    assert_eq!(list_dir(&dir), vec!["big.vpc"]);
}

#[test]
fn image_progress_is_reported_for_convert() {
    let mut s = Server::ready();
    let src = s.tmp.join("p.qcow2");
    s.call_ok(
        "image_create",
        json!({"path": src.to_str().unwrap(), "size": "4M"}),
    );
    let (resp, others) = s.request_full(
        "tools/call",
        json!({"name": "image_convert",
               "arguments": {"source": src.to_str().unwrap(), "dest": s.tmp.file("p.raw"),
                             "format": "raw"},
               "_meta": {"progressToken": "conv"}}),
    );
    tool_ok(&resp["result"], "image_convert");
    let values: Vec<f64> = others
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .map(|m| m["params"]["progress"].as_f64().unwrap())
        .collect();
    // A convert this small is done within half a second: it says nothing (a longer one
    // reports at most twice a second, from half a second on).
    assert!(values.is_empty(), "{others:?}");
}
