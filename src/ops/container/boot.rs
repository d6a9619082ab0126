//! What boots a container image's root: an image has no kernel, so mcqemu brings one, and an
//! initrd whose `/init` is mcqemu-agent with the few modules the kernel needs to reach the
//! root's disk and the host (virtio PCI, block, console, net). The agent mounts the root's
//! disk (`mcqemu.root=/dev/vda`), makes it `/` and applies the image's config.
//!
//! The kernel is the user's (`kernel`: its drivers must be built in, the initrd then carries
//! only the agent), or Debian's cloud kernel, which mcqemu obtains once per version with
//! `apt-get download`: apt checks the package against the SHA-256 in Debian's signed package
//! index, and the package's own SHA-256 is kept beside the kernel (`source`). For x86_64 and
//! aarch64; a foreign architecture's packages come through apt lists of their own in the
//! cache. Kits are cached in `<state>/oci/boot/`, the initrd keyed by the agent's digest.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::host::cpio::Cpio;
use crate::host::run::{run, RunError};
use crate::ops::error::OpError;
use crate::ops::work::Work;
use crate::state::lockfile;

/// A guest architecture's kernel as mcqemu obtains it.
struct Flavour {
    /// The guest architecture.
    arch: &'static str,
    /// Debian's package that depends on the newest cloud kernel.
    meta: &'static str,
    /// Debian's name of the architecture.
    deb_arch: &'static str,
    /// The serial console.
    console: &'static str,
}

const FLAVOURS: &[Flavour] = &[
    Flavour {
        arch: "x86_64",
        meta: "linux-image-cloud-amd64",
        deb_arch: "amd64",
        console: "ttyS0",
    },
    Flavour {
        arch: "aarch64",
        meta: "linux-image-cloud-arm64",
        deb_arch: "arm64",
        console: "ttyAMA0",
    },
];
/// How old apt lists of a foreign architecture may be before they are refreshed: Debian's
/// archive keeps only the newest kernel, so old lists name packages that are gone.
const LISTS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// The modules the initrd loads, in dependency order; those a kernel lacks (built in) are left
/// out.
const MODULES: &[&str] = &[
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "virtio_mmio",
    "virtio_blk",
    "virtio_console",
    "failover",
    "net_failover",
    "virtio_net",
    "fuse",
];
/// The kernel command line for a guest of `arch`: the root's disk, the serial console, no
/// reboot loop on a panic.
pub fn append(arch: &str) -> String {
    let console = FLAVOURS
        .iter()
        .find(|f| f.arch == arch)
        .map_or("ttyS0", |f| f.console);
    format!("console={console} mcqemu.root=/dev/vda panic=-1 loglevel=4 cryptomgr.notests")
}
/// The longest apt may take.
const APT_TIMEOUT: Duration = Duration::from_secs(600);

/// A kernel and initrd for an image root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kit {
    /// The kernel.
    pub kernel: PathBuf,
    /// The initrd (the agent as /init, the modules).
    pub initrd: PathBuf,
    /// Where the kernel came from (`the user's kernel`, or the Debian package, version and
    /// digest).
    pub source: String,
}

/// The folder kits are cached in.
fn cache() -> PathBuf {
    crate::state::paths::state_dir().join("oci").join("boot")
}

