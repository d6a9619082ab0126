//! Internal snapshots of disk images at rest (qcow2): list, create, apply, delete, each
//! refused while a running VM uses the image.

use serde_json::{json, Value};

use super::params::{out_object, path_schema, snapshot_item_schema, snapshots_of, tag_schema};
use super::{check_tag, checked_image, object, path_arg, presets};
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::ops::vm::checks::refuse_in_use;
use crate::qemu::img::{self, SnapshotOp};
use crate::state::roots::Access;

fn snapshot_list_out() -> Value {
    out_object(
        json!({
            "path": {"type": "string"},
            "snapshots": {"type": "array", "items": snapshot_item_schema()}
        }),
        &["path", "snapshots"],
    )
}

fn snapshot_op_out() -> Value {
    out_object(
        json!({
            "path": {"type": "string"},
            "tag": {"type": "string"},
            "action": {"type": "string"},
            "snapshots": {"type": "array", "items": snapshot_item_schema()}
        }),
        &["path", "tag", "action", "snapshots"],
    )
}

fn snapshot_in_schema() -> Value {
    object(
        json!({
            "path": path_schema("A qcow2 image not in use by a running VM."), "tag": tag_schema()
        }),
        &["path", "tag"],
    )
}

const SNAPSHOT_LIST_DESCRIPTION: &str = "List the internal snapshots stored in a qcow2 image: \
    tag, id, saved VM state size, date and guest clock.";

/// `image_snapshot_list`.
pub const SNAPSHOT_LIST: ToolDef = ToolDef {
    name: "image_snapshot_list",
    title: "List an image's internal snapshots",
    description: SNAPSHOT_LIST_DESCRIPTION,
    input_schema: || object(json!({"path": path_schema("The image.")}), &["path"]),
    output_schema: snapshot_list_out,
    annotations: presets::READ_ONLY,
    handler: snapshot_list,
    ui: crate::mcp::tool::Ui::NONE,
};

fn snapshot_list(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let path = path_arg(args, "path", Access::Read)?;
    let format = checked_image(&path, "image", None)?.format;
    let info = img::info(&path, &format, false)?;
    Ok(ToolOutput::json(
        json!({"path": path.display().to_string(), "snapshots": snapshots_of(&info)}),
    ))
}

const SNAPSHOT_CREATE_DESCRIPTION: &str = "Store an internal snapshot of a qcow2 image that no VM \
    is using (for a running VM use vm_snapshot_create). Refuses a tag that already exists.";

/// `image_snapshot_create`.
pub const SNAPSHOT_CREATE: ToolDef = ToolDef {
    name: "image_snapshot_create",
    title: "Snapshot an image at rest",
    description: SNAPSHOT_CREATE_DESCRIPTION,
    input_schema: snapshot_in_schema,
    output_schema: snapshot_op_out,
    annotations: presets::ADDITIVE,
    handler: |ctx, args| snapshot_op(ctx, args, SnapshotOp::Create),
    ui: crate::mcp::tool::Ui::NONE,
};

const SNAPSHOT_APPLY_DESCRIPTION: &str = "Revert a qcow2 image that no VM is using to one of its \
    internal snapshots; changes made since are lost.";

/// `image_snapshot_apply`.
pub const SNAPSHOT_APPLY: ToolDef = ToolDef {
    name: "image_snapshot_apply",
    title: "Revert an image to a snapshot",
    description: SNAPSHOT_APPLY_DESCRIPTION,
    input_schema: snapshot_in_schema,
    output_schema: snapshot_op_out,
    annotations: presets::DESTRUCTIVE_IDEMPOTENT,
    handler: |ctx, args| snapshot_op(ctx, args, SnapshotOp::Apply),
    ui: crate::mcp::tool::Ui::NONE,
};

const SNAPSHOT_DELETE_DESCRIPTION: &str = "Delete an internal snapshot from a qcow2 image that no \
    VM is using.";

/// `image_snapshot_delete`.
pub const SNAPSHOT_DELETE: ToolDef = ToolDef {
    name: "image_snapshot_delete",
    title: "Delete an image snapshot",
    description: SNAPSHOT_DELETE_DESCRIPTION,
    input_schema: snapshot_in_schema,
    output_schema: snapshot_op_out,
    annotations: presets::DESTRUCTIVE,
    handler: |ctx, args| snapshot_op(ctx, args, SnapshotOp::Delete),
    ui: crate::mcp::tool::Ui::NONE,
};

fn snapshot_op(_ctx: &ToolCtx, args: &Args, op: SnapshotOp) -> ToolResult {
    let path = path_arg(args, "path", Access::Write)?;
    let tag = args.str("tag")?;
    check_tag(tag)?;
    let format = checked_image(&path, "image", None)?.format;
    refuse_in_use(&path)?;
    let info = img::info(&path, &format, false)?;
    let existing = snapshots_of(&info);
    let has = existing.iter().any(|s| s["tag"] == tag);
    let tags: Vec<&str> = existing.iter().filter_map(|s| s["tag"].as_str()).collect();
    match op {
        SnapshotOp::Create if has => {
            return Err(ToolError::new(format!(
                "snapshot {tag:?} already exists in {}; delete it first or choose another tag",
                path.display()
            )))
        }
        SnapshotOp::Apply | SnapshotOp::Delete if !has => {
            return Err(ToolError::new(format!(
                "no snapshot {tag:?} in {}; existing tags: [{}]",
                path.display(),
                tags.join(", ")
            )))
        }
        _ => {}
    }
    img::snapshot(&path, &format, op, tag)?;
    let after = img::info(&path, &format, false)?;
    let action = match op {
        SnapshotOp::Create => "created",
        SnapshotOp::Apply => "applied",
        SnapshotOp::Delete => "deleted",
    };
    Ok(ToolOutput::json(json!({
        "path": path.display().to_string(),
        "tag": tag,
        "action": action,
        "snapshots": snapshots_of(&after),
    })))
}
