//! The image kernel: Debian's cloud kernel package, pinned per architecture by version,
//! URLs and SHA-256 (as the catalog pins cloud images), fetched with the resumable downloader
//! and unpacked in-process ([`crate::host::deb`]), so any Linux host boots container images
//! with no apt, dpkg, ar or xz. `MCQEMU_IMAGE_KERNEL_DEB` (`_AARCH64` for arm64) names another
//! package as `URL-or-path#sha256=HEX`, for operators who mirror Debian and for tests.
//!
//! A package becomes a folder keyed by its digest in `<state>/oci/boot/`: the kernel (the ELF
//! for PVH on x86_64, the raw Image on arm64), the few modules the initrd loads, and
//! `modules.ext4`, every module of the release with the `modules.dep` and `modules.alias`
//! depmod would write, attached read-only to the guest (mcqemu-agent mounts it at
//! `/lib/modules/RELEASE`). A cached folder is found with no network and no program run.

use crate::kind::Failed;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::host::kmod;
use crate::net::download::{self, Algo, Request};
use crate::ops::error::OpError;
use crate::ops::watch::CtxWatch;
use crate::ops::work::Work;
use crate::state::lockfile;

/// A kernel package mcqemu knows.
pub struct Pinned {
    /// The guest architecture.
    pub arch: &'static str,
    /// The package's name and version.
    pub package: &'static str,
    /// Its SHA-256.
    pub sha256: &'static str,
    /// Where it is: Debian's pool first (fast, until the package is superseded), then Debian's
    /// snapshot archive by the file's SHA-1 (kept for good). Plain http, as apt fetches: the
    /// digest is what is trusted, and TLS through a host's intercepting proxy fails with a
    /// CA that mcqemu's TLS roots do not hold.
    pub urls: &'static [&'static str],
}

/// The packages, checked against `apt-cache show` on 2026-12-06 (../shared/reference).
pub const PINNED: &[Pinned] = &[
    Pinned {
        arch: "x86_64",
        package: "linux-image-6.1.0-57-cloud-amd64 6.1.192-3",
        sha256: "4fdd0172a8c3f41a97e92465b2ac1867e1c10d82d7aeed3d26ee7a5d14df1754",
        urls: &[
            "http://deb.debian.org/debian-security/pool/updates/main/l/linux-signed-amd64/linux-image-6.1.0-57-cloud-amd64_6.1.192-3_amd64.deb",
            "http://snapshot.debian.org/file/c012d284d480c5bc14b557fa314d97b1dd7615c1",
        ],
    },
    Pinned {
        arch: "aarch64",
        package: "linux-image-6.1.0-57-cloud-arm64 6.1.192-3",
        sha256: "51952bf54e96b0bc6263fb51a47b79e206dca0213cd5421162bc55cddbd6e51e",
        urls: &[
            "http://deb.debian.org/debian-security/pool/updates/main/l/linux-signed-arm64/linux-image-6.1.0-57-cloud-arm64_6.1.192-3_arm64.deb",
            "http://snapshot.debian.org/file/7a4f4cfa6823b8af65aa5afa3e9000d82f129680",
        ],
    },
];

/// The largest package fetched (the cloud kernels are 21-27 MB).
const MAX_PACKAGE: u64 = 512 << 20;
/// How long a second server waits for the first one's fetch.
const FETCH_WAIT: Duration = Duration::from_secs(900);

/// Where a package comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// URLs to try in order, or one local file.
    pub places: Vec<String>,
    /// Its SHA-256, lower-case hex.
    pub sha256: String,
    /// What to call it in messages.
    pub label: String,
}

/// The variable that names another package for `arch`.
pub fn env_name(arch: &str) -> String {
    match arch {
        "x86_64" => "MCQEMU_IMAGE_KERNEL_DEB".to_string(),
        other => format!("MCQEMU_IMAGE_KERNEL_DEB_{}", other.to_ascii_uppercase()),
    }
}

