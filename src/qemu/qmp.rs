//! A blocking QMP client over a unix socket: greeting, capabilities negotiation, commands with
//! ids and time bounds, events collected between replies, replies capped in size. Sessions to
//! one socket are serialized in-process, since QEMU's monitor serves one client at a time.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::sock::LineStream;
use super::wire::{self, brief, Reply, WireError};

/// Default bound for one command.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// How long to wait for the greeting after connecting.
pub const GREETING_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest single message accepted from QEMU.
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;
/// Most events kept per session.
const MAX_EVENTS: usize = 1000;

/// What went wrong talking to QMP.
#[derive(Debug)]
pub enum QmpError {
    /// The socket could not be reached (missing, refused).
    Connect(String),
    /// Connected, but QEMU never greeted: another client holds the monitor, or QEMU is stuck.
    NoGreeting,
    /// A command got no reply in time.
    Timeout(String),
    /// QEMU closed the connection.
    Closed,
    /// QEMU sent something that is not QMP.
    Garbage(String),
    /// A message exceeded the size cap.
    TooLarge,
    /// Another operation of this server kept the monitor past the caller's budget.
    Held,
    /// QEMU answered with an error.
    Command {
        /// QMP error class.
        class: String,
        /// QEMU's description.
        desc: String,
    },
}

impl std::fmt::Display for QmpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QmpError::Connect(m) => write!(f, "cannot connect to the QMP socket: {m}"),
            QmpError::NoGreeting => write!(
                f,
                "QEMU did not send its QMP greeting within {} s (another client may hold the \
                 monitor)",
                GREETING_TIMEOUT.as_secs()
            ),
            QmpError::Timeout(c) => write!(f, "QEMU did not answer {c} in time"),
            QmpError::Closed => write!(f, "QEMU closed the QMP connection"),
            QmpError::Garbage(m) => write!(f, "QEMU sent something that is not QMP: {m}"),
            QmpError::TooLarge => write!(f, "a QMP message exceeded {MAX_MESSAGE} bytes"),
            QmpError::Held => write!(
                f,
                "another operation of this server is using the monitor; retry shortly"
            ),
            QmpError::Command { class, desc } => write!(f, "QEMU refused: {desc} ({class})"),
        }
    }
}

impl std::error::Error for QmpError {}

impl From<WireError> for QmpError {
    fn from(e: WireError) -> Self {
        match e {
            WireError::Timeout => QmpError::Timeout("a message".into()),
            WireError::Closed => QmpError::Closed,
            WireError::TooLarge => QmpError::TooLarge,
            WireError::Garbage(g) => QmpError::Garbage(g),
        }
    }
}

