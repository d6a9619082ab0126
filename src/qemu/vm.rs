//! A registered VM as the tools see it: its record's fields, its folders, and its measured
//! status (process and QMP, never remembered).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::process;
use super::qmp::{self, QmpError};
use crate::state::paths;
use crate::state::record::{text, Forward};
use crate::state::registry::Record;

/// Per-VM runtime folder (sockets, pidfile).
pub fn runtime_dir(name: &str) -> PathBuf {
    paths::runtime_dir().join(name)
}

/// Per-VM state folder (logs, overlays, firmware variables).
pub fn state_dir(name: &str) -> PathBuf {
    paths::state_dir().join("vms").join(name)
}

/// The record's PID, if any.
pub fn pid(rec: &Record) -> Option<i32> {
    rec.pid
        .and_then(|p| i32::try_from(p).ok())
        .filter(|p| *p > 0)
}

/// The record's QMP socket.
pub fn qmp_socket(rec: &Record) -> PathBuf {
    PathBuf::from(text(&rec.qmp_socket).unwrap_or(""))
}

/// The QMP socket path the VM's QEMU was started with, which its command line names (a pooled
/// clone handed out later has moved to another folder since): what proves a PID is this VM.
pub fn identity_socket(rec: &Record) -> PathBuf {
    text(&rec.launch_qmp_socket)
        .map(PathBuf::from)
        .unwrap_or_else(|| qmp_socket(rec))
}

/// True for VMs this server family spawned (as opposed to attached).
pub fn spawned(rec: &Record) -> bool {
    text(&rec.source) != Some("attached")
}

/// A status is its name in a result.
impl crate::schema::Schema for Status {
    fn schema() -> serde_json::Value {
        serde_json::json!({"type": "string"})
    }
}

/// What a VM is doing, measured (never remembered).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// QEMU runs the guest.
    Running,
    /// QEMU is there, the guest is stopped (pause_vm, or a snapshot in progress).
    Paused,
    /// No QEMU process for this VM.
    Stopped,
    /// Being launched by a live mcqemu.
    Starting,
    /// Another client holds the monitor.
    Busy,
    /// A process is there but QMP failed.
    Unreachable,
    /// QEMU's monitor did not answer in time: QEMU is stuck, or another program holds it.
    Unresponsive,
    /// The QEMU process is stopped (SIGSTOP, state T in /proc).
    Frozen,
    /// Saved to disk by sandbox_suspend, no QEMU: sandbox_resume brings it back.
    Suspended,
    /// Another QEMU run state (inmigrate, prelaunch, shutdown, guest-panicked, ...).
    RunState(String),
}

impl Status {
    /// The status for a QEMU run state as `query-status` reports it.
    pub fn from_run_state(s: &str) -> Status {
        match s {
            "running" => Status::Running,
            "paused" => Status::Paused,
            other => Status::RunState(other.to_string()),
        }
    }

