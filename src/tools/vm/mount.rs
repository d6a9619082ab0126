//! vm_mount: host folders mounted into and removed from a running VM. An adapter over
//! [`crate::ops::guest::mounts`].

use std::time::Duration;

use serde::Deserialize;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::guest::mounts as m;
use crate::schema::Param;
use crate::tools::names::VmName;
use crate::tools::params::Mounts;
use crate::tools::presets;

const DESCRIPTION: &str = "Mount host folders into a running VM or remove them, live: add as \
    launch_vm's mounts, remove guest paths (removals first; programs inside get errors, never a \
    hang). With neither, mounts still waiting for the guest are made. Waits until the guest has \
    them (wait_s).";

/// `vm_mount`.
pub const MOUNT: ToolDef = ToolDef {
    name: "vm_mount",
    title: "Mount host folders into a running VM",
    description: DESCRIPTION,
    input_schema: MountArgs::param,
    output_schema: <crate::ops::guest::mounts::Outcome as crate::schema::Schema>::schema,
    annotations: presets::ADDITIVE,
    handler: mount,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct MountArgs {
        name: VmName,
        #[serde(default)]
        add: Mounts,
        /// Guest paths of mounts to remove.
        remove: Vec<String> = {"items": {"minLength": 1}, "default": []},
        /// For the guest to mount them.
        wait_s: f64 = {"minimum": 0, "maximum": 600, "default": 20},
    }
}

fn mount(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: MountArgs = args.parse()?;
    let req = m::Request {
        name: a.name.0,
        add: a.add.0,
        remove: a.remove,
        wait: Duration::from_secs_f64(a.wait_s),
    };
    let out = m::apply(ctx, &req)?;
    crate::tools::to_output(&out)
}
