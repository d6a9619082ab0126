//! Internal snapshots of disk images at rest (qcow2): list, create, apply, delete, each
//! refused while a running VM uses the image.

use serde::Deserialize;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::image::snapshots::{self, SnapshotOp};
use crate::ops::vm::checks::{checked_path, Access};
use crate::schema::Param;
use crate::tools::names::Tag;
use crate::tools::presets;

crate::params! {
    #[derive(Deserialize)]
    struct TagArgs {
        /// A qcow2 image not in use by a running VM.
        path: String = {"minLength": 1},
        tag: Tag,
    }
}

crate::params! {
    #[derive(Deserialize)]
    struct ListArgs {
        /// The image.
        path: String = {"minLength": 1},
    }
}

const SNAPSHOT_LIST_DESCRIPTION: &str = "List the internal snapshots stored in a qcow2 image: \
    tag, id, saved VM state size, date and guest clock.";

/// `image_snapshot_list`.
pub const SNAPSHOT_LIST: ToolDef = ToolDef {
    name: "image_snapshot_list",
    title: "List an image's internal snapshots",
    description: SNAPSHOT_LIST_DESCRIPTION,
    input_schema: ListArgs::param,
    output_schema: <crate::ops::image::snapshots::Listed as crate::schema::Schema>::schema,
    annotations: presets::READ_ONLY,
    handler: snapshot_list,
    ui: crate::mcp::tool::Ui::NONE,
};

fn snapshot_list(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: ListArgs = args.parse()?;
    let path = checked_path(&a.path, "path", Access::Read)?;
    crate::tools::to_output(&snapshots::list(&path)?)
}

const SNAPSHOT_CREATE_DESCRIPTION: &str = "Store an internal snapshot of a qcow2 image that no VM \
    is using (for a running VM use vm_snapshot_create). Refuses a tag that already exists.";

/// `image_snapshot_create`.
pub const SNAPSHOT_CREATE: ToolDef = ToolDef {
    name: "image_snapshot_create",
    title: "Snapshot an image at rest",
    description: SNAPSHOT_CREATE_DESCRIPTION,
    input_schema: TagArgs::param,
    output_schema: <crate::ops::image::snapshots::Done as crate::schema::Schema>::schema,
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
    input_schema: TagArgs::param,
    output_schema: <crate::ops::image::snapshots::Done as crate::schema::Schema>::schema,
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
    input_schema: TagArgs::param,
    output_schema: <crate::ops::image::snapshots::Done as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE,
    handler: |ctx, args| snapshot_op(ctx, args, SnapshotOp::Delete),
    ui: crate::mcp::tool::Ui::NONE,
};

fn snapshot_op(_ctx: &ToolCtx, args: &Args, op: SnapshotOp) -> ToolResult {
    let a: TagArgs = args.parse()?;
    let path = checked_path(&a.path, "path", Access::Write)?;
    crate::tools::to_output(&snapshots::operate(&path, &a.tag.0, op)?)
}
