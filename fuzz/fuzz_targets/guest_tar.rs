//! guest_copy_out's tar reader and extractor: the fuzz bytes are the archive a hostile guest
//! sends (names, links, sizes, truncation, huge headers). The real reader and extractor write
//! into a fresh folder below a sandbox folder; nothing may panic, nothing may be written outside
//! the extraction's own temporary folder, and no entry may leave a symlink that the extractor
//! followed (every path under the temporary is inside it when resolved without links).
#![no_main]

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use libfuzzer_sys::{fuzz_target, Corpus};
use mcqemu::state::extract::Extract;
use mcqemu::state::tar::Reader;
use mcqemu::state::tree::Folder;

/// Inputs above this are refused: a tar stream's blocks are 512 bytes; 64 KiB is many entries.
const MAX_INPUT: usize = 64 * 1024;
/// The content cap the copy applies (per copy): small, so a huge size is refused quickly.
const CAP: u64 = 1 << 20;

/// Every path below `dir` (links not followed), depth first.
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

fn sandbox() -> PathBuf {
    let d = std::env::temp_dir().join(format!("mcq-fuzz-tar-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("dest")).expect("the fuzz folder");
    // A file beside the destination that an escaping entry would overwrite.
    std::fs::write(d.join("beside"), b"untouched").expect("the marker file");
    d
}

fuzz_target!(|data: &[u8]| -> Corpus {
    if data.len() > MAX_INPUT {
        return Corpus::Reject;
    }
    let root = sandbox();
    let dest = root.join("dest");
    let folder = Folder::open(&dest).expect("open the destination");
    let tmp = OsString::from(".mcq-tmp");
    {
        let mut x = Extract::new(&folder, tmp.clone(), b"top");
        let mut tr = Reader::new(data);
        let mut ok = true;
        loop {
            match tr.next_entry() {
                Ok(Some(e)) => {
                    if x.counts.bytes.saturating_add(e.size) > CAP {
                        break;
                    }
                    if x.entry(&e, &mut tr).is_err() {
                        ok = false;
                        break;
                    }
                }
                Ok(None) => break,
                Err(_) => {
                    ok = false;
                    break;
                }
            }
        }
        if ok && x.started {
            let _ = x.finish();
        }
    }
    // Nothing outside dest/.mcq-tmp: the marker is untouched, dest holds only the temporary.
    assert_eq!(
        std::fs::read(root.join("beside")).expect("the marker file"),
        b"untouched",
        "an entry wrote beside the destination"
    );
    let mut top: Vec<PathBuf> = Vec::new();
    walk(&root, &mut top);
    for p in &top {
        assert!(
            p == &root.join("beside") || p == &dest || p.starts_with(dest.join(&tmp)),
            "written outside the extraction's temporary: {}",
            p.display()
        );
        // No hidden name is ever written below the temporary.
        if let Ok(rel) = p.strip_prefix(dest.join(&tmp)) {
            for c in rel.components() {
                let name = c.as_os_str().to_string_lossy();
                assert!(
                    !name.starts_with('.'),
                    "a hidden name was written: {}",
                    p.display()
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&root);
    Corpus::Keep
});
