//! `mcqemu fs-serve`: the process that serves one mount of one VM. It connects to the VM's port
//! socket (QEMU listens), waits for the guest's relay to say hello, tells it where to mount and
//! whether writes are allowed, then answers FUSE requests until the VM ends. It says how the
//! mount stands in its status file, which vm_info reads.
//!
//! The port's conversation, before FUSE: the guest writes [`HELLO`] + `\n`; the host answers
//! `MCQFS mount ro|rw PATH\n`; the guest answers `MCQFS ok UID GID\n` (who the files show as
//! owned by: the image's user in a container root, else root) or `MCQFS error WHY\n`. A hello
//! in place of a FUSE request (the guest rebooted, its relay started again) starts the
//! conversation again; bytes that are neither (a request cut off when a relay died) are
//! skipped up to the next hello.

use crate::kind::Failed;
use std::io::{self, Read, Write};
use std::os::unix::io::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::abi::IN_HEADER;
use super::server::{Server, MAX_REQUEST};

/// The guest relay's first words; its first four bytes read as a FUSE length far beyond any
/// request, so a hello is never taken for one.
pub const HELLO: &str = "MCQFS relay 1";
/// The descriptor the share's folder is handed down on.
pub const SHARE_FD: i32 = 3;
/// How long the helper waits for QEMU's socket to appear.
const SOCKET_WAIT: Duration = Duration::from_secs(20);
/// The longest line of the conversation.
const MAX_LINE: usize = 4200;

/// The helper's parameters.
#[derive(Debug)]
pub struct Config {
    /// QEMU's socket for the mount's port.
    pub socket: PathBuf,
    /// Where the guest mounts it.
    pub guest: String,
    /// Writes allowed.
    pub writable: bool,
    /// The status file.
    pub status: PathBuf,
}

/// The subcommand's arguments.
pub fn parse_args(args: &[String]) -> Result<Config, Failed> {
    let (mut socket, mut guest, mut status, mut writable) = (None, None, None, false);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--writable" {
            writable = true;
            continue;
        }
        let value = it
            .next()
            .ok_or(Failed::host(format!("{flag} needs a value")))?;
        match flag.as_str() {
            "--socket" => socket = Some(PathBuf::from(value)),
            "--guest" => guest = Some(value.clone()),
            "--status" => status = Some(PathBuf::from(value)),
            other => return Err(Failed::host(format!("unknown option {other:?}"))),
        }
    }
    Ok(Config {
        socket: socket.ok_or(Failed::host("--socket is required"))?,
        guest: guest.ok_or(Failed::host("--guest is required"))?,
        writable,
        status: status.ok_or(Failed::host("--status is required"))?,
    })
}

/// Writes the status file (atomically): `waiting`, `mounted`, `failed` (with why), `ended`.
fn status(c: &Config, state: &str, error: Option<&str>) {
    let v = serde_json::json!({"state": state, "error": error, "pid": std::process::id()});
    let tmp = c.status.with_extension("tmp");
    if std::fs::write(&tmp, v.to_string()).is_ok() {
        let _ = std::fs::rename(&tmp, &c.status);
    }
}

