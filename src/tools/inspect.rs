//! Inspect tools: list_vms and vm_info, with status measured, never remembered.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{presets, vm_name_arg};
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolOutput, ToolResult};
use crate::ops::session::explain_qmp;
use crate::ops::vm::records::lookup;
use crate::qemu::qmp::{self, QmpError};
use crate::qemu::vm::{self, Measured, Status};
use crate::state::registry::{Record, Vms};

/// What a running QEMU cannot change (vCPUs are never hot-plugged by mcqemu).
#[derive(Clone, Debug)]
struct StaticFacts {
    vcpus: Option<usize>,
    accel: &'static str,
    memory_mb: Option<u64>,
    version: String,
}

/// Static facts per QEMU, keyed by its QMP socket and PID.
type FactsCache = std::sync::Mutex<HashMap<(PathBuf, Option<i32>), StaticFacts>>;

/// Static facts, asked once per server process.
fn static_facts() -> &'static FactsCache {
    static FACTS: OnceLock<FactsCache> = OnceLock::new();
    FACTS.get_or_init(Default::default)
}

/// How long vm_info may spend on QMP: a wedged QEMU is reported, not waited for.
const INFO_BUDGET: Duration = Duration::from_millis(4500);

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
                            "created_at": {"type": ["string", "null"]},
                            "held": {"type": "object", "description": "A person's hold (vm_takeover): since when."}
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

/// How long list_vms may spend measuring, for all VMs together.
const LIST_BUDGET: Duration = Duration::from_millis(900);

/// Measures every VM at once, each within the list's budget: a VM settled by its record or
/// process costs nothing; the others are asked over QMP in parallel, and one that has not
/// answered when the budget runs out is reported `unresponsive` instead of holding up the rest.
fn measure_all(vms: &Vms) -> BTreeMap<String, Measured> {
    let deadline = Instant::now() + LIST_BUDGET;
    let mut out = BTreeMap::new();
    let (tx, rx) = mpsc::channel();
    let mut asked = 0;
    for (name, rec) in vms {
        if let Some(m) = vm::measure_process(rec) {
            out.insert(name.clone(), m);
            continue;
        }
        let (tx, name, rec) = (tx.clone(), name.clone(), rec.clone());
        let probe = std::thread::Builder::new()
            .name("list-probe".into())
            .spawn(move || {
                let m =
                    vm::measure_within(&rec, LIST_BUDGET.saturating_sub(Duration::from_millis(50)));
                let _ = tx.send((name, m));
            });
        if probe.is_ok() {
            asked += 1;
        }
    }
    drop(tx);
    for _ in 0..asked {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((name, m)) => {
                out.insert(name, m);
            }
            Err(_) => break,
        }
    }
    for name in vms.keys() {
        out.entry(name.clone()).or_insert_with(|| Measured {
            status: Status::Unresponsive,
            detail: Some(format!(
                "did not answer within {} ms; vm_info waits longer, stop_vm with force=true \
                 ends it",
                LIST_BUDGET.as_millis()
            )),
        });
    }
    out
}

fn list_vms(_ctx: &ToolCtx, _args: &Args) -> ToolResult {
    let reg = vm::registry();
    let vms = reg.load();
    let mut measured = measure_all(&vms);
    let list: Vec<Value> = vms
        .iter()
        // Pooled clones are the server's, not the caller's: template_list counts them.
        .filter(|(_, rec)| rec.get(crate::ops::sandbox::pool::POOLED).is_none())
        .map(|(name, rec)| {
            let m = measured.remove(name).unwrap_or(Measured {
                status: Status::Unresponsive,
                detail: None,
            });
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
            if let Some(h) = crate::ops::screen::hold::of(rec) {
                o["held"] = json!(h);
            }
            o
        })
        .collect();
    Ok(ToolOutput::json(
        json!({"vms": list, "registry_warnings": reg.take_warnings()}),
    ))
}

const INFO_DESCRIPTION: &str = "A VM's record plus live details from QMP: run state, QEMU \
    version, accelerator in use, vCPUs, memory, block devices, port forwards, and the seccomp \
    sandbox the kernel enforces on its QEMU. Answers within 5 s: a QEMU whose monitor does not \
    answer is reported unresponsive, a stopped (SIGSTOP) one frozen; stop_vm with force=true \
    ends either.";

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
                "held": {"type": ["object", "null"], "description": "A person's hold (vm_takeover): since when."}
            },
            "required": ["name", "status", "record"]
        })
    },
    annotations: presets::READ_ONLY,
    handler: vm_info,
    ui: crate::mcp::tool::Ui::NONE,
};

