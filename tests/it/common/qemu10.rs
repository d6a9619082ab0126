//! QEMU 10.0 beside the system's 7.2: unpacked from Debian bookworm-backports by
//! `.ci/fetch-qemu10` into `target/qemu10` (once, under a lock, cached across runs), run through
//! the wrappers in its `bin/` (they set `QEMU_MODULE_DIR` and its own data folders, which
//! Debian's non-relocatable build needs). A server started with [`Qemu10::env`] launches every
//! VM with it; the tests that must hold on both QEMUs run again with `MCQEMU_QEMU_DIR` set.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// Longest wait for the unpacking, the lock included (apt update and ~40 MB of packages).
pub const QEMU10_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The unpacked QEMU 10.
#[derive(Clone, Debug)]
pub struct Qemu10 {
    /// The folder of its wrappers (`qemu-system-x86_64`, `qemu-img`): `MCQEMU_QEMU_DIR`.
    pub bin: PathBuf,
}

impl Qemu10 {
    /// The environment that makes a server use it.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![("MCQEMU_QEMU_DIR", self.bin.display().to_string())]
    }
}

/// QEMU 10, unpacked at the first call of the process; an error (never a skip) when it cannot
/// be had.
pub fn qemu10() -> Qemu10 {
    static Q: OnceLock<Result<Qemu10, String>> = OnceLock::new();
    Q.get_or_init(fetch)
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn fetch() -> Result<Qemu10, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dest = root.join("target").join("qemu10");
    let lock_dir = root.join("target").join("qemu10.lock.d");
    let mut cmd = Command::new("bash");
    cmd.arg(root.join(".ci").join("fetch-qemu10")).arg(&dest);
    let out = super::cli::run_locked("QEMU 10 unpacking", &mut cmd, &lock_dir, QEMU10_TIMEOUT)?;
    let line = String::from_utf8_lossy(&out);
    let bin = line
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("MCQEMU_QEMU_DIR="))
        .map(PathBuf::from)
        .ok_or_else(|| format!(".ci/fetch-qemu10 printed no MCQEMU_QEMU_DIR: {line}"))?;
    if !bin.join("qemu-system-x86_64").is_file() {
        return Err(format!("{} has no qemu-system-x86_64", bin.display()));
    }
    Ok(Qemu10 { bin })
}
