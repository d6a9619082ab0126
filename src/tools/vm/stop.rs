//! `stop_vm`: its definition and arguments; the stop itself is [`crate::ops::vm::stop`].

use std::time::Duration;

use serde::Deserialize;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::vm::stop;
use crate::schema::Param;
use crate::tools::names::VmName;
use crate::tools::presets;

const STOP_DESCRIPTION: &str = "Stop a VM: ACPI power-down, waiting up to timeout seconds; force: \
    QMP quit, SIGTERM, SIGKILL, each verified. The record stays (forget_vm drops it).";

/// `stop_vm`.
pub const STOP: ToolDef = ToolDef {
    name: "stop_vm",
    title: "Stop a VM",
    description: STOP_DESCRIPTION,
    input_schema: StopArgs::param,
    output_schema: <crate::ops::vm::stop::Stopped as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE_IDEMPOTENT,
    handler: stop_vm,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct StopArgs {
        name: VmName,
        force: bool = {"default": false},
        /// Seconds to wait for a graceful stop.
        timeout: f64 = {"minimum": 0, "maximum": 3600, "default": 30},
    }
}

fn stop_vm(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: StopArgs = args.parse()?;
    let timeout = Duration::from_secs_f64(a.timeout);
    crate::tools::to_output(&stop::stop(ctx, &a.name.0, a.force, timeout)?)
}
