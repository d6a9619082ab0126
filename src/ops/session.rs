//! Where errors from the layers below become operation errors, in one place: the `From`
//! conversions, and the sessions to a VM's monitor and guest agent that always explain their
//! failures in terms of that VM (is it running, paused, busy, or gone?) instead of passing
//! QEMU's bare words through.

use crate::oci::error::OciError;
use std::time::Duration;

use super::error::{ErrorKind, OpError};
use crate::cloudinit::ConfigError;
use crate::net::download::DownloadError;
use crate::qemu::extra_args::ArgsError;
use crate::qemu::firmware::FirmwareError;
use crate::qemu::forwards::ForwardError;
use crate::qemu::img::{ImgError, SizeError};
use crate::qemu::keys::KeyError;
use crate::qemu::process::{self, KillError, SpawnError};
use crate::qemu::qga::{self, Qga, QgaError, SessionFault};
use crate::qemu::qmp::{self, Qmp, QmpError};
use crate::qemu::run::RunError;
use crate::qemu::untrusted::ImageError;
use crate::qemu::vm::{self, measure, Status};
use crate::state::record::text;
use crate::state::registry::{Record, RegistryError};
use crate::state::roots::RootsError;

/// `From<E> for OpError` for errors whose messages are already written for the agent, each
/// with the kind it always is.
macro_rules! tool_error_from {
    ($($kind:ident: $error:ty),* $(,)?) => {$(
        impl From<$error> for OpError {
            fn from(e: $error) -> Self {
                OpError::of(ErrorKind::$kind, e.to_string())
            }
        }
    )*};
}

tool_error_from!(
    HostFailed: ImgError,
    HostFailed: RunError,
    InvalidArgument: SizeError,
    Refused: ArgsError,
    InvalidArgument: ForwardError,
    HostFailed: FirmwareError,
    HostFailed: SpawnError,
    HostFailed: KillError,
    InvalidArgument: KeyError,
    HostFailed: DownloadError,
    InvalidArgument: ConfigError,
);

/// A lower layer's failure that carries its kind.
impl From<crate::kind::Failed> for OpError {
    fn from(e: crate::kind::Failed) -> Self {
        OpError::of(e.kind, e.msg)
    }
}

/// The roots' refusals: a path outside them, hidden or read-only is refused by policy; text
/// that is no path is an argument's fault; one that cannot be resolved names nothing.
impl From<RootsError> for OpError {
    fn from(e: RootsError) -> Self {
        let kind = match e {
            RootsError::Invalid(_) => ErrorKind::InvalidArgument,
            RootsError::Unresolvable(_) => ErrorKind::NotFound,
            _ => ErrorKind::Refused,
        };
        OpError::of(kind, e.to_string())
    }
}

/// An untrusted image's refusals (what it reaches, its depth) are policy; qemu-img's own
/// failure to read it is the host's.
impl From<ImageError> for OpError {
    fn from(e: ImageError) -> Self {
        let kind = match e {
            ImageError::Img(_) => ErrorKind::HostFailed,
            _ => ErrorKind::Refused,
        };
        OpError::of(kind, e.to_string())
    }
}

/// A container image's failures, each kind as the oci layer found it.
impl From<OciError> for OpError {
    fn from(e: OciError) -> Self {
        let kind = match e {
            OciError::Invalid(_) => ErrorKind::InvalidArgument,
            OciError::NotFound(_) => ErrorKind::NotFound,
            OciError::Refused(_) => ErrorKind::Refused,
            OciError::Host(_) => ErrorKind::HostFailed,
            OciError::Cancelled(_) => ErrorKind::Cancelled,
        };
        OpError::of(kind, e.to_string())
    }
}

/// The registry's failures: a record another server holds is busy; the rest are the host's.
impl From<RegistryError> for OpError {
    fn from(e: RegistryError) -> Self {
        let kind = match e {
            RegistryError::LockTimeout => ErrorKind::Busy,
            RegistryError::NewerSchema(_) => ErrorKind::Refused,
            _ => ErrorKind::HostFailed,
        };
        OpError::of(kind, e.to_string())
    }
}

/// What can fail inside a VM session: the channel itself (explained for the VM when the
/// session ends), or the tool's own work between commands (passed through as it is).
#[derive(Debug)]
pub enum SessionError<E> {
    /// The monitor or agent failed.
    Channel(E),
    /// Something else failed; its message is already for the agent.
    Tool(OpError),
}

impl From<QmpError> for SessionError<QmpError> {
    fn from(e: QmpError) -> Self {
        SessionError::Channel(e)
    }
}

impl From<QgaError> for SessionError<QgaError> {
    fn from(e: QgaError) -> Self {
        SessionError::Channel(e)
    }
}

impl<E> From<OpError> for SessionError<E> {
    fn from(e: OpError) -> Self {
        SessionError::Tool(e)
    }
}

impl SessionFault for SessionError<QgaError> {
    fn keeps_connection(&self) -> bool {
        match self {
            SessionError::Channel(c) => c.keeps_connection(),
            SessionError::Tool(_) => true,
        }
    }
}

