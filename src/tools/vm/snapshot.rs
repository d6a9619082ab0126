//! Live snapshots of a running VM: the tools (the operations are
//! [`crate::ops::vm::snapshot`]'s).

use serde_json::{json, Value};

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::vm::snapshot::{self, Op};
use crate::tools::{check_tag, object, presets, vm_name_arg};

fn tag_in() -> Value {
    object(
        json!({
            "name": presets::name_schema(),
            "tag": {
                "type": "string", "minLength": 1, "maxLength": 64,
                "description": "1-64 of A-Z a-z 0-9 _ . -, starting with a letter or digit."
            }
        }),
        &["name", "tag"],
    )
}

fn op_out() -> Value {
    json!({"type": "object", "properties": {
        "name": {"type": "string"}, "tag": {"type": "string"}, "action": {"type": "string"},
        "status": {"type": "string"}, "duration_ms": {"type": "integer"}
    }, "required": ["name", "tag", "action"]})
}

const CREATE_DESCRIPTION: &str = "Save a live snapshot of the whole running VM (RAM, device state \
    and disks) inside its qcow2 disk, under tag. The VM pauses briefly while saving. Refuses an \
    existing tag.";

/// `vm_snapshot_create`.
pub const CREATE: ToolDef = ToolDef {
    name: "vm_snapshot_create",
    title: "Snapshot a running VM",
    description: CREATE_DESCRIPTION,
    input_schema: tag_in,
    output_schema: op_out,
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
    input_schema: tag_in,
    output_schema: op_out,
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
    input_schema: tag_in,
    output_schema: op_out,
    annotations: presets::DESTRUCTIVE,
    handler: |ctx, args| snapshot_op(ctx, args, Op::Delete),
    ui: crate::mcp::tool::Ui::NONE,
};

fn snapshot_op(ctx: &ToolCtx, args: &Args, op: Op) -> ToolResult {
    let name = vm_name_arg(args)?;
    let tag = args.str("tag")?.to_string();
    check_tag(&tag)?;
    crate::tools::to_output(&snapshot::operate(ctx, &name, &tag, op)?)
}

fn list(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    crate::tools::to_output(&snapshot::list(&vm_name_arg(args)?)?)
}

const LIST_DESCRIPTION: &str = "List the live snapshots of a running VM: tag, id, saved VM state \
    size, date and guest clock.";

/// `vm_snapshot_list`.
pub const LIST: ToolDef = ToolDef {
    name: "vm_snapshot_list",
    title: "List a VM's live snapshots",
    description: LIST_DESCRIPTION,
    input_schema: presets::name_only,
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "snapshots": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": ["string", "null"]},
                            "tag": {"type": ["string", "null"]},
                            "vm_state_size": {"type": "integer"},
                            "date": {"type": "string"},
                            "vm_clock": {"type": "string"}
                        }
                    }
                }
            },
            "required": ["name", "snapshots"]
        })
    },
    annotations: presets::READ_ONLY,
    handler: list,
    ui: crate::mcp::tool::Ui::NONE,
};
