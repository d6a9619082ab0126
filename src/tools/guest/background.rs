//! Background processes' tools: guest_exec_status reads one by offsets, guest_exec_kill ends
//! it (guest_exec {background: true} starts one). Adapters over [`crate::ops::guest::background`].

use std::time::Duration;

use serde::Deserialize;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolResult};
use crate::ops::guest::background as bg;
use crate::schema::Param;
use crate::tools::names::VmName;
use crate::tools::presets;

const STATUS_DESCRIPTION: &str = "A background process's state (running, exitcode or signal) and \
    its output since stdout_offset and stderr_offset, with the next offsets (at most 1 MiB a \
    stream; more says there is more; the last 8 MiB stay readable). wait_s waits for new output or \
    the end.";

/// `guest_exec_status`.
pub const STATUS: ToolDef = ToolDef {
    name: "guest_exec_status",
    title: "Read a background process",
    description: STATUS_DESCRIPTION,
    input_schema: StatusArgs::param,
    output_schema: <crate::ops::guest::background::Status as crate::schema::Schema>::schema,
    annotations: presets::READ_ONLY,
    handler: status,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct StatusArgs {
        name: VmName,
        /// From guest_exec with background=true.
        handle: String = {"minLength": 1},
        stdout_offset: u64 = {"minimum": 0, "default": 0},
        stderr_offset: u64 = {"minimum": 0, "default": 0},
        wait_s: f64 = {"minimum": 0, "maximum": 300, "default": 0},
    }
}

fn status(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: StatusArgs = args.parse()?;
    let req = bg::StatusRequest {
        name: a.name.0,
        handle: a.handle,
        stdout_offset: a.stdout_offset,
        stderr_offset: a.stderr_offset,
        wait: Duration::from_secs_f64(a.wait_s),
    };
    crate::tools::to_output(&bg::status(&req, &|| ctx.cancelled())?)
}

const KILL_DESCRIPTION: &str = "Signal a background process and its children (TERM default; KILL \
    follows after 5 s). Its output stays readable.";

/// `guest_exec_kill`.
pub const KILL: ToolDef = ToolDef {
    name: "guest_exec_kill",
    title: "End a background process",
    description: KILL_DESCRIPTION,
    input_schema: KillArgs::param,
    output_schema: <crate::ops::guest::background::Killed as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE_IDEMPOTENT,
    handler: kill,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct KillArgs {
        name: VmName,
        handle: String = {"minLength": 1},
        signal: String = {"minLength": 1, "default": "TERM"},
    }
}

fn kill(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: KillArgs = args.parse()?;
    let sig = &a.signal;
    let signal = bg::signal_number(sig).ok_or_else(|| {
        ToolError::new(format!(
            "signal {sig:?} is not one guest_exec_kill knows: use TERM, INT, HUP, QUIT, KILL, \
             USR1, USR2, STOP, CONT or a number from 1 to 64"
        ))
    })?;
    let req = bg::KillRequest {
        name: a.name.0,
        handle: a.handle,
        signal,
    };
    crate::tools::to_output(&bg::kill(&req)?)
}
