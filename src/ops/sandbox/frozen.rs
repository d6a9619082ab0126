//! The frozen states sandbox_fork leaves in `<state>/forks/ID/`: the parent's memory (`ram`,
//! sparse, mapped copy-on-write by every copy), its device state (`state`), its disk as it was
//! (`disk.qcow2`, the backing file of the parent's new overlay and of each copy's) and its UEFI
//! variables and seed. A record names the frozen states its disk stands on (`sandbox.chain`)
//! and the one its memory maps (`sandbox.frozen`); [`collect`] removes what no record needs.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::qemu::vm;
use crate::state::paths;
use crate::state::registry::{valid_name, Record};

/// The folder of all frozen states.
pub fn forks_dir() -> PathBuf {
    paths::state_dir().join("forks")
}

/// A frozen state's folder.
pub fn dir_of(id: &str) -> PathBuf {
    forks_dir().join(id)
}

/// A new frozen state's id for a fork of `parent`: unique per call.
pub fn new_id(parent: &str) -> String {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    // A VM name is at most 48 characters; the id stays a valid name-like folder.
    format!("{parent}.{ms}-{}-{seq}", std::process::id())
}

/// The frozen states a record's disk stands on.
pub fn chain_of(rec: &Record) -> Vec<String> {
    rec.sandbox
        .as_ref()
        .and_then(|s| s.chain.clone())
        .unwrap_or_default()
}

/// The frozen state whose memory a record's QEMU maps, if any.
pub fn memory_of(rec: &Record) -> Option<String> {
    rec.sandbox.as_ref().and_then(|s| s.frozen.clone())
}

/// Removes the frozen states no record stands on, and the memory of those no live copy maps.
/// Returns what could not be removed.
pub fn collect() -> Vec<String> {
    let vms = crate::state::registry::shared().load();
    let mut needed: HashSet<String> = HashSet::new();
    let mut mapped: HashSet<String> = HashSet::new();
    for rec in vms.values() {
        needed.extend(chain_of(rec));
        let live = vm::measure_process(rec).is_none_or(|m| m.alive());
        if let Some(id) = memory_of(rec).filter(|_| live) {
            mapped.insert(id);
        }
    }
    let mut errors = Vec::new();
    let Ok(entries) = std::fs::read_dir(forks_dir()) else {
        return errors;
    };
    for e in entries.flatten() {
        let id = e.file_name().to_string_lossy().into_owned();
        let dir = dir_of(&id);
        if !is_frozen_dir(&dir, &id) {
            continue;
        }
        if !needed.contains(&id) {
            errors.extend(remove(&dir));
        } else if !mapped.contains(&id) {
            let _ = std::fs::remove_file(dir.join("ram"));
        }
    }
    errors
}

/// True for a folder directly in [`forks_dir`] with an id made by [`new_id`].
fn is_frozen_dir(dir: &Path, id: &str) -> bool {
    let parent_ok = id.rsplit_once('.').is_some_and(|(p, _)| valid_name(p));
    parent_ok && dir.parent() == Some(forks_dir().as_path()) && dir.is_dir() && !dir.is_symlink()
}

/// Removes a frozen state's files and its folder (nothing below it is a folder).
fn remove(dir: &Path) -> Vec<String> {
    let mut errors = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                errors.push(format!("{} is a folder; left alone", p.display()));
            } else if let Err(err) = std::fs::remove_file(&p) {
                errors.push(format!("cannot delete {}: {err}", p.display()));
            }
        }
    }
    if let Err(err) = std::fs::remove_dir(dir) {
        errors.push(format!("cannot delete {}: {err}", dir.display()));
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_name_their_parent() {
        let (a, b) = (new_id("box"), new_id("box"));
        assert_ne!(a, b);
        assert!(a.starts_with("box."), "{a}");
        let rec: Record = serde_json::from_value(serde_json::json!({
            "sandbox": {"chain": [a.clone(), b.clone()], "frozen": b.clone()}
        }))
        .unwrap();
        assert_eq!(chain_of(&rec), vec![a, b.clone()]);
        assert_eq!(memory_of(&rec), Some(b));
        assert!(chain_of(&Record::default()).is_empty());
    }
}
