//! The path resolver behind the roots: random trees of folders, files and symlinks (pointing
//! inside, outside, upwards, at themselves) under a temporary root, and random paths. No path
//! the roots accept may resolve outside the root when the kernel itself resolves it (the
//! oracle: open with O_PATH, then read /proc/self/fd/N back).
#![no_main]

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::{fuzz_target, Corpus};
use mcqemu::state::roots::{judge, resolve, Access, Origin, Root};

struct Playground {
    base: PathBuf,
}

fn playground() -> &'static Playground {
    static P: OnceLock<Playground> = OnceLock::new();
    P.get_or_init(|| {
        let base = std::env::temp_dir().join(format!("mcq-fuzz-roots-{}", std::process::id()));
        Playground { base }
    })
}

const NAMES: &[&str] = &["a", "b", ".h", "..", ".", "c d", "x"];

fn name(b: u8) -> &'static str {
    NAMES[b as usize % NAMES.len()]
}

/// A relative path of 1-3 components drawn from `bytes`.
fn rel(bytes: &[u8]) -> String {
    let n = 1 + bytes.first().copied().unwrap_or(0) as usize % 3;
    (0..n)
        .map(|i| name(bytes.get(i + 1).copied().unwrap_or(0)))
        .collect::<Vec<_>>()
        .join("/")
}

/// Where the kernel resolves `p` (None: it does not exist).
fn kernel_resolves(p: &Path) -> Option<PathBuf> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(p)
        .ok()?;
    use std::os::unix::io::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd())).ok()
}

fuzz_target!(|data: &[u8]| -> Corpus {
    if data.len() < 4 || data.len() > 512 {
        return Corpus::Reject;
    }
    let pg = playground();
    let _ = std::fs::remove_dir_all(&pg.base);
    let root = pg.base.join("root");
    let outside = pg.base.join("outside");
    for d in [&root, &outside] {
        if std::fs::create_dir_all(d).is_err() {
            return Corpus::Reject;
        }
    }
    let _ = std::fs::write(outside.join("secret"), b"s");
    // Build: each 4 bytes is one operation.
    let (ops, paths) = data.split_at(data.len() / 2);
    for op in ops.chunks(4) {
        let at = root.join(rel(&op[1..]));
        match op[0] % 4 {
            0 => {
                let _ = std::fs::create_dir_all(&at);
            }
            1 => {
                let _ = std::fs::write(&at, b"f");
            }
            2 => {
                let target = match op.get(3).copied().unwrap_or(0) % 5 {
                    0 => outside.clone(),
                    1 => outside.join("secret"),
                    2 => PathBuf::from("../outside"),
                    3 => PathBuf::from(".."),
                    _ => root.join(rel(&op[2..])),
                };
                let _ = std::os::unix::fs::symlink(target, &at);
            }
            _ => {
                let _ = std::os::unix::fs::symlink(&at, &at);
            }
        }
    }
    let canon_root = match std::fs::canonicalize(&root) {
        Ok(r) => r,
        Err(_) => return Corpus::Reject,
    };
    let roots = [Root {
        path: canon_root.clone(),
        writable: true,
        origin: Origin::Operator,
    }];
    for chunk in paths.chunks(4) {
        let p = root.join(rel(chunk));
        let Ok(resolved) = resolve(&p) else { continue };
        if judge(&resolved, Access::Write, &roots).is_err() {
            continue;
        }
        // Accepted: the kernel must agree that it lies inside the root.
        assert!(
            resolved.starts_with(&canon_root),
            "{p:?} accepted as {resolved:?}"
        );
        let real = kernel_resolves(&p).or_else(|| {
            p.parent()
                .and_then(kernel_resolves)
                .zip(p.file_name())
                .map(|(d, n)| d.join(n))
        });
        if let Some(real) = real {
            assert!(
                real.starts_with(&canon_root),
                "{p:?} was accepted (as {resolved:?}) but the kernel resolves it to {real:?}"
            );
        }
        assert!(
            !resolved
                .strip_prefix(&canon_root)
                .map(|r| r
                    .components()
                    .any(|c| c.as_os_str().as_bytes().starts_with(b".")))
                .unwrap_or(true),
            "{resolved:?} has a hidden component below the root"
        );
    }
    Corpus::Keep
});
