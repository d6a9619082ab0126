//! The template store: a running guest saved once (RAM in a file, device state in a small
//! stream, its disk frozen as a backing file) in `<state>/templates/NAME/`, its record, the
//! checks that its files are whole, and its live clones.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ops::error::OpError;
use crate::qemu::{img, qcow2, vm};
use crate::state::config::SeedBus;
use crate::state::paths;
use crate::state::registry::valid_name;

/// What a template holds, written last (atomically): a folder without it is not a template.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Template {
    /// Its name.
    pub name: String,
    /// The base image its disk was made over (None: an empty disk).
    pub base_image: Option<String>,
    /// Guest memory in MiB (the RAM file's size).
    pub memory_mb: u64,
    /// vCPUs.
    pub cpus: u64,
    /// QEMU architecture and machine type.
    pub arch: String,
    /// Machine type: concrete (`pc-q35-7.2`), so a newer QEMU loads it as the same machine;
    /// an alias in templates from before machine types were pinned.
    pub machine: String,
    /// The accelerator it ran under (a KVM state does not load under TCG).
    #[serde(default = "tcg")]
    pub accel: crate::state::config::Accel,
    /// Its CPU model (None: QEMU's default, in templates from before it was recorded).
    #[serde(default)]
    pub cpu: Option<String>,
    /// The QEMU version that saved it: a clone needs the same or a newer one.
    #[serde(default)]
    pub qemu_version: String,
    /// Direct kernel boot, as the template booted (clones need the same).
    pub kernel: Option<String>,
    /// Initial ramdisk.
    pub initrd: Option<String>,
    /// Kernel command line.
    pub append: Option<String>,
    /// An image kernel's modules disk (clones need the same devices).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modules: Option<String>,
    /// Whether a cloud-init seed CD-ROM was attached (clones need the same devices).
    pub seed: bool,
    /// Which device the seed was (templates older than the virtio seed have none recorded).
    #[serde(default = "legacy_seed_bus")]
    pub seed_bus: SeedBus,
    /// "bios" or "uefi"; a UEFI template keeps its variable store (`uefi-vars.fd`), and every
    /// clone boots from the same code file with a copy of it.
    #[serde(default = "bios")]
    pub firmware: String,
    /// The UEFI code file the template ran (clones must load the same one).
    #[serde(default)]
    pub uefi_code: Option<String>,
    /// The format of its code and variable store (`raw` when not recorded).
    #[serde(default)]
    pub uefi_format: Option<String>,
    /// Whether the template had mcqemu's data channel (its clones need the same devices).
    #[serde(default)]
    pub data_channel: bool,
    /// Whether the template had a mount port from the start (its clones need the same
    /// devices, and their first mount takes it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mount_spare: bool,
    /// Whether the template had a network card.
    pub no_net: bool,
    /// Operator extra_args, repeated for every clone (same devices).
    pub extra_args: Vec<String>,
    /// Host folders every clone gets mounted (after its start, before it is handed out).
    #[serde(default)]
    pub mounts: Vec<crate::ops::vm::mounts::MountSpec>,
    /// Whether the saved guest's agent is mcqemu-agent (its clones run the same program, so a
    /// clone's mounts need no question to it first); None in templates made before.
    #[serde(default)]
    pub agent_ours: Option<bool>,
    /// When it was saved.
    pub created_at: String,
    /// Bytes of the saved device state.
    pub state_bytes: u64,
}

fn legacy_seed_bus() -> SeedBus {
    SeedBus::Cdrom
}

fn tcg() -> crate::state::config::Accel {
    crate::state::config::Accel::Tcg
}

fn bios() -> String {
    "bios".into()
}

/// The folder of all templates.
pub fn templates_dir() -> PathBuf {
    paths::state_dir().join("templates")
}

/// A template's folder.
pub fn dir_of(name: &str) -> PathBuf {
    templates_dir().join(name)
}

/// Its files.
pub fn disk_of(dir: &Path) -> PathBuf {
    dir.join("disk.qcow2")
}
/// Its RAM file.
pub fn ram_of(dir: &Path) -> PathBuf {
    dir.join("ram")
}
/// Its device state.
pub fn state_of(dir: &Path) -> PathBuf {
    dir.join("state")
}
/// Its seed, when it had one.
pub fn seed_of(dir: &Path) -> PathBuf {
    dir.join("seed.iso")
}
/// Its UEFI variable store, when it booted with UEFI.
pub fn vars_of(dir: &Path) -> PathBuf {
    dir.join("uefi-vars.fd")
}
/// Its record.
pub fn meta_of(dir: &Path) -> PathBuf {
    dir.join("template.json")
}
/// An empty qcow2 overlay over its disk, which each clone copies as its own.
pub fn blank_overlay_of(dir: &Path) -> PathBuf {
    dir.join("overlay-blank.qcow2")
}

/// Makes the template's blank overlay unless one over its disk is there; template_create
/// calls it so that the first clone does not pay for it.
pub fn ensure_blank_overlay(dir: &Path) -> Result<PathBuf, OpError> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let blank = blank_overlay_of(dir);
    let disk = disk_of(dir);
    if qcow2::backing_of(&blank).is_some_and(|b| Path::new(&b) == disk) {
        return Ok(blank);
    }
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".overlay-blank.tmp-{}-{seq}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    img::create(&tmp, "qcow2", None, Some((&disk, "qcow2")))?;
    std::fs::rename(&tmp, &blank).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        OpError::host(format!("cannot place {}: {e}", blank.display()))
    })?;
    Ok(blank)
}

