//! Lifecycle tools besides launch and stop: pause, resume, attach and forget.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolResult};
use crate::ops::vm::checks::Access;
use crate::ops::vm::lifecycle::{self, AttachRequest, Change};
use crate::tools::{object, path_arg, presets, vm_name_arg};

fn run_state_out() -> Value {
    json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "status": {"type": "string"}},
        "required": ["name", "status"]
    })
}

const PAUSE_DESCRIPTION: &str = "Freeze a running VM's vCPUs (QMP stop); reports the resulting \
    run state. The guest agent does not answer while paused.";

/// `pause_vm`.
pub const PAUSE: ToolDef = ToolDef {
    name: "pause_vm",
    title: "Pause a VM",
    description: PAUSE_DESCRIPTION,
    input_schema: presets::name_only,
    output_schema: run_state_out,
    annotations: presets::IDEMPOTENT,
    handler: |_ctx, args| run_state_change(args, Change::Pause),
    ui: crate::mcp::tool::Ui::NONE,
};

const RESUME_DESCRIPTION: &str = "Resume a paused VM (QMP cont); reports the resulting run state.";

/// `resume_vm`.
pub const RESUME: ToolDef = ToolDef {
    name: "resume_vm",
    title: "Resume a VM",
    description: RESUME_DESCRIPTION,
    input_schema: presets::name_only,
    output_schema: run_state_out,
    annotations: presets::IDEMPOTENT,
    handler: |_ctx, args| run_state_change(args, Change::Resume),
    ui: crate::mcp::tool::Ui::NONE,
};

fn run_state_change(args: &Args, how: Change) -> ToolResult {
    crate::tools::to_output(&lifecycle::change(&vm_name_arg(args)?, how)?)
}

// ---- attach / forget ----

const ATTACH_DESCRIPTION: &str = "Register a QEMU started elsewhere so the other tools can drive \
    it. qmp_socket must be a unix socket that answers QMP; qga_socket (optional) is its \
    guest-agent socket; pid (optional) lets stop_vm signal it. Its liveness is judged by \
    connecting to the socket.";

/// `attach_vm`.
pub const ATTACH: ToolDef = ToolDef {
    name: "attach_vm",
    title: "Adopt a running QEMU",
    description: ATTACH_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": {"type": "string", "minLength": 1, "maxLength": 48},
                "qmp_socket": {"type": "string", "minLength": 1},
                "qga_socket": {"type": "string"},
                "pid": {"type": "integer", "minimum": 1}
            }),
            &["name", "qmp_socket"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "status": {"type": "string"},
                "qmp_socket": {"type": "string"},
                "qga_socket": {"type": ["string", "null"]},
                "pid": {"type": ["integer", "null"]},
                "qemu_version": {"type": "string"}
            },
            "required": ["name", "status", "qmp_socket"]
        })
    },
    annotations: presets::ADDITIVE,
    handler: attach_vm,
    ui: crate::mcp::tool::Ui::NONE,
};

fn socket_arg(args: &Args, key: &str) -> Result<Option<PathBuf>, ToolError> {
    if args.opt_str(key)?.is_none() {
        return Ok(None);
    }
    Ok(Some(path_arg(args, key, Access::Read)?))
}

fn attach_vm(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let req = AttachRequest {
        name: vm_name_arg(args)?,
        qmp_socket: socket_arg(args, "qmp_socket")?
            .ok_or_else(|| ToolError::new("missing qmp_socket"))?,
        qga_socket: socket_arg(args, "qga_socket")?,
        pid: args.opt_i64("pid")?.map(|p| p as i32),
    };
    crate::tools::to_output(&lifecycle::attach(&req)?)
}

const FORGET_DESCRIPTION: &str = "Drop a VM's registry record only; the QEMU process and its \
    files are left alone. Refuses a live VM that mcqemu spawned unless force=true (it would keep \
    running unmanaged). Attached VMs can always be forgotten.";

/// `forget_vm`.
pub const FORGET: ToolDef = ToolDef {
    name: "forget_vm",
    title: "Forget a VM",
    description: FORGET_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "force": {"type": "boolean", "default": false}
            }),
            &["name"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "forgotten": {"type": "boolean"},
                "was_running": {"type": "boolean"}
            },
            "required": ["name", "forgotten"]
        })
    },
    annotations: presets::DESTRUCTIVE,
    handler: forget_vm,
    ui: crate::mcp::tool::Ui::NONE,
};

fn forget_vm(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let done = lifecycle::forget(&name, args.bool_or("force", false)?)?;
    ctx.log.log(
        "notice",
        &format!("forget_vm {name} (was running: {})", done.was_running),
    );
    crate::tools::to_output(&done)
}