/// Raises the open-file limit to its hard maximum: every node the guest holds is a descriptor.
fn raise_nofile() {
    // SAFETY: a zeroed rlimit is valid; getrlimit fills it.
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer / in-pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

fn connect(path: &Path) -> Result<UnixStream, Failed> {
    let deadline = Instant::now() + SOCKET_WAIT;
    loop {
        match UnixStream::connect(path) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => {
                return Err(Failed::host(format!(
                    "cannot reach {}: {e}",
                    path.display()
                )))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Reads one `\n`-ended line (bounded), starting with `start` already read.
fn read_line(s: &mut impl Read, start: &[u8]) -> io::Result<String> {
    let mut line = start.to_vec();
    let mut b = [0u8; 1];
    while !line.ends_with(b"\n") {
        if line.len() > MAX_LINE {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "line too long"));
        }
        if s.read(&mut b)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        line.push(b[0]);
    }
    Ok(String::from_utf8_lossy(&line).trim_end().to_string())
}

/// Serves the mount until its VM ends.
pub fn run(c: &Config) -> Result<(), Failed> {
    // SAFETY: the starter hands the share's folder down on SHARE_FD; it is ours from here.
    let share = unsafe { OwnedFd::from_raw_fd(SHARE_FD) };
    if let Err(e) = super::nodes::fstat(share.as_raw_fd()) {
        return Err(Failed::host(format!(
            "the share's folder was not handed down: {e}"
        )));
    }
    raise_nofile();
    status(c, "waiting", None);
    let sock = connect(&c.socket)?;
    serve_on(sock, c, &share)
}

/// The conversation and the FUSE requests on a connected port (a socket pair in tests).
pub fn serve_on(mut sock: UnixStream, c: &Config, share: &OwnedFd) -> Result<(), Failed> {
    let mut out = sock
        .try_clone()
        .map_err(|e| Failed::host(format!("cannot clone the socket: {e}")))?;
    let mut start: Vec<u8> = Vec::new();
    loop {
        // Anything but a hello (the end of a request cut off when the relay died, stale
        // lines) is skipped up to the next hello: the conversation always starts again.
        match find_hello(&mut sock, &start) {
            Ok(()) => start.clear(),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(Failed::host(format!("reading the guest's hello: {e}"))),
        }
        let mode = if c.writable { "rw" } else { "ro" };
        writeln!(out, "MCQFS mount {mode} {}", c.guest).map_err(|e| Failed::host(e.to_string()))?;
        let owner = match read_line(&mut sock, &[]) {
            Ok(l) if l == "MCQFS ok" || l.starts_with("MCQFS ok ") => {
                status(c, "mounted", None);
                parse_owner(&l)
            }
            // The relay started again before it answered: answer its new hello.
            Ok(l) if l == HELLO => {
                start = format!("{HELLO}\n").into_bytes();
                continue;
            }
            Ok(l) => {
                let why = l.strip_prefix("MCQFS error ").unwrap_or(&l).to_string();
                status(c, "failed", Some(&why));
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(Failed::host(format!("reading the guest's answer: {e}"))),
        };
        let root = share
            .try_clone()
            .map_err(|e| Failed::host(format!("cannot reuse the share's folder: {e}")))?;
        let mut server =
            Server::new(root, c.writable, owner).map_err(|e| Failed::host(e.to_string()))?;
        match serve(&mut sock, &mut out, &mut server) {
            Ok(Some(again)) => start = again,
            Ok(None) => break,
            Err(e) => return Err(e),
        }
        status(c, "waiting", None);
    }
    status(c, "ended", None);
    Ok(())
}

/// Reads (after `start`, already read) up to the end of the relay's next hello, skipping
/// whatever comes before it; a hello is found even when it follows garbage on its line.
fn find_hello(sock: &mut UnixStream, start: &[u8]) -> io::Result<()> {
    let want = format!("{HELLO}\n").into_bytes();
    let mut seen = start.to_vec();
    let mut b = [0u8; 1];
    while !seen.ends_with(&want) {
        if seen.len() > MAX_LINE {
            seen.drain(..seen.len() - want.len());
        }
        if sock.read(&mut b)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        seen.push(b[0]);
    }
    Ok(())
}

/// `MCQFS ok UID GID`: the owner the guest's files show (root when not said).
fn parse_owner(line: &str) -> (u32, u32) {
    let mut w = line.split_whitespace().skip(2).map(str::parse::<u32>);
    match (w.next(), w.next()) {
        (Some(Ok(u)), Some(Ok(g))) => (u, g),
        _ => (0, 0),
    }
}

/// Answers requests until the VM ends (None) or the guest says hello again (the bytes read).
fn serve(
    sock: &mut UnixStream,
    out: &mut UnixStream,
    server: &mut Server,
) -> Result<Option<Vec<u8>>, Failed> {
    let mut buf = vec![0u8; MAX_REQUEST];
    loop {
        match sock.read_exact(&mut buf[..4]) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(Failed::host(format!("reading a request: {e}"))),
        }
        if &buf[..4] == b"MCQF" {
            return Ok(Some(buf[..4].to_vec()));
        }
        let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if !(IN_HEADER..=MAX_REQUEST).contains(&len) {
            // Not FUSE (the stream lost its place): look for the relay's next hello.
            return Ok(Some(Vec::new()));
        }
        match sock.read_exact(&mut buf[4..len]) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(Failed::host(format!("reading a request: {e}"))),
        }
        if let Some(reply) = server.handle(&buf[..len]) {
            if let Err(e) = out.write_all(&reply) {
                return if e.kind() == io::ErrorKind::BrokenPipe {
                    Ok(None)
                } else {
                    Err(Failed::host(format!("writing a reply: {e}")))
                };
            }
        }
    }
}
