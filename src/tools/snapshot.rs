//! Live snapshots of a running VM (RAM + disks) through QEMU's snapshot-save/-load/-delete
//! jobs, watched to their end so QEMU's refusals surface as errors.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{check_tag, object, presets, vm_name_arg};
use crate::clock;
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::ops::session;
use crate::qemu::qmp::{Qmp, QmpError};
use crate::state::registry::Record;

/// Bound for one snapshot job.
pub const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The writable block nodes that can hold internal snapshots, and QEMU's snapshot list.
fn snapshot_nodes(q: &mut Qmp) -> Result<(Vec<String>, Vec<Value>), QmpError> {
    let block = q.execute("query-block", None)?;
    let mut nodes = Vec::new();
    let mut snaps = Vec::new();
    for d in block.as_array().into_iter().flatten() {
        let Some(ins) = d.get("inserted") else {
            continue;
        };
        if ins.get("ro").and_then(Value::as_bool) == Some(true)
            || ins.get("drv").and_then(Value::as_str) != Some("qcow2")
        {
            continue;
        }
        if let Some(n) = ins.get("node-name").and_then(Value::as_str) {
            if nodes.is_empty() {
                snaps = ins
                    .get("image")
                    .and_then(|i| i.get("snapshots"))
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
            }
            nodes.push(n.to_string());
        }
    }
    Ok((nodes, snaps))
}

fn structured(snaps: &[Value]) -> Vec<Value> {
    snaps
        .iter()
        .map(|s| {
            let secs = s.get("vm-clock-sec").and_then(Value::as_u64).unwrap_or(0);
            let nsecs = s.get("vm-clock-nsec").and_then(Value::as_u64).unwrap_or(0);
            let clock_ns = secs * 1_000_000_000 + nsecs;
            let date = s
                .get("date-sec")
                .and_then(Value::as_i64)
                .map(clock::iso8601);
            json!({
                "id": s.get("id").cloned().unwrap_or(Value::Null),
                "tag": s.get("name").cloned().unwrap_or(Value::Null),
                "vm_state_size": s.get("vm-state-size").and_then(Value::as_u64).unwrap_or(0),
                "date": date.unwrap_or_default(),
                "vm_clock": clock::vm_clock(clock_ns)
            })
        })
        .collect()
}

/// How a snapshot operation ended in a healthy monitor session.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It did what was asked.
    Done,
    /// QEMU refused or the job failed; its words.
    Refused(String),
}

/// Starts a snapshot job and watches it to its end, sending progress.
fn run_job(ctx: &ToolCtx, q: &mut Qmp, cmd: &str, mut args: Value) -> Result<Verdict, QmpError> {
    let job_id = format!("mcq-{cmd}-{}-{}", std::process::id(), clock::now_secs());
    args["job-id"] = json!(job_id);
    q.execute(cmd, Some(args))?;
    let start = Instant::now();
    loop {
        let jobs = q.execute("query-jobs", None)?;
        let job = jobs
            .as_array()
            .and_then(|a| a.iter().find(|j| j["id"] == job_id.as_str()))
            .cloned();
        let Some(job) = job else {
            return Ok(Verdict::Refused(format!(
                "the {cmd} job disappeared before it concluded"
            )));
        };
        let status = job["status"].as_str().unwrap_or("");
        if status == "concluded" || status == "null" {
            let err = job.get("error").and_then(Value::as_str).map(str::to_string);
            let _ = q.execute("job-dismiss", Some(json!({"id": job_id})));
            return Ok(match err {
                Some(e) => Verdict::Refused(e),
                None => Verdict::Done,
            });
        }
        ctx.progress(
            start.elapsed().as_secs_f64(),
            None,
            &format!("{cmd}: {status}"),
        );
        if start.elapsed() > SNAPSHOT_TIMEOUT {
            let _ = q.execute("job-cancel", Some(json!({"id": job_id})));
            return Ok(Verdict::Refused(format!(
                "the {cmd} job did not finish within {} minutes and was cancelled",
                SNAPSHOT_TIMEOUT.as_secs() / 60
            )));
        }
        if ctx.cancelled() {
            let _ = q.execute("job-cancel", Some(json!({"id": job_id})));
            return Ok(Verdict::Refused("cancelled by the client".into()));
        }
        let _ = q.next_event(Duration::from_millis(100))?;
    }
}

