//! Lifecycle tools besides launch and stop: pause, resume, attach and forget.

use serde::Deserialize;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::vm::checks::{checked_path, Access};
use crate::ops::vm::lifecycle::{self, AttachRequest, Change};
use crate::schema::Param;
use crate::tools::names::{VmName, VmOnly};
use crate::tools::presets;

const PAUSE_DESCRIPTION: &str = "Freeze a VM's vCPUs; its agent does not answer while paused.";

/// `pause_vm`.
pub const PAUSE: ToolDef = ToolDef {
    name: "pause_vm",
    title: "Pause a VM",
    description: PAUSE_DESCRIPTION,
    input_schema: VmOnly::param,
    output_schema: <crate::ops::vm::lifecycle::RunState as crate::schema::Schema>::schema,
    annotations: presets::IDEMPOTENT,
    handler: |_ctx, args| run_state_change(args, Change::Pause),
    ui: crate::mcp::tool::Ui::NONE,
};

const RESUME_DESCRIPTION: &str = "Resume a paused VM.";

/// `resume_vm`.
pub const RESUME: ToolDef = ToolDef {
    name: "resume_vm",
    title: "Resume a VM",
    description: RESUME_DESCRIPTION,
    input_schema: VmOnly::param,
    output_schema: <crate::ops::vm::lifecycle::RunState as crate::schema::Schema>::schema,
    annotations: presets::IDEMPOTENT,
    handler: |_ctx, args| run_state_change(args, Change::Resume),
    ui: crate::mcp::tool::Ui::NONE,
};

fn run_state_change(args: &Args, how: Change) -> ToolResult {
    let name = args.parse::<VmOnly>()?.name();
    crate::tools::to_output(&lifecycle::change(&name, how)?)
}

// ---- attach / forget ----

const ATTACH_DESCRIPTION: &str = "Register a QEMU started elsewhere: qmp_socket must answer QMP; \
    qga_socket is its agent, pid lets stop_vm signal it.";

/// `attach_vm`.
pub const ATTACH: ToolDef = ToolDef {
    name: "attach_vm",
    title: "Adopt a running QEMU",
    description: ATTACH_DESCRIPTION,
    input_schema: AttachArgs::param,
    output_schema: <crate::ops::vm::lifecycle::Attached as crate::schema::Schema>::schema,
    annotations: presets::ADDITIVE,
    handler: attach_vm,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct AttachArgs {
        name: VmName = {"maxLength": 48},
        qmp_socket: String = {"minLength": 1},
        qga_socket: Option<String>,
        pid: Option<i32> = {"minimum": 1},
    }
}

fn attach_vm(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: AttachArgs = args.parse()?;
    let req = AttachRequest {
        name: a.name.0,
        qmp_socket: checked_path(&a.qmp_socket, "qmp_socket", Access::Read)?,
        qga_socket: a
            .qga_socket
            .map(|s| checked_path(&s, "qga_socket", Access::Read))
            .transpose()?,
        pid: a.pid,
    };
    crate::tools::to_output(&lifecycle::attach(&req)?)
}

const FORGET_DESCRIPTION: &str = "Drop a VM's record only; QEMU and its files stay. A live VM \
    mcqemu started needs force.";

/// `forget_vm`.
pub const FORGET: ToolDef = ToolDef {
    name: "forget_vm",
    title: "Forget a VM",
    description: FORGET_DESCRIPTION,
    input_schema: ForgetArgs::param,
    output_schema: <crate::ops::vm::lifecycle::Forgotten as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE,
    handler: forget_vm,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct ForgetArgs {
        name: VmName,
        force: bool = {"default": false},
    }
}

fn forget_vm(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let ForgetArgs { name, force } = args.parse()?;
    let name = name.0;
    let done = lifecycle::forget(&name, force)?;
    ctx.log.log(
        "notice",
        &format!("forget_vm {name} (was running: {})", done.was_running),
    );
    crate::tools::to_output(&done)
}
