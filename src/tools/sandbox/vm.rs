//! `sandbox_vm` and `sandbox_destroy`: their definitions and arguments; the sandboxes
//! themselves are [`crate::ops::sandbox`].

use serde::Deserialize;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::sandbox;
use crate::ops::sandbox::request::{Root, SandboxRequest};
use crate::ops::vm::launch::DEFAULT_MEMORY_MB;
use crate::ops::vm::launch_args::PortSpec;
use crate::ops::vm::lifetime::ACTIONS;
use crate::schema::Param;
use crate::tools::names::VmOnly;
use crate::tools::params::{
    action_extra, asked, idle_extra, memory_extra, ttl_extra, Machine, SandboxCommon,
};
use crate::tools::presets;

const SANDBOX_DESCRIPTION: &str = "A disposable VM: an overlay on base_image (never modified), a \
    container image (oci) or a clone of a template, then a wait for its guest agent. Use \
    guest_exec and guest_file_*, then sandbox_destroy. Guest network is off unless allow_network; \
    auto:22 is forwarded by default. A failed cloud-init module is a warning. Ends by itself: \
    suspended after 900 idle seconds, stopped after a day (vm_lifetime).";

/// `sandbox_vm`.
pub const SANDBOX: ToolDef = ToolDef {
    name: "sandbox_vm",
    title: "Start a disposable sandbox VM",
    description: SANDBOX_DESCRIPTION,
    input_schema: SandboxArgs::param,
    output_schema: <crate::ops::sandbox::result::Sandboxed as crate::schema::Schema>::schema,
    annotations: presets::ADDITIVE,
    handler: sandbox_vm,
    ui: presets::OPENS_VIEW,
};

crate::params! {
    #[derive(Deserialize)]
    struct SandboxArgs {
        /// Never modified. Give this, oci or template.
        base_image: Option<String> = {"minLength": 1},
        #[serde(flatten)]
        common: SandboxCommon,
        /// With oci: start its Entrypoint and Cmd in the background (image_process.handle).
        run: bool = {"default": false},
        /// With oci: forward auto ports to its ExposedPorts.
        expose: bool = {"default": false},
        /// Clone this template (~0.1 s); it fixes memory, cpus and disks.
        template: Option<String>,
        /// A sandbox_push reference: start that sandbox here.
        from: Option<String> = {"minLength": 1, "maxLength": 512},
        /// Default: sandbox, sandbox-2, ...
        name: Option<String>,
        memory_mb: Option<i64> = (memory_extra(DEFAULT_MEMORY_MB)),
        /// Default ["auto:22"].
        port_forwards: Option<Vec<PortSpec>>,
        #[serde(flatten)]
        guest: Machine,
        ttl_s: Option<u64> = (ttl_extra("Default 86400, then stop; idle_s 900, then suspend.")),
        idle_s: Option<u64> = (idle_extra()),
        on_idle: Option<String> = (action_extra(&ACTIONS, true)),
        on_ttl: Option<String> = (action_extra(&ACTIONS, false)),
    }
}

fn sandbox_vm(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let mut a: SandboxArgs = args.parse()?;
    let mut launch = a.guest.launch(a.memory_mb);
    let allow_network = a.common.onto(&mut launch)?;
    launch.port_forwards = a.port_forwards;
    launch.lifetime = asked(a.ttl_s, a.idle_s, a.on_idle, a.on_ttl);
    let req = SandboxRequest {
        name: a.name,
        root: Root::given(a.base_image, a.common.oci, a.template, a.from)?,
        run: a.run,
        expose: a.expose,
        disk_size: a.common.disk_size,
        launch,
        allow_network,
        wait_agent_s: a.common.wait_agent_s,
        wait_cloud_init: a.common.wait_cloud_init,
        wait_cloud_init_s: Some(a.common.wait_cloud_init_s),
    };
    crate::tools::to_output(&sandbox::create(ctx, &req)?)
}

const DESTROY_DESCRIPTION: &str = "Stop a sandbox_vm VM, delete its overlay and state folder, and \
    drop its record; the base image is never touched. destroyed says what happened; errors lists \
    cleanup problems.";

/// `sandbox_destroy`.
pub const DESTROY: ToolDef = ToolDef {
    name: "sandbox_destroy",
    title: "Destroy a sandbox",
    description: DESTROY_DESCRIPTION,
    input_schema: VmOnly::param,
    output_schema: <crate::ops::sandbox::destroy::Destroyed as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE,
    handler: destroy,
    ui: crate::mcp::tool::Ui::NONE,
};

fn destroy(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = args.parse::<VmOnly>()?.name();
    crate::tools::to_output(&crate::ops::sandbox::destroy::destroy(ctx, &name)?)
}
