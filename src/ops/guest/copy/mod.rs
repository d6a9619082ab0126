//! guest_copy_in and guest_copy_out: files or whole folder trees between the host and a guest,
//! as one tar stream (a round trip per file would cost a guest-exec each under TCG). The
//! guest's own `tar` packs and unpacks; the host side is `state::tar` and `state::tree`, which
//! never follow a symlink. Nothing partial is left on failure: both sides build under a
//! temporary name beside the destination and rename it into place at the end.
//!
//! The bytes go over the VM's data channel when it has one (`channel`, `port`), streamed with
//! no archive in the guest (its side played by mcqemu-agent itself where it answers, so the
//! guest needs no shell or tar; by sh and tar otherwise); through the agent's file commands
//! when there is no channel (one agent session, `guest_stream`); the result says which
//! (`via`) and why.
//!
//! - `to_guest.rs`: copy_in; `from_guest.rs`: copy_out.
//! - `channel.rs`: the guest's side of a channel transfer and its framing.
//! - `frame.rs`: the framing as the host reads it (fuzzed).
//! - `port.rs`: the host's side: the socket, its lock, the guest program's status.

mod channel;
pub mod frame;
mod from_guest;
mod port;
mod to_guest;

pub use from_guest::copy_out;
pub use to_guest::copy_in;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::ops::error::{ErrorKind, OpError};
use crate::ops::guest::stream::{self as gs, Watch};
use crate::ops::vm::records::lookup;
use crate::qemu::qga::{Qga, QgaError};
use crate::state::tree::Counts;
use port::{Channel, Open, Side};

/// Default cap per call on the bytes copied (MCQEMU_MAX_COPY_MB).
const DEFAULT_MAX_MB: u64 = 2048;

/// The one name the copied tree has inside an archive sent to the guest.
const TOP: &str = "c";

/// guest_copy_in: a host file or tree into the guest.
pub struct CopyIn {
    /// The VM.
    pub name: String,
    /// The host path as given (checked against the roots here, for reading).
    pub host_path: String,
    /// The absolute guest path to create.
    pub guest_path: String,
    /// Replace what is at `guest_path`.
    pub overwrite: bool,
}

/// guest_copy_out: a guest file or tree to the host.
pub struct CopyOut {
    /// The VM.
    pub name: String,
    /// The absolute guest path to copy.
    pub guest_path: String,
    /// The host path as given (checked against the roots here, for writing).
    pub host_path: String,
    /// Replace what is at `host_path`.
    pub overwrite: bool,
}

crate::described! {
    /// What a copy did (guest_copy_in's and guest_copy_out's result, in this order).
    #[derive(Debug, serde::Serialize)]
    pub struct Copied {
        /// The VM.
        pub name: String,
        /// The host path as resolved.
        pub host_path: PathBuf,
        /// The guest path.
        pub guest_path: String,
        /// What was copied (and left out).
        #[serde(flatten)]
        pub counts: Counts,
        /// Wall time of the whole call.
        pub duration_ms: u64,
        /// How the bytes went: `channel` (mcqemu's data channel, a virtio-serial port, at the
        /// device's speed) or `agent` (the guest agent's file commands).
        pub via: &'static str,
        /// Why the channel was not used, when it was not.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub via_reason: Option<String>,
    }
}

/// How a copy's bytes went.
enum Via {
    Channel,
    Agent(String),
}

impl Via {
    fn parts(self) -> (&'static str, Option<String>) {
        match self {
            Via::Channel => ("channel", None),
            Via::Agent(why) => ("agent", Some(why)),
        }
    }
}

/// How a copy's bytes will go: the VM's data channel, opened for this transfer, with who plays
/// the guest's side (mcqemu-agent itself, or sh and tar); or the agent's file commands, and why.
enum Route {
    Channel(Channel, Side),
    Agent(String),
}

/// The copy's [`Route`]; an error when the channel is held by another transfer past the wait.
fn channel_for(name: &str, watch: &dyn Watch) -> Result<Route, OpError> {
    let rec = lookup(name)?;
    let sock = match channel::socket_of(&rec) {
        Ok(s) => s,
        Err(why) => return Ok(Route::Agent(why.to_string())),
    };
    let side = if crate::ops::guest::agent_is_ours(name)? {
        Side::Agent
    } else {
        Side::Shell
    };
    match Channel::open(&sock, watch) {
        Ok(ch) => Ok(Route::Channel(ch, side)),
        Err(Open::Unusable(why)) => Ok(Route::Agent(why)),
        Err(Open::Busy(msg)) => Err(OpError::busy(msg)),
    }
}

/// The kind of a guest copy program's exit code, as the scripts and mcqemu-agent's copy
/// subcommands use them: 4 nothing at the path (or no such folder), 6 over the cap, 13 the
/// destination exists (overwrite not given); 20-22 mean "use the agent's file commands" and
/// never reach here; every other code is the guest's own failure (2 bad arguments, 3 a missing
/// program, 5 unreadable, 10-12 and 14-15 the guest's file system, 23-24 the framing).
fn exit_kind(code: i64) -> ErrorKind {
    match code {
        4 => ErrorKind::NotFound,
        6 => ErrorKind::Refused,
        13 => ErrorKind::InvalidArgument,
        _ => ErrorKind::GuestFailed,
    }
}