/// Like [`with_session`], but never waits longer than `budget` for the in-process session lock
/// and QEMU's greeting together: for callers that must answer in time even when the monitor
/// is held or QEMU is wedged (list_vms, vm_info, a forced stop).
pub fn with_session_within<T, E: From<QmpError>>(
    path: &Path,
    budget: Duration,
    f: impl FnOnce(&mut Qmp) -> Result<T, E>,
) -> Result<T, E> {
    let deadline = Instant::now() + budget;
    let lock = super::sock::session_lock(path);
    let _guard = loop {
        match lock.try_lock() {
            Ok(g) => break g,
            Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                if Instant::now() >= deadline {
                    return Err(QmpError::Held.into());
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    };
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let mut qmp = Qmp::connect(path, left)?;
    f(&mut qmp)
}

/// Runs `f` with an open QMP session on `path`, serialized against other sessions to the same
/// socket in this process.
pub fn with_session<T, E: From<QmpError>>(
    path: &Path,
    f: impl FnOnce(&mut Qmp) -> Result<T, E>,
) -> Result<T, E> {
    let lock = super::sock::session_lock(path);
    let _guard = lock.lock().unwrap_or_else(|p| p.into_inner());
    let mut qmp = Qmp::connect(path, GREETING_TIMEOUT)?;
    f(&mut qmp)
}

/// One QMP session.
pub struct Qmp {
    conn: LineStream,
    /// QEMU's version from the greeting, e.g. "7.2.22".
    pub version: String,
    /// Events received so far, oldest first.
    pub events: Vec<Value>,
    next_id: u64,
}

impl Qmp {
    /// Connects, reads the greeting and negotiates capabilities, all within bounds.
    pub fn connect(path: &Path, greeting_timeout: Duration) -> Result<Qmp, QmpError> {
        let stream = super::sock::connect(path, greeting_timeout).map_err(|e| {
            if e.kind() == std::io::ErrorKind::TimedOut {
                QmpError::NoGreeting
            } else {
                QmpError::Connect(format!("{}: {e}", path.display()))
            }
        })?;
        Self::from_stream(stream, greeting_timeout)
    }

    /// Runs the handshake on an already connected stream.
    pub fn from_stream(stream: UnixStream, greeting_timeout: Duration) -> Result<Qmp, QmpError> {
        let mut qmp = Qmp {
            conn: LineStream::new(stream, MAX_MESSAGE),
            version: String::new(),
            events: Vec::new(),
            next_id: 1,
        };
        let deadline = Instant::now() + greeting_timeout;
        let greeting = match qmp.read_message(deadline) {
            Ok(g) => g,
            Err(QmpError::Timeout(_)) => return Err(QmpError::NoGreeting),
            Err(e) => return Err(e),
        };
        let q = greeting.get("QMP").ok_or_else(|| {
            QmpError::Garbage(format!("expected a greeting, got {}", brief(&greeting)))
        })?;
        let v = &q["version"]["qemu"];
        qmp.version = format!("{}.{}.{}", v["major"], v["minor"], v["micro"]);
        // The negotiation shares the greeting's bound: a QEMU that greets and then stalls
        // must not hold a caller with a short budget for longer.
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(500));
        qmp.execute_within("qmp_capabilities", None, left)?;
        Ok(qmp)
    }

    /// Reads one JSON message (a line) before `deadline`.
    fn read_message(&mut self, deadline: Instant) -> Result<Value, QmpError> {
        Ok(wire::read_message(&mut self.conn, deadline, None)?)
    }

    fn keep_event(&mut self, ev: Value) {
        if self.events.len() >= MAX_EVENTS {
            self.events.remove(0);
        }
        self.events.push(ev);
    }

    /// Runs a command with the default bound.
    pub fn execute(&mut self, cmd: &str, args: Option<Value>) -> Result<Value, QmpError> {
        self.execute_within(cmd, args, COMMAND_TIMEOUT)
    }

    /// Runs a command; events arriving before the reply are kept in [`Qmp::events`].
    pub fn execute_within(
        &mut self,
        cmd: &str,
        args: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, QmpError> {
        self.run(cmd, args, None, timeout)
    }

    /// Runs a command that takes a file descriptor (`getfd`, `add-fd`): `fd` travels with it.
    pub fn execute_with_fd(
        &mut self,
        cmd: &str,
        args: Option<Value>,
        fd: std::os::unix::io::RawFd,
        timeout: Duration,
    ) -> Result<Value, QmpError> {
        self.run(cmd, args, Some(fd), timeout)
    }

    fn run(
        &mut self,
        cmd: &str,
        args: Option<Value>,
        fd: Option<std::os::unix::io::RawFd>,
        timeout: Duration,
    ) -> Result<Value, QmpError> {
        let id = format!("mcq-{}", self.next_id);
        self.next_id += 1;
        let mut msg = json!({"execute": cmd, "id": id});
        if let Some(a) = args {
            msg["arguments"] = a;
        }
        let mut line = serde_json::to_vec(&msg).map_err(|e| QmpError::Garbage(e.to_string()))?;
        line.push(b'\n');
        let written = match fd {
            Some(fd) => self.conn.write_with_fd(&line, fd),
            None => self.conn.write_all(&line),
        };
        written.map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => {
                QmpError::Closed
            }
            _ => QmpError::Timeout(format!("{cmd} (write: {e})")),
        })?;
        let deadline = Instant::now() + timeout;
        loop {
            let m = match self.read_message(deadline) {
                Err(QmpError::Timeout(_)) => return Err(QmpError::Timeout(cmd.to_string())),
                other => other?,
            };
            if m.get("event").is_some() {
                self.keep_event(m);
                continue;
            }
            let ours = m.get("id").and_then(Value::as_str) == Some(id.as_str());
            return match (ours, wire::decode_reply(&m)) {
                // A stale reply to an earlier, timed-out command.
                (false, Some(_)) => continue,
                (false, None) => Err(QmpError::Garbage(format!(
                    "unexpected message {}",
                    brief(&m)
                ))),
                (true, Some(Reply::Return(r))) => Ok(r),
                (true, Some(Reply::Error { class, desc })) => {
                    Err(QmpError::Command { class, desc })
                }
                (true, None) => Err(QmpError::Garbage(format!(
                    "reply without return or error: {}",
                    brief(&m)
                ))),
            };
        }
    }

    /// Sends several commands at once and collects their replies (a round trip for all of
    /// them instead of one each). The outer error is the channel's; each command's own
    /// result is inside.
    pub fn execute_pipelined(
        &mut self,
        cmds: &[(&str, Option<Value>)],
        timeout: Duration,
    ) -> Result<Vec<Result<Value, QmpError>>, QmpError> {
        let mut ids = Vec::with_capacity(cmds.len());
        let mut buf = Vec::new();
        for (cmd, args) in cmds {
            let id = format!("mcq-{}", self.next_id);
            self.next_id += 1;
            let mut msg = json!({"execute": cmd, "id": id});
            if let Some(a) = args {
                msg["arguments"] = a.clone();
            }
            buf.extend(serde_json::to_vec(&msg).map_err(|e| QmpError::Garbage(e.to_string()))?);
            buf.push(b'\n');
            ids.push(id);
        }
        self.conn.write_all(&buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => {
                QmpError::Closed
            }
            _ => QmpError::Timeout(format!("a pipelined write ({e})")),
        })?;
        let deadline = Instant::now() + timeout;
        let mut results: Vec<Option<Result<Value, QmpError>>> = cmds.iter().map(|_| None).collect();
        while results.iter().any(Option::is_none) {
            let m = match self.read_message(deadline) {
                Err(QmpError::Timeout(_)) => {
                    let waiting = cmds
                        .iter()
                        .zip(&results)
                        .find(|(_, r)| r.is_none())
                        .map_or("a reply", |(c, _)| c.0);
                    return Err(QmpError::Timeout(waiting.to_string()));
                }
                other => other?,
            };
            if m.get("event").is_some() {
                self.keep_event(m);
                continue;
            }
            let id = m.get("id").and_then(Value::as_str).unwrap_or_default();
            let Some(slot) = ids.iter().position(|i| i == id) else {
                if wire::decode_reply(&m).is_some() {
                    continue; // a stale reply to an earlier, timed-out command
                }
                return Err(QmpError::Garbage(format!(
                    "unexpected message {}",
                    brief(&m)
                )));
            };
            results[slot] = Some(match wire::decode_reply(&m) {
                Some(Reply::Return(r)) => Ok(r),
                Some(Reply::Error { class, desc }) => Err(QmpError::Command { class, desc }),
                None => Err(QmpError::Garbage(format!(
                    "reply without return or error: {}",
                    brief(&m)
                ))),
            });
        }
        Ok(results
            .into_iter()
            .map(|r| r.unwrap_or(Err(QmpError::Closed)))
            .collect())
    }

    /// Waits up to `slice` for the next event; Ok(None) when none came. Closed means QEMU went
    /// away.
    pub fn next_event(&mut self, slice: Duration) -> Result<Option<Value>, QmpError> {
        match self.read_message(Instant::now() + slice) {
            Ok(m) if m.get("event").is_some() => {
                self.keep_event(m.clone());
                Ok(Some(m))
            }
            Ok(_) => Ok(None),
            Err(QmpError::Timeout(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Runs an HMP command through QMP and returns its text output.
    pub fn hmp(&mut self, command: &str, timeout: Duration) -> Result<String, QmpError> {
        let r = self.execute_within(
            "human-monitor-command",
            Some(json!({"command-line": command})),
            timeout,
        )?;
        Ok(r.as_str().unwrap_or("").to_string())
    }

    /// Names of the events seen so far.
    pub fn event_names(&self) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|e| e["event"].as_str().map(str::to_string))
            .collect()
    }
}
