//! Copying a running guest into a second QEMU while it runs: precopy migration over a unix
//! socket, with a stop before the switchover (`pause-before-switchover`) at which the caller
//! freezes the guest's disk at the same instant as its memory. sandbox_fork and sandbox_suspend
//! capture a VM this way; the guest is stopped only for the last dirty pages and the disk step.
//!
//! Except where QEMU's dirty tracking loses writes: under TCG before QEMU 9.0, a guest store
//! through a TLB entry cached before a dirty-bitmap sync marks no page dirty (fixed upstream by
//! 03bfc2188f, "physmem: Fix migration dirty bitmap coherency with TCG memory access"), so a
//! live copy misses pages the guest wrote during it: measured on 7.2, 4 of 9 captures of a busy
//! guest held 15-22 pages unlike the stopped guest's, and a fork's kernel crashed on them. There
//! the guest is stopped for the whole copy ([`Method::Stopped`]); see [`copy_for`].

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::qmp::{Qmp, QmpError};

/// Bandwidth for the copy (QEMU 7.2 defaults to 128 MiB/s).
const MAX_BANDWIDTH: u64 = 64 * 1024 * 1024 * 1024;
/// The stop QEMU aims at for the last dirty pages, in ms (the default is 300).
const DOWNTIME_LIMIT_MS: u64 = 50;

/// How the guest is copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// While it runs; stopped only for the last dirty pages.
    Live,
    /// Stopped from the start: every page goes once, nothing depends on dirty tracking.
    Stopped,
}

/// The copy a QEMU of `version` (major, minor) can make soundly: live under KVM (the kernel
/// tracks dirty pages) or from QEMU 9.0 on; stopped under TCG before 9.0, whose dirty tracking
/// loses writes (see the module's comment).
pub fn copy_for(version: (u64, u64), kvm: bool) -> Method {
    if kvm || version >= (9, 0) {
        Method::Live
    } else {
        Method::Stopped
    }
}

/// The running QEMU's version (major, minor) and whether it runs the guest under KVM.
pub fn engine(q: &mut Qmp) -> Result<((u64, u64), bool), QmpError> {
    let v = q.execute("query-version", None)?;
    let n = |k: &str| {
        v.get("qemu")
            .and_then(|q| q.get(k))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let kvm = q.execute("query-kvm", None)?;
    let kvm = kvm.get("enabled").and_then(Value::as_bool) == Some(true);
    Ok(((n("major"), n("minor")), kvm))
}

/// What the sender measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sent {
    /// How long the guest was stopped, from QEMU's own count (the disk step included).
    pub downtime_ms: u64,
    /// The whole migration.
    pub total_ms: u64,
    /// Bytes of RAM sent.
    pub ram_bytes: u64,
}

