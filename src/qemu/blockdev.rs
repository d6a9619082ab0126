//! Moving a running guest's disk onto a new overlay (`blockdev-snapshot`): the old top image
//! becomes read-only backing, frozen at that instant, and the guest writes to the overlay from
//! then on. sandbox_fork freezes a sandbox's disk this way for its copies.

use std::path::Path;

use serde_json::{json, Value};

use super::qmp::{Qmp, QmpError};

/// The node name of the top image of drive `drive` (its `-drive id`).
pub fn top_node(q: &mut Qmp, drive: &str) -> Result<String, QmpError> {
    inserted(q, drive, "node-name")
}

/// The file name of the top image of drive `drive`, as QEMU opened it.
pub fn top_file(q: &mut Qmp, drive: &str) -> Result<String, QmpError> {
    inserted(q, drive, "file")
}

fn inserted(q: &mut Qmp, drive: &str, key: &str) -> Result<String, QmpError> {
    let blocks = q.execute("query-block", None)?;
    blocks
        .as_array()
        .into_iter()
        .flatten()
        .find(|b| b.get("device").and_then(Value::as_str) == Some(drive))
        .and_then(|b| b.get("inserted"))
        .and_then(|i| i.get(key))
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| {
            QmpError::Garbage(format!(
                "QEMU lists no image in drive {drive:?} (query-block)"
            ))
        })
}

/// Puts the qcow2 `overlay` (made beforehand, its header naming the current top image as its
/// backing file) on top of drive `drive` as node `node`: the guest's writes go there from now
/// on and the old top image is never written again.
pub fn snapshot_onto(q: &mut Qmp, drive: &str, overlay: &Path, node: &str) -> Result<(), QmpError> {
    let top = top_node(q, drive)?;
    q.execute(
        "blockdev-add",
        Some(json!({
            "driver": "qcow2", "node-name": node,
            "file": {"driver": "file", "filename": overlay.display().to_string()},
            "backing": null
        })),
    )?;
    if let Err(e) = q.execute(
        "blockdev-snapshot",
        Some(json!({"node": top, "overlay": node})),
    ) {
        let _ = q.execute("blockdev-del", Some(json!({"node-name": node})));
        return Err(e);
    }
    Ok(())
}
