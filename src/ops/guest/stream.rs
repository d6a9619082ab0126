//! Guest files as byte streams over one agent session: a writer and a reader that move ~1 MiB
//! per guest-file-write / guest-file-read (each call is a round trip into the guest, so fewer
//! and larger is faster), and a program run to its end inside that same session (qemu-ga
//! drains a program's output slowly while no client is connected, so stay connected).

use std::cell::Cell;
use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use crate::ops::error::OpError;
use crate::qemu::agent_calls::{self, ExecRequest, FileHandle};
use crate::qemu::qga::{Qga, QgaError};

/// Bytes per guest-file-read / guest-file-write: a multiple of 3, so base64 chunks need no
/// padding (qemu-ga allows reads of up to 48 MB).
pub const CHUNK: usize = 1024 * 1024 - 1;

/// What a copy reports as it goes, and how it learns it was cancelled.
pub trait Watch {
    /// `bytes` of `total` moved so far, `files` of them complete.
    fn progress(&self, bytes: u64, total: u64, files: u64);
    /// True once the caller has given up.
    fn cancelled(&self) -> bool;
}

/// Starts a program with guest-exec request `req`; returns its guest PID.
pub fn spawn(q: &mut Qga, req: &ExecRequest) -> Result<i64, QgaError> {
    agent_calls::exec(q, req, Duration::from_secs(30))
}

/// Closes a guest file handle (bounded; its failure is returned for writers to check).
pub fn close(q: &mut Qga, h: FileHandle) -> Result<(), QgaError> {
    agent_calls::file_close(q, h, Duration::from_secs(10))
}

/// The error an agent failure becomes inside an io stream; the agent error itself is kept
/// beside it, so the session can explain it for the VM.
fn stream_err(slot: &mut Option<QgaError>, e: QgaError) -> io::Error {
    let msg = e.to_string();
    *slot = Some(e);
    io::Error::other(msg)
}

/// Writes to an open guest file in [`CHUNK`]s, reporting progress and stopping at `cap`.
pub struct GuestWriter<'a> {
    q: &'a mut Qga,
    handle: FileHandle,
    buf: Vec<u8>,
    /// Bytes the guest has accepted.
    pub sent: u64,
    total: u64,
    cap: u64,
    files: &'a Cell<u64>,
    watch: &'a dyn Watch,
    /// The agent failure that ended the stream, if one did.
    pub failure: Option<QgaError>,
}

impl<'a> GuestWriter<'a> {
    /// A writer on `handle` expecting about `total` bytes, refusing more than `cap`.
    pub fn new(
        q: &'a mut Qga,
        handle: FileHandle,
        total: u64,
        cap: u64,
        files: &'a Cell<u64>,
        watch: &'a dyn Watch,
    ) -> Self {
        GuestWriter {
            q,
            handle,
            buf: Vec::with_capacity(CHUNK),
            sent: 0,
            total,
            cap,
            files,
            watch,
            failure: None,
        }
    }

    fn send(&mut self) -> io::Result<()> {
        if self.watch.cancelled() {
            return Err(io::Error::other(OpError::cancelled(
                "cancelled by the client",
            )));
        }
        let mut done = 0;
        let mut idle = 0;
        while done < self.buf.len() {
            let n = match agent_calls::file_write(self.q, self.handle, &self.buf[done..]) {
                Ok(n) => n as usize,
                Err(e) => return Err(stream_err(&mut self.failure, e)),
            };
            idle = if n == 0 { idle + 1 } else { 0 };
            if idle >= 3 {
                return Err(io::Error::other(OpError::guest(format!(
                    "the guest accepted no bytes after {}; is its disk (or memory, for a \
                     tmpfs) full?",
                    self.sent
                ))));
            }
            done += n.min(self.buf.len() - done);
            self.sent += n as u64;
        }
        self.buf.clear();
        self.watch.progress(self.sent, self.total, self.files.get());
        Ok(())
    }

    /// Sends what is buffered and gives the session back.
    pub fn finish(mut self) -> io::Result<(u64, FileHandle)> {
        self.send()?;
        Ok((self.sent, self.handle))
    }
}