/// The package for `arch`: the operator's, else the pinned one.
pub fn source(arch: &str) -> Result<Source, OpError> {
    let var = env_name(arch);
    if let Some(v) = std::env::var(&var).ok().filter(|v| !v.trim().is_empty()) {
        return parse_source(&v).map_err(|e| OpError::invalid(format!("{var}: {e}")));
    }
    let p = PINNED.iter().find(|p| p.arch == arch).ok_or_else(|| {
        OpError::invalid(format!(
            "mcqemu brings kernels for x86_64 and aarch64 image roots; for {arch} give kernel \
             (one with virtio PCI, block, console and ext4 built in), or name a Debian kernel \
             package in {var}=URL#sha256=HEX"
        ))
    })?;
    Ok(Source {
        places: p.urls.iter().map(|u| u.to_string()).collect(),
        sha256: p.sha256.to_string(),
        label: format!("Debian's {}", p.package),
    })
}

/// `URL-or-path#sha256=HEX`.
pub fn parse_source(v: &str) -> Result<Source, Failed> {
    let (place, digest) = v.trim().rsplit_once("#sha256=").ok_or(Failed::invalid(
        "give URL-or-path#sha256=HEX (the package's SHA-256 is required)",
    ))?;
    let sha256 = download::check_sha256(digest).map_err(|e| Failed::invalid(e.to_string()))?;
    let is_url = place.starts_with("http://") || place.starts_with("https://");
    if !is_url && !place.starts_with('/') {
        return Err(Failed::invalid(format!(
            "{place:?} is neither an http(s) URL nor an absolute path"
        )));
    }
    Ok(Source {
        places: vec![place.to_string()],
        label: format!("the package {place}"),
        sha256,
    })
}

/// The folder of kits.
pub fn cache() -> PathBuf {
    crate::state::paths::state_dir().join("oci").join("boot")
}

/// The layout of a kernel folder: a folder of another layout is never read as this one.
const LAYOUT: u32 = 2;

/// The folder `src` becomes.
pub fn home_of(src: &Source) -> PathBuf {
    cache().join(format!("kernel-{}-{LAYOUT}", &src.sha256[..16]))
}

/// What a kernel folder holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    /// Its folder.
    pub home: PathBuf,
    /// The kernel QEMU boots.
    pub kernel: PathBuf,
    /// The release (`uname -r`).
    pub release: String,
    /// The modules disk (ext4, read-only in the guest).
    pub modules_disk: PathBuf,
    /// Where it came from, for the record and doctor.
    pub source: String,
}

/// The kernel folder for `src` when it is cached (no network, no program).
pub fn cached(src: &Source) -> Option<Kernel> {
    let home = home_of(src);
    let source = std::fs::read_to_string(home.join("source")).ok()?;
    let release = std::fs::read_to_string(home.join("release")).ok()?;
    let kernel = ["vmlinux", "Image", "vmlinuz"]
        .iter()
        .map(|n| home.join(n))
        .find(|p| p.is_file())?;
    Some(Kernel {
        kernel,
        release: release.trim().to_string(),
        modules_disk: home.join("modules.ext4"),
        source: source.trim().to_string(),
        home,
    })
}

