//! Live snapshots of a running VM: the tools (the operations are
//! [`crate::ops::vm::snapshot`]'s).

use serde::Deserialize;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::vm::snapshot::{self, Op};
use crate::schema::Param;
use crate::tools::names::{Tag, VmName, VmOnly};
use crate::tools::presets;

crate::params! {
    /// The VM and the snapshot's tag.
    #[derive(Deserialize)]
    struct TagArgs {
        name: VmName,
        tag: Tag,
    }
}

const CREATE_DESCRIPTION: &str = "Save a live snapshot of the whole running VM (RAM, device state \
    and disks) inside its qcow2 disk, under tag. The VM pauses briefly while saving. Refuses an \
    existing tag.";

/// `vm_snapshot_create`.
pub const CREATE: ToolDef = ToolDef {
    name: "vm_snapshot_create",
    title: "Snapshot a running VM",
    description: CREATE_DESCRIPTION,
    input_schema: TagArgs::param,
    output_schema: <crate::ops::vm::snapshot::Operated as crate::schema::Schema>::schema,
    annotations: presets::ADDITIVE,
    handler: |ctx, args| snapshot_op(ctx, args, Op::Save),
    ui: crate::mcp::tool::Ui::NONE,
};

const RESTORE_DESCRIPTION: &str = "Roll the running VM back to a live snapshot: RAM, devices and \
    disks return to that moment; changes since are lost. The guest agent's next call resyncs \
    automatically.";

/// `vm_snapshot_restore`.
pub const RESTORE: ToolDef = ToolDef {
    name: "vm_snapshot_restore",
    title: "Restore a VM snapshot",
    description: RESTORE_DESCRIPTION,
    input_schema: TagArgs::param,
    output_schema: <crate::ops::vm::snapshot::Operated as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE_IDEMPOTENT,
    handler: |ctx, args| snapshot_op(ctx, args, Op::Load),
    ui: crate::mcp::tool::Ui::NONE,
};

const DELETE_DESCRIPTION: &str = "Delete a live snapshot from the running VM's disks.";

/// `vm_snapshot_delete`.
pub const DELETE: ToolDef = ToolDef {
    name: "vm_snapshot_delete",
    title: "Delete a VM snapshot",
    description: DELETE_DESCRIPTION,
    input_schema: TagArgs::param,
    output_schema: <crate::ops::vm::snapshot::Operated as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE,
    handler: |ctx, args| snapshot_op(ctx, args, Op::Delete),
    ui: crate::mcp::tool::Ui::NONE,
};

fn snapshot_op(ctx: &ToolCtx, args: &Args, op: Op) -> ToolResult {
    let a: TagArgs = args.parse()?;
    crate::tools::to_output(&snapshot::operate(ctx, &a.name.0, &a.tag.0, op)?)
}

fn list(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = args.parse::<VmOnly>()?.name();
    crate::tools::to_output(&snapshot::list(&name)?)
}

const LIST_DESCRIPTION: &str = "List the live snapshots of a running VM: tag, id, saved VM state \
    size, date and guest clock.";

/// `vm_snapshot_list`.
pub const LIST: ToolDef = ToolDef {
    name: "vm_snapshot_list",
    title: "List a VM's live snapshots",
    description: LIST_DESCRIPTION,
    input_schema: VmOnly::param,
    output_schema: <crate::ops::vm::snapshot::Listed as crate::schema::Schema>::schema,
    annotations: presets::READ_ONLY,
    handler: list,
    ui: crate::mcp::tool::Ui::NONE,
};
