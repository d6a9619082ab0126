//! vm_port_forward: host forwards added to and removed from a running VM. An adapter over
//! [`crate::ops::vm::port_forward`].

use serde_json::json;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::ops::vm::port_forward as pf;
use crate::tools::{object, presets, vm_name_arg};

const DESCRIPTION: &str = "Add and remove host port forwards on a running VM (its user \
    network takes them live): add takes launch_vm's forms (\"HOST:GUEST\", \"auto:GUEST\", \
    \"GUEST\", \"ADDR:HOST:GUEST\"; auto picks a free host port), remove a host port or a spec \
    as added. Removals happen first. Returns what was added (with the ports picked), removed, \
    and the VM's forwards now; vm_info and a restarted server see the same set.";

/// `vm_port_forward`.
pub const FORWARD: ToolDef = ToolDef {
    name: "vm_port_forward",
    title: "Change a running VM's port forwards",
    description: DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "add": {"type": "array", "items": {"type": "string", "minLength": 1},
                        "default": []},
                "remove": {"type": "array", "items": {"type": "string", "minLength": 1},
                           "default": []}
            }),
            &["name"],
        )
    },
    output_schema: || {
        let list = json!({"type": "array", "items": {"type": "object"}});
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"}, "added": list, "removed": list,
                "port_forwards": list
            },
            "required": ["name", "added", "removed", "port_forwards"]
        })
    },
    annotations: presets::ADDITIVE,
    handler: forward,
    ui: crate::mcp::tool::Ui::NONE,
};

fn forward(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let req = pf::Request {
        name: vm_name_arg(args)?,
        add: args.str_list("add")?,
        remove: args.str_list("remove")?,
    };
    if req.add.is_empty() && req.remove.is_empty() {
        return Err(ToolError::new(
            "give add, remove or both (vm_info shows the VM's forwards)",
        ));
    }
    let out = pf::apply(&req)?;
    serde_json::to_value(out)
        .map(ToolOutput::json)
        .map_err(|e| ToolError::new(format!("cannot shape the result: {e}")))
}
