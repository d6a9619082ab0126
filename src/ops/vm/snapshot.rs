//! Live snapshots of a running VM (vm_snapshot_create/restore/delete/list): QEMU's snapshot
//! jobs on every writable qcow2 disk (HMP's savevm/loadvm/delvm before QEMU 6.0), watched to
//! their end within [`SNAPSHOT_TIMEOUT`], the tag's presence checked first.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::clock;
use crate::ops::error::OpError;
use crate::ops::session;
use crate::ops::work::Work;
use crate::qemu::qmp::{Qmp, QmpError};
use crate::qemu::qmp_calls::{SnapshotInfo, SnapshotJob};
use crate::state::registry::Record;

/// Bound for one snapshot job.
pub const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// What a snapshot operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// vm_snapshot_create.
    Save,
    /// vm_snapshot_restore.
    Load,
    /// vm_snapshot_delete.
    Delete,
}

/// The writable block nodes that can hold internal snapshots, and QEMU's snapshot list.
fn snapshot_nodes(q: &mut Qmp) -> Result<(Vec<String>, Vec<SnapshotInfo>), QmpError> {
    let mut nodes = Vec::new();
    let mut snaps = Vec::new();
    for d in q.query_block()? {
        let Some(ins) = d.inserted else {
            continue;
        };
        if ins.ro || ins.drv.as_deref() != Some("qcow2") {
            continue;
        }
        if let Some(n) = ins.node_name {
            if nodes.is_empty() {
                snaps = ins.image.map(|i| i.snapshots).unwrap_or_default();
            }
            nodes.push(n);
        }
    }
    Ok((nodes, snaps))
}

crate::described! {
    /// One live snapshot as vm_snapshot_list shows it.
    #[derive(Debug, Clone, Serialize)]
    pub struct LiveSnapshot {
        /// QEMU's id.
        pub id: Option<String>,
        /// The tag.
        pub tag: Option<String>,
        /// Bytes of saved VM state.
        pub vm_state_size: u64,
        /// When it was taken, ISO 8601.
        pub date: String,
        /// The guest's clock then.
        pub vm_clock: String,
    }
}

