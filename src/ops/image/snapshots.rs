//! Internal snapshots of qcow2 images at rest (no VM using them): listed, created, applied,
//! deleted with qemu-img, each refused when the tag's presence says it would do the wrong thing.

use std::path::Path;

use serde::Serialize;

use crate::clock;
use crate::ops::error::OpError;
use crate::ops::vm::checks::{checked_image, refuse_in_use};
use crate::qemu::img::{self, ImageInfo};

/// What an image snapshot operation does.
pub use crate::qemu::img::SnapshotOp;

crate::described! {
    /// One internal snapshot of an image, as the image tools list it.
    #[derive(Debug, Clone, Serialize)]
    pub struct SnapshotItem {
        /// qemu-img's id.
        pub id: String,
        /// The tag.
        pub tag: String,
        /// Bytes of saved VM state (0 for a disk-only snapshot).
        pub vm_state_size: u64,
        /// When it was taken, ISO 8601.
        pub date: String,
        /// The guest's clock then, HH:MM:SS.mmm.
        pub vm_clock: String,
    }
}

/// Snapshots of an image, structured, from qemu-img's JSON.
pub fn snapshots_of(info: &ImageInfo) -> Vec<SnapshotItem> {
    info.snapshots
        .iter()
        .map(|s| SnapshotItem {
            id: s.id.clone().unwrap_or_default(),
            tag: s.name.clone().unwrap_or_default(),
            vm_state_size: s.vm_state_size,
            date: s.date_sec.map(clock::iso8601).unwrap_or_default(),
            vm_clock: s
                .vm_clock_sec
                .map(|sec| clock::vm_clock(sec * 1_000_000_000 + s.vm_clock_nsec))
                .unwrap_or_default(),
        })
        .collect()
}

crate::described! {
    /// An image's snapshots (image_snapshot_list's result).
    #[derive(Debug, Clone, Serialize)]
    pub struct Listed {
        /// The image.
        pub path: String,
        /// Its snapshots.
        pub snapshots: Vec<SnapshotItem>,
    }
}

/// The snapshots of the (checked) image at `path`.
pub fn list(path: &Path) -> Result<Listed, OpError> {
    let format = checked_image(path, "image", None)?.format;
    let info = img::info(path, &format)?;
    Ok(Listed {
        path: path.display().to_string(),
        snapshots: snapshots_of(&info),
    })
}

crate::described! {
    /// What an operation did (the snapshot tools' result, in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct Done {
        /// The image.
        pub path: String,
        /// The tag.
        pub tag: String,
        /// created, applied or deleted.
        pub action: &'static str,
        /// The snapshots after it.
        pub snapshots: Vec<SnapshotItem>,
    }
}

/// Creates, applies or deletes snapshot `tag` (already checked) of the image at `path`.
pub fn operate(path: &Path, tag: &str, op: SnapshotOp) -> Result<Done, OpError> {
    let format = checked_image(path, "image", None)?.format;
    refuse_in_use(path)?;
    let info = img::info(path, &format)?;
    let existing = snapshots_of(&info);
    let has = existing.iter().any(|s| s.tag == tag);
    let tags: Vec<&str> = existing.iter().map(|s| s.tag.as_str()).collect();
    match op {
        SnapshotOp::Create if has => {
            return Err(OpError::invalid(format!(
                "snapshot {tag:?} already exists in {}; delete it first or choose another tag",
                path.display()
            )))
        }
        SnapshotOp::Apply | SnapshotOp::Delete if !has => {
            return Err(OpError::not_found(format!(
                "no snapshot {tag:?} in {}; existing tags: [{}]",
                path.display(),
                tags.join(", ")
            )))
        }
        _ => {}
    }
    img::snapshot(path, &format, op, tag)?;
    let after = img::info(path, &format)?;
    Ok(Done {
        path: path.display().to_string(),
        tag: tag.to_string(),
        action: match op {
            SnapshotOp::Create => "created",
            SnapshotOp::Apply => "applied",
            SnapshotOp::Delete => "deleted",
        },
        snapshots: snapshots_of(&after),
    })
}
