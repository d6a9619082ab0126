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
use std::sync::OnceLock;
use std::time::Duration;

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
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = root.join("target").join("test-cloud");
    let script = root.join("tests").join("cloud").join("build_cloud.py");
    let v = super::cli::run_locked_builder("test cloud image", &script, &out, CLOUD_BUILD_TIMEOUT)?;
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
