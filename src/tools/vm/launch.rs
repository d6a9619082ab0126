//! `launch_vm`: its definition and arguments; the launch itself is [`crate::ops::vm::launch`].

use std::time::Duration;

use serde_json::json;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::guest::run::{agent_then_cloud_init, report_cloud_init};
use crate::ops::vm::launch::launch;
use crate::ops::vm::launch_args::{checked_disks, request};
use crate::tools::params::{launch_args, launch_out, launch_props};
use crate::tools::{object, presets, vm_name_arg};

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
    input_schema: || {
        let mut props = launch_props();
        crate::tools::params::lifetime_props(
            &mut props,
            "Default for launch_vm: none (a launched VM may be a person's install; only stop \
                is allowed).",
            &["stop"],
        );
        props["wait_cloud_init"] = json!({
            "type": "boolean", "default": false,
            "description": "With cloud_init: wait, through the guest agent, until cloud-init \
                has finished, and report its status (a failed module is a warning)."
        });
        props["wait_cloud_init_s"] = json!({
            "type": "number", "minimum": 0, "maximum": 3600, "default": 600,
            "description": "How long wait_cloud_init waits in all (agent and cloud-init)."
        });
        object(props, &["name"])
    },
    output_schema: launch_out,
    annotations: presets::ADDITIVE,
    handler: launch_vm,
    ui: presets::OPENS_VIEW,
};

fn launch_vm(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let disks = checked_disks(&name, &args.str_list("disks")?)?;
    let la = launch_args(args)?;
    // Mounts are checked before anything starts, and plugged in once QEMU runs.
    crate::ops::vm::mounts::check(&la.mounts, &[])?;
    let req = request(&la, &name, disks)?;
    let mut out = launch(ctx, req)?;
    // The VM runs either way: a mount that could not be plugged in is a warning (vm_info
    // shows the mounts that were; vm_mount adds the rest).
    match crate::ops::guest::mounts::after_start(ctx, &name, &la.mounts, None) {
        Ok(m) => out.mounts = m,
        Err(e) => out.warnings.push(format!("mounts: {e}")),
    }
    if args.bool_or("wait_cloud_init", false)? {
        let wait = Duration::from_secs_f64(args.number("wait_cloud_init_s")?);
        let (waited, saw) = agent_then_cloud_init(ctx, &name, wait)?;
        report_cloud_init(&mut out.warnings, &mut out.cloud_init, waited, &saw);
    }
    crate::tools::to_output(&out)
}
