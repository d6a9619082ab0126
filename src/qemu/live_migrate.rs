//! Copying a running guest into a second QEMU while it runs: precopy migration over a unix
//! socket, with a stop before the switchover (`pause-before-switchover`) at which the caller
//! freezes the guest's disk at the same instant as its memory. sandbox_fork and sandbox_suspend
//! capture a VM this way; the guest is stopped only for the last dirty pages and the disk step.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::qmp::{Qmp, QmpError};

/// Bandwidth for the copy (QEMU 7.2 defaults to 128 MiB/s).
const MAX_BANDWIDTH: u64 = 64 * 1024 * 1024 * 1024;
/// The stop QEMU aims at for the last dirty pages, in ms (the default is 300).
const DOWNTIME_LIMIT_MS: u64 = 50;

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

/// Sends the guest to the QEMU listening on `socket` while it runs; once QEMU has stopped it
/// for the switchover, `at_switchover` runs (the guest stopped, its disks still usable), then
/// the last state goes. The guest is left stopped (`postmigrate`): the caller lets it run on
/// (`cont`) or quits it. A failure cancels the migration, which lets a running guest run on.
pub fn send(
    q: &mut Qmp,
    socket: &Path,
    deadline: Instant,
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
    let result = run(q, socket, deadline, at_switchover);
    if result.is_err() {
        let _ = q.execute_within("migrate_cancel", None, Duration::from_secs(2));
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