/// The kernel for `arch`, fetched and unpacked unless cached.
pub fn obtain(work: &dyn Work, arch: &str) -> Result<Kernel, OpError> {
    let src = source(arch)?;
    if let Some(k) = cached(&src) {
        return Ok(k);
    }
    std::fs::create_dir_all(cache())
        .map_err(|e| OpError::host(format!("cannot create {}: {e}", cache().display())))?;
    let home = home_of(&src);
    let lock_path = home.with_extension("lock");
    let _lock = lockfile::lock_within(&lock_path, FETCH_WAIT, &|| work.cancelled())
        .map_err(|e| OpError::host(format!("cannot lock {}: {e}", lock_path.display())))?
        .ok_or_else(|| OpError::busy("another server is fetching the image kernel; try again"))?;
    if let Some(k) = cached(&src) {
        return Ok(k);
    }
    let deb = fetch(work, &src)?;
    let tmp = cache().join(format!(
        ".kernel-{}.{}.tmp",
        &src.sha256[..16],
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    let made = unpack(work, &deb, &src, &tmp).and_then(|()| {
        std::fs::rename(&tmp, &home)
            .map_err(|e| OpError::host(format!("cannot place {}: {e}", home.display())))
    });
    let _ = std::fs::remove_dir_all(&tmp);
    if !src.places[0].starts_with('/') {
        let _ = std::fs::remove_file(&deb);
    }
    made?;
    cached(&src).ok_or_else(|| {
        OpError::host(format!(
            "{} was unpacked into {} but holds no kernel",
            src.label,
            home.display()
        ))
    })
}

/// The package as a local file, its digest checked: a path as given, a URL downloaded (and
/// resumed) beside the cache, from the first place that has it.
fn fetch(work: &dyn Work, src: &Source) -> Result<PathBuf, OpError> {
    let first = &src.places[0];
    if first.starts_with('/') {
        let p = PathBuf::from(first);
        let digest = crate::net::digest::sha256_file(&p)
            .map_err(|e| OpError::not_found(format!("{}: {e}", p.display())))?;
        return match digest == src.sha256 {
            true => Ok(p),
            false => Err(mismatch(src, &digest)),
        };
    }
    let dest = cache().join(format!("kernel-{}.deb", &src.sha256[..16]));
    let mut errors = Vec::new();
    for url in &src.places {
        work.progress_phase(&format!("fetching the image kernel ({})", src.label));
        let req = Request {
            url,
            dest: &dest,
            algo: Algo::Sha256,
            expect: Some(src.sha256.clone()),
            overwrite: true,
            max_bytes: Some(MAX_PACKAGE),
            resume: true,
        };
        match download::download(&req, &CtxWatch(work)) {
            Ok(_) => return Ok(dest),
            Err(download::DownloadError::Checksum { got, .. }) => return Err(mismatch(src, &got)),
            Err(e) if work.cancelled() => return Err(OpError::from(e)),
            Err(e) => errors.push(format!("{url}: {e}")),
        }
    }
    Err(OpError::host(format!(
        "cannot fetch the image kernel ({}): {}; give kernel, or name a reachable copy in \
         MCQEMU_IMAGE_KERNEL_DEB=URL-or-path#sha256={}",
        src.label,
        errors.join("; "),
        src.sha256
    )))
}

fn mismatch(src: &Source, got: &str) -> OpError {
    OpError::invalid(format!(
        "{} is not the package asked for: its SHA-256 is {got}, not {}; nothing was kept",
        src.label, src.sha256
    ))
}

/// Unpacks `deb` into `dir`: the kernel, the initrd's modules, the modules disk, `release`
/// and `source`.
fn unpack(work: &dyn Work, deb: &Path, src: &Source, dir: &Path) -> Result<(), OpError> {
    work.progress_phase(&format!("unpacking the image kernel ({})", src.label));
    let x = dir.join("x");
    let host = |what: &Path, e: std::io::Error| OpError::host(format!("{}: {e}", what.display()));
    let keep = |p: &str| p.starts_with("boot/vmlinuz-") || p.starts_with("lib/modules/");
    crate::host::deb::extract(deb, &x, &keep, &|| work.cancelled())
        .map_err(|e| OpError::invalid(format!("{} cannot be unpacked: {e}", src.label)))?;
    let vmlinuz = std::fs::read_dir(x.join("boot"))
        .ok()
        .and_then(|d| d.flatten().map(|e| e.path()).next())
        .ok_or_else(|| OpError::invalid(format!("{} holds no boot/vmlinuz-*", src.label)))?;
    let release = vmlinuz
        .file_name()
        .map(|n| {
            n.to_string_lossy()
                .trim_start_matches("vmlinuz-")
                .to_string()
        })
        .unwrap_or_default();
    let bz = std::fs::read(&vmlinuz).map_err(|e| host(&vmlinuz, e))?;
    std::fs::write(dir.join("vmlinuz"), &bz).map_err(|e| host(&dir.join("vmlinuz"), e))?;
    if let Some(elf) = crate::host::vmlinux::extract(&bz) {
        std::fs::write(dir.join("vmlinux"), elf).map_err(|e| host(&dir.join("vmlinux"), e))?;
    }
    if let Some(image) = arm64_image(&bz) {
        std::fs::write(dir.join("Image"), image).map_err(|e| host(&dir.join("Image"), e))?;
    }
    let tree = x.join("lib/modules").join(&release);
    let initrd_mods = dir.join("modules");
    std::fs::create_dir_all(&initrd_mods).map_err(|e| host(&initrd_mods, e))?;
    let mut mods = BTreeMap::new();
    let mut content = 0u64;
    collect(&tree, &tree, &mut mods, &mut content).map_err(|e| host(&tree, e))?;
    for rel in mods.keys() {
        if MODULES.contains(&kmod::name_of(rel).as_str()) {
            let name = rel.rsplit('/').next().unwrap_or(rel);
            std::fs::copy(tree.join(rel), initrd_mods.join(name))
                .map_err(|e| host(&tree.join(rel), e))?;
        }
    }
    let builtin = std::fs::read_to_string(tree.join("modules.builtin")).unwrap_or_default();
    for (name, bytes) in kmod::depmod(&mods, &builtin) {
        std::fs::write(tree.join(name), bytes).map_err(|e| host(&tree.join(name), e))?;
    }
    work.progress_phase("building the modules disk");
    crate::oci::rootfs::build(
        crate::oci::rootfs::Fs {
            label: crate::state::config::MODULES_LABEL,
            read_only: true,
        },
        &tree,
        &BTreeMap::new(),
        content,
        &dir.join("modules.ext4"),
        &|| work.cancelled(),
    )
    .map_err(|e| OpError::host(format!("the modules disk: {e}")))?;
    std::fs::remove_dir_all(&x).map_err(|e| host(&x, e))?;
    std::fs::write(dir.join("release"), format!("{release}\n")).map_err(|e| host(dir, e))?;
    std::fs::write(
        dir.join("source"),
        format!(
            "{} (sha256 {}), {} modules\n",
            src.label,
            src.sha256,
            mods.len()
        ),
    )
    .map_err(|e| host(dir, e))
}

/// Every `.ko` below `dir` (paths relative to `top`) with its `.modinfo`; `content` counts the
/// bytes of all files.
fn collect(
    top: &Path,
    dir: &Path,
    mods: &mut BTreeMap<String, kmod::ModInfo>,
    content: &mut u64,
) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let p = e.path();
        let t = e.file_type()?;
        if t.is_dir() {
            collect(top, &p, mods, content)?;
        } else if t.is_file() {
            *content += e.metadata()?.len();
            let rel = p
                .strip_prefix(top)
                .map(|r| r.to_string_lossy().into_owned())
                .unwrap_or_default();
            if rel.ends_with(".ko") {
                let info = kmod::modinfo(&std::fs::read(&p)?).unwrap_or_default();
                mods.insert(rel, info);
            }
        }
    }
    Ok(())
}

