//! `stop_vm`: its definition and arguments; the stop itself is [`crate::ops::vm::stop`].

use std::time::Duration;

use serde_json::json;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::vm::stop;
use crate::tools::{object, presets, vm_name_arg};

const STOP_DESCRIPTION: &str = "Stop a VM. Graceful by default: ACPI power-down, then wait up to \
    timeout seconds for QEMU to exit (a guest without an OS or still booting may ignore it). \
    force=true: QMP quit, then SIGTERM and SIGKILL, each verified. The record stays (list_vms \
    shows it stopped); forget_vm drops it.";

/// `stop_vm`.
pub const STOP: ToolDef = ToolDef {
    name: "stop_vm",
    title: "Stop a VM",
    description: STOP_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "force": {"type": "boolean", "default": false},
                "timeout": {
                    "type": "number", "minimum": 0, "maximum": 3600, "default": 30,
                    "description": "Seconds to wait for a graceful stop."
                }
            }),
            &["name"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "status": {"type": "string"},
                "method": {"type": "string"},
                "events": {"type": "array", "items": {"type": "string"}},
                "elapsed_ms": {"type": "integer"},
                "cleanup_errors": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["name", "status", "method"]
        })
    },
    annotations: presets::DESTRUCTIVE_IDEMPOTENT,
    handler: stop_vm,
    ui: crate::mcp::tool::Ui::NONE,
};

fn stop_vm(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let timeout = Duration::from_secs_f64(args.number("timeout")?);
    crate::tools::to_output(&stop::stop(
        ctx,
        &vm_name_arg(args)?,
        args.bool_or("force", false)?,
        timeout,
    )?)
}
