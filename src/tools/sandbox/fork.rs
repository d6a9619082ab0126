//! `sandbox_fork`, `sandbox_suspend` and `sandbox_resume`: their definitions and arguments; the
//! work is [`crate::ops::sandbox::fork`] and [`crate::ops::sandbox::suspend`].

use std::time::Duration;

use serde_json::json;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::ops::sandbox::fork::{self, ForkRequest, MAX_COPIES};
use crate::ops::sandbox::suspend;
use crate::tools::{object, presets, vm_name_arg};

const FORK_DESCRIPTION: &str = "Make count live copies of a running sandbox as it is now: \
    memory, disk and running processes. The sandbox is paused only for the last step of the \
    copy (parent_paused_ms; for the whole copy under TCG before QEMU 9.0, whose live copies \
    lose writes: copied says which) and runs on. Each copy is an ordinary sandbox (listed, counted in \
    the quotas, removed with sandbox_destroy) with its own disk overlay on a frozen copy of the \
    parent's disk, its own generation ID, clock and randomness, and the parent's guest ports \
    forwarded from new host ports. Copies share the memory they have not changed. Forks of \
    forks work. All copies are made or none.";

/// `sandbox_fork`.
pub const FORK: ToolDef = ToolDef {
    name: "sandbox_fork",
    title: "Fork a running sandbox",
    description: FORK_DESCRIPTION,
    input_schema: || {
        let mut props = json!({
            "name": presets::name_schema(),
            "count": {"type": "integer", "minimum": 1, "maximum": MAX_COPIES, "default": 1,
                      "description": "How many copies (default: one per name in names, \
                          else 1)."},
            "names": {"type": "array", "items": presets::name_schema(),
                      "description": "The copies' names, one per copy (default: \
                          NAME-fork-1, NAME-fork-2, ...)."},
            "wait_agent_s": {"type": "number", "minimum": 1, "maximum": 600, "default": 60,
                             "description": "How long each copy's guest agent may take."}
        });
        crate::tools::params::lifetime_props(
            &mut props,
            "Default for a copy: the parent's limits, from the copy's start (else a \
                sandbox's: a day, and suspend after 900 idle seconds).",
            &["stop", "suspend", "destroy"],
        );
        object(props, &["name"])
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "parent": {"type": "string"},
                "copies": {"type": "array", "items": {"type": "object"}},
                "parent_paused_ms": {"type": "integer"},
                "copied": {"type": "string", "enum": ["live", "stopped"]},
                "capture_ms": {"type": "integer"},
                "first_ready_ms": {"type": "integer"},
                "all_ready_ms": {"type": "integer"},
                "state_bytes": {"type": "integer"},
                "ram_bytes": {"type": "integer"},
                "frozen": {"type": "string"}
            },
            "required": ["parent", "copies", "parent_paused_ms"]
        })
    },
    annotations: presets::ADDITIVE,
    handler: sandbox_fork,
    ui: presets::OPENS_VIEW,
};

fn sandbox_fork(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let names = args.opt_str_list("names")?;
    // Names alone say how many copies.
    let given = names.as_ref().map_or(1, |n| n.len() as i64);
    let count = args.i64_or("count", given)?;
    let req = ForkRequest {
        name: vm_name_arg(args)?,
        count: usize::try_from(count).unwrap_or(0),
        names,
        wait_agent: wait(args)?,
        lifetime: crate::tools::params::lifetime_arg(args)?,
    };
    let forked = fork::fork(ctx, &req)?;
    let out = serde_json::to_value(&forked)
        .map_err(|e| ToolError::new(format!("cannot shape the fork's result: {e}")))?;
    Ok(ToolOutput::json(out))
}

/// `wait_agent_s` (bounds and default in the schema).
fn wait(args: &Args) -> Result<Duration, ToolError> {
    Ok(Duration::from_secs_f64(args.number("wait_agent_s")?))
}

const SUSPEND_DESCRIPTION: &str = "Save a sandbox to disk with its processes, memory and devices, \
    and end its QEMU (its host memory is freed). It stays listed as suspended, survives a \
    server restart and a host reboot, and comes back with sandbox_resume (or goes with \
    sandbox_destroy). The saved memory takes disk for what the guest touched. A VM with a \
    device that cannot migrate is refused, naming it.";

/// `sandbox_suspend`.
pub const SUSPEND: ToolDef = ToolDef {
    name: "sandbox_suspend",
    title: "Suspend a sandbox to disk",
    description: SUSPEND_DESCRIPTION,
    input_schema: presets::name_only,
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"}, "status": {"type": "string"},
                "suspend_ms": {"type": "integer"}, "state_bytes": {"type": "integer"},
                "ram_bytes": {"type": "integer"}, "path": {"type": "string"},
                "warnings": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["name", "status", "suspend_ms"]
        })
    },
    annotations: presets::DESTRUCTIVE_IDEMPOTENT,
    handler: sandbox_suspend,
    ui: crate::mcp::tool::Ui::NONE,
};

fn sandbox_suspend(ctx: &ToolCtx, args: &Args) -> ToolResult {
    crate::tools::to_output(&suspend::suspend(ctx, &vm_name_arg(args)?)?)
}

const RESUME_DESCRIPTION: &str = "Bring a suspended sandbox back: its processes, memory and \
    disk as they were, under the same name and port forwards, its clock set; ready when its \
    guest agent answers (in about the time of a clone).";

/// `sandbox_resume`.
pub const RESUME: ToolDef = ToolDef {
    name: "sandbox_resume",
    title: "Resume a suspended sandbox",
    description: RESUME_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "wait_agent_s": {"type": "number", "minimum": 1, "maximum": 600, "default": 60,
                                 "description": "How long the guest agent may take."}
            }),
            &["name"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"}, "status": {"type": "string"},
                "resume_ms": {"type": "integer"}, "agent_ready": {"type": "boolean"},
                "port_forwards": {"type": "array", "items": {"type": "object"}},
                "steps_ms": {"type": "object"}
            },
            "required": ["name", "status", "resume_ms"]
        })
    },
    annotations: presets::ADDITIVE,
    handler: sandbox_resume,
    ui: crate::mcp::tool::Ui::NONE,
};

fn sandbox_resume(ctx: &ToolCtx, args: &Args) -> ToolResult {
    crate::tools::to_output(&suspend::resume(ctx, &vm_name_arg(args)?, wait(args)?)?)
}