/// Gives a clone its overlay over the template's disk: a copy of the template's blank overlay
/// (~0.1 ms), made once with qemu-img (~7 ms a clone before) and made again when its backing
/// file is not this template's disk any more (a moved state folder).
pub fn new_overlay(dir: &Path, overlay: &Path) -> Result<(), OpError> {
    let blank = ensure_blank_overlay(dir)?;
    let disk = disk_of(dir);
    let fits = |p: &Path| qcow2::backing_of(p).is_some_and(|b| Path::new(&b) == disk);
    std::fs::copy(&blank, overlay).map_err(|e| {
        let _ = std::fs::remove_file(overlay);
        OpError::host(format!(
            "cannot copy the template's blank overlay to {}: {e}",
            overlay.display()
        ))
    })?;
    if !fits(overlay) {
        let _ = std::fs::remove_file(overlay);
        return Err(OpError::host(format!(
            "the copy of {} at {} does not name the template's disk as its backing file; \
             delete {} and try again",
            blank.display(),
            overlay.display(),
            blank.display()
        )));
    }
    Ok(())
}

/// Loads a template, checking that its files are all there and whole.
pub fn load(name: &str) -> Result<Template, OpError> {
    if !valid_name(name) {
        return Err(OpError::invalid(crate::state::registry::invalid_name(
            "template", name,
        )));
    }
    let dir = dir_of(name);
    let bytes = std::fs::read(meta_of(&dir)).map_err(|_| {
        OpError::not_found(format!(
            "no template named {name:?}; template_list shows the templates, template_create \
             makes one"
        ))
    })?;
    let t: Template = serde_json::from_slice(&bytes).map_err(|e| {
        OpError::host(format!(
            "template {name:?} is damaged ({}: {e}); template_delete it and create it again",
            meta_of(&dir).display()
        ))
    })?;
    let ram_len = std::fs::metadata(ram_of(&dir)).map(|m| m.len()).ok();
    let state_len = std::fs::metadata(state_of(&dir))
        .map(|m| m.len())
        .unwrap_or(0);
    let problem = match ram_len {
        None => Some("its RAM file is missing".to_string()),
        Some(len) if len != t.memory_mb * 1024 * 1024 => Some(format!(
            "its RAM file is {len} bytes, not {} MiB",
            t.memory_mb
        )),
        _ if !disk_of(&dir).is_file() => Some("its disk is missing".to_string()),
        _ if state_len == 0 => Some("its saved state is missing or empty".to_string()),
        _ if t.state_bytes > 0 && state_len != t.state_bytes => Some(format!(
            "its saved state is {state_len} bytes, not the {} saved",
            t.state_bytes
        )),
        _ if t.seed && !seed_of(&dir).is_file() => {
            Some("its cloud-init seed is missing".to_string())
        }
        _ if t.firmware == "uefi" && !vars_of(&dir).is_file() => {
            Some("its UEFI variable store is missing".to_string())
        }
        _ => None,
    };
    match problem {
        Some(p) => Err(OpError::host(format!(
            "template {name:?} is damaged: {p}; template_delete it and create it again"
        ))),
        None => Ok(t),
    }
}

/// Names of the VMs that stand on template `name`'s disk: its live clones, their forks and
/// the suspended ones among them.
pub fn clones_of(name: &str) -> Vec<String> {
    crate::state::registry::shared()
        .load()
        .into_iter()
        .filter(|(_, r)| {
            r.sandbox.as_ref().and_then(|s| s.template.as_deref()) == Some(name)
                && vm::measure_process(r)
                    .is_none_or(|m| m.alive() || m.status == vm::Status::Suspended)
        })
        .map(|(n, _)| n)
        .collect()
}

/// Removes a template folder's known files and then the folder, reporting what failed.
pub fn remove_dir(dir: &Path) -> Vec<String> {
    let mut errors = Vec::new();
    if !dir.starts_with(templates_dir()) || dir == templates_dir() {
        return vec![format!(
            "refusing to delete {} (not a template folder)",
            dir.display()
        )];
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                errors.push(format!("{} is a folder; left alone", p.display()));
                continue;
            }
            if let Err(err) = std::fs::remove_file(&p) {
                errors.push(format!("cannot delete {}: {err}", p.display()));
            }
        }
    }
    if let Err(err) = std::fs::remove_dir(dir) {
        if err.kind() != std::io::ErrorKind::NotFound {
            errors.push(format!("cannot delete {}: {err}", dir.display()));
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clone's overlay is byte for byte what qemu-img would have made for it, and names the
    /// template's disk; a blank overlay over another disk is made again.
    #[test]
    fn clones_copy_an_overlay_identical_to_qemu_imgs() {
        let dir = std::env::temp_dir().join(format!("mcqemu-blank-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        img::create(&disk_of(&dir), "qcow2", Some(64 << 20), None).unwrap();
        let (a, b, fresh) = (dir.join("a"), dir.join("b"), dir.join("fresh"));
        new_overlay(&dir, &a).unwrap();
        new_overlay(&dir, &b).unwrap();
        img::create(&fresh, "qcow2", None, Some((&disk_of(&dir), "qcow2"))).unwrap();
        let read = |p: &Path| std::fs::read(p).unwrap();
        assert_eq!(read(&a), read(&fresh));
        assert_eq!(read(&b), read(&fresh));
        let disk = disk_of(&dir).display().to_string();
        assert_eq!(qcow2::backing_of(&a), Some(disk.clone()));

        let other = dir.join("other.qcow2");
        img::create(&other, "qcow2", Some(64 << 20), None).unwrap();
        img::create(
            &blank_overlay_of(&dir),
            "qcow2",
            None,
            Some((&other, "qcow2")),
        )
        .unwrap();
        let c = dir.join("c");
        new_overlay(&dir, &c).unwrap();
        assert_eq!(qcow2::backing_of(&c), Some(disk));
        assert_eq!(read(&c), read(&fresh));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
