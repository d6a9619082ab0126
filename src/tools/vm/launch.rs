//! `launch_vm`: its definition and arguments; the operation is
//! [`crate::ops::guest::launch::launch_vm`].

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::guest::launch::{self as guest_launch, LaunchVm};
use crate::ops::vm::launch::DEFAULT_MEMORY_MB;
use crate::ops::vm::launch_args::{LaunchArgs, PortSpec};
use crate::schema::{Param, Schema};
use crate::tools::names::VmName;
use crate::tools::params::{
    action_extra, asked, cloud_init_extra, idle_extra, memory_extra, ttl_extra, AllowNetwork,
    Machine, Mounts, NAME_PATTERN,
};
use crate::tools::presets;

const LAUNCH_DESCRIPTION: &str = "Start a VM that outlives this server, with a QMP socket, a \
    guest-agent channel and a serial log. Returns the PID, the accelerator in use, host ports and \
    paths. iso boots an installer; kernel boots a kernel directly.";

/// `launch_vm`.
pub const LAUNCH: ToolDef = ToolDef {
    name: "launch_vm",
    title: "Launch a VM",
    description: LAUNCH_DESCRIPTION,
    input_schema: LaunchParams::param,
    output_schema: <crate::ops::vm::launch::Launched as Schema>::schema,
    annotations: presets::ADDITIVE,
    handler: launch_vm,
    ui: presets::OPENS_VIEW,
};

crate::params! {
    #[derive(Deserialize)]
    struct LaunchParams {
        name: VmName = {"maxLength": 48, "pattern": NAME_PATTERN},
        #[serde(flatten)]
        guest: Machine,
        /// Image paths (formats probed).
        disks: Vec<String> = {"default": []},
        /// Installer ISO as a CD-ROM (boots first).
        iso: Option<String>,
        memory_mb: Option<i64> = (memory_extra(DEFAULT_MEMORY_MB)),
        /// Default q35 on x86, virt on Arm/RISC-V.
        #[serde(rename = "machine")]
        machine_type: Option<String>,
        /// TCP: "HOST:GUEST", "auto:GUEST", "GUEST", "ADDR:HOST:GUEST" (127.0.0.1 unless ADDR).
        port_forwards: Vec<PortSpec> = {"default": []},
        /// No network card.
        no_net: bool = {"default": false},
        allow_network: Option<AllowNetwork> = {"default": true},
        /// Same as allow_network false.
        restrict_net: bool = {"default": false},
        /// Names of the operator's secrets, added by the egress proxy (needs allow_network
        /// rules); the guest holds placeholders.
        secrets: Vec<String> = {"default": [], "maxItems": 16, "items": {"minLength": 1, "maxLength": 64}},
        /// OPERATOR-ONLY extra QEMU arguments (none reaching host files).
        extra_args: Vec<String> = {"default": []},
        /// auto: KVM where it really runs guests.
        accel: String = {"enum": ["auto", "kvm", "tcg"], "default": "auto"},
        cloud_init: Option<Map<String, Value>> = (cloud_init_extra()),
        #[serde(default)]
        mounts: Mounts,
        ttl_s: Option<u64> = (ttl_extra(
            "Default for launch_vm: none (a launched VM may be a person's install; only stop is \
             allowed)."
        )),
        idle_s: Option<u64> = (idle_extra()),
        on_idle: Option<String> = (action_extra(&["stop"], true)),
        on_ttl: Option<String> = (action_extra(&["stop"], false)),
        /// With cloud_init: wait for it to finish; report its status.
        wait_cloud_init: bool = {"default": false},
        /// Bound on that wait (agent included).
        wait_cloud_init_s: f64 = {"minimum": 0, "maximum": 3600, "default": 600},
    }
}

fn launch_vm(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: LaunchParams = args.parse()?;
    let (allow, egress) = AllowNetwork::parse(a.allow_network)?;
    let launch = LaunchArgs {
        machine: a.machine_type,
        accel: Some(a.accel),
        iso: a.iso,
        extra_args: a.extra_args,
        no_net: a.no_net,
        restrict_net: a.restrict_net || allow == Some(false),
        port_forwards: Some(a.port_forwards),
        cloud_init: a.cloud_init.map(Value::Object),
        egress,
        secrets: a.secrets,
        mounts: a.mounts.0,
        lifetime: asked(a.ttl_s, a.idle_s, a.on_idle, a.on_ttl),
        ..a.guest.launch(a.memory_mb)
    };
    let req = LaunchVm {
        name: a.name.0,
        disks: a.disks,
        launch,
        wait_cloud_init: a
            .wait_cloud_init
            .then(|| Duration::from_secs_f64(a.wait_cloud_init_s)),
    };
    crate::tools::to_output(&guest_launch::launch_vm(ctx, &req)?)
}
