//! A blocking client for qemu-guest-agent over its virtio-serial chardev socket. Every
//! connection resyncs (0xFF, then `guest-sync-delimited` with a random id, discarding
//! everything until that id comes back), every call is bounded, replies are capped, and
//! sessions to one VM are serialized in-process.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::sock::LineStream;
use super::wire::{self, brief, Reply, WireError};

/// Bound for the connect + resync handshake.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(3);
/// Default bound for one agent command.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest reply accepted. The biggest legitimate one is a guest-exec-status carrying the
/// agent's full capture: up to 16 MiB of stdout and 16 MiB of stderr, both in base64 (~44 MiB).
pub const MAX_REPLY: usize = 48 * 1024 * 1024;

/// What went wrong talking to the agent.
#[derive(Debug)]
pub enum QgaError {
    /// The VM's agent socket cannot be reached (QEMU gone, or no agent channel).
    Connect(String),
    /// Connected, but no agent answered the sync in time.
    NoAgent,
    /// A command got no reply in time.
    Timeout(String),
    /// The channel closed.
    Closed,
    /// Not the agent protocol.
    Garbage(String),
    /// A reply exceeded the cap.
    TooLarge,
    /// The agent refused or the command failed in the guest.
    Command {
        /// Error class.
        class: String,
        /// Description.
        desc: String,
    },
}

impl QgaError {
    /// True when the guest has disabled the command (qemu-ga --block-rpcs / --allow-rpcs).
    pub fn is_disabled(&self) -> bool {
        matches!(self, QgaError::Command { desc, .. } if desc.contains("disabled"))
    }
}

impl std::fmt::Display for QgaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QgaError::Connect(m) => write!(f, "cannot connect to the guest-agent socket: {m}"),
            QgaError::NoAgent => write!(
                f,
                "no guest agent answered within {} s",
                SYNC_TIMEOUT.as_secs()
            ),
            QgaError::Timeout(c) => write!(f, "the guest agent did not answer {c} in time"),
            QgaError::Closed => write!(f, "the guest-agent channel closed"),
            QgaError::Garbage(m) => write!(f, "the guest agent sent something unexpected: {m}"),
            QgaError::TooLarge => write!(f, "a guest-agent reply exceeded {MAX_REPLY} bytes"),
            QgaError::Command { class, desc } => write!(f, "{desc} ({class})"),
        }
    }
}

impl std::error::Error for QgaError {}

impl From<WireError> for QgaError {
    fn from(e: WireError) -> Self {
        match e {
            WireError::Timeout => QgaError::Timeout("a reply".into()),
            WireError::Closed => QgaError::Closed,
            WireError::TooLarge => QgaError::TooLarge,
            WireError::Garbage(g) => QgaError::Garbage(g),
        }
    }
}

fn random_id() -> u64 {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_err()
    {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        b = (t as u64 ^ u64::from(std::process::id())).to_le_bytes();
    }
    u64::from_le_bytes(b) >> 12 // stay well inside JSON's exact integer range
}

/// How long an agent connection is kept open after a call. qemu-ga sleeps ~100 ms after the
/// host hangs up, so a call following another within that time would wait for it; keeping the
/// connection briefly makes back-to-back calls cost one resync instead. It is short because
/// the agent channel serves one client at a time: other programs wait while we hold it.
pub const IDLE_KEEP: Duration = Duration::from_secs(2);

struct Idle {
    qga: Qga,
    since: Instant,
}

/// Closes the idle connection kept for `path`, if any: the agent's channel takes one client at
/// a time, and a VM whose socket moves (a pooled clone handed out) is reached by another path.
pub fn release_idle(path: &Path) {
    idle_pool()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(path);
}

fn idle_pool() -> &'static Mutex<HashMap<PathBuf, Idle>> {
    static POOL: OnceLock<Mutex<HashMap<PathBuf, Idle>>> = OnceLock::new();
    POOL.get_or_init(|| {
        // One reaper closes connections idle for longer than IDLE_KEEP.
        let _ = std::thread::Builder::new()
            .name("qga-idle".into())
            .spawn(|| loop {
                std::thread::sleep(IDLE_KEEP / 4);
                if let Some(pool) = POOL.get() {
                    let mut p = pool.lock().unwrap_or_else(|e| e.into_inner());
                    p.retain(|_, idle| idle.since.elapsed() < IDLE_KEEP);
                }
            });
        Mutex::new(HashMap::new())
    })
}

/// An error a session can end with: says whether the connection is still in step with the
/// agent and may serve the next call (after a resync), or must be closed.
pub trait SessionFault: From<QgaError> {
    /// True when the connection may be kept.
    fn keeps_connection(&self) -> bool;
}

impl SessionFault for QgaError {
    /// Only the agent's own refusal leaves the conversation in step: after a timeout or garbage a
    /// late reply could be read as the next call's answer.
    fn keeps_connection(&self) -> bool {
        matches!(self, QgaError::Command { .. })
    }
}

/// Runs `f` with a synced agent session on `path`, serialized per socket in-process.
/// `sync_timeout` bounds the connect and the handshake together. A connection kept from a
/// recent call is reused after a fresh resync; one whose call failed other than by the
/// agent's own refusal is closed, so a late reply can never be read as the next answer.
pub fn with_agent<T, E: SessionFault>(
    path: &Path,
    sync_timeout: Duration,
    f: impl FnOnce(&mut Qga) -> Result<T, E>,
) -> Result<T, E> {
    let lock = super::sock::session_lock(path);
    let _guard = lock.lock().unwrap_or_else(|p| p.into_inner());
    in_session(path, sync_timeout, f)
}