/// The kit for a guest of `arch`: around `kernel` when the user gives one, else Debian's.
pub fn kit(work: &dyn Work, arch: &str, kernel: Option<&Path>) -> Result<Kit, OpError> {
    let agent_path = crate::host::agent::find(arch).map_err(OpError::new)?;
    let agent = std::fs::read(&agent_path).map_err(|e| {
        OpError::new(format!(
            "cannot read the agent {}: {e}",
            agent_path.display()
        ))
    })?;
    let tag = &crate::oci::layout::sha256_hex(&agent)[..16];
    std::fs::create_dir_all(cache())
        .map_err(|e| OpError::new(format!("cannot create {}: {e}", cache().display())))?;
    let (kernel, modules, source, home) = match kernel {
        Some(k) => (
            k.to_path_buf(),
            None,
            format!("the user's kernel {}", k.display()),
            cache().join("user"),
        ),
        None => {
            let home = debian_kernel(work, arch)?;
            let source = std::fs::read_to_string(home.join("source")).unwrap_or_default();
            // The ELF boots through PVH, faster than the bzImage (see host::vmlinux); an
            // arm64 kernel is its unpacked Image.
            let kernel = ["vmlinux", "Image"]
                .iter()
                .map(|n| home.join(n))
                .find(|p| p.is_file())
                .unwrap_or_else(|| home.join("vmlinuz"));
            (kernel, Some(home.join("modules")), source, home)
        }
    };
    std::fs::create_dir_all(&home)
        .map_err(|e| OpError::new(format!("cannot create {}: {e}", home.display())))?;
    let initrd = home.join(format!("initrd-{tag}.cpio"));
    if !initrd.is_file() {
        let bytes = initrd_bytes(&agent, modules.as_deref())?;
        let tmp = home.join(format!("initrd-{tag}.{}.tmp", std::process::id()));
        std::fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.sync_all()))
            .and_then(|()| std::fs::rename(&tmp, &initrd))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                OpError::new(format!("cannot write {}: {e}", initrd.display()))
            })?;
    }
    Ok(Kit {
        kernel,
        initrd,
        source: source.trim().to_string(),
    })
}

/// The initrd: the agent as /init, and the modules found in `modules` (none for a user's
/// kernel) listed for it to load.
fn initrd_bytes(agent: &[u8], modules: Option<&Path>) -> Result<Vec<u8>, OpError> {
    let mut c = Cpio::new();
    for d in [
        "dev",
        "proc",
        "sys",
        "tmp",
        "run",
        "etc",
        "etc/mcqemu-agent",
        "lib",
        "lib/modules",
        "newroot",
    ] {
        c.dir(d);
    }
    c.chardev("dev/console", 5, 1);
    c.chardev("dev/null", 1, 3);
    c.file("init", agent, 0o755);
    let mut list = String::new();
    for m in modules.map_or(&[][..], |_| MODULES) {
        let Some(p) = modules.map(|d| d.join(format!("{m}.ko"))) else {
            continue;
        };
        let Ok(data) = std::fs::read(&p) else {
            continue;
        };
        c.file(&format!("lib/modules/{m}.ko"), &data, 0o644);
        list.push_str(&format!("/lib/modules/{m}.ko\n"));
    }
    c.file("etc/mcqemu-agent/modules", list.as_bytes(), 0o644);
    Ok(c.finish())
}

/// Debian's cloud kernel for `arch`, obtained unless cached: its folder (vmlinuz, modules/,
/// source).
fn debian_kernel(work: &dyn Work, arch: &str) -> Result<PathBuf, OpError> {
    let Some(f) = FLAVOURS.iter().find(|f| f.arch == arch) else {
        return Err(OpError::invalid(format!(
            "mcqemu obtains kernels for x86_64 and aarch64 image roots; for {arch} give kernel \
             (one with virtio PCI, block, console and ext4 built in)"
        )));
    };
    let opts = apt_options(work, f)?;
    let meta = qualified(f, f.meta);
    let argv: Vec<&str> = std::iter::once("apt-cache")
        .chain(opts.iter().map(String::as_str))
        .chain(["depends", &meta])
        .collect();
    let depends = apt(work, &argv, None)?;
    let pkg = depends
        .lines()
        .find_map(|l| l.trim().strip_prefix("Depends: "))
        .filter(|p| p.starts_with("linux-image-"))
        .map(|p| p.split(':').next().unwrap_or(p).to_string())
        .ok_or_else(|| {
            OpError::not_found(format!(
                "apt knows no {meta}; run 'apt-get update', or give kernel"
            ))
        })?;
    let home = cache().join(&pkg);
    if home.join("source").is_file() {
        return Ok(home);
    }
    let lock_path = cache().join(format!("{pkg}.lock"));
    let _lock = lockfile::lock_within(&lock_path, APT_TIMEOUT, &|| work.cancelled())
        .map_err(|e| OpError::new(format!("cannot lock {}: {e}", lock_path.display())))?
        .ok_or_else(|| OpError::busy("another server is fetching the kernel; try again"))?;
    if home.join("source").is_file() {
        return Ok(home);
    }
    work.progress_phase(&format!("fetching the kernel ({pkg})"));
    let tmp = cache().join(format!("{pkg}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let made = fetch_kernel(work, &opts, &qualified(f, &pkg), &tmp).and_then(|()| {
        let _ = std::fs::remove_dir_all(&home);
        std::fs::rename(&tmp, &home)
            .map_err(|e| OpError::new(format!("cannot place {}: {e}", home.display())))
    });
    let _ = std::fs::remove_dir_all(&tmp);
    made.map(|()| home)
}