/// A failed guest copy program's error: `what`, how it ended, and its own words.
fn program_failure(what: &str, code: Option<i64>, said: &str) -> OpError {
    let (kind, how) = match code {
        Some(c) if c > 128 => (
            ErrorKind::GuestFailed,
            format!(
                "killed by signal {} in the guest; nothing was kept, retry the copy",
                c - 128
            ),
        ),
        Some(c) => (exit_kind(c), format!("exit {c}")),
        None => (ErrorKind::GuestFailed, "ended by a signal".to_string()),
    };
    OpError::of(kind, format!("{what} failed in the guest ({how}): {said}"))
}

/// An I/O failure of a transfer as an operation error: one that carries an [`OpError`] (made
/// where the transfer stopped: a cancel, a cap, a guest program's exit) keeps its kind; an
/// archive entry the extractor refused (`PermissionDenied`) is a refusal; the rest are
/// `kind`.
fn io_failure(what: &str, e: std::io::Error, kind: ErrorKind) -> OpError {
    let kind = match e.get_ref().and_then(|i| i.downcast_ref::<OpError>()) {
        Some(inner) => inner.kind,
        None if e.kind() == std::io::ErrorKind::PermissionDenied => ErrorKind::Refused,
        None => kind,
    };
    OpError::of(kind, format!("{what}: {e}"))
}

/// A per-transfer nonce for the channel's framing.
fn nonce() -> String {
    crate::ops::vm::hold::new_secret()
        .map(|s| s.chars().take(24).collect())
        .unwrap_or_else(|_| temp_tag())
}

/// The cap per call, in bytes.
pub fn max_bytes() -> u64 {
    std::env::var("MCQEMU_MAX_COPY_MB")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(DEFAULT_MAX_MB)
        .saturating_mul(1 << 20)
}

/// An absolute guest path split into its folder and name.
fn guest_split(path: &str) -> Result<(String, String), OpError> {
    let trimmed = path.trim_end_matches('/');
    if !path.starts_with('/') || trimmed.is_empty() || path.contains('\0') {
        return Err(OpError::invalid(format!(
            "guest_path {path:?} must be an absolute path below / (e.g. /root/data)"
        )));
    }
    let (parent, base) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
    if base == "." || base == ".." {
        return Err(OpError::invalid(format!(
            "guest_path {path:?} must end in a name, not {base:?}"
        )));
    }
    let parent = if parent.is_empty() { "/" } else { parent };
    Ok((parent.to_string(), base.to_string()))
}

/// A name for temporaries, unique enough per call.
fn temp_tag() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(".mcq-copy-{}-{nanos:08x}", std::process::id())
}

fn join(parent: &str, name: &str) -> String {
    if parent.ends_with('/') {
        format!("{parent}{name}")
    } else {
        format!("{parent}/{name}")
    }
}

/// A session step's result: the agent failed (explained by the session), or this copy did.
type Step<T> = Result<Result<T, OpError>, QgaError>;

/// Runs `sh -c script sh args...` in the guest; a non-zero exit becomes `what`'s error.
fn sh(
    q: &mut Qga,
    script: &str,
    args: &[&str],
    timeout: Duration,
    what: &str,
    watch: Option<&dyn Watch>,
) -> Step<String> {
    let mut argv = vec!["sh", "-c", script, "sh"];
    argv.extend_from_slice(args);
    Ok(
        gs::run(q, &argv, timeout, watch)?.and_then(|r| match r.code {
            Some(0) => Ok(r.stdout),
            code => Err(program_failure(
                what,
                code,
                if r.stderr.is_empty() {
                    &r.stdout
                } else {
                    &r.stderr
                },
            )),
        }),
    )
}

/// Renames `$src` over `$dst`, keeping the old one (parked at `$old`) until the new one is in
/// place, then removes the unpack folder `$d`; `bye CODE TEXT` cleans up and fails. The end
/// of both ways in: [`PLACE`] after the agent's upload, and the channel's unpacking.
const RENAME: &str = r#"if [ -e "$dst" ] || [ -L "$dst" ]; then
  [ "$ow" = 1 ] || bye 13 "$dst appeared in the guest meanwhile; pass overwrite=true to replace it"
  mv "$dst" "$old" || bye 14 "cannot move the old $dst aside"
  if mv "$src" "$dst"; then rm -rf "$old"; else mv "$old" "$dst"; bye 15 "cannot rename into $dst"; fi
else
  mv "$src" "$dst" || bye 15 "cannot rename into $dst"
fi
rm -rf "$d""#;

/// How long the guest may take to unpack or pack `bytes` (TCG guests write slowly).
fn guest_time(bytes: u64) -> Duration {
    Duration::from_secs(60 + bytes / (1 << 20))
}

/// The folder and name of a resolved host path.
fn host_parts(host: &Path) -> Result<(&Path, &OsStr), OpError> {
    match (host.parent(), host.file_name()) {
        (Some(d), Some(n)) => Ok((d, n)),
        _ => Err(OpError::invalid(format!(
            "{} names no file or folder to copy",
            host.display()
        ))),
    }
}
