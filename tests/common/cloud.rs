//! The test cloud image: a small Debian 12 (systemd, cloud-init limited to the NoCloud
//! datasource, qemu-guest-agent, the Debian kernel) built by `tests/cloud/build_cloud.py` with
//! mmdebstrap and `mke2fs -d`, booted directly from its kernel and initramfs.
//!
//! Under TCG on 2 cores its agent answers about 20-35 s after launch and cloud-init finishes
//! (with a NoCloud seed CD-ROM) at about 45-70 s; more on a loaded machine, and about 20 s more
//! without a NIC (systemd-networkd-wait-online's timeout). The agent starts before cloud-init
//! is done: wait for `/var/lib/cloud/instance/boot-finished` (or `cloud-init status` saying
//! `done`) before checking what the seed configured. Root has no password (serial console
//! login).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::cli::try_run_command;

/// Longest wait for the cloud-image build, its lock included (about 1-3 minutes when nothing is
/// cached: mmdebstrap downloads and installs ~190 packages; another test binary may be building
/// it).
pub const CLOUD_BUILD_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The test cloud image built by `tests/cloud/build_cloud.py`. Its files are shared by every
/// test (and cached across runs): boot a copy-on-write overlay of `disk`, never `disk` itself.
#[derive(Clone, Debug)]
pub struct CloudImage {
    /// The root file system: qcow2, 2 GiB virtual, ext4 on the whole device (no partition
    /// table), labelled `root`. A `manifest.json` next to it lists the package versions.
    pub disk: PathBuf,
    /// The Debian kernel (bzImage).
    pub kernel: PathBuf,
    /// Its initramfs (virtio-blk, ext4, and the CD-ROM and ISO 9660 / FAT drivers for the seed).
    pub initrd: PathBuf,
    /// The kernel command line: `root=/dev/vda rw console=ttyS0`, so `disk` must be the first
    /// virtio disk.
    pub append: String,
}

/// The test cloud image, built once per process (see [`try_test_cloud_image`]); fails the test
/// when it cannot be built.
pub fn test_cloud_image() -> CloudImage {
    try_test_cloud_image().unwrap_or_else(|e| panic!("{e}"))
}

/// Builds the test cloud image once per process into `<workspace>/target/test-cloud/<key>/`
/// (cached there across runs, keyed by the builder script and the package versions); later
/// calls return the first call's outcome. A file lock keeps two test binaries from building it
/// at the same time; the builder also renames its finished folder into place atomically.
/// Everything, the wait for the lock included, is bounded by [`CLOUD_BUILD_TIMEOUT`].
///
/// An `Err` (never a skip) when it cannot be built, e.g. when mmdebstrap or mke2fs is missing
/// (the message says to run `.ci/setup-host`) or when not running as root.
pub fn try_test_cloud_image() -> Result<CloudImage, String> {
    static IMAGE: OnceLock<Result<CloudImage, String>> = OnceLock::new();
    IMAGE.get_or_init(build).clone()
}

fn build() -> Result<CloudImage, String> {
    use std::os::unix::io::AsRawFd;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = root.join("target").join("test-cloud");
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let lock_path = out.join(".build.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("cannot open the cloud image build lock: {e}"))?;
    let deadline = Instant::now() + CLOUD_BUILD_TIMEOUT;
    // Released when `lock` closes.
    loop {
        // SAFETY: flock on a file descriptor we own; no memory is involved.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            break;
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "another build of the test cloud image held {} for over {CLOUD_BUILD_TIMEOUT:?}",
                lock_path.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let script = root.join("tests").join("cloud").join("build_cloud.py");
    let left = deadline.saturating_duration_since(Instant::now());
    let built = try_run_command(
        Command::new("python3").arg(&script).arg(&out),
        None,
        left.max(Duration::from_secs(1)),
    );
    drop(lock);
    let built = built.map_err(|e| {
        format!("tests/cloud/build_cloud.py: {e} (python3 is needed; run .ci/setup-host)")
    })?;
    if !built.status.success() {
        return Err(format!(
            "build_cloud.py failed ({}): {}",
            built.status,
            String::from_utf8_lossy(&built.stderr).trim()
        ));
    }
    let v: Value = serde_json::from_slice(&built.stdout).map_err(|e| {
        format!(
            "build_cloud.py printed no JSON ({e}): {}",
            String::from_utf8_lossy(&built.stdout)
        )
    })?;
    let field = |k: &str| {
        v[k].as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("build_cloud.py output lacks {k}: {v}"))
    };
    let image = CloudImage {
        disk: field("disk")?.into(),
        kernel: field("kernel")?.into(),
        initrd: field("initrd")?.into(),
        append: field("append")?,
    };
    for f in [&image.disk, &image.kernel, &image.initrd] {
        if !f.is_file() {
            return Err(format!(
                "build_cloud.py reported {} but it is missing",
                f.display()
            ));
        }
    }
    Ok(image)
}

/// `MCQEMU_ROOTS` for a server that boots the test cloud image: [`test_roots`] plus the cloud
/// image cache (`target/test-cloud`), where the image's disk, kernel and initramfs live.
///
/// [`test_roots`]: super::server::test_roots
pub fn cloud_roots() -> String {
    let cloud = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("test-cloud");
    let _ = std::fs::create_dir_all(&cloud);
    format!("{}:{}", super::server::test_roots(), cloud.display())
}
