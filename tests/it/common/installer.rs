//! The Debian 12 installer ISO built by `tests/installer/build_installer.py` (Debian's own
//! netboot kernel and initrd on a grub-mkrescue ISO), for the install journey.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// Longest wait for the installer ISO build, its lock included (about 10 s when nothing is
/// cached: a 133 MB package download and grub-mkrescue).
pub const INSTALLER_BUILD_TIMEOUT: Duration = Duration::from_secs(600);

/// The installer ISO and what it was built from.
#[derive(Clone, Debug)]
pub struct Installer {
    /// The ISO (cached and shared: launch it as a CD-ROM, it is never written).
    pub iso: PathBuf,
    /// The version of debian-installer-12-netboot-amd64 it holds.
    pub version: String,
}

/// The cache folder: `<workspace>/target/test-installer` (one of the test roots).
pub fn installer_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("test-installer")
}

/// The installer ISO, built once per process into [`installer_dir`] (cached there by the
/// package's version across runs, under the build lock); fails the test when it cannot be
/// built.
pub fn test_installer() -> Installer {
    static ISO: OnceLock<Result<Installer, String>> = OnceLock::new();
    ISO.get_or_init(build)
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn build() -> Result<Installer, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = root
        .join("tests")
        .join("installer")
        .join("build_installer.py");
    let v = super::cli::run_locked_builder(
        "installer ISO",
        &script,
        &installer_dir(),
        INSTALLER_BUILD_TIMEOUT,
    )?;
    let field = |k: &str| {
        v[k].as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("build_installer.py output lacks {k}: {v}"))
    };
    Ok(Installer {
        iso: PathBuf::from(field("iso")?),
        version: field("version")?,
    })
}
