//! `sandbox_fork`, `sandbox_suspend` and `sandbox_resume`: their definitions and arguments; the
//! work is [`crate::ops::sandbox::fork`] and [`crate::ops::sandbox::suspend`].

use serde::Deserialize;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::sandbox::fork::{self, ForkRequest, MAX_COPIES};
use crate::ops::sandbox::request::COPY_AGENT_WAIT;
use crate::ops::sandbox::suspend;
use crate::ops::vm::lifetime::ACTIONS;
use crate::schema::Param;
use crate::tools::names::{VmName, VmOnly};
use crate::tools::params::{action_extra, agent_wait_extra, asked, idle_extra, ttl_extra};
use crate::tools::presets;

const FORK_DESCRIPTION: &str = "Make count live copies of a running sandbox: memory, disk and \
    processes. The parent pauses only for the copy's last step (parent_paused_ms) and runs on. \
    Each copy is an ordinary sandbox with its own disk overlay, clock, randomness and host ports. \
    All copies are made or none.";

/// `sandbox_fork`.
pub const FORK: ToolDef = ToolDef {
    name: "sandbox_fork",
    title: "Fork a running sandbox",
    description: FORK_DESCRIPTION,
    input_schema: ForkArgs::param,
    output_schema: <crate::ops::sandbox::fork::Forked as crate::schema::Schema>::schema,
    annotations: presets::ADDITIVE,
    handler: sandbox_fork,
    ui: presets::OPENS_VIEW,
};

crate::params! {
    #[derive(Deserialize)]
    struct ForkArgs {
        name: VmName,
        /// Default: one per name, else 1.
        count: Option<u64> = {"minimum": 1, "maximum": MAX_COPIES, "default": 1},
        /// Default NAME-fork-1, ...
        names: Option<Vec<VmName>>,
        wait_agent_s: Option<f64> = (agent_wait_extra(COPY_AGENT_WAIT)),
        ttl_s: Option<u64> = (ttl_extra("Default: the parent's.")),
        idle_s: Option<u64> = (idle_extra()),
        on_idle: Option<String> = (action_extra(&ACTIONS, true)),
        on_ttl: Option<String> = (action_extra(&ACTIONS, false)),
    }
}

fn sandbox_fork(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: ForkArgs = args.parse()?;
    let names: Option<Vec<String>> = a.names.map(|n| n.into_iter().map(|n| n.0).collect());
    // Names alone say how many copies.
    let given = names.as_ref().map_or(1, |n| n.len() as u64);
    let req = ForkRequest {
        name: a.name.0,
        count: usize::try_from(a.count.unwrap_or(given)).unwrap_or(0),
        names,
        wait_agent: COPY_AGENT_WAIT.of(a.wait_agent_s),
        lifetime: asked(a.ttl_s, a.idle_s, a.on_idle, a.on_ttl),
    };
    crate::tools::to_output(&fork::fork(ctx, &req)?)
}

const SUSPEND_DESCRIPTION: &str = "Save a sandbox with its processes and memory to disk and end \
    its QEMU, freeing its memory. It stays listed, survives restarts and reboots, and returns with \
    sandbox_resume.";

/// `sandbox_suspend`.
pub const SUSPEND: ToolDef = ToolDef {
    name: "sandbox_suspend",
    title: "Suspend a sandbox to disk",
    description: SUSPEND_DESCRIPTION,
    input_schema: VmOnly::param,
    output_schema: <crate::ops::sandbox::suspend::Suspended as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE_IDEMPOTENT,
    handler: sandbox_suspend,
    ui: crate::mcp::tool::Ui::NONE,
};

fn sandbox_suspend(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = args.parse::<VmOnly>()?.name();
    crate::tools::to_output(&suspend::suspend(ctx, &name)?)
}

const RESUME_DESCRIPTION: &str = "Bring a suspended sandbox back as it was, same name and \
    forwards; ready when its agent answers.";

/// `sandbox_resume`.
pub const RESUME: ToolDef = ToolDef {
    name: "sandbox_resume",
    title: "Resume a suspended sandbox",
    description: RESUME_DESCRIPTION,
    input_schema: ResumeArgs::param,
    output_schema: <crate::ops::sandbox::suspend::Resumed as crate::schema::Schema>::schema,
    annotations: presets::ADDITIVE,
    handler: sandbox_resume,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct ResumeArgs {
        name: VmName,
        wait_agent_s: Option<f64> = (agent_wait_extra(COPY_AGENT_WAIT)),
    }
}

fn sandbox_resume(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: ResumeArgs = args.parse()?;
    let wait = COPY_AGENT_WAIT.of(a.wait_agent_s);
    crate::tools::to_output(&suspend::resume(ctx, &a.name.0, wait)?)
}