fn left(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

fn uri(socket: &Path) -> String {
    format!("unix:{}", socket.display())
}

fn status(st: &Value) -> &str {
    st.get("status").and_then(Value::as_str).unwrap_or("")
}

fn failed(st: &Value, what: &str) -> QmpError {
    let why = st
        .get("error-desc")
        .and_then(Value::as_str)
        .unwrap_or("no reason given");
    QmpError::Command {
        class: "MigrationFailed".into(),
        desc: format!("{what} failed: {why}"),
    }
}

/// Why this QEMU cannot migrate (devices that registered a migration blocker), if it says.
pub fn blockers(q: &mut Qmp) -> Result<Vec<String>, QmpError> {
    let st = q.execute("query-migrate", None)?;
    Ok(st
        .get("blocked-reasons")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default())
}

/// Sets the receiving QEMU (started with `-incoming defer`) listening on `socket`.
pub fn listen(q: &mut Qmp, socket: &Path, deadline: Instant) -> Result<(), QmpError> {
    q.execute(
        "migrate-set-capabilities",
        Some(json!({"capabilities": [{"capability": "x-ignore-shared", "state": false}]})),
    )?;
    q.execute_within(
        "migrate-incoming",
        Some(json!({ "uri": uri(socket) })),
        left(deadline),
    )?;
    Ok(())
}

/// Waits until the receiver has loaded the whole stream; started with `-S`, it stays stopped.
pub fn wait_received(q: &mut Qmp, deadline: Instant) -> Result<(), QmpError> {
    loop {
        let st = q.execute_within("query-status", None, left(deadline))?;
        if status(&st) != "inmigrate" {
            return Ok(());
        }
        let mig = q.execute_within("query-migrate", None, left(deadline))?;
        if status(&mig) == "failed" {
            return Err(failed(&mig, "receiving the guest"));
        }
        if Instant::now() >= deadline {
            return Err(QmpError::Timeout("receiving the guest".into()));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sends the guest to the QEMU listening on `socket`, while it runs or stopped first (`how`);
/// once QEMU has stopped it for the switchover, `at_switchover` runs (the guest stopped, its
/// disks still usable), then the last state goes. The guest is left stopped (`postmigrate`):
/// the caller lets it run on (`cont`) or quits it. A failure cancels the migration and lets a
/// guest that ran run on.
pub fn send(
    q: &mut Qmp,
    socket: &Path,
    deadline: Instant,
    how: Method,
    at_switchover: &mut dyn FnMut(&mut Qmp) -> Result<(), QmpError>,
) -> Result<Sent, QmpError> {
    q.execute(
        "migrate-set-capabilities",
        Some(json!({"capabilities": [
            {"capability": "x-ignore-shared", "state": false},
            {"capability": "pause-before-switchover", "state": true}
        ]})),
    )?;
    q.execute(
        "migrate-set-parameters",
        Some(json!({"max-bandwidth": MAX_BANDWIDTH, "downtime-limit": DOWNTIME_LIMIT_MS})),
    )?;
    let stopped_at = match how {
        Method::Stopped if running(q)? => {
            q.execute("stop", None)?;
            Some(Instant::now())
        }
        _ => None,
    };
    let mut result = run(q, socket, deadline, at_switchover);
    if result.is_err() {
        let _ = q.execute_within("migrate_cancel", None, Duration::from_secs(2));
        if stopped_at.is_some() {
            let _ = q.execute_within("cont", None, Duration::from_secs(2));
        }
    }
    if let (Ok(sent), Some(t)) = (&mut result, stopped_at) {
        sent.downtime_ms = sent.downtime_ms.max(t.elapsed().as_millis() as u64);
    }
    let _ = q.execute_within(
        "migrate-set-capabilities",
        Some(json!({"capabilities": [
            {"capability": "pause-before-switchover", "state": false}
        ]})),
        Duration::from_secs(2),
    );
    result
}

fn running(q: &mut Qmp) -> Result<bool, QmpError> {
    let st = q.execute("query-status", None)?;
    Ok(st.get("running").and_then(Value::as_bool) == Some(true))
}

fn run(
    q: &mut Qmp,
    socket: &Path,
    deadline: Instant,
    at_switchover: &mut dyn FnMut(&mut Qmp) -> Result<(), QmpError>,
) -> Result<Sent, QmpError> {
    q.execute_within(
        "migrate",
        Some(json!({ "uri": uri(socket) })),
        left(deadline),
    )?;
    let mut switched = false;
    loop {
        let st = q.execute_within("query-migrate", None, left(deadline))?;
        match status(&st) {
            "completed" => return Ok(measured(&st)),
            "failed" | "cancelled" => return Err(failed(&st, "copying the running guest")),
            "pre-switchover" if !switched => {
                switched = true;
                at_switchover(q)?;
                q.execute_within(
                    "migrate-continue",
                    Some(json!({"state": "pre-switchover"})),
                    left(deadline),
                )?;
            }
            _ => {}
        }
        if Instant::now() >= deadline {
            return Err(QmpError::Timeout("copying the running guest".into()));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn measured(st: &Value) -> Sent {
    let n = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
    Sent {
        downtime_ms: n(st.get("downtime")),
        total_ms: n(st.get("total-time")),
        ram_bytes: n(st.get("ram").and_then(|r| r.get("transferred"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_copy_is_stopped_only_where_dirty_tracking_loses_writes() {
        assert_eq!(copy_for((7, 2), false), Method::Stopped);
        assert_eq!(copy_for((8, 2), false), Method::Stopped);
        assert_eq!(copy_for((9, 0), false), Method::Live);
        assert_eq!(copy_for((10, 0), false), Method::Live);
        assert_eq!(copy_for((7, 2), true), Method::Live);
        // A QEMU that names no version is taken for an old one.
        assert_eq!(copy_for((0, 0), false), Method::Stopped);
    }
}
