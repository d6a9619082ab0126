//! The test guest: a tiny Linux built by `tests/guest/build_guest.py`, booted directly from its
//! kernel and initramfs.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::cli::try_run_command;

/// Longest wait for the test-guest build, its lock included (about 25 s when nothing is cached;
/// another test binary or the bench may be building it).
pub const GUEST_BUILD_TIMEOUT: Duration = Duration::from_secs(600);

/// The tiny Linux test guest built by `tests/guest/build_guest.py` (direct kernel boot).
#[derive(Clone, Debug)]
pub struct Guest {
    /// Uncompressed kernel (PVH-bootable vmlinux).
    pub kernel: String,
    /// The initramfs.
    pub initrd: String,
    /// The kernel command line to boot it with.
    pub append: String,
}

/// The test guest, built once per process (see [`try_test_guest`]); fails the test when it
/// cannot be built.
pub fn test_guest() -> Guest {
    try_test_guest().unwrap_or_else(|e| panic!("{e}"))
}

/// Builds the test guest once per process into `<workspace>/target/test-guest` (cached there by
/// package versions across runs); later calls return the first call's outcome. A file lock
/// keeps two test binaries (or a test binary and the bench) from building it at the same time;
/// the builder also renames its finished folder into place atomically. Everything, the wait for
/// the lock included, is bounded by [`GUEST_BUILD_TIMEOUT`].
pub fn try_test_guest() -> Result<Guest, String> {
    static GUEST: OnceLock<Result<Guest, String>> = OnceLock::new();
    GUEST.get_or_init(build).clone()
}

fn build() -> Result<Guest, String> {
    use std::os::unix::io::AsRawFd;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = root.join("target").join("test-guest");
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(out.join(".build.lock"))
        .map_err(|e| format!("cannot open the guest build lock: {e}"))?;
    let deadline = Instant::now() + GUEST_BUILD_TIMEOUT;
    // Released when `lock` closes.
    loop {
        // SAFETY: flock on a file descriptor we own; no memory is involved.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            break;
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "another build of the test guest held {} for over {GUEST_BUILD_TIMEOUT:?}",
                out.join(".build.lock").display()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let script = root.join("tests").join("guest").join("build_guest.py");
    let left = deadline.saturating_duration_since(Instant::now());
    let built = try_run_command(
        Command::new("python3").arg(&script).arg(&out),
        None,
        left.max(Duration::from_secs(1)),
    );
    drop(lock);
    let built = built.map_err(|e| format!("tests/guest/build_guest.py: {e}"))?;
    if !built.status.success() {
        return Err(format!(
            "build_guest.py failed ({}): {}",
            built.status,
            String::from_utf8_lossy(&built.stderr)
        ));
    }
    let v: Value = serde_json::from_slice(&built.stdout).map_err(|e| {
        format!(
            "build_guest.py printed no JSON ({e}): {}",
            String::from_utf8_lossy(&built.stdout)
        )
    })?;
    let field = |k: &str| {
        v[k].as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("build_guest.py output lacks {k}: {v}"))
    };
    Ok(Guest {
        kernel: field("kernel")?,
        initrd: field("initrd")?,
        append: field("append")?,
    })
}
