//! Container-image layers applied in order (whiteouts, opaque folders, hard links, replaced
//! folders): the fuzz bytes are split into up to three layer tars a hostile image could hold.
//! The real unpacker writes into a fresh root below a sandbox folder; nothing may panic,
//! nothing may be written outside the root, no device node may be made, and every path the
//! unpacker reports is one that exists below the root.
#![no_main]

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use libfuzzer_sys::{fuzz_target, Corpus};
use mcqemu::oci::unpack::Unpacker;
use mcqemu::state::tree::Folder;

/// Inputs above this are refused: a tar stream's blocks are 512 bytes; 64 KiB is many entries.
const MAX_INPUT: usize = 64 * 1024;
/// The content cap: small, so a huge size is refused quickly.
const CAP: u64 = 1 << 20;
/// What separates layers in an input.
const SPLIT: &[u8] = b"--LAYER--";

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        out.push(p.clone());
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&p, out);
        }
    }
}

fn layers(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    while out.len() < 2 {
        match rest.windows(SPLIT.len()).position(|w| w == SPLIT) {
            Some(i) => {
                out.push(&rest[..i]);
                rest = &rest[i + SPLIT.len()..];
            }
            None => break,
        }
    }
    out.push(rest);
    out
}

fuzz_target!(|data: &[u8]| -> Corpus {
    if data.len() > MAX_INPUT {
        return Corpus::Reject;
    }
    let sandbox = std::env::temp_dir().join(format!("mcq-fuzz-oci-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&sandbox);
    let root = sandbox.join("root");
    std::fs::create_dir_all(&root).expect("the fuzz folder");
    std::fs::write(sandbox.join("beside"), b"untouched").expect("the marker file");
    let mut u = Unpacker::new(Folder::open(&root).expect("open the root"), CAP);
    for layer in layers(data) {
        if u.layer(layer).is_err() {
            break;
        }
    }
    let out = u.finish();
    assert_eq!(
        std::fs::read(sandbox.join("beside")).expect("the marker file"),
        b"untouched",
        "a layer wrote beside the root"
    );
    let mut all = Vec::new();
    walk(&sandbox, &mut all);
    for p in &all {
        assert!(
            p == &sandbox.join("beside") || p.starts_with(&root),
            "written outside the root: {}",
            p.display()
        );
        let t = std::fs::symlink_metadata(p).expect("a listed path").file_type();
        assert!(
            !(t.is_block_device() || t.is_char_device() || t.is_fifo() || t.is_socket()),
            "a device, fifo or socket was made: {}",
            p.display()
        );
    }
    for path in out.meta.keys() {
        let p = root.join(String::from_utf8_lossy(path).as_ref());
        assert!(
            std::fs::symlink_metadata(&p).is_ok(),
            "the unpacker reports {} but it is not there",
            p.display()
        );
    }
    let _ = std::fs::remove_dir_all(&sandbox);
    Corpus::Keep
});