/// [`with_agent`] only when no other call of this process uses the agent now (None then): for
/// a look that must not wait behind a long guest_exec.
pub fn try_with_agent<T, E: SessionFault>(
    path: &Path,
    sync_timeout: Duration,
    f: impl FnOnce(&mut Qga) -> Result<T, E>,
) -> Option<Result<T, E>> {
    let lock = super::sock::session_lock(path);
    let _guard = match lock.try_lock() {
        Ok(g) => g,
        Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => return None,
    };
    Some(in_session(path, sync_timeout, f))
}

/// The body of a session, its lock held.
fn in_session<T, E: SessionFault>(
    path: &Path,
    sync_timeout: Duration,
    f: impl FnOnce(&mut Qga) -> Result<T, E>,
) -> Result<T, E> {
    let kept = idle_pool()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(path);
    let reused = kept.and_then(|mut idle| {
        let deadline = Instant::now() + sync_timeout.min(Duration::from_secs(1));
        idle.qga.sync(deadline).ok().map(|_| idle.qga)
    });
    let mut qga = match reused {
        Some(q) => q,
        None => match Qga::connect(path, sync_timeout) {
            Ok(q) => {
                super::agent_seen::answered(path);
                q
            }
            Err(e) => {
                super::agent_seen::silent(path);
                return Err(e.into());
            }
        },
    };
    let result = f(&mut qga);
    if result
        .as_ref()
        .map_or_else(SessionFault::keeps_connection, |_| true)
    {
        idle_pool()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                path.to_path_buf(),
                Idle {
                    qga,
                    since: Instant::now(),
                },
            );
    }
    result
}

/// One agent session.
pub struct Qga {
    conn: LineStream,
}

impl Qga {
    /// Connects and resyncs within `timeout`.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Qga, QgaError> {
        let deadline = Instant::now() + timeout;
        let stream = super::sock::connect(path, timeout)
            .map_err(|e| QgaError::Connect(format!("{}: {e}", path.display())))?;
        let mut q = Qga {
            conn: LineStream::new(stream, MAX_REPLY),
        };
        q.sync(deadline)?;
        Ok(q)
    }

    /// Wraps an already connected stream and resyncs (used by tests with a fake agent).
    pub fn from_stream(stream: UnixStream, timeout: Duration) -> Result<Qga, QgaError> {
        let mut q = Qga {
            conn: LineStream::new(stream, MAX_REPLY),
        };
        q.sync(Instant::now() + timeout)?;
        Ok(q)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), QgaError> {
        self.conn.write_all(bytes).map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => {
                QgaError::Closed
            }
            _ => QgaError::Timeout(format!("a write ({e})")),
        })
    }

    /// Sends 0xFF and guest-sync-delimited, then discards everything until our id returns.
    fn sync(&mut self, deadline: Instant) -> Result<(), QgaError> {
        let id = random_id();
        let mut msg = vec![0xFFu8];
        msg.extend_from_slice(
            json!({"execute": "guest-sync-delimited", "arguments": {"id": id}})
                .to_string()
                .as_bytes(),
        );
        msg.push(b'\n');
        self.write(&msg)?;
        loop {
            match self.read_message(deadline) {
                Ok(v) if v.get("return").and_then(Value::as_u64) == Some(id) => return Ok(()),
                // Anything else before our id (stale replies, noise) is what a resync discards.
                Ok(_) | Err(QgaError::Garbage(_)) => {}
                Err(QgaError::Timeout(_)) => return Err(QgaError::NoAgent),
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads one message, dropping the 0xFF delimiter bytes of the sync protocol.
    fn read_message(&mut self, deadline: Instant) -> Result<Value, QgaError> {
        Ok(wire::read_message(&mut self.conn, deadline, Some(0xFF))?)
    }

    /// Runs one command with the default bound.
    pub fn execute(&mut self, cmd: &str, args: Option<Value>) -> Result<Value, QgaError> {
        self.execute_within(cmd, args, COMMAND_TIMEOUT)
    }

    /// Runs one command within `timeout`. After a timeout the session must not be reused:
    /// a late reply would be taken for the next command's (the next connection resyncs).
    pub fn execute_within(
        &mut self,
        cmd: &str,
        args: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, QgaError> {
        let mut msg = json!({"execute": cmd});
        if let Some(a) = args {
            msg["arguments"] = a;
        }
        let mut line = msg.to_string().into_bytes();
        line.push(b'\n');
        self.write(&line)?;
        let deadline = Instant::now() + timeout;
        let reply = match self.read_message(deadline) {
            Err(QgaError::Timeout(_)) => return Err(QgaError::Timeout(cmd.to_string())),
            other => other?,
        };
        match wire::decode_reply(&reply) {
            Some(Reply::Return(r)) => Ok(r),
            Some(Reply::Error { class, desc }) => Err(QgaError::Command { class, desc }),
            None => Err(QgaError::Garbage(format!(
                "reply without return or error: {}",
                brief(&reply)
            ))),
        }
    }
}
