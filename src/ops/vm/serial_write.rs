//! Typing into a VM's serial console: bytes into QEMU's console socket, paced as the UART
//! drains. vm_serial_write and the live view's console pane both write through here.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::ops::error::OpError;
use crate::qemu::sock;
use crate::state::record;

/// How long a write waits for the guest to take its bytes, plus a millisecond a byte.
const DRAIN_BASE: Duration = Duration::from_secs(5);

crate::described! {
    /// What a write did.
    #[derive(Debug, Clone, serde::Serialize)]
    pub struct Written {
        /// The VM.
        pub name: String,
        /// Bytes written.
        pub bytes: usize,
        /// The serial log's length before the write (where its echo starts), if it has a log
        /// (absent otherwise).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub offset: Option<u64>,
    }
}

/// Who writes to a serial console: an agent's tool (refused while a person holds the VM), or
/// the person's live view (whose hold the view has checked).
#[derive(Debug, Clone, Copy)]
pub enum By<'a> {
    /// The tool of this name.
    Tool(&'a str),
    /// The live view.
    View,
}

/// Writes `text` to VM `name`'s serial console.
pub fn write(name: &str, text: &str, by: By) -> Result<Written, OpError> {
    if let By::Tool(tool) = by {
        crate::ops::vm::hold::check_agent(name, tool)?;
    }
    let rec = crate::ops::vm::records::lookup_live(name, "launch it first")?;
    let sock_path = record::text(&rec.serial_socket)
        .map(PathBuf::from)
        .ok_or_else(|| {
            OpError::invalid(format!(
                "VM {name:?} has no serial console socket (VMs adopted with attach_vm, or \
                 launched by an older mcqemu, have none)"
            ))
        })?;
    let offset = record::text(&rec.serial_log)
        .map(|p| std::fs::metadata(Path::new(p)).map_or(0, |m| m.len()));
    let lock = sock::session_lock(&sock_path);
    let _guard = lock.lock().unwrap_or_else(|p| p.into_inner());
    let mut s = sock::connect(&sock_path, Duration::from_secs(5)).map_err(|e| {
        OpError::busy(format!(
            "cannot connect to the serial console of {name:?} ({e}); another client may hold it"
        ))
    })?;
    let _ = s.set_write_timeout(Some(Duration::from_secs(10)));
    // Paced in small pieces: the UART takes 16 bytes at a time and QEMU pulls as the guest reads.
    for chunk in text.as_bytes().chunks(64) {
        s.write_all(chunk).map_err(|e| {
            OpError::host(format!(
                "writing to the serial console of {name:?} failed: {e}"
            ))
        })?;
    }
    let _ = s.flush();
    // QEMU drops what the guest has not taken when we hang up, and a TCG guest on a busy host
    // takes its 16-byte FIFO's worth at a time: close only once QEMU has read it all.
    let drain = DRAIN_BASE + Duration::from_millis(text.len() as u64);
    if sock::wait_read_by_peer(&s, std::time::Instant::now() + drain).is_err() {
        return Err(OpError::timed_out(format!(
            "the serial console of {name:?} did not take all {} bytes within {} s and the rest \
             was dropped: the guest is not reading its console (still booting, or no getty on \
             it). Wait for its prompt with vm_serial_wait and write again",
            text.len(),
            drain.as_secs()
        )));
    }
    Ok(Written {
        name: name.to_string(),
        bytes: text.len(),
        offset,
    })
}
