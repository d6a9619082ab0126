//! A VM's consoles as the resources read them: which VMs have a serial log and a screen, the
//! log's last window, and the screen within a budget so that a wedged QEMU cannot hold up a
//! read. The MCP side (URIs, the `Provider`) is in `tools/resources.rs`.

use std::path::Path;
use std::time::Duration;

use crate::ops::screen::{self, Wait};
use crate::ops::session::explain_qmp;
use crate::ops::vm::{records, serial};
use crate::qemu::qmp::QmpError;
use crate::qemu::screen::CaptureError;
use crate::qemu::vm::{self, Status};
use crate::state::record::text;
use crate::state::registry::Record;

/// The longest a screen read takes, the wait for the monitor included.
pub const SCREEN_BUDGET: Duration = Duration::from_secs(4);
/// The longest a screen read waits for the monitor (another call may hold it, QEMU may be
/// wedged before its greeting).
const MONITOR_WAIT: Duration = Duration::from_secs(2);

/// Why a console read gave nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unread {
    /// There is no such VM or console; what to read instead.
    NotFound(String),
    /// The read failed; what happened.
    Failed(String),
}

/// A VM that shows consoles: its name, and whether it has a serial log.
pub struct Shown {
    /// The VM.
    pub name: String,
    /// It has a serial log (attached VMs have none); every VM shown has a screen.
    pub serial: bool,
}

/// The VMs whose consoles are offered, in the registry's order: pooled clones (the server's)
/// and VMs still being launched are left out.
pub fn shown() -> Vec<Shown> {
    crate::state::registry::shared()
        .load()
        .into_iter()
        .filter(|(_, rec)| rec.pooled.is_none() && rec.launching.is_none())
        .map(|(name, rec)| Shown {
            serial: text(&rec.serial_log).is_some(),
            name,
        })
        .collect()
}

/// The registry file, whose identity changes at every change (resources' list stamp).
pub fn registry_file() -> std::path::PathBuf {
    crate::state::registry::shared().path().to_path_buf()
}

/// The record of VM `name`, or the not-found error saying what to do.
fn record(name: &str) -> Result<Record, Unread> {
    crate::state::registry::shared()
        .load()
        .remove(name)
        .ok_or_else(|| {
            Unread::NotFound(format!(
            "resource not found: there is no VM named {name:?} (it was forgotten or destroyed, \
             or never existed); resources/list and list_vms show the VMs there are, and \
             launch_vm or sandbox_vm starts one"
        ))
        })
}

/// The last [`serial::WINDOW`] of VM `name`'s serial log; `instead` names what to read when it
/// has none.
pub fn serial_text(name: &str, instead: &str) -> Result<String, Unread> {
    let rec = record(name)?;
    let path = text(&rec.serial_log).ok_or_else(|| {
        Unread::NotFound(format!(
            "resource not found: VM {name:?} has no serial console log (VMs adopted with \
             attach_vm have none); read {instead} instead"
        ))
    })?;
    serial::tail_text(Path::new(path)).map_err(|e| {
        Unread::Failed(format!(
            "cannot read the serial log of VM {name:?} ({path}): {e}"
        ))
    })
}

/// Why the monitor gave no screen, for VM `name`: a silent or busy monitor in terms of the
/// read's own bound, anything else as the tools explain it.
fn monitor_failure(name: &str, rec: &Record, e: &QmpError) -> String {
    match e {
        QmpError::NoGreeting | QmpError::Timeout(_) | QmpError::Held => format!(
            "VM {name:?} did not show its screen within {} s: its monitor did not answer (QEMU \
             is stuck, or another operation holds the monitor). Retry shortly; stop_vm with \
             force=true ends a stuck QEMU",
            SCREEN_BUDGET.as_secs()
        ),
        other => explain_qmp(name, rec, other),
    }
}

/// VM `name`'s screen as a PNG bounded as vm_screenshot's inline image, within
/// [`SCREEN_BUDGET`].
pub fn screen_png(name: &str) -> Result<Vec<u8>, Unread> {
    record(name)?;
    let rec = records::lookup_live(name, "launch it with launch_vm, then read its screen")
        .map_err(|e| Unread::Failed(e.msg))?;
    if let Some(m) = vm::measure_process(&rec).filter(|m| m.status == Status::Frozen) {
        return Err(Unread::Failed(format!(
            "VM {name:?} cannot show its screen: {}",
            m.detail
                .unwrap_or_else(|| "its QEMU process is stopped".into())
        )));
    }
    let wait = Wait::Within {
        monitor: MONITOR_WAIT,
        all: SCREEN_BUDGET,
    };
    // Bounded as vm_screenshot's inline image: clients hand a resource to the model as is.
    let got = screen::capture(name, &rec, &screen::INLINE, wait).map_err(|e| {
        Unread::Failed(match e {
            CaptureError::Qmp(e) => monitor_failure(name, &rec, &e),
            other => format!("the screen of VM {name:?} could not be read: {other}; retry"),
        })
    })?;
    Ok(got.shot.png.data)
}