/// The package name as apt must be told it: with `:ARCH` for a foreign architecture.
fn qualified(f: &Flavour, pkg: &str) -> String {
    if f.arch == crate::host::get().arch {
        pkg.to_string()
    } else {
        format!("{pkg}:{}", f.deb_arch)
    }
}

/// apt's options for `f`'s packages: none on a host of that architecture; else lists of their
/// own in the kit cache with the architecture added (the host's sources, its lists and its
/// package cache are left alone), refreshed once a day.
fn apt_options(work: &dyn Work, f: &Flavour) -> Result<Vec<String>, OpError> {
    if f.arch == crate::host::get().arch {
        return Ok(Vec::new());
    }
    let base = cache().join(format!("apt-{}", f.deb_arch));
    let opts: Vec<String> = [
        format!("APT::Architectures::={}", f.deb_arch),
        format!("Dir::State::Lists={}", base.join("lists").display()),
        format!("Dir::Cache={}", base.join("cache").display()),
        "APT::Sandbox::User=root".to_string(),
    ]
    .into_iter()
    .flat_map(|o| ["-o".to_string(), o])
    .collect();
    let stamp = base.join("updated");
    let fresh = std::fs::metadata(&stamp)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age < LISTS_MAX_AGE);
    if !fresh {
        for d in ["lists/partial", "cache/archives/partial"] {
            std::fs::create_dir_all(base.join(d))
                .map_err(|e| OpError::new(format!("cannot create {}: {e}", base.display())))?;
        }
        work.progress_phase(&format!("reading Debian's {} package lists", f.deb_arch));
        let argv: Vec<&str> = std::iter::once("apt-get")
            .chain(opts.iter().map(String::as_str))
            .chain(["-q", "update"])
            .collect();
        apt(work, &argv, None)?;
        std::fs::write(&stamp, b"")
            .map_err(|e| OpError::new(format!("cannot write {}: {e}", stamp.display())))?;
    }
    Ok(opts)
}

