//! vm_mount: host folders mounted into and removed from a running VM. An adapter over
//! [`crate::ops::guest::mounts`].

use std::time::Duration;

use serde_json::json;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::guest::mounts as m;
use crate::tools::params::{mounts_arg, mounts_schema};
use crate::tools::{object, presets, vm_name_arg};

const DESCRIPTION: &str = "Mount host folders into a running VM, or remove them, live: add \
    takes launch_vm's mounts ({host, guest, writable}; host inside the roots, read-only unless \
    writable), remove guest paths. Removals happen first; a removed mount is unmounted in the \
    guest (programs inside get errors, never a hang). With neither, mounts still waiting for \
    the guest (a launch_vm'd guest with qemu-ga) are made now. Waits until the guest has \
    mounted them (wait_s) and returns what was added, removed, and the VM's mounts now; \
    vm_info shows them too. The guest needs fuse.ko; with qemu-ga as its agent, mcqemu puts \
    its own relay into /var/lib/mcqemu.";

/// `vm_mount`.
pub const MOUNT: ToolDef = ToolDef {
    name: "vm_mount",
    title: "Mount host folders into a running VM",
    description: DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "add": mounts_schema(),
                "remove": {"type": "array", "items": {"type": "string", "minLength": 1},
                           "default": [], "description": "Guest paths of mounts to remove."},
                "wait_s": {"type": "number", "minimum": 0, "maximum": 600, "default": 20,
                           "description": "How long to wait for the guest to mount them."}
            }),
            &["name"],
        )
    },
    output_schema: || {
        let list = json!({"type": "array", "items": {"type": "object"}});
        json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "added": list, "removed": list,
                           "mounts": list},
            "required": ["name", "added", "removed", "mounts"]
        })
    },
    annotations: presets::ADDITIVE,
    handler: mount,
    ui: crate::mcp::tool::Ui::NONE,
};

fn mount(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let req = m::Request {
        name: vm_name_arg(args)?,
        add: mounts_arg(args, "add")?,
        remove: args.str_list("remove")?,
        wait: Duration::from_secs_f64(args.number("wait_s").unwrap_or(20.0).clamp(0.0, 600.0)),
    };
    let out = m::apply(ctx, &req)?;
    crate::tools::to_output(&out)
}
