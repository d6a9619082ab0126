//! Unix-socket connect with a time bound. `UnixStream::connect` can block forever when the
//! listener's backlog is full (QEMU serves one monitor client at a time), so connect
//! non-blocking and retry in short slices until the deadline.

use std::collections::HashMap;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::FromRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Longest path a `sockaddr_un` holds (including the terminating NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// Connects to the unix socket at `path`, giving up after `timeout`. A full backlog
/// (EAGAIN) is retried; a missing socket or refused connection fails at once.
pub fn connect(path: &Path, timeout: Duration) -> io::Result<UnixStream> {
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() > MAX_SOCKET_PATH || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket path too long or contains NUL",
        ));
    }
    let deadline = Instant::now() + timeout;
    loop {
        // SAFETY: plain socket(2) call; the fd is owned by UnixStream below or closed on error.
        let fd = unsafe {
            libc::socket(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: UnixStream takes ownership of a freshly created, valid socket fd.
        let stream = unsafe { UnixStream::from_raw_fd(fd) };
        // SAFETY: sockaddr_un is plain old data; zeroed is a valid initial value.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
            *dst = *src as libc::c_char;
        }
        let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
        // SAFETY: addr is a valid sockaddr_un and len covers the path and its NUL.
        let rc = unsafe {
            libc::connect(
                fd,
                &addr as *const libc::sockaddr_un as *const libc::sockaddr,
                len,
            )
        };
        if rc == 0 {
            stream.set_nonblocking(false)?;
            return Ok(stream);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => {
                if Instant::now() >= deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the socket's backlog stayed full: another client holds it",
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            _ => return Err(err),
        }
    }
}

/// True when something is accepting connections at `path` right now.
pub fn is_listening(path: &Path) -> bool {
    match connect(path, Duration::from_millis(200)) {
        Ok(_) => true,
        Err(e) => e.kind() == io::ErrorKind::TimedOut,
    }
}

/// True when `path` is a unix socket (not a regular file or a missing path).
pub fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path)
        .map(|m| m.file_type().is_socket())
        .unwrap_or(false)
}

/// The in-process lock for sessions on one socket: QEMU's monitor and the guest-agent channel
/// each serve one client at a time, so sessions to the same path take turns.
pub fn session_lock(path: &Path) -> Arc<Mutex<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>> = OnceLock::new();
    let map = LOCKS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    map.entry(path.to_path_buf()).or_default().clone()
}

/// Why [`LineStream::read_line`] returned no line.
#[derive(Debug, PartialEq, Eq)]
pub enum LineError {
    /// The deadline passed first.
    Timeout,
    /// The peer closed the connection (or reset it).
    Closed,
    /// A line grew past the cap without a newline.
    TooLarge,
}

/// Newline-delimited messages over a unix socket, as QMP and the guest agent speak them:
/// every read is bounded by a deadline, every line by a size cap, and the buffer is scanned
/// for newlines only where new bytes arrived (a long line costs linear time, not quadratic).
pub struct LineStream {
    stream: std::os::unix::net::UnixStream,
    buf: Vec<u8>,
    scanned: usize,
    cap: usize,
}

impl LineStream {
    /// Wraps a connected stream; writes are bounded at 5 s.
    pub fn new(stream: std::os::unix::net::UnixStream, cap: usize) -> Self {
        let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
        LineStream {
            stream,
            buf: Vec::new(),
            scanned: 0,
            cap,
        }
    }

    /// Writes all of `bytes` (bounded by the write timeout).
    pub fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        use std::io::Write;
        self.stream.write_all(bytes)
    }

    /// Reads the next line before `deadline`, without its newline.
    pub fn read_line(&mut self, deadline: Instant) -> Result<Vec<u8>, LineError> {
        use std::io::Read;
        loop {
            if let Some(p) = self.buf[self.scanned..].iter().position(|b| *b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=self.scanned + p).collect();
                self.scanned = 0;
                line.pop();
                return Ok(line);
            }
            self.scanned = self.buf.len();
            if self.buf.len() > self.cap {
                return Err(LineError::TooLarge);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(LineError::Timeout);
            }
            let _ = self
                .stream
                .set_read_timeout(Some((deadline - now).max(Duration::from_millis(1))));
            let mut chunk = [0u8; 64 * 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(LineError::Closed),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(LineError::Timeout)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Err(LineError::Closed),
            }
        }
    }
}
