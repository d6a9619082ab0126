//! A VM's run state changed in place (pause_vm, resume_vm), a QEMU started elsewhere adopted
//! (attach_vm), and a record dropped (forget_vm).

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::ops::error::OpError;
use crate::ops::session;
use crate::ops::vm::records::{self, lookup_live};
use crate::qemu::qmp::{self, QmpError};
use crate::qemu::vm::measure;
use crate::qemu::{process, sock};
use crate::state::record::Record;

/// A run-state change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// pause_vm: QMP `stop`.
    Pause,
    /// resume_vm: QMP `cont`.
    Resume,
}

crate::described! {
    /// A VM's run state after a change (in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct RunState {
        /// The VM.
        pub name: String,
        /// QEMU's run state.
        pub status: String,
    }
}

/// Pauses or resumes running VM `name`; returns the state QEMU reports after.
pub fn change(name: &str, how: Change) -> Result<RunState, OpError> {
    let rec = lookup_live(name, "launch it with launch_vm")?;
    let st = session::monitor(name, &rec, |q| {
        match how {
            Change::Pause => q.stop_vcpus()?,
            Change::Resume => q.cont()?,
        }
        Ok(q.query_status()?)
    })?;
    Ok(RunState {
        name: name.to_string(),
        status: st.status,
    })
}

/// attach_vm's request: sockets already checked against the roots.
#[derive(Debug, Clone)]
pub struct AttachRequest {
    /// The name to register it under.
    pub name: String,
    /// Its QMP socket.
    pub qmp_socket: PathBuf,
    /// Its guest-agent socket.
    pub qga_socket: Option<PathBuf>,
    /// Its process, for stop_vm.
    pub pid: Option<i32>,
}

crate::described! {
    /// What attach_vm registered (in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct Attached {
        /// The VM.
        pub name: String,
        /// QEMU's run state.
        pub status: String,
        /// Its QMP socket.
        pub qmp_socket: String,
        /// Its guest-agent socket.
        pub qga_socket: Option<String>,
        /// Its process.
        pub pid: Option<i32>,
        /// QEMU's version, from its greeting.
        pub qemu_version: String,
    }
}

/// The socket at `path` (parameter `key`), resolved: refused unless it is a unix socket.
fn socket(path: &Path, key: &str) -> Result<PathBuf, OpError> {
    let p = std::fs::canonicalize(path)
        .map_err(|e| OpError::host(format!("{key} {}: {e}", path.display())))?;
    if !sock::is_socket(&p) {
        return Err(OpError::invalid(format!(
            "{key} {} is not a unix socket",
            p.display()
        )));
    }
    Ok(p)
}

/// Registers a QEMU that answers QMP on its socket, unless a live VM holds the name.
pub fn attach(req: &AttachRequest) -> Result<Attached, OpError> {
    let qmp_path = socket(&req.qmp_socket, "qmp_socket")?;
    let qga = match &req.qga_socket {
        Some(p) => Some(socket(p, "qga_socket")?),
        None => None,
    };
    if let Some(p) = req.pid {
        if !process::alive(p) {
            return Err(OpError::invalid(format!("process {p} is not running")));
        }
    }
    let (status, version) = qmp::with_session(&qmp_path, |q| -> Result<_, QmpError> {
        Ok((q.query_status()?.status, q.version.clone()))
    })
    .map_err(|e| match e {
        QmpError::NoGreeting => OpError::busy(format!(
            "{} accepts connections but sends no QMP greeting: another client holds that monitor. \
             Free it and retry",
            qmp_path.display()
        )),
        other => OpError::host(format!(
            "{} does not answer QMP: {other}",
            qmp_path.display()
        )),
    })?;
    let name = req.name.clone();
    let rec = Record {
        name: Some(name.clone()),
        source: Some("attached".into()),
        pid: req.pid.map(i64::from),
        qmp_socket: Some(qmp_path.display().to_string()),
        qga_socket: qga.as_ref().map(|p| p.display().to_string()),
        qemu_version: Some(version.clone()),
        created_at: Some(crate::clock::iso8601(crate::clock::now_secs())),
        ..Record::default()
    };
    let name_c = name.clone();
    crate::state::registry::shared().update(move |vms| {
        if let Some(old) = vms.get(&name_c) {
            if measure(old).alive() {
                return Err(OpError::invalid(format!(
                    "a live VM is already registered as {name_c:?}; choose another name"
                )));
            }
        }
        vms.insert(name_c, rec);
        Ok(())
    })?;
    Ok(Attached {
        name,
        status,
        qmp_socket: qmp_path.display().to_string(),
        qga_socket: qga.map(|p| p.display().to_string()),
        pid: req.pid,
        qemu_version: version,
    })
}

crate::described! {
    /// What forget_vm did (in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct Forgotten {
        /// The VM.
        pub name: String,
        /// Always true.
        pub forgotten: bool,
        /// Whether its QEMU was still running (left alone, unmanaged).
        pub was_running: bool,
    }
}

/// Drops VM `name`'s record (a live spawned VM only with `force`).
pub fn forget(name: &str, force: bool) -> Result<Forgotten, OpError> {
    let was_running = records::forget(name, force)?;
    Ok(Forgotten {
        name: name.to_string(),
        forgotten: true,
        was_running,
    })
}