fn vm_info(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let rec = lookup(&name)?;
    // One QMP session answers everything; only when the process already settles the status
    // (or the session fails) is the status measured separately.
    let settled = vm::measure_process(&rec);
    let mut out = json!({
        "name": name,
        "status": settled.as_ref().map_or(Status::Running, |m| m.status.clone()),
        "record": rec,
        "port_forwards": vm::forwards(&rec),
        "background": crate::ops::guest::background::list(&rec),
        "block_devices": [],
        "vcpus": null, "memory_mb": null,
        "accel": rec.get("accel").cloned().unwrap_or(Value::Null),
        "qemu_version": rec.get("qemu_version").cloned().unwrap_or(Value::Null),
        "seccomp": vm::pid(&rec).and_then(crate::qemu::process::seccomp),
        "held": crate::ops::screen::hold::of(&rec),
    });
    if let Some(e) = crate::ops::vm::egress::info(&name, &rec) {
        out["egress_proxy"] = e["egress_proxy"].clone();
        out["egress"] = e;
    }
    if let Some(m) = settled {
        if let Some(d) = &m.detail {
            out["detail"] = json!(d);
        }
        return Ok(ToolOutput::json(out));
    }
    match ask_live(&rec) {
        Ok((status, block, facts)) => {
            out["status"] = status.get("status").cloned().unwrap_or(json!("unknown"));
            out["vcpus"] = json!(facts.vcpus);
            out["accel"] = json!(facts.accel);
            out["qemu_version"] = json!(facts.version);
            if let Some(m) = facts.memory_mb {
                out["memory_mb"] = json!(m);
            }
            out["block_devices"] = json!(block_devices(&block));
        }
        Err(e) => {
            // The session failed: say why without another wait (busy, unresponsive, exited).
            let m = match vm::measure_process(&rec) {
                Some(settled) => settled,
                None => vm::classify(&rec, &e, INFO_BUDGET),
            };
            out["status"] = json!(m.status);
            out["detail"] = json!(m.detail.unwrap_or_else(|| explain_qmp(&name, &rec, &e)));
        }
    }
    Ok(ToolOutput::json(out))
}

/// One QMP session within [`INFO_BUDGET`]: the run state, the block devices and the static
/// facts (asked once per QEMU process, then cached).
fn ask_live(rec: &Record) -> Result<(Value, Value, StaticFacts), QmpError> {
    let deadline = Instant::now() + INFO_BUDGET;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let sock = vm::qmp_socket(rec);
    let key = (sock.clone(), vm::pid(rec));
    let cached = static_facts()
        .lock()
        .ok()
        .and_then(|m| m.get(&key).cloned());
    let (status, block, facts) = qmp::with_session_within(&sock, INFO_BUDGET, |q| {
        // What cannot change while this QEMU runs is asked once per process; the rest goes
        // out in one pipelined round trip.
        let mut cmds: Vec<(&str, Option<Value>)> =
            vec![("query-status", None), ("query-block", None)];
        if cached.is_none() {
            cmds.extend([
                ("query-cpus-fast", None),
                ("query-kvm", None),
                ("query-memory-size-summary", None),
            ]);
        }
        let mut replies = q.execute_pipelined(&cmds, left())?.into_iter();
        let status = replies.next().unwrap_or(Err(QmpError::Closed))?;
        let block = replies.next().unwrap_or(Err(QmpError::Closed))?;
        let facts = match &cached {
            Some(f) => f.clone(),
            None => facts_from(&mut replies, &q.version)?,
        };
        Ok::<_, QmpError>((status, block, facts))
    })?;
    if cached.is_none() {
        remember(key, &facts);
    }
    Ok((status, block, facts))
}

/// The static facts from the replies to query-cpus-fast, query-kvm and
/// query-memory-size-summary (the last may fail: memory is then unknown).
fn facts_from(
    replies: &mut impl Iterator<Item = Result<Value, QmpError>>,
    version: &str,
) -> Result<StaticFacts, QmpError> {
    let cpus = replies.next().unwrap_or(Err(QmpError::Closed))?;
    let kvm = replies.next().unwrap_or(Err(QmpError::Closed))?;
    let mem = replies.next().and_then(Result::ok);
    Ok(StaticFacts {
        vcpus: cpus.as_array().map(Vec::len),
        accel: if kvm.get("enabled").and_then(Value::as_bool) == Some(true) {
            "kvm"
        } else {
            "tcg"
        },
        memory_mb: mem
            .as_ref()
            .and_then(|m| m.get("base-memory"))
            .and_then(Value::as_u64)
            .map(|b| b / (1024 * 1024)),
        version: version.to_string(),
    })
}

/// Caches one QEMU's static facts.
fn remember(key: (PathBuf, Option<i32>), facts: &StaticFacts) {
    if let Ok(mut m) = static_facts().lock() {
        // Bounded: entries of VMs long gone are dropped when the map grows.
        if m.len() > 1024 {
            m.clear();
        }
        m.insert(key, facts.clone());
    }
}

/// query-block's devices that hold a medium, in vm_info's shape.
fn block_devices(block: &Value) -> Vec<Value> {
    block
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
        .unwrap_or_default()
}