/// Runs `f` in a QMP session with VM `name` (serialized with other sessions to it); a monitor
/// failure is always explained by [`explain_qmp`].
pub fn monitor<T>(
    name: &str,
    rec: &Record,
    f: impl FnOnce(&mut Qmp) -> Result<T, SessionError<QmpError>>,
) -> Result<T, OpError> {
    qmp::with_session(&vm::qmp_socket(rec), f).map_err(|e| match e {
        SessionError::Channel(c) => OpError::of(qmp_kind(rec, &c), explain_qmp(name, rec, &c)),
        SessionError::Tool(t) => t,
    })
}

/// Runs `f` on a synced guest-agent session of VM `name`; an agent failure is explained by
/// [`explain_agent`] for the command `cmd`.
pub fn agent<T>(
    name: &str,
    rec: &Record,
    cmd: &str,
    f: impl FnOnce(&mut Qga) -> Result<T, SessionError<QgaError>>,
) -> Result<T, OpError> {
    let sock = text(&rec.qga_socket).ok_or_else(|| {
        OpError::invalid(format!(
            "VM {name:?} has no guest-agent socket (attached without qga_socket); attach it again \
             with qga_socket"
        ))
    })?;
    qga::with_agent(std::path::Path::new(sock), qga::SYNC_TIMEOUT, f).map_err(|e| match e {
        SessionError::Channel(c) => explain_agent(name, rec, cmd, &c),
        SessionError::Tool(t) => t,
    })
}

/// The kind of a monitor failure, by the same checks as [`explain_qmp`]'s words.
fn qmp_kind(rec: &Record, e: &QmpError) -> ErrorKind {
    let proc_alive = vm::pid(rec).map(process::alive);
    if rec.suspended.is_some() {
        return ErrorKind::InvalidArgument;
    }
    match e {
        QmpError::NoGreeting if proc_alive != Some(false) => ErrorKind::Busy,
        QmpError::Connect(_) | QmpError::Closed | QmpError::NoGreeting
            if proc_alive != Some(true) =>
        {
            ErrorKind::InvalidArgument
        }
        QmpError::Timeout(_) => ErrorKind::TimedOut,
        _ => ErrorKind::HostFailed,
    }
}

/// Maps a QMP error for a VM to words for the agent, checking the process instead of guessing.
pub fn explain_qmp(name: &str, rec: &Record, e: &QmpError) -> String {
    let proc_alive = vm::pid(rec).map(process::alive);
    if rec.suspended.is_some() {
        return format!(
            "VM {name:?} is suspended (saved to disk, no QEMU); sandbox_resume it first"
        );
    }
    match e {
        QmpError::NoGreeting if proc_alive != Some(false) => format!(
            "another operation holds the monitor of VM {name:?} (QEMU serves one QMP client at a \
             time); retry shortly"
        ),
        QmpError::Connect(_) | QmpError::Closed | QmpError::NoGreeting
            if proc_alive != Some(true) =>
        {
            format!(
                "VM {name:?} is not running (its QEMU process has exited); launch it again with \
                 launch_vm"
            )
        }
        QmpError::Timeout(cmd) => format!(
            "VM {name:?}: QEMU did not answer {cmd} in time; it may be overloaded. Retry, or \
             stop_vm with force=true"
        ),
        other => format!("VM {name:?}: {other}"),
    }
}

/// Turns an agent error into words for the agent, checking the VM's run state first.
pub fn explain_agent(name: &str, rec: &Record, cmd: &str, e: &QgaError) -> OpError {
    match e {
        QgaError::NoAgent | QgaError::Connect(_) | QgaError::Closed => {
            let m = measure(rec);
            let state = if m.alive() {
                // Bounded: an explanation must not wait behind a long monitor session.
                qmp::with_session_within(&vm::qmp_socket(rec), Duration::from_secs(3), |q| {
                    q.query_status_within(Duration::from_secs(3))
                })
                .map_or(m.status, |s| Status::from_run_state(&s.status))
            } else {
                m.status
            };
            let kind = if state == Status::Running {
                ErrorKind::GuestFailed
            } else {
                ErrorKind::InvalidArgument
            };
            let msg = match state {
                Status::Suspended => format!(
                    "VM {name:?} is suspended (saved to disk, no QEMU); sandbox_resume it first"
                ),
                Status::Stopped => {
                    format!("VM {name:?} is not running; launch it (or sandbox_vm) first")
                }
                Status::Paused => format!(
                    "no guest agent answers because VM {name:?} is paused; resume_vm it first"
                ),
                Status::Running => format!(
                    "no guest agent answers in VM {name:?} ({e}): qemu-guest-agent is not \
                     installed or not started yet (the guest may still be booting). Wait and \
                     retry guest_ping, or check the guest with vm_serial_read / vm_screenshot"
                ),
                other => format!("no guest agent answers in VM {name:?}: the VM is {other}"),
            };
            OpError::of(kind, msg)
        }
        e if e.is_disabled() => OpError::refused(format!(
            "the guest has disabled {cmd} in its agent configuration (qemu-ga \
             --block-rpcs/--allow-rpcs); guest_info lists the enabled commands. Agent said: {e}"
        )),
        QgaError::Command { .. } => {
            OpError::guest(format!("{cmd} failed inside guest {name:?}: {e}"))
        }
        QgaError::Timeout(_) => OpError::timed_out(format!(
            "the guest agent in VM {name:?} did not answer {cmd} in time; the guest may be \
             overloaded. Retry"
        )),
        other => OpError::guest(format!("guest agent of VM {name:?}: {other}")),
    }
}
