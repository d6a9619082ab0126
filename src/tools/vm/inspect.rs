//! Inspect tools: list_vms and vm_info (the operations are [`crate::ops::vm::inspect`]'s).

use serde_json::json;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::vm::inspect;
use crate::tools::{presets, vm_name_arg};

const LIST_DESCRIPTION: &str = "List every registered VM with its measured status (process and \
    QMP checked now): running, paused, stopped, starting, busy (another operation holds its \
    monitor) or another QEMU run state; its lifetime (deadline, idle clock), why it ended, and \
    metrics (CPU %, memory, disk, uptime) read now from the host. registry_warnings reports, \
    once, records that were skipped or a registry file that had to be quarantined.";

/// `list_vms`.
pub const LIST: ToolDef = ToolDef {
    name: "list_vms",
    title: "List VMs",
    description: LIST_DESCRIPTION,
    input_schema: || json!({"type": "object", "properties": {}, "additionalProperties": false}),
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "vms": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "status": {"type": "string"},
                            "source": {"type": ["string", "null"]},
                            "arch": {"type": ["string", "null"]},
                            "accel": {"type": ["string", "null"]},
                            "pid": {"type": ["integer", "null"]},
                            "created_at": {"type": ["string", "null"]},
                            "held": {"type": "object", "description": "A person's hold (vm_takeover): since when."},
                            "lifetime": crate::tools::params::lifetime_out(),
                            "end": end_out(),
                            "metrics": metrics_out()
                        },
                        "required": ["name", "status"]
                    }
                },
                "registry_warnings": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["vms", "registry_warnings"]
        })
    },
    annotations: presets::READ_ONLY,
    handler: list_vms,
    ui: crate::mcp::tool::Ui::NONE,
};

fn list_vms(_ctx: &ToolCtx, _args: &Args) -> ToolResult {
    crate::tools::to_output(&inspect::list())
}

const INFO_DESCRIPTION: &str = "A VM's record plus live details from QMP: run state, QEMU \
    version, accelerator in use, vCPUs, memory, block devices, port forwards, and the seccomp \
    sandbox the kernel enforces on its QEMU. Answers within 5 s: a QEMU whose monitor does not \
    answer is reported unresponsive, a stopped (SIGSTOP) one frozen; stop_vm with force=true \
    ends either. Also its lifetime (deadline, idle clock, what keeps it busy), why it ended, and \
    metrics: CPU % since the last look, QEMU's RSS and Pss, the guest's own memory (through its \
    agent), the disk's allocated bytes, bytes read and written, egress bytes, uptime.";

/// `vm_info`.
pub const INFO: ToolDef = ToolDef {
    name: "vm_info",
    title: "Describe a VM",
    description: INFO_DESCRIPTION,
    input_schema: presets::name_only,
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "status": {"type": "string"},
                "record": {"type": "object"},
                "vcpus": {"type": ["integer", "null"]},
                "memory_mb": {"type": ["integer", "null"]},
                "block_devices": {"type": "array", "items": {"type": "object"}},
                "port_forwards": {"type": "array", "items": {"type": "object"}},
                "background": {"type": "array", "items": {"type": "object"}},
                "accel": {"type": ["string", "null"]},
                "qemu_version": {"type": ["string", "null"]},
                "seccomp": {"type": ["string", "null"]},
                "egress_proxy": {"type": "string"},
                "egress": {"type": "object"},
                "detail": {"type": "string"},
                "held": {"type": ["object", "null"], "description": "A person's hold (vm_takeover): since when."},
                "lifetime": crate::tools::params::lifetime_out(),
                "end": end_out(),
                "metrics": metrics_out()
            },
            "required": ["name", "status", "record", "metrics"]
        })
    },
    annotations: presets::READ_ONLY,
    handler: vm_info,
    ui: crate::mcp::tool::Ui::NONE,
};

fn vm_info(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    crate::tools::to_output(&inspect::info(&vm_name_arg(args)?)?)
}

/// Why a VM ended, in results.
fn end_out() -> serde_json::Value {
    json!({"type": "object", "description": "Why it ended: reason (asked, ttl, idle, \
        guest_poweroff, crashed, oom, killed, unknown), tool (what asked), detail, at, \
        exit_code, signal."})
}

/// A VM's metrics, in results.
fn metrics_out() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "cpu_pct": {"type": ["number", "null"], "description": "QEMU's CPU over cpu_interval_s, in % of one core."},
            "cpu_interval_s": {"type": ["number", "null"]},
            "rss_bytes": {"type": ["integer", "null"]},
            "pss_bytes": {"type": ["integer", "null"]},
            "guest_memory": {"type": "object"},
            "disk_allocated_bytes": {"type": ["integer", "null"]},
            "disk_read_bytes": {"type": ["integer", "null"]},
            "disk_written_bytes": {"type": ["integer", "null"]},
            "net_bytes": {"type": ["integer", "null"]},
            "uptime_s": {"type": ["integer", "null"]}
        }
    })
}
