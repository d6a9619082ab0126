//! What boots a container image's root: an image has no kernel, so mcqemu brings one, and an
//! initrd whose `/init` is mcqemu-agent with the few modules the kernel needs to reach the
//! root's disk and the host (virtio PCI, block, console, net). The agent mounts the root's
//! disk (`mcqemu.root=/dev/vda`), makes it `/` and applies the image's config.
//!
//! The kernel is the user's (`kernel`: its drivers must be built in, the initrd then carries
//! only the agent), or Debian's cloud kernel ([`super::kernel`]: fetched once per package
//! without apt, with every module of the release on a read-only disk beside the root). For
//! x86_64 and aarch64. Kits are cached in `<state>/oci/boot/`, the initrd keyed by the agent's
//! digest.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::host::cpio::Cpio;
use crate::ops::error::OpError;
use crate::ops::work::Work;

/// The kernel command line for a guest of `arch`: the root's disk, the serial console, no
/// reboot loop on a panic.
pub fn append(arch: &str) -> String {
    let console = if arch == "aarch64" {
        "ttyAMA0"
    } else {
        "ttyS0"
    };
    format!("console={console} mcqemu.root=/dev/vda panic=-1 loglevel=4 cryptomgr.notests")
}

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
    /// Every module of the kernel on an ext4 image, for the guest's `/lib/modules/RELEASE`
    /// (none for a user's kernel).
    pub modules_disk: Option<PathBuf>,
}

/// The folder kits are cached in.
fn cache() -> PathBuf {
    super::kernel::cache()
}

/// The kit for a guest of `arch`: around `kernel` when the user gives one, else Debian's.
pub fn kit(work: &dyn Work, arch: &str, kernel: Option<&Path>) -> Result<Kit, OpError> {
    let agent_path = crate::host::agent::find(arch)?;
    let agent = std::fs::read(&agent_path).map_err(|e| {
        OpError::host(format!(
            "cannot read the agent {}: {e}",
            agent_path.display()
        ))
    })?;
    let tag = &crate::oci::layout::sha256_hex(&agent)[..16];
    std::fs::create_dir_all(cache())
        .map_err(|e| OpError::host(format!("cannot create {}: {e}", cache().display())))?;
    let (kernel, modules, source, home, modules_disk) = match kernel {
        Some(k) => (
            k.to_path_buf(),
            None,
            format!("the user's kernel {}", k.display()),
            cache().join("user"),
            None,
        ),
        None => {
            let k = super::kernel::obtain(work, arch)?;
            (
                k.kernel,
                Some(k.home.join("modules")),
                k.source,
                k.home,
                Some(k.modules_disk),
            )
        }
    };
    std::fs::create_dir_all(&home)
        .map_err(|e| OpError::host(format!("cannot create {}: {e}", home.display())))?;
    let initrd = home.join(format!("initrd-{tag}.cpio"));
    if !initrd.is_file() {
        let bytes = initrd_bytes(&agent, modules.as_deref())?;
        let tmp = home.join(format!("initrd-{tag}.{}.tmp", std::process::id()));
        std::fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.sync_all()))
            .and_then(|()| std::fs::rename(&tmp, &initrd))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                OpError::host(format!("cannot write {}: {e}", initrd.display()))
            })?;
    }
    Ok(Kit {
        kernel,
        initrd,
        source: source.trim().to_string(),
        modules_disk,
    })
}

/// The initrd: the agent as /init, and the modules found in `modules` (none for a user's
/// kernel) listed for it to load, without their signatures (the kernel then loads them
/// without an RSA check: 80-90 ms instead of 100-130 for the set under TCG; it marks itself
/// tainted, `E`, and says so only below the console's log level).
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
    for m in modules.map_or(&[][..], |_| super::kernel::MODULES) {
        let Some(p) = modules.map(|d| d.join(format!("{m}.ko"))) else {
            continue;
        };
        let Ok(data) = std::fs::read(&p) else {
            continue;
        };
        c.file(&format!("lib/modules/{m}.ko"), unsigned(&data), 0o644);
        list.push_str(&format!("/lib/modules/{m}.ko\n"));
    }
    c.file("etc/mcqemu-agent/modules", list.as_bytes(), 0o644);
    Ok(c.finish())
}

/// A module without its appended signature (`~Module signature appended~`): the kernel then
/// skips the RSA check, which under TCG costs more than the module's own load.
fn unsigned(ko: &[u8]) -> &[u8] {
    const MAGIC: &[u8] = b"~Module signature appended~\n";
    let Some(body) = ko.strip_suffix(MAGIC) else {
        return ko;
    };
    // struct module_signature: algo, hash, id_type, signer_len, key_id_len, 3 pad, sig_len (BE).
    let Some(info) = body.len().checked_sub(12).and_then(|at| body.get(at..)) else {
        return ko;
    };
    let sig_len = u32::from_be_bytes([info[8], info[9], info[10], info[11]]) as usize;
    let total = sig_len + info[3] as usize + info[4] as usize + 12;
    body.len().checked_sub(total).map_or(ko, |end| &body[..end])
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

    #[test]
    fn a_module_s_signature_is_cut_off_and_an_unsigned_one_is_left_alone() {
        let mut ko = b"\x7fELF module body".to_vec();
        let (signer, key, sig) = (b"".len(), b"".len(), [7u8; 9]);
        ko.extend_from_slice(&sig);
        ko.extend_from_slice(&[0, 0, 2, signer as u8, key as u8, 0, 0, 0, 0, 0, 0, 9]);
        ko.extend_from_slice(b"~Module signature appended~\n");
        assert_eq!(unsigned(&ko), b"\x7fELF module body");
        assert_eq!(unsigned(b"\x7fELF plain"), b"\x7fELF plain");
        assert_eq!(
            unsigned(b"~Module signature appended~\n"),
            b"~Module signature appended~\n"
        );
    }
}
