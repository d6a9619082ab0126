//! Saving a running guest's device state to a file and loading it into a new QEMU: the
//! mechanics of templates and their clones. Guest RAM stays in a shared memory file
//! (`x-ignore-shared`), so the stream holds only device state (under a megabyte). The state
//! file travels as a file descriptor passed over QMP, never through `exec:`, which QEMU's
//! seccomp sandbox (`spawn=deny`) forbids: from QEMU 9.0 into an fd set (`add-fd`) named by a
//! `file:/dev/fdset/N` URI, since `fd:` to a plain file is deprecated from 9.1 on; before
//! 9.0, which has no `file:` migration, by `getfd` and an `fd:` URI. The stream is the same
//! either way, so a state saved one way loads the other.

use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::qmp::{Qmp, QmpError};

/// The name the state file's descriptor gets inside QEMU.
const FD_NAME: &str = "mcq-state";
/// The fd set it goes into, where QEMU has `file:` migration.
const FDSET: u64 = 7;
/// Bandwidth for the save (QEMU 7.2 defaults to 128 MiB/s, which made a save take 0.5 s).
const MAX_BANDWIDTH: u64 = 64 * 1024 * 1024 * 1024;

fn io_error(what: &str, path: &Path, e: std::io::Error) -> QmpError {
    QmpError::Garbage(format!("cannot {what} {}: {e}", path.display()))
}

/// True when this QEMU (its QMP greeting's version) migrates to files through `file:`.
fn has_file_uri(q: &Qmp) -> bool {
    crate::host::binaries::parse_version(&q.version).is_some_and(|v| v >= (9, 0, 0))
}

/// Hands `file` to QEMU and returns the migration URI naming it.
fn pass_file(q: &mut Qmp, file: &std::fs::File, deadline: Instant) -> Result<String, QmpError> {
    if has_file_uri(q) {
        let _ = q.execute_within(
            "remove-fd",
            Some(json!({"fdset-id": FDSET})),
            left(deadline),
        );
        q.execute_with_fd(
            "add-fd",
            Some(json!({"fdset-id": FDSET, "opaque": FD_NAME})),
            file.as_raw_fd(),
            left(deadline),
        )?;
        Ok(format!("file:/dev/fdset/{FDSET}"))
    } else {
        q.execute_with_fd(
            "getfd",
            Some(json!({"fdname": FD_NAME})),
            file.as_raw_fd(),
            left(deadline),
        )?;
        Ok(format!("fd:{FD_NAME}"))
    }
}

/// Drops the fd set once the migration is over (QEMU keeps its own dup until it closes it).
fn release_file(q: &mut Qmp, deadline: Instant) {
    if has_file_uri(q) {
        let _ = q.execute_within(
            "remove-fd",
            Some(json!({"fdset-id": FDSET})),
            left(deadline),
        );
    }
}

fn ignore_shared(q: &mut Qmp) -> Result<(), QmpError> {
    q.execute(
        "migrate-set-capabilities",
        Some(json!({"capabilities": [{"capability": "x-ignore-shared", "state": true}]})),
    )?;
    Ok(())
}

fn left(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// Stops the guest and writes its device state into `file`, within `deadline`. The guest stays
/// stopped (the caller quits QEMU).
pub fn save(q: &mut Qmp, file: &Path, deadline: Instant) -> Result<u64, QmpError> {
    ignore_shared(q)?;
    q.execute(
        "migrate-set-parameters",
        Some(json!({"max-bandwidth": MAX_BANDWIDTH})),
    )?;
    q.execute("stop", None)?;
    // Write-only: QEMU takes the descriptor of the fd set whose access mode matches its own
    // open (O_WRONLY for an outgoing file).
    let out = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(file)
        .map_err(|e| io_error("create", file, e))?;
    let uri = pass_file(q, &out, deadline)?;
    q.execute_within("migrate", Some(json!({ "uri": uri })), left(deadline))?;
    loop {
        let st = q.execute_within("query-migrate", None, left(deadline))?;
        match st.get("status").and_then(Value::as_str).unwrap_or("") {
            "completed" => break,
            "failed" | "cancelled" => {
                let why = st
                    .get("error-desc")
                    .and_then(Value::as_str)
                    .unwrap_or("no reason given");
                return Err(QmpError::Command {
                    class: "MigrationFailed".into(),
                    desc: format!("saving the guest state failed: {why}"),
                });
            }
            _ => {}
        }
        if Instant::now() >= deadline {
            let _ = q.execute("migrate_cancel", None);
            return Err(QmpError::Timeout("saving the guest state".into()));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    release_file(q, deadline);
    out.sync_all().map_err(|e| io_error("flush", file, e))?;
    Ok(std::fs::metadata(file).map(|m| m.len()).unwrap_or(0))
}

/// Loads the device state in `file` into a QEMU started with `-incoming defer`, within
/// `deadline`, and lets the guest run.
pub fn load(q: &mut Qmp, file: &Path, deadline: Instant) -> Result<(), QmpError> {
    ignore_shared(q)?;
    let input = std::fs::File::open(file).map_err(|e| io_error("open", file, e))?;
    let uri = pass_file(q, &input, deadline)?;
    q.execute_within(
        "migrate-incoming",
        Some(json!({ "uri": uri })),
        left(deadline),
    )?;
    loop {
        let st = q.execute_within("query-status", None, left(deadline))?;
        let status = st.get("status").and_then(Value::as_str).unwrap_or("");
        if status != "inmigrate" {
            break;
        }
        let mig = q.execute_within("query-migrate", None, left(deadline))?;
        if matches!(mig.get("status").and_then(Value::as_str), Some("failed")) {
            let why = mig
                .get("error-desc")
                .and_then(Value::as_str)
                .unwrap_or("no reason given");
            return Err(QmpError::Command {
                class: "MigrationFailed".into(),
                desc: format!("loading the template state failed: {why}"),
            });
        }
        if Instant::now() >= deadline {
            return Err(QmpError::Timeout("loading the template state".into()));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    release_file(q, deadline);
    q.execute_within("cont", None, left(deadline))?;
    Ok(())
}