/// The modules the initrd loads, in dependency order; those a kernel lacks (built in) are left
/// out.
pub(super) const MODULES: &[&str] = &[
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "virtio_blk",
    "virtio_console",
    "failover",
    "net_failover",
    "virtio_net",
];

/// The raw arm64 Image QEMU's `-kernel` takes on the virt board: Debian's vmlinuz for arm64 is
/// that Image gzip'd (or already raw); None when it is not an arm64 kernel.
pub(super) fn arm64_image(vmlinuz: &[u8]) -> Option<Vec<u8>> {
    use std::io::Read;
    let raw = if vmlinuz.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(vmlinuz)
            .take(256 << 20)
            .read_to_end(&mut out)
            .ok()?;
        out
    } else {
        vmlinuz.to_vec()
    };
    (raw.get(0x38..0x3c)? == b"ARM\x64").then_some(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operator_package_is_a_url_or_an_absolute_path_with_its_digest() {
        let hex = "ab".repeat(32);
        let s = parse_source(&format!("http://127.0.0.1:8080/k.deb#sha256={hex}")).unwrap();
        assert_eq!(s.places, vec!["http://127.0.0.1:8080/k.deb".to_string()]);
        assert_eq!(s.sha256, hex);
        let s = parse_source(&format!("/srv/k.deb#sha256={}", hex.to_uppercase())).unwrap();
        assert_eq!(s.sha256, hex);
        assert!(parse_source("/srv/k.deb")
            .unwrap_err()
            .msg
            .contains("sha256"));
        assert!(parse_source(&format!("k.deb#sha256={hex}"))
            .unwrap_err()
            .msg
            .contains("absolute"));
        assert!(parse_source("/k.deb#sha256=12").is_err());
        assert_eq!(env_name("aarch64"), "MCQEMU_IMAGE_KERNEL_DEB_AARCH64");
        for p in PINNED {
            assert_eq!(p.sha256.len(), 64);
            assert!(p.urls.iter().all(|u| u.starts_with("http://")));
        }
    }
}
