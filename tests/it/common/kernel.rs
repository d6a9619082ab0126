//! Today's Debian cloud kernel packages for the servers the tests start: fetched with apt by
//! `tests/guest/kernel_deb.py` into `target/test-guest/kernel-debs` (kept across runs), and
//! named to every server in `MCQEMU_IMAGE_KERNEL_DEB` and `MCQEMU_IMAGE_KERNEL_DEB_AARCH64`.
//! mcqemu itself never runs apt; the tests do, so that a Debian kernel update that moves the
//! pinned package out of Debian's pool never breaks them.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// A kernel package on this host.
#[derive(Debug, Clone)]
pub struct KernelDeb {
    /// The `.deb`.
    pub path: PathBuf,
    /// Its SHA-256.
    pub sha256: String,
    /// The package's name.
    pub package: String,
}

impl KernelDeb {
    /// The value of `MCQEMU_IMAGE_KERNEL_DEB` naming this file (or `place`, a URL serving it).
    pub fn env_value(&self, place: &str) -> String {
        format!("{place}#sha256={}", self.sha256)
    }
}

/// The package of Debian architecture `deb_arch` (`amd64`, `arm64`), fetched once per process.
pub fn kernel_deb(deb_arch: &str) -> Result<KernelDeb, String> {
    static AMD64: OnceLock<Result<KernelDeb, String>> = OnceLock::new();
    static ARM64: OnceLock<Result<KernelDeb, String>> = OnceLock::new();
    let cell = match deb_arch {
        "amd64" => &AMD64,
        "arm64" => &ARM64,
        other => return Err(format!("no kernel package for {other}")),
    };
    cell.get_or_init(|| fetch(deb_arch)).clone()
}

fn fetch(deb_arch: &str) -> Result<KernelDeb, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = root.join("target").join("test-guest");
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(root.join("tests/guest/kernel_deb.py"))
        .args(["--arch", deb_arch])
        .arg(&out);
    let what = format!("the {deb_arch} kernel package");
    let stdout = super::cli::run_locked(&what, &mut cmd, &out, Duration::from_secs(900))?;
    let v: serde_json::Value = serde_json::from_slice(&stdout)
        .map_err(|e| format!("kernel_deb.py printed no JSON ({e})"))?;
    Ok(KernelDeb {
        path: PathBuf::from(v["path"].as_str().unwrap_or_default()),
        sha256: v["sha256"].as_str().unwrap_or_default().to_string(),
        package: v["package"].as_str().unwrap_or_default().to_string(),
    })
}

/// The variables that give a server the packages (a package that could not be fetched is
/// left out, and the server falls back to its pinned one).
pub fn kernel_env() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (deb_arch, var) in [
        ("amd64", "MCQEMU_IMAGE_KERNEL_DEB"),
        ("arm64", "MCQEMU_IMAGE_KERNEL_DEB_AARCH64"),
    ] {
        match kernel_deb(deb_arch) {
            Ok(k) => out.push((var.to_string(), k.env_value(&k.path.display().to_string()))),
            Err(e) => eprintln!("no {deb_arch} kernel package for the servers: {e}"),
        }
    }
    out
}
