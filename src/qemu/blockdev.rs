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

/// A node name `PREFIX-N` this QEMU has not used (the first such N): node names are a QEMU's
/// own, so asking it is what keeps them apart (a name made of the clock and a counter repeated
/// itself when a second server, or the CLI, forked the same VM within a second).
pub fn free_node_name(q: &mut Qmp, prefix: &str) -> Result<String, QmpError> {
    let nodes = q.execute("query-named-block-nodes", Some(json!({"flat": true})))?;
    let used: Vec<&str> = nodes
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.get("node-name").and_then(Value::as_str))
        .collect();
    Ok(free_name(&used, prefix))
}

/// Puts the qcow2 `overlay` (made beforehand, its header naming the current top image as its
/// backing file) on top of node `top` (the drive's top, from [`top_node`] beforehand: with a
/// long backing chain query-block takes tens of ms, too long for a stopped guest) as node
/// `node`: the guest's writes go there from now on and the old top image is never written
/// again. Whether it is on top is then told by [`top_node`] (the top's file name QEMU reports
/// is a `json:` description once an overlay's backing is not the file its header names).
pub fn snapshot_onto(q: &mut Qmp, top: &str, overlay: &Path, node: &str) -> Result<(), QmpError> {
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

/// `PREFIX-N` for the first N from 1 not in `used`.
fn free_name(used: &[&str], prefix: &str) -> String {
    (1u64..)
        .map(|n| format!("{prefix}-{n}"))
        .find(|name| !used.contains(&name.as_str()))
        .unwrap_or_else(|| prefix.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_node_takes_the_first_free_name() {
        assert_eq!(free_name(&[], "mcq-top"), "mcq-top-1");
        assert_eq!(
            free_name(&["mcq-disk0", "mcq-top-1", "mcq-top-3"], "mcq-top"),
            "mcq-top-2"
        );
    }
}
