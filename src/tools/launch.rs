//! `launch_vm`: its definition and arguments; the launch itself is [`crate::ops::launch`].

use serde_json::{Map, Value};

use super::params::{launch_out, launch_props};
use super::{checked_image, object, vm_name_arg};
use crate::mcp::tool::{Annotations, Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::ops::launch::{launch, request_from_args};
use crate::qemu::vm;
use crate::state::roots::{self, Access};

const LAUNCH_DESCRIPTION: &str = "Start a QEMU virtual machine that outlives this server, with a \
    QMP control socket, a guest-agent channel (virtio-serial org.qemu.guest_agent.0) and a serial \
    console log. Disk formats are probed. Returns the PID, the accelerator QEMU really uses, \
    resolved host ports and socket/log paths. Boot an installer with iso; boot a kernel directly \
    with kernel/initrd/append.";

/// `launch_vm`.
pub const LAUNCH: ToolDef = ToolDef {
    name: "launch_vm",
    title: "Launch a VM",
    description: LAUNCH_DESCRIPTION,
    input_schema: || object(launch_props(), &["name"]),
    output_schema: launch_out,
    annotations: Annotations {
        read_only: false,
        destructive: false,
        idempotent: false,
        open_world: false,
    },
    handler: launch_vm,
};

fn launch_vm(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    // Formats probed at an earlier launch of this VM stay pinned: a guest that wrote another
    // format's header into its raw disk must not change how the next launch opens it.
    let pinned: Map<String, Value> = vm::registry()
        .load()
        .get(&name)
        .and_then(|r| r.get("disk_formats"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut disks = Vec::new();
    for (i, d) in args.str_list("disks")?.iter().enumerate() {
        let p = roots::check_str(d, Access::Write)
            .map_err(|e| ToolError::new(format!("disks[{i}]: {e}")))?;
        if !p.is_file() {
            return Err(ToolError::new(format!(
                "disks[{i}]: {} does not exist or is not a file; create one with image_create",
                p.display()
            )));
        }
        let pin = pinned.get(&p.display().to_string()).and_then(Value::as_str);
        let fmt = checked_image(&p, &format!("disks[{i}]"), pin)?.format;
        disks.push((p, fmt));
    }
    let req = request_from_args(args, &name, disks)?;
    Ok(launch(ctx, req).map(ToolOutput::json)?)
}
