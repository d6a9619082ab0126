//! Background processes' tools: guest_exec_status reads one by offsets, guest_exec_kill ends
//! it (guest_exec {background: true} starts one). Adapters over [`crate::ops::guest::background`].

use std::time::Duration;

use serde_json::json;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolResult};
use crate::ops::guest::background as bg;
use crate::tools::{object, presets, vm_name_arg};

const STATUS_DESCRIPTION: &str = "A background process's state (running, or its exitcode or \
    signal) and the output it wrote since stdout_offset / stderr_offset, with the offsets to \
    pass next time (nothing repeated, nothing lost; at most 1 MiB per stream per call, `more` \
    says when there is more; only the last 8 MiB of each stream stay readable and \
    *_dropped counts what was skipped). wait_s waits up to that long for new output or the end.";

/// `guest_exec_status`.
pub const STATUS: ToolDef = ToolDef {
    name: "guest_exec_status",
    title: "Read a background process",
    description: STATUS_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "handle": {"type": "string", "minLength": 1,
                           "description": "From guest_exec with background=true."},
                "stdout_offset": {"type": "integer", "minimum": 0, "default": 0},
                "stderr_offset": {"type": "integer", "minimum": 0, "default": 0},
                "wait_s": {"type": "number", "minimum": 0, "maximum": 300, "default": 0}
            }),
            &["name", "handle"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"}, "handle": {"type": "string"},
                "pid": {"type": "integer"}, "command": {"type": "string"},
                "running": {"type": "boolean"},
                "exitcode": {"type": ["integer", "null"]},
                "signal": {"type": ["integer", "null"]},
                "stdout": {"type": "string"}, "stderr": {"type": "string"},
                "stdout_next_offset": {"type": "integer"},
                "stderr_next_offset": {"type": "integer"},
                "stdout_dropped": {"type": "integer"}, "stderr_dropped": {"type": "integer"},
                "more": {"type": "boolean"}
            },
            "required": ["name", "handle", "running", "stdout", "stderr",
                         "stdout_next_offset", "stderr_next_offset"]
        })
    },
    annotations: presets::READ_ONLY,
    handler: status,
    ui: crate::mcp::tool::Ui::NONE,
};

fn offset(args: &Args, key: &str) -> Result<u64, ToolError> {
    let v = args.int(key)?;
    u64::try_from(v).map_err(|_| ToolError::new(format!("{key} must be 0 or more")))
}

fn status(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let req = bg::StatusRequest {
        name: vm_name_arg(args)?,
        handle: args.str("handle")?.to_string(),
        stdout_offset: offset(args, "stdout_offset")?,
        stderr_offset: offset(args, "stderr_offset")?,
        wait: Duration::from_secs_f64(args.number("wait_s")?),
    };
    crate::tools::to_output(&bg::status(&req, &|| ctx.cancelled())?)
}

const KILL_DESCRIPTION: &str = "End a background process: its signal (TERM by default; a name \
    such as INT or KILL, or a number) goes to the process and its children, and SIGKILL follows \
    after 5 s if it still runs. Its output stays readable with guest_exec_status.";

/// `guest_exec_kill`.
pub const KILL: ToolDef = ToolDef {
    name: "guest_exec_kill",
    title: "End a background process",
    description: KILL_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "handle": {"type": "string", "minLength": 1},
                "signal": {"type": "string", "minLength": 1, "default": "TERM"}
            }),
            &["name", "handle"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"}, "handle": {"type": "string"},
                "pid": {"type": "integer"}, "signalled": {"type": "boolean"},
                "forced": {"type": "boolean"},
                "exitcode": {"type": ["integer", "null"]},
                "signal": {"type": ["integer", "null"]}
            },
            "required": ["name", "handle", "pid", "signalled", "forced"]
        })
    },
    annotations: presets::DESTRUCTIVE_IDEMPOTENT,
    handler: kill,
    ui: crate::mcp::tool::Ui::NONE,
};

fn kill(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let sig = args.str_or("signal", "TERM")?;
    let signal = bg::signal_number(sig).ok_or_else(|| {
        ToolError::new(format!(
            "signal {sig:?} is not one guest_exec_kill knows: use TERM, INT, HUP, QUIT, KILL, \
             USR1, USR2, STOP, CONT or a number from 1 to 64"
        ))
    })?;
    let req = bg::KillRequest {
        name: vm_name_arg(args)?,
        handle: args.str("handle")?.to_string(),
        signal,
    };
    crate::tools::to_output(&bg::kill(&req)?)
}