/// Downloads and unpacks kernel package `pkg` into `dir` (the kernel, modules/, source).
fn fetch_kernel(work: &dyn Work, opts: &[String], pkg: &str, dir: &Path) -> Result<(), OpError> {
    let debs = dir.join("deb");
    let x = dir.join("x");
    std::fs::create_dir_all(&debs)
        .map_err(|e| OpError::new(format!("cannot create {}: {e}", debs.display())))?;
    let argv: Vec<&str> = std::iter::once("apt-get")
        .chain(opts.iter().map(String::as_str))
        .chain(["download", "-o", "APT::Sandbox::User=root", pkg])
        .collect();
    apt(work, &argv, Some(&debs))?;
    let deb = std::fs::read_dir(&debs)
        .ok()
        .and_then(|d| {
            d.flatten()
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|e| e == "deb"))
        })
        .ok_or_else(|| OpError::new(format!("apt-get download {pkg} left no package")))?;
    let digest = std::fs::read(&deb)
        .map(|b| crate::oci::layout::sha256_hex(&b))
        .map_err(|e| OpError::new(format!("cannot read {}: {e}", deb.display())))?;
    let deb_arg = deb.display().to_string();
    let x_arg = x.display().to_string();
    apt(work, &["dpkg-deb", "-x", &deb_arg, &x_arg], None)?;
    let boot = x.join("boot");
    let vmlinuz = std::fs::read_dir(&boot)
        .ok()
        .and_then(|d| {
            d.flatten().map(|e| e.path()).find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
            })
        })
        .ok_or_else(|| OpError::new(format!("{pkg} holds no boot/vmlinuz-*")))?;
    let host = |what: &Path, e: std::io::Error| OpError::new(format!("{}: {e}", what.display()));
    std::fs::rename(&vmlinuz, dir.join("vmlinuz")).map_err(|e| host(&vmlinuz, e))?;
    let bz = std::fs::read(dir.join("vmlinuz")).map_err(|e| host(&dir.join("vmlinuz"), e))?;
    if let Some(elf) = crate::host::vmlinux::extract(&bz) {
        std::fs::write(dir.join("vmlinux"), elf).map_err(|e| host(&dir.join("vmlinux"), e))?;
    }
    if let Some(image) = arm64_image(&bz) {
        std::fs::write(dir.join("Image"), image).map_err(|e| host(&dir.join("Image"), e))?;
    }
    let modules = dir.join("modules");
    std::fs::create_dir_all(&modules).map_err(|e| host(&modules, e))?;
    let mut found = Vec::new();
    collect_modules(&x.join("lib/modules"), &modules, &mut found)
        .map_err(|e| host(&x.join("lib/modules"), e))?;
    let _ = std::fs::remove_dir_all(&x);
    let _ = std::fs::remove_dir_all(&debs);
    let deb_name = deb
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    std::fs::write(
        dir.join("source"),
        format!(
            "Debian package {deb_name} (sha256 {digest}), checked by apt against Debian's signed \
             package index; modules {}\n",
            found.join(" ")
        ),
    )
    .map_err(|e| host(dir, e))
}

/// The raw arm64 Image QEMU's `-kernel` takes on the virt board: Debian's vmlinuz for arm64 is
/// that Image gzip'd (or already raw); None when it is not an arm64 kernel.
fn arm64_image(vmlinuz: &[u8]) -> Option<Vec<u8>> {
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

/// Copies the `.ko` files named in [`MODULES`] found below `from` into `to`.
fn collect_modules(from: &Path, to: &Path, found: &mut Vec<String>) -> std::io::Result<()> {
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let t = e.file_type()?;
        let p = e.path();
        if t.is_dir() {
            collect_modules(&p, to, found)?;
        } else if t.is_file() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(m) = name.strip_suffix(".ko").filter(|m| MODULES.contains(m)) {
                std::fs::copy(&p, to.join(&name))?;
                found.push(m.to_string());
            }
        }
    }
    Ok(())
}

/// Runs an apt or dpkg tool; its stdout, or an error with its words.
fn apt(work: &dyn Work, argv: &[&str], dir: Option<&Path>) -> Result<String, OpError> {
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..]);
    if let Some(d) = dir {
        cmd.current_dir(d);
    }
    let r = run(&mut cmd, APT_TIMEOUT, &|| work.cancelled()).map_err(|e| match e {
        RunError::NotFound(p) => OpError::not_found(format!(
            "{p} is not installed: mcqemu obtains image kernels with apt (Debian, Ubuntu); on \
             other hosts give kernel"
        )),
        RunError::Cancelled(_) => OpError::cancelled("cancelled while fetching the kernel"),
        other => OpError::new(format!("{}: {other}", argv.join(" "))),
    })?;
    if !r.status.success() {
        return Err(OpError::new(format!(
            "{} failed ({}): {}",
            argv.join(" "),
            r.status,
            String::from_utf8_lossy(&r.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&r.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_initrd_has_the_agent_as_init_and_lists_only_the_modules_present() {
        let dir = std::env::temp_dir().join(format!("mcq-initrd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("virtio_blk.ko"), b"ko").unwrap();
        let a = initrd_bytes(b"\x7fELF-agent", Some(&dir)).unwrap();
        let text = String::from_utf8_lossy(&a);
        assert!(text.contains("init\0"));
        assert!(text.contains("/lib/modules/virtio_blk.ko\n"));
        assert!(!text.contains("virtio_net.ko"));
        let bare = initrd_bytes(b"\x7fELF-agent", None).unwrap();
        assert!(
            !String::from_utf8_lossy(&bare).contains(".ko"),
            "a user's kernel gets no modules"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