    /// The word agents see.
    pub fn as_str(&self) -> &str {
        match self {
            Status::Running => "running",
            Status::Paused => "paused",
            Status::Stopped => "stopped",
            Status::Starting => "starting",
            Status::Busy => "busy",
            Status::Unreachable => "unreachable",
            Status::Unresponsive => "unresponsive",
            Status::Frozen => "frozen",
            Status::Suspended => "suspended",
            Status::RunState(s) => s,
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Status {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A measured status.
#[derive(Debug, Clone)]
pub struct Measured {
    /// What the VM is doing.
    pub status: Status,
    /// Why, when it is not plain.
    pub detail: Option<String>,
}

impl Measured {
    fn new(status: Status, detail: Option<String>) -> Self {
        Measured { status, detail }
    }

    /// True when a QEMU process for this VM is still there in any state.
    pub fn alive(&self) -> bool {
        !matches!(self.status, Status::Stopped | Status::Suspended)
    }
}

/// The part of [`measure`] that needs no QMP session: Some when the record or the process
/// already settles the status (being launched, exited, PID reused), None when a QEMU looks
/// alive (or, for attached VMs without a PID, only its socket can tell). Tools that open a
/// session anyway use this and let the session's errors speak, saving a round trip.
pub fn measure_process(rec: &Record) -> Option<Measured> {
    if let Some(l) = &rec.launching {
        let owner = l.owner_pid.and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
        let since = l.since.unwrap_or(0);
        let fresh = crate::clock::now_secs() - since < process::START_TIMEOUT.as_secs() as i64 + 30;
        if process::alive(owner) && fresh {
            return Some(Measured::new(
                Status::Starting,
                Some("being launched".into()),
            ));
        }
        return Some(Measured::new(
            Status::Stopped,
            Some("an interrupted launch".into()),
        ));
    }
    if rec.suspended.is_some() {
        return Some(Measured::new(
            Status::Suspended,
            Some("saved to disk; sandbox_resume brings it back".into()),
        ));
    }
    let p = pid(rec)?;
    if !process::alive(p) {
        return Some(Measured::new(Status::Stopped, None));
    }
    if spawned(rec) && !process::is_our_vm(p, &identity_socket(rec)) {
        return Some(Measured::new(
            Status::Stopped,
            Some(format!("PID {p} now belongs to another program")),
        ));
    }
    if matches!(process::state(p), Some('T') | Some('t')) {
        return Some(Measured::new(
            Status::Frozen,
            Some(format!(
                "the QEMU process (PID {p}) is stopped (SIGSTOP) and answers nothing; stop_vm \
                 with force=true ends it, or SIGCONT lets it run again"
            )),
        ));
    }
    None
}

/// How long [`measure`] may take for one VM.
pub const MEASURE_BUDGET: Duration = Duration::from_secs(4);

/// Measures a VM: process liveness and identity for spawned VMs, a QMP query for the run state,
/// within [`MEASURE_BUDGET`].
pub fn measure(rec: &Record) -> Measured {
    measure_within(rec, MEASURE_BUDGET)
}

/// [`measure`] within `budget`: a monitor that has not answered by then is `unresponsive`.
pub fn measure_within(rec: &Record, budget: Duration) -> Measured {
    if let Some(m) = measure_process(rec) {
        return m;
    }
    let sock = qmp_socket(rec);
    let deadline = std::time::Instant::now() + budget;
    match qmp::with_session_within(&sock, budget, |q| {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        q.execute_within("query-status", None, left.max(Duration::from_millis(1)))
    }) {
        Ok(st) => {
            let s = st
                .get("status")
                .and_then(Value::as_str)
                .unwrap_or("unknown");
            Measured::new(Status::from_run_state(s), None)
        }
        Err(e) => classify(rec, &e, budget),
    }
}

/// [`measure_within`], and the guest's disk bytes read and written (query-blockstats) in the
/// same round trip.
pub fn measure_with_io(rec: &Record, budget: Duration) -> (Measured, Option<(u64, u64)>) {
    if let Some(m) = measure_process(rec) {
        return (m, None);
    }
    let sock = qmp_socket(rec);
    let deadline = std::time::Instant::now() + budget;
    let asked = qmp::with_session_within(&sock, budget, |q| {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let cmds = [("query-status", None), ("query-blockstats", None)];
        let mut replies = q
            .execute_pipelined(&cmds, left.max(Duration::from_millis(1)))?
            .into_iter();
        let st = replies.next().unwrap_or(Err(QmpError::Closed))?;
        let io = replies
            .next()
            .and_then(|r| r.ok())
            .as_ref()
            .and_then(super::qmp_calls::disk_io);
        Ok::<_, QmpError>((st, io))
    });
    match asked {
        Ok((st, io)) => {
            let s = st
                .get("status")
                .and_then(Value::as_str)
                .unwrap_or("unknown");
            (Measured::new(Status::from_run_state(s), None), io)
        }
        Err(e) => (classify(rec, &e, budget), None),
    }
}

/// The status of a record whose monitor socket is gone, told without a session: what a
/// connect to it would end in, without the thread list_vms gives each VM it asks (over 100
/// long-dead records those threads were most of its time). None while the socket is there.
pub fn measure_gone(rec: &Record) -> Option<Measured> {
    let sock = qmp_socket(rec);
    match std::fs::symlink_metadata(&sock) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(classify(
            rec,
            &QmpError::Connect(format!("{}: {e}", sock.display())),
            MEASURE_BUDGET,
        )),
        _ => None,
    }
}

/// The status a failed QMP session shows, for a VM whose process (if known) looked alive.
pub fn classify(rec: &Record, e: &QmpError, budget: Duration) -> Measured {
    let pid = pid(rec);
    match e {
        QmpError::Held => Measured::new(
            Status::Busy,
            Some("another operation of this server is using the monitor".into()),
        ),
        QmpError::NoGreeting | QmpError::Timeout(_) => Measured::new(
            Status::Unresponsive,
            Some(format!(
                "the monitor did not answer within {:.1} s: QEMU is stuck, or another \
                 operation holds the monitor; stop_vm with force=true ends it",
                budget.as_secs_f64()
            )),
        ),
        // Without a PID only a socket nobody serves means stopped: one that answers with
        // garbage, too much, or too late has a live QEMU (or something) behind it.
        _ => {
            if pid.is_some() {
                Measured::new(
                    Status::Unreachable,
                    Some(format!("the process is alive but QMP failed: {e}")),
                )
            } else if !matches!(e, QmpError::Connect(_) | QmpError::Closed) {
                Measured::new(
                    Status::Unreachable,
                    Some(format!("the QMP socket answers but QMP failed: {e}")),
                )
            } else {
                Measured::new(
                    Status::Stopped,
                    Some(format!("QMP socket does not answer: {e}")),
                )
            }
        }
    }
}

/// Resolved paths of images that live VMs use (their disks, and sandbox bases), with the VM name.
pub fn images_in_use() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for (name, rec) in crate::state::registry::shared().load() {
        let mut paths = rec.disk_paths();
        if let Some(b) = rec.sandbox.as_ref().and_then(|s| s.base_image.as_ref()) {
            paths.push(PathBuf::from(b));
        }
        // A QEMU process that is there holds its images, whatever its monitor says: judged
        // from the process alone, so a wedged VM cannot stall the image tools.
        let alive = measure_process(&rec).is_none_or(|m| m.alive());
        if paths.is_empty() || !alive {
            continue;
        }
        out.extend(paths.into_iter().map(|p| (name.clone(), p)));
    }
    out
}

/// The live VM using `image`, if any (compared after resolving symlinks).
pub fn user_of(image: &Path) -> Option<String> {
    let canon = std::fs::canonicalize(image).unwrap_or_else(|_| image.to_path_buf());
    images_in_use().into_iter().find_map(|(name, p)| {
        let pc = std::fs::canonicalize(&p).unwrap_or(p);
        (pc == canon).then_some(name)
    })
}

/// Removes a VM's runtime files, but never a QMP socket that still accepts connections.
pub fn cleanup_runtime(rec: &Record) -> Vec<String> {
    let mut errors = Vec::new();
    let sock = qmp_socket(rec);
    if super::sock::is_listening(&sock) {
        return errors;
    }
    if !spawned(rec) {
        return errors;
    }
    let mut paths: Vec<PathBuf> = [
        &rec.qmp_socket,
        &rec.qga_socket,
        &rec.serial_socket,
        &rec.pidfile,
    ]
    .into_iter()
    .filter_map(|f| text(f).map(PathBuf::from))
    .collect();
    // The supervisor's lock: it may still hold it for a moment (an unlinked file's lock stays
    // its own), and a folder removed with remove_dir must be empty.
    paths.push(super::process::supervisor_lock(&sock));
    // The data channel's socket and its transfers' lock, beside the agent's socket, and the
    // note that its agent answered.
    if let Some(qga) = text(&rec.qga_socket) {
        paths.extend(super::agent_seen::stamp(Path::new(qga)));
        let data = super::cmdline::data_socket(Path::new(qga));
        paths.push(data.with_file_name("data.lock"));
        paths.push(data);
    }
    for p in paths {
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => errors.push(format!("cannot remove {}: {e}", p.display())),
        }
    }
    errors
}

/// The port forwards of a record as stored.
pub fn forwards(rec: &Record) -> Vec<Forward> {
    rec.forwards()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_whose_socket_is_gone_is_stopped_without_a_session_and_one_with_it_is_asked() {
        let dir = std::env::temp_dir().join(format!("mcqemu-gone-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp folder");
        let sock = dir.join("qmp.sock");
        let rec = Record {
            qmp_socket: Some(sock.display().to_string()),
            ..Record::default()
        };
        let m = measure_gone(&rec).expect("no socket: told at once");
        assert_eq!(m.status, Status::Stopped);
        let detail = m.detail.unwrap_or_default();
        assert!(detail.contains("qmp.sock"), "{detail}");
        let listener = std::os::unix::net::UnixListener::bind(&sock).expect("a socket");
        assert!(measure_gone(&rec).is_none(), "a socket there is asked");
        drop(listener);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