impl Write for GuestWriter<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.sent + (self.buf.len() + data.len()) as u64 > self.cap {
            return Err(io::Error::other(OpError::refused(format!(
                "the copy grew past the cap of {} MiB while it was sent",
                self.cap >> 20
            ))));
        }
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads an open guest file in [`CHUNK`]s, reporting progress and stopping past `cap`.
pub struct GuestReader<'a> {
    q: &'a mut Qga,
    handle: FileHandle,
    buf: Vec<u8>,
    pos: usize,
    eof: bool,
    /// Bytes received.
    pub received: u64,
    total: u64,
    cap: u64,
    files: &'a Cell<u64>,
    watch: &'a dyn Watch,
    /// The agent failure that ended the stream, if one did.
    pub failure: Option<QgaError>,
}

impl<'a> GuestReader<'a> {
    /// A reader on `handle` of a file of `total` bytes (0: unknown), refusing past `cap`.
    pub fn new(
        q: &'a mut Qga,
        handle: FileHandle,
        total: u64,
        cap: u64,
        files: &'a Cell<u64>,
        watch: &'a dyn Watch,
    ) -> Self {
        GuestReader {
            q,
            handle,
            buf: Vec::new(),
            pos: 0,
            eof: false,
            received: 0,
            total,
            cap,
            files,
            watch,
            failure: None,
        }
    }

    fn fill(&mut self) -> io::Result<()> {
        if self.watch.cancelled() {
            return Err(io::Error::other(OpError::cancelled(
                "cancelled by the client",
            )));
        }
        let mut idle = 0;
        loop {
            let (chunk, eof) = match agent_calls::file_read(self.q, self.handle, CHUNK) {
                Ok(r) => r,
                Err(e) => return Err(stream_err(&mut self.failure, e)),
            };
            self.eof = eof;
            idle = if chunk.is_empty() { idle + 1 } else { 0 };
            if !chunk.is_empty() || self.eof || idle >= 3 {
                self.eof |= chunk.is_empty();
                self.received += chunk.len() as u64;
                if self.received > self.cap {
                    return Err(io::Error::other(OpError::refused(format!(
                        "the guest's data passed the cap of {} MiB (MCQEMU_MAX_COPY_MB)",
                        self.cap >> 20
                    ))));
                }
                self.buf = chunk;
                self.pos = 0;
                self.watch
                    .progress(self.received, self.total, self.files.get());
                return Ok(());
            }
        }
    }

    /// The agent session and handle back, to close the file.
    pub fn into_parts(self) -> (&'a mut Qga, FileHandle) {
        (self.q, self.handle)
    }
}

impl Read for GuestReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.pos >= self.buf.len() {
            if self.eof {
                return Ok(0);
            }
            self.fill()?;
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// How a guest program ended.
pub struct Ran {
    /// Its exit code (None when a signal ended it).
    pub code: Option<i64>,
    /// Its standard output, lossily decoded.
    pub stdout: String,
    /// Its standard error, lossily decoded.
    pub stderr: String,
}

/// Runs `argv` in the guest on this session, polling its status until it ends, `timeout`
/// passes or `watch` is cancelled (then it is still running; the error gives its pid).
pub fn run(
    q: &mut Qga,
    argv: &[&str],
    timeout: Duration,
    watch: Option<&dyn Watch>,
) -> Result<Result<Ran, OpError>, QgaError> {
    let Some((program, args)) = argv.split_first() else {
        return Ok(Err(OpError::invalid("nothing to run")));
    };
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let pid = spawn(q, &ExecRequest::captured(program, &args))?;
    let deadline = Instant::now() + timeout;
    let mut slice = Duration::from_millis(2);
    loop {
        let s = agent_calls::exec_status(q, pid, crate::qemu::qga::COMMAND_TIMEOUT)?;
        if s.exited {
            let text = |b: Vec<u8>| String::from_utf8_lossy(&b).trim().to_string();
            return Ok(Ok(Ran {
                code: s.exitcode,
                stdout: text(s.stdout()),
                stderr: text(s.stderr()),
            }));
        }
        if watch.is_some_and(|w| w.cancelled()) {
            return Ok(Err(OpError::cancelled(format!(
                "cancelled by the client; {program} is still running in the guest as pid {pid}"
            ))));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(Err(OpError::timed_out(format!(
                "{} did not finish in the guest within {} s; it is still running as pid {pid}",
                args.first().map_or(*program, String::as_str),
                timeout.as_secs()
            ))));
        }
        std::thread::sleep(slice.min(deadline - now));
        slice = (slice * 2).min(Duration::from_millis(100));
    }
}