/// Runs savevm/loadvm/delvm through HMP. HMP reports failure as text inside a successful
/// reply ("Error: ..."), so the text is the verdict; `delvm` of a missing tag prints nothing,
/// which is why callers check the tag exists first.
fn hmp_snapshot(q: &mut Qmp, op: Op, tag: &str) -> Result<Verdict, QmpError> {
    let verb = match op {
        Op::Save => "savevm",
        Op::Load => "loadvm",
        Op::Delete => "delvm",
    };
    let out = q.hmp(&format!("{verb} {tag}"), SNAPSHOT_TIMEOUT)?;
    Ok(hmp_verdict(&out))
}

/// Reads an HMP reply: any line starting with "Error" (or mentioning "error:") is a failure.
pub fn hmp_verdict(out: &str) -> Verdict {
    let failed = out
        .lines()
        .find(|l| l.trim_start().starts_with("Error") || l.to_ascii_lowercase().contains("error:"));
    match failed {
        Some(line) => Verdict::Refused(line.trim().to_string()),
        None => Verdict::Done,
    }
}

fn live(name: &str) -> Result<Record, ToolError> {
    Ok(crate::ops::vm::records::lookup_live(
        name,
        "live snapshots need a running VM (for an image at rest use image_snapshot_*)",
    )?)
}

fn no_disk(name: &str) -> ToolError {
    ToolError::new(format!(
        "VM {name:?} has no writable qcow2 disk: live snapshots are stored inside a qcow2 image. \
         Launch it with a qcow2 disk (image_create, format qcow2)"
    ))
}

fn tag_in() -> Value {
    object(
        json!({
            "name": presets::name_schema(),
            "tag": {
                "type": "string", "minLength": 1, "maxLength": 64,
                "description": "1-64 of A-Z a-z 0-9 _ . -, starting with a letter or digit."
            }
        }),
        &["name", "tag"],
    )
}

fn op_out() -> Value {
    json!({"type": "object", "properties": {
        "name": {"type": "string"}, "tag": {"type": "string"}, "action": {"type": "string"},
        "status": {"type": "string"}, "duration_ms": {"type": "integer"}
    }, "required": ["name", "tag", "action"]})
}

#[derive(Clone, Copy)]
enum Op {
    Save,
    Load,
    Delete,
}

const CREATE_DESCRIPTION: &str = "Save a live snapshot of the whole running VM (RAM, device state \
    and disks) inside its qcow2 disk, under tag. The VM pauses briefly while saving. Refuses an \
    existing tag.";

/// `vm_snapshot_create`.
pub const CREATE: ToolDef = ToolDef {
    name: "vm_snapshot_create",
    title: "Snapshot a running VM",
    description: CREATE_DESCRIPTION,
    input_schema: tag_in,
    output_schema: op_out,
    annotations: presets::ADDITIVE,
    handler: |ctx, args| snapshot_op(ctx, args, Op::Save),
    ui: crate::mcp::tool::Ui::NONE,
};

const RESTORE_DESCRIPTION: &str = "Roll the running VM back to a live snapshot: RAM, devices and \
    disks return to that moment; changes since are lost. The guest agent's next call resyncs \
    automatically.";

/// `vm_snapshot_restore`.
pub const RESTORE: ToolDef = ToolDef {
    name: "vm_snapshot_restore",
    title: "Restore a VM snapshot",
    description: RESTORE_DESCRIPTION,
    input_schema: tag_in,
    output_schema: op_out,
    annotations: presets::DESTRUCTIVE_IDEMPOTENT,
    handler: |ctx, args| snapshot_op(ctx, args, Op::Load),
    ui: crate::mcp::tool::Ui::NONE,
};

const DELETE_DESCRIPTION: &str = "Delete a live snapshot from the running VM's disks.";

/// `vm_snapshot_delete`.
pub const DELETE: ToolDef = ToolDef {
    name: "vm_snapshot_delete",
    title: "Delete a VM snapshot",
    description: DELETE_DESCRIPTION,
    input_schema: tag_in,
    output_schema: op_out,
    annotations: presets::DESTRUCTIVE,
    handler: |ctx, args| snapshot_op(ctx, args, Op::Delete),
    ui: crate::mcp::tool::Ui::NONE,
};

