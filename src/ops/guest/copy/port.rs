//! The host's side of a data-channel transfer: the channel taken for one transfer (a lock
//! file beside the socket, across servers), the guest program at the other end and what is
//! known of its end, and the byte stream between them. Every wait on the socket is a short
//! read or write timeout between which the guest program's status, the caller's cancel and
//! an idle bound are checked; reads and writes are counted against a cap.

use std::cell::Cell;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::ops::error::OpError;
use crate::ops::guest::stream::{self as gs, Watch};
use crate::qemu::agent_calls::{self, ExecRequest};
use crate::qemu::qga::{self, Qga, QgaError};
use crate::state::lockfile::{self, FileLock};

/// One socket read or write wait, between checks of the guest program and the caller.
const TICK: Duration = Duration::from_millis(500);

/// Longest time with no byte moving while the guest program still runs.
const IDLE: Duration = Duration::from_secs(60);

/// After the guest program ended, how long its last bytes may take to arrive.
const AFTER_EXIT: Duration = Duration::from_secs(3);

/// How long a second transfer waits for the channel.
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// The channel, held for one transfer: the lock file (released when dropped) and the socket.
pub struct Channel {
    _lock: FileLock,
    stream: UnixStream,
}

impl Channel {
    /// Takes the channel at `sock` (waiting up to [`LOCK_WAIT`] for another transfer) and
    /// connects to it; [`Open`] says whether to fall back to the agent or to refuse.
    pub fn open(sock: &Path, watch: &dyn Watch) -> Result<Channel, Open> {
        let lock = lockfile::lock_within(&sock.with_file_name("data.lock"), LOCK_WAIT, &|| {
            watch.cancelled()
        })
        .map_err(|e| Open::Unusable(format!("cannot take the channel's lock: {e}")))?
        .ok_or_else(|| {
            Open::Busy(format!(
                "another copy has held this VM's data channel for over {} s; wait for it to \
                 finish, then retry",
                LOCK_WAIT.as_secs()
            ))
        })?;
        let stream = UnixStream::connect(sock)
            .map_err(|e| Open::Unusable(format!("cannot connect to {}: {e}", sock.display())))?;
        stream
            .set_read_timeout(Some(TICK))
            .and_then(|()| stream.set_write_timeout(Some(TICK)))
            .map_err(|e| Open::Unusable(format!("socket timeouts: {e}")))?;
        Ok(Channel {
            _lock: lock,
            stream,
        })
    }
}

/// Why a channel could not be opened.
pub enum Open {
    /// Not usable here: copy through the agent (the reason goes in the result).
    Unusable(String),
    /// Held by another transfer past the wait.
    Busy(String),
}

/// Who plays the guest's side of a transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// `sh` and `tar` started through any agent's guest-exec.
    Shell,
    /// mcqemu-agent's own `copy-*` programs: no shell, tar or dd needed in the guest.
    Agent,
}

/// How the host names mcqemu-agent's own program to guest-exec (the agent's child execs it
/// as what the agent itself is).
const AGENT_SELF: &str = "/proc/self/exe";

/// A guest program started for a transfer, and what is known of its end.
pub(super) struct Program {
    pub(super) pid: i64,
    pub(super) side: Side,
    pub(super) ended: Option<(Option<i64>, String)>,
    pub(super) ended_at: Option<Instant>,
}

impl Program {
    /// Starts the guest's side: `sh -c script sh args...`, or `mcqemu-agent sub args...`,
    /// with its output captured.
    pub(super) fn start(
        q: &mut Qga,
        side: Side,
        (script, sub): (&str, &str),
        args: &[&str],
    ) -> Result<Program, QgaError> {
        let (path, mut argv) = match side {
            Side::Shell => (
                "sh",
                vec!["-c".to_string(), script.to_string(), "sh".to_string()],
            ),
            Side::Agent => (AGENT_SELF, vec![sub.to_string()]),
        };
        argv.extend(args.iter().map(|a| a.to_string()));
        let pid = gs::spawn(q, &ExecRequest::captured(path, &argv))?;
        Ok(Program {
            pid,
            side,
            ended: None,
            ended_at: None,
        })
    }

    /// Asks the agent whether the program has ended; remembers its exit code and stderr.
    pub(super) fn poll(&mut self, q: &mut Qga) -> Result<(), QgaError> {
        if self.ended.is_some() {
            return Ok(());
        }
        let s = agent_calls::exec_status(q, self.pid, qga::COMMAND_TIMEOUT)?;
        if s.exited {
            let err = s.stderr();
            let code = s.exitcode.or(s.signal.map(|_| -1));
            self.ended = Some((code, String::from_utf8_lossy(&err).trim().to_string()));
            self.ended_at = Some(Instant::now());
        }
        Ok(())
    }