fn structured(snaps: &[SnapshotInfo]) -> Vec<LiveSnapshot> {
    snaps
        .iter()
        .map(|s| {
            let clock_ns = s.vm_clock_sec.unwrap_or(0) * 1_000_000_000 + s.vm_clock_nsec;
            LiveSnapshot {
                id: s.id.clone(),
                tag: s.name.clone(),
                vm_state_size: s.vm_state_size,
                date: s.date_sec.map(clock::iso8601).unwrap_or_default(),
                vm_clock: clock::vm_clock(clock_ns),
            }
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
fn run_job(
    ctx: &dyn Work,
    q: &mut Qmp,
    job: SnapshotJob,
    tag: &str,
    nodes: &[String],
) -> Result<Verdict, QmpError> {
    let cmd = job.command();
    let job_id = format!("mcq-{cmd}-{}-{}", std::process::id(), clock::now_secs());
    q.start_snapshot_job(job, &job_id, tag, nodes)?;
    let start = Instant::now();
    loop {
        let job = q.query_jobs()?.into_iter().find(|j| j.id == job_id);
        let Some(job) = job else {
            return Ok(Verdict::Refused(format!(
                "the {cmd} job disappeared before it concluded"
            )));
        };
        if job.status == "concluded" || job.status == "null" {
            let _ = q.job_dismiss(&job_id);
            return Ok(match job.error {
                Some(e) => Verdict::Refused(e),
                None => Verdict::Done,
            });
        }
        ctx.progress(
            start.elapsed().as_secs_f64(),
            None,
            &format!("{cmd}: {}", job.status),
        );
        if start.elapsed() > SNAPSHOT_TIMEOUT {
            let _ = q.job_cancel(&job_id);
            return Ok(Verdict::Refused(format!(
                "the {cmd} job did not finish within {} minutes and was cancelled",
                SNAPSHOT_TIMEOUT.as_secs() / 60
            )));
        }
        if ctx.cancelled() {
            let _ = q.job_cancel(&job_id);
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

fn live(name: &str) -> Result<Record, OpError> {
    crate::ops::vm::records::lookup_live(
        name,
        "live snapshots need a running VM (for an image at rest use image_snapshot_*)",
    )
}

fn no_disk(name: &str) -> OpError {
    OpError::invalid(format!(
        "VM {name:?} has no writable qcow2 disk: live snapshots are stored inside a qcow2 image. \
         Launch it with a qcow2 disk (image_create, format qcow2)"
    ))
}

crate::described! {
    /// What an operation did (the tools' result, in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct Operated {
        /// The VM.
        pub name: String,
        /// The tag.
        pub tag: String,
        /// created, restored or deleted.
        pub action: &'static str,
        /// The VM's run state after it.
        pub status: String,
        /// How long it took.
        pub duration_ms: u64,
    }
}

/// Saves, loads or deletes snapshot `tag` (already checked) of running VM `name`.
pub fn operate(ctx: &dyn Work, name: &str, tag: &str, op: Op) -> Result<Operated, OpError> {
    let rec = live(name)?;
    let started = Instant::now();
    ctx.log(
        "notice",
        &format!("snapshot {} of {name}: {tag}", op.verb()),
    );
    let status = session::monitor(name, &rec, |q| {
        let (nodes, snaps) = snapshot_nodes(q)?;
        if nodes.is_empty() {
            return Err(no_disk(name).into());
        }
        let job = job_for(op, name, tag, &snaps)?;
        let cmd = job.command();
        let verdict = match run_job(ctx, q, job, tag, &nodes) {
            // QEMU before 6.0 has no snapshot jobs: fall back to HMP and read its text.
            Err(QmpError::Command { class, .. }) if class == "CommandNotFound" => {
                hmp_snapshot(q, op, tag)?
            }
            other => other?,
        };
        let status = q.query_status()?.status;
        match verdict {
            Verdict::Done => Ok(status),
            Verdict::Refused(e) => Err(refused(op, cmd, tag, &status, &e).into()),
        }
    })?;
    Ok(Operated {
        name: name.to_string(),
        tag: tag.to_string(),
        action: op.action(),
        status,
        duration_ms: started.elapsed().as_millis() as u64,
    })
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

/// The snapshot job for `op`, or why it cannot run: saving over an existing tag, loading or
/// deleting one that is not there (`snaps` is QEMU's list).
fn job_for(op: Op, name: &str, tag: &str, snaps: &[SnapshotInfo]) -> Result<SnapshotJob, OpError> {
    let tags: Vec<&str> = snaps.iter().filter_map(|s| s.name.as_deref()).collect();
    let exists = tags.contains(&tag);
    match op {
        Op::Save if exists => Err(OpError::invalid(format!(
            "snapshot {tag:?} already exists in VM {name:?}; delete it first or choose another \
             tag"
        ))),
        Op::Load | Op::Delete if !exists => Err(OpError::host(format!(
            "VM {name:?} has no snapshot {tag:?}; existing tags: [{}]",
            tags.join(", ")
        ))),
        Op::Save => Ok(SnapshotJob::Save),
        Op::Load => Ok(SnapshotJob::Load),
        Op::Delete => Ok(SnapshotJob::Delete),
    }
}

/// QEMU's refusal of `cmd`, with what to do when a failed load left the VM stopped.
fn refused(op: Op, cmd: &str, tag: &str, status: &str, e: &str) -> OpError {
    let hint = if matches!(op, Op::Load) && status != "running" {
        format!(" The VM is now {status}: restore another snapshot, or resume_vm it as it is")
    } else {
        String::new()
    };
    OpError::host(format!("QEMU refused {cmd} of {tag:?}: {e}.{hint}"))
}

crate::described! {
    /// A running VM's live snapshots (vm_snapshot_list's result).
    #[derive(Debug, Clone, Serialize)]
    pub struct Listed {
        /// The VM.
        pub name: String,
        /// Its snapshots.
        pub snapshots: Vec<LiveSnapshot>,
    }
}

/// The live snapshots of running VM `name`.
pub fn list(name: &str) -> Result<Listed, OpError> {
    let rec = live(name)?;
    let (nodes, snaps) = session::monitor(name, &rec, |q| Ok(snapshot_nodes(q)?))?;
    if nodes.is_empty() {
        return Err(no_disk(name));
    }
    Ok(Listed {
        name: name.to_string(),
        snapshots: structured(&snaps),
    })
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
