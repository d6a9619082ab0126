//! `launch_vm`: its definition and arguments; the launch itself is [`crate::ops::launch`].

use super::params::{launch_args, launch_out, launch_props};
use super::{object, vm_name_arg};
use crate::mcp::tool::{Annotations, Args, ToolCtx, ToolDef, ToolOutput, ToolResult};
use crate::ops::launch::launch;
use crate::ops::launch_args::{checked_disks, request};

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
    let disks = checked_disks(&name, &args.str_list("disks")?)?;
    let req = request(&launch_args(args)?, &name, disks)?;
    Ok(ToolOutput::json(launch(ctx, req)?))
}
