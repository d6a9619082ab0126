//! vm_port_forward: host forwards added to and removed from a running VM. An adapter over
//! [`crate::ops::vm::port_forward`].

use serde::Deserialize;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolResult};
use crate::ops::vm::port_forward as pf;
use crate::schema::Param;
use crate::tools::names::VmName;
use crate::tools::presets;

const DESCRIPTION: &str = "Add and remove port forwards on a running VM, live: add takes \
    launch_vm's forms (auto picks a free port), remove a host port or a spec as added; removals \
    first. Returns added, removed and the forwards now.";

/// `vm_port_forward`.
pub const FORWARD: ToolDef = ToolDef {
    name: "vm_port_forward",
    title: "Change a running VM's port forwards",
    description: DESCRIPTION,
    input_schema: ForwardArgs::param,
    output_schema: <crate::ops::vm::port_forward::Outcome as crate::schema::Schema>::schema,
    annotations: presets::ADDITIVE,
    handler: forward,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct ForwardArgs {
        name: VmName,
        add: Vec<String> = {"items": {"minLength": 1}, "default": []},
        remove: Vec<String> = {"items": {"minLength": 1}, "default": []},
    }
}

fn forward(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: ForwardArgs = args.parse()?;
    let req = pf::Request {
        name: a.name.0,
        add: a.add,
        remove: a.remove,
    };
    if req.add.is_empty() && req.remove.is_empty() {
        return Err(ToolError::new(
            "give add, remove or both (vm_info shows the VM's forwards)",
        ));
    }
    crate::tools::to_output(&pf::apply(&req)?)
}
