//! Inspect tools: list_vms and vm_info (the operations are [`crate::ops::vm::inspect`]'s).

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::vm::inspect;
use crate::schema::Param;
use crate::tools::names::VmOnly;
use crate::tools::presets;

const LIST_DESCRIPTION: &str = "List every VM with its status checked now (running, paused, \
    stopped, starting, busy...), lifetime, why it ended, and CPU, memory and disk. \
    registry_warnings names skipped records.";

/// `list_vms`.
pub const LIST: ToolDef = ToolDef {
    name: "list_vms",
    title: "List VMs",
    description: LIST_DESCRIPTION,
    input_schema: presets::NoArgs::param,
    output_schema: <crate::ops::vm::inspect::VmList as crate::schema::Schema>::schema,
    annotations: presets::READ_ONLY,
    handler: list_vms,
    ui: crate::mcp::tool::Ui::NONE,
};

fn list_vms(_ctx: &ToolCtx, _args: &Args) -> ToolResult {
    crate::tools::to_output(&inspect::list())
}

const INFO_DESCRIPTION: &str = "A VM's record and live details: run state, QEMU version, \
    accelerator, vCPUs, memory, disks, forwards, seccomp, lifetime, why it ended, and metrics \
    (CPU, RSS, guest memory, disk, egress). Answers within 5 s; a hung QEMU shows as unresponsive \
    or frozen (stop_vm force ends it).";

/// `vm_info`.
pub const INFO: ToolDef = ToolDef {
    name: "vm_info",
    title: "Describe a VM",
    description: INFO_DESCRIPTION,
    input_schema: VmOnly::param,
    output_schema: <crate::ops::vm::inspect::VmInfo as crate::schema::Schema>::schema,
    annotations: presets::READ_ONLY,
    handler: vm_info,
    ui: crate::mcp::tool::Ui::NONE,
};

fn vm_info(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = args.parse::<VmOnly>()?.name();
    crate::tools::to_output(&inspect::info(&name)?)
}
