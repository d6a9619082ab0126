//! The test guest: a tiny Linux built by `tests/guest/build_guest.py`, booted directly from its
//! kernel and initramfs.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

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
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = root.join("target").join("test-guest");
    let script = root.join("tests").join("guest").join("build_guest.py");
    let v = super::cli::run_locked_builder("test guest", &script, &out, GUEST_BUILD_TIMEOUT)?;
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
