//! Inspect tools: list_vms and vm_info, with status measured, never remembered.

use std::time::Duration;

use serde_json::{json, Value};

use super::lifecycle::lookup;
use super::session::explain_qmp;
use crate::mcp::tool::{Annotations, Args, ToolCtx, ToolDef, ToolOutput, ToolResult};
use crate::qemu::qmp::{self, QmpError};
use crate::qemu::vm::{self, measure, Status};

const SUMMARY_FIELDS: &[&str] = &[
    "source",
    "arch",
    "accel",
    "pid",
    "created_at",
    "memory_mb",
    "cpus",
    "qmp_socket",
    "serial_log",
    "port_forwards",
    "sandbox",
];

const LIST_DESCRIPTION: &str = "List every registered VM with its measured status (process and \
    QMP checked now): running, paused, stopped, starting, busy (another operation holds its \
    monitor) or another QEMU run state. registry_warnings reports, once, records that were \
    skipped or a registry file that had to be quarantined.";

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
                            "created_at": {"type": ["string", "null"]}
                        },
                        "required": ["name", "status"]
                    }
                },
                "registry_warnings": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["vms", "registry_warnings"]
        })
    },
    annotations: Annotations {
        read_only: true,
        destructive: false,
        idempotent: true,
        open_world: false,
    },
    handler: list_vms,
};

fn list_vms(_ctx: &ToolCtx, _args: &Args) -> ToolResult {
    let reg = vm::registry();
    let vms = reg.load();
    let list: Vec<Value> = vms
        .iter()
        .map(|(name, rec)| {
            let m = measure(rec);
            let mut o = json!({"name": name, "status": m.status});
            for f in SUMMARY_FIELDS {
                o[*f] = rec.get(*f).cloned().unwrap_or(Value::Null);
            }
            if o["source"].is_null() {
                o["source"] = json!("spawned");
            }
            if let Some(d) = m.detail {
                o["detail"] = json!(d);
            }
            o
        })
        .collect();
    Ok(ToolOutput::json(
        json!({"vms": list, "registry_warnings": reg.take_warnings()}),
    ))
}

const INFO_DESCRIPTION: &str = "A VM's record plus live details from QMP: run state, QEMU \
    version, accelerator in use, vCPUs, memory, block devices and port forwards.";

/// `vm_info`.
pub const INFO: ToolDef = ToolDef {
    name: "vm_info",
    title: "Describe a VM",
    description: INFO_DESCRIPTION,
    input_schema: || {
        json!({
            "type": "object",
            "properties": {"name": {"type": "string", "minLength": 1}},
            "required": ["name"],
            "additionalProperties": false
        })
    },
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
                "accel": {"type": ["string", "null"]},
                "qemu_version": {"type": ["string", "null"]}
            },
            "required": ["name", "status", "record"]
        })
    },
    annotations: Annotations {
        read_only: true,
        destructive: false,
        idempotent: true,
        open_world: false,
    },
    handler: vm_info,
};

fn vm_info(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = args.str("name")?.to_string();
    let rec = lookup(&name)?;
    // One QMP session answers everything; only when the process already settles the status
    // (or the session fails) is the status measured separately.
    let settled = vm::measure_process(&rec);
    let mut out = json!({
        "name": name,
        "status": settled.as_ref().map_or(Status::Running, |m| m.status.clone()),
        "record": rec,
        "port_forwards": vm::forwards(&rec),
        "block_devices": [],
        "vcpus": null, "memory_mb": null,
        "accel": rec.get("accel").cloned().unwrap_or(Value::Null),
        "qemu_version": rec.get("qemu_version").cloned().unwrap_or(Value::Null),
    });
    if let Some(m) = settled {
        if let Some(d) = &m.detail {
            out["detail"] = json!(d);
        }
        return Ok(ToolOutput::json(out));
    }
    let live = qmp::with_session(&vm::qmp_socket(&rec), |q| -> Result<_, QmpError> {
        let t = Duration::from_secs(5);
        let status = q.execute_within("query-status", None, t)?;
        let cpus = q.execute_within("query-cpus-fast", None, t)?;
        let block = q.execute_within("query-block", None, t)?;
        let kvm = q.execute_within("query-kvm", None, t)?;
        let mem = q.execute_within("query-memory-size-summary", None, t).ok();
        Ok((status, cpus, block, kvm, mem, q.version.clone()))
    });
    match live {
        Ok((status, cpus, block, kvm, mem, version)) => {
            out["status"] = status.get("status").cloned().unwrap_or(json!("unknown"));
            out["vcpus"] = json!(cpus.as_array().map(|a| a.len()));
            out["accel"] = json!(
                if kvm.get("enabled").and_then(Value::as_bool) == Some(true) {
                    "kvm"
                } else {
                    "tcg"
                }
            );
            out["qemu_version"] = json!(version);
            if let Some(base) = mem
                .as_ref()
                .and_then(|m| m.get("base-memory"))
                .and_then(Value::as_u64)
            {
                out["memory_mb"] = json!(base / (1024 * 1024));
            }
            let devs: Vec<Value> = block
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter(|d| d.get("inserted").is_some())
                        .map(|d| {
                            let ins = &d["inserted"];
                            json!({
                                "device": d.get("device").cloned().unwrap_or(Value::Null),
                                "qdev": d.get("qdev").cloned().unwrap_or(Value::Null),
                                "file": ins.get("file").cloned().unwrap_or(Value::Null),
                                "format": ins.get("drv").cloned().unwrap_or(Value::Null),
                                "read_only": ins.get("ro").cloned().unwrap_or(Value::Null),
                            })
                        })
                        .collect()
                })
                .unwrap_or_default();
            out["block_devices"] = json!(devs);
        }
        Err(e) => {
            // The session failed: measure properly (busy monitor, exited, unreachable).
            let m = measure(&rec);
            out["status"] = json!(m.status);
            out["detail"] = json!(m.detail.unwrap_or_else(|| explain_qmp(&name, &rec, &e)));
        }
    }
    Ok(ToolOutput::json(out))
}