    /// Waits (bounded) for the program to end.
    pub(super) fn wait(
        &mut self,
        q: &mut Qga,
        limit: Duration,
        watch: &dyn Watch,
    ) -> Result<(), QgaError> {
        let deadline = Instant::now() + limit;
        let mut slice = Duration::from_millis(2);
        while self.ended.is_none() && Instant::now() < deadline && !watch.cancelled() {
            self.poll(q)?;
            if self.ended.is_none() {
                std::thread::sleep(slice);
                slice = (slice * 2).min(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// The failure to report for an ended program (None: it ended well or has not ended).
    pub(super) fn failure(&self, what: &str) -> Option<OpError> {
        match &self.ended {
            Some((Some(0), _)) | None => None,
            Some((code, err)) => Some(super::program_failure(what, *code, err)),
        }
    }
}

/// The byte stream between host and guest for one transfer: counts, caps, progress, and
/// between socket waits the guest program's status, the caller's cancel and the idle bound.
pub(super) struct Port<'a> {
    pub(super) ch: &'a mut Channel,
    pub(super) q: &'a mut Qga,
    pub(super) prog: Program,
    pub(super) watch: &'a dyn Watch,
    /// Bytes moved (after the nonce's line).
    pub(super) moved: u64,
    pub(super) total: u64,
    pub(super) cap: u64,
    pub(super) files: &'a Cell<u64>,
    pub(super) last: Instant,
    /// The agent failure that ended the stream, if one did.
    pub(super) failure: Option<QgaError>,
}

impl<'a> Port<'a> {
    pub(super) fn new(
        ch: &'a mut Channel,
        q: &'a mut Qga,
        prog: Program,
        watch: &'a dyn Watch,
        files: &'a Cell<u64>,
        (total, cap): (u64, u64),
    ) -> Self {
        Port {
            ch,
            q,
            prog,
            watch,
            moved: 0,
            total,
            cap,
            files,
            last: Instant::now(),
            failure: None,
        }
    }

    /// Called when a socket wait timed out: is it still worth waiting?
    fn still(&mut self) -> io::Result<()> {
        if self.watch.cancelled() {
            return Err(io::Error::other(OpError::cancelled(
                "cancelled by the client",
            )));
        }
        if let Err(e) = self.prog.poll(self.q) {
            let msg = e.to_string();
            self.failure = Some(e);
            return Err(io::Error::other(msg));
        }
        if let Some(f) = self.prog.failure("the guest's side of the copy") {
            return Err(io::Error::other(f));
        }
        if self.prog.ended_at.is_some_and(|t| t.elapsed() > AFTER_EXIT) {
            return Err(io::Error::other(OpError::guest(
                "the guest's side of the copy ended but its data did not arrive whole",
            )));
        }
        if self.last.elapsed() > IDLE {
            return Err(io::Error::other(OpError::timed_out(format!(
                "no data moved on the channel for {} s",
                IDLE.as_secs()
            ))));
        }
        Ok(())
    }

    fn timed_out(e: &io::Error) -> bool {
        matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
        )
    }

    /// One read from the socket, waiting in ticks.
    fn read_raw(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.ch.stream.read(out) {
                Ok(0) => return Err(io::Error::other(
                        "QEMU closed the data channel (the VM stopped or was killed; vm_info shows its state)",
                    )),
                Ok(n) => {
                    self.last = Instant::now();
                    return Ok(n);
                }
                Err(e) if Self::timed_out(&e) => self.still()?,
                Err(e) => return Err(e),
            }
        }
    }
}

impl Read for Port<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let n = self.read_raw(out)?;
        self.moved += n as u64;
        if self.moved > self.cap {
            return Err(io::Error::other(OpError::refused(format!(
                "the guest's data passed the cap of {} MiB (MCQEMU_MAX_COPY_MB)",
                self.cap >> 20
            ))));
        }
        self.watch
            .progress(self.moved, self.total, self.files.get());
        Ok(n)
    }
}

impl Write for Port<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.moved + data.len() as u64 > self.cap {
            return Err(io::Error::other(format!(
                "the copy grew past the {} bytes measured before it was sent (did the tree \
                 change meanwhile? copy again)",
                self.cap
            )));
        }
        loop {
            match self.ch.stream.write(data) {
                Ok(n) => {
                    self.moved += n as u64;
                    self.last = Instant::now();
                    self.watch
                        .progress(self.moved, self.total, self.files.get());
                    return Ok(n);
                }
                Err(e) if Self::timed_out(&e) => self.still()?,
                Err(e) => return Err(e),
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.ch.stream.flush()
    }
}
