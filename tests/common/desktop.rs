//! The desktop test image: Debian 12 with Xorg (modesetting on QEMU's std VGA through
//! bochs-drm, libinput for the PS/2 keyboard and the virtio tablet), openbox and a full-screen
//! Tk program (`tests/cloud/desktop_app.py`) that logs every input event it receives as JSON
//! lines to [`DesktopImage::events`]; built by `tests/cloud/build_desktop.py` and booted
//! directly from its kernel and initramfs.
//!
//! X starts at boot from a systemd unit; the mode is 1280x800 unless the kernel command line
//! has `mcqemu.mode=WxH`, and `desktop-mode WxH` in the guest switches it (xrandr) and
//! restarts the program, which then logs a new `ready` record with its widgets' rectangles.
//! Measured under TCG (1 vCPU, 512 MiB or 1 GiB alike, 2 host cores, load 2-7 from other
//! tests): the agent answers 36-122 s after launch, the program is ready 60-170 s after
//! launch (about 25 s after the agent); wait for its `ready` record, not for a fixed time.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// Longest wait for the desktop-image build, its lock included (about 2 minutes when nothing
/// is cached).
pub const DESKTOP_BUILD_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The desktop test image. Boot an overlay of `disk` (sandbox_vm does), never `disk` itself.
#[derive(Clone, Debug)]
pub struct DesktopImage {
    /// The root file system: qcow2, ext4 on the whole device; `manifest.json` beside it lists
    /// the package versions and the build times.
    pub disk: PathBuf,
    /// The Debian kernel.
    pub kernel: PathBuf,
    /// Its initramfs (virtio-blk and ext4).
    pub initrd: PathBuf,
    /// The kernel command line (`root=/dev/vda ...`).
    pub append: String,
    /// `manifest.json`.
    pub manifest: PathBuf,
    /// The program's event log in the guest.
    pub events: String,
}

/// The desktop test image, built once per process; fails the test when it cannot be built.
pub fn test_desktop_image() -> DesktopImage {
    try_test_desktop_image().unwrap_or_else(|e| panic!("{e}"))
}

/// Builds the desktop image once per process into `<workspace>/target/test-desktop/<key>/`
/// (cached there across runs, keyed by the scripts and the package versions), under the
/// builders' lock; an `Err` when it cannot be built (not root, a tool missing).
pub fn try_test_desktop_image() -> Result<DesktopImage, String> {
    static IMAGE: OnceLock<Result<DesktopImage, String>> = OnceLock::new();
    IMAGE.get_or_init(build).clone()
}

fn build() -> Result<DesktopImage, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = desktop_dir();
    let script = root.join("tests").join("cloud").join("build_desktop.py");
    let v =
        super::cli::run_locked_builder("desktop test image", &script, &out, DESKTOP_BUILD_TIMEOUT)?;
    let field = |k: &str| {
        v[k].as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("build_desktop.py output lacks {k}: {v}"))
    };
    let image = DesktopImage {
        disk: field("disk")?.into(),
        kernel: field("kernel")?.into(),
        initrd: field("initrd")?.into(),
        append: field("append")?,
        manifest: field("manifest")?.into(),
        events: field("events")?,
    };
    for f in [&image.disk, &image.kernel, &image.initrd, &image.manifest] {
        if !f.is_file() {
            return Err(format!(
                "build_desktop.py reported {} but it is missing",
                f.display()
            ));
        }
    }
    Ok(image)
}

fn desktop_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("test-desktop")
}

/// `MCQEMU_ROOTS` for a server that boots the desktop image: the test roots plus its cache.
pub fn desktop_roots() -> String {
    let dir = desktop_dir();
    let _ = std::fs::create_dir_all(&dir);
    format!("{}:{}", super::server::test_roots(), dir.display())
}