fn snapshot_op(ctx: &ToolCtx, args: &Args, op: Op) -> ToolResult {
    let name = vm_name_arg(args)?;
    let tag = args.str("tag")?.to_string();
    check_tag(&tag)?;
    let rec = live(&name)?;
    let started = Instant::now();
    ctx.log.log(
        "notice",
        &format!("snapshot {} of {name}: {tag}", op.verb()),
    );
    let status = session::monitor(&name, &rec, |q| {
        let (nodes, snaps) = snapshot_nodes(q)?;
        if nodes.is_empty() {
            return Err(no_disk(&name).into());
        }
        let (cmd, args) = job_for(op, &name, &tag, &nodes, &snaps)?;
        let verdict = match run_job(ctx, q, cmd, args) {
            // QEMU before 6.0 has no snapshot jobs: fall back to HMP and read its text.
            Err(QmpError::Command { class, .. }) if class == "CommandNotFound" => {
                hmp_snapshot(q, op, &tag)?
            }
            other => other?,
        };
        let status = q
            .execute("query-status", None)?
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_string();
        match verdict {
            Verdict::Done => Ok(status),
            Verdict::Refused(e) => Err(refused(op, cmd, &tag, &status, &e).into()),
        }
    })?;
    Ok(ToolOutput::json(json!({
        "name": name, "tag": tag, "action": op.action(), "status": status,
        "duration_ms": started.elapsed().as_millis() as u64
    })))
}

impl Op {
    /// The word the log uses.
    fn verb(self) -> &'static str {
        match self {
            Op::Save => "save",
            Op::Load => "load",
            Op::Delete => "delete",
        }
    }

    /// The word the result uses.
    fn action(self) -> &'static str {
        match self {
            Op::Save => "created",
            Op::Load => "restored",
            Op::Delete => "deleted",
        }
    }
}

/// The QMP job command and arguments for `op` on `nodes`, or why it cannot run: saving over
/// an existing tag, loading or deleting one that is not there (`snaps` is QEMU's list).
fn job_for(
    op: Op,
    name: &str,
    tag: &str,
    nodes: &[String],
    snaps: &[Value],
) -> Result<(&'static str, Value), ToolError> {
    let exists = snaps.iter().any(|s| s["name"] == tag);
    let tags: Vec<&str> = snaps.iter().filter_map(|s| s["name"].as_str()).collect();
    match op {
        Op::Save if exists => Err(ToolError::new(format!(
            "snapshot {tag:?} already exists in VM {name:?}; delete it first or choose another \
             tag"
        ))),
        Op::Load | Op::Delete if !exists => Err(ToolError::new(format!(
            "VM {name:?} has no snapshot {tag:?}; existing tags: [{}]",
            tags.join(", ")
        ))),
        Op::Save => Ok((
            "snapshot-save",
            json!({"tag": tag, "vmstate": nodes[0], "devices": nodes}),
        )),
        Op::Load => Ok((
            "snapshot-load",
            json!({"tag": tag, "vmstate": nodes[0], "devices": nodes}),
        )),
        Op::Delete => Ok(("snapshot-delete", json!({"tag": tag, "devices": nodes}))),
    }
}

/// QEMU's refusal of `cmd`, with what to do when a failed load left the VM stopped.
fn refused(op: Op, cmd: &str, tag: &str, status: &str, e: &str) -> ToolError {
    let hint = if matches!(op, Op::Load) && status != "running" {
        format!(" The VM is now {status}: restore another snapshot, or resume_vm it as it is")
    } else {
        String::new()
    };
    ToolError::new(format!("QEMU refused {cmd} of {tag:?}: {e}.{hint}"))
}

const LIST_DESCRIPTION: &str = "List the live snapshots of a running VM: tag, id, saved VM state \
    size, date and guest clock.";

/// `vm_snapshot_list`.
pub const LIST: ToolDef = ToolDef {
    name: "vm_snapshot_list",
    title: "List a VM's live snapshots",
    description: LIST_DESCRIPTION,
    input_schema: presets::name_only,
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "snapshots": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": ["string", "null"]},
                            "tag": {"type": ["string", "null"]},
                            "vm_state_size": {"type": "integer"},
                            "date": {"type": "string"},
                            "vm_clock": {"type": "string"}
                        }
                    }
                }
            },
            "required": ["name", "snapshots"]
        })
    },
    annotations: presets::READ_ONLY,
    handler: list,
    ui: crate::mcp::tool::Ui::NONE,
};

fn list(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let rec = live(&name)?;
    let (nodes, snaps) = session::monitor(&name, &rec, |q| Ok(snapshot_nodes(q)?))?;
    if nodes.is_empty() {
        return Err(no_disk(&name));
    }
    Ok(ToolOutput::json(
        json!({"name": name, "snapshots": structured(&snaps)}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmp_errors_inside_successful_replies_are_failures() {
        assert_eq!(hmp_verdict(""), Verdict::Done);
        assert!(matches!(
            hmp_verdict("Error: Device 'ide0-hd0' is writable but does not support snapshots\r\n"),
            Verdict::Refused(_)
        ));
        assert!(matches!(
            hmp_verdict("loadvm: error: Snapshot 'x' does not exist\n"),
            Verdict::Refused(_)
        ));
    }
}
