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

/// What written on `stream` the peer has not read yet (`SIOCOUTQ`: 0 once it has read all;
/// otherwise the kernel's buffer size for it, more than the bytes). QEMU drops what a
/// chardev client sent but the guest did not take when the client hangs up, so a writer that
/// is about to close asks this first.
pub fn unread_by_peer(stream: &UnixStream) -> io::Result<usize> {
    use std::os::unix::io::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ writes one int through the pointer, which outlives the call.
    let rc = unsafe { libc::ioctl(stream.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Waits until the peer has read everything written on `stream`, or until `deadline`.
/// `Err(n)` carries [`unread_by_peer`] then.
pub fn wait_read_by_peer(stream: &UnixStream, deadline: Instant) -> Result<(), usize> {
    loop {
        let left = match unread_by_peer(stream) {
            Ok(n) => n,
            // A socket that cannot say has nothing we can wait for.
            Err(_) => return Ok(()),
        };
        if left == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(left);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
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

    /// Writes `bytes` with the file descriptor `fd` attached (SCM_RIGHTS), as QMP's `getfd`
    /// wants it: the descriptor travels with the first byte; the rest follows as usual.
    pub fn write_with_fd(&mut self, bytes: &[u8], fd: std::os::unix::io::RawFd) -> io::Result<()> {
        use std::os::unix::io::AsRawFd;
        if bytes.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "nothing to send the fd with",
            ));
        }
        let mut iov = libc::iovec {
            iov_base: bytes.as_ptr() as *mut libc::c_void,
            iov_len: 1,
        };
        // SAFETY: CMSG_SPACE only computes a size from its argument.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
        let mut control = vec![0u8; space];
        // SAFETY: msghdr is plain old data; zeroed is a valid initial value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space as _;
        // SAFETY: msg_control points at `space` bytes, enough for one cmsg with one int, so
        // CMSG_FIRSTHDR is non-null and CMSG_DATA stays inside `control`.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut libc::c_int, fd);
        }
        // SAFETY: a valid socket fd and a msghdr whose buffers live until the call returns.
        let sent = unsafe { libc::sendmsg(self.stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if sent != 1 {
            return Err(if sent < 0 {
                io::Error::last_os_error()
            } else {
                io::Error::new(io::ErrorKind::WriteZero, "sendmsg sent nothing")
            });
        }
        self.write_all(&bytes[1..])
    }

    /// Reads the next line before `deadline`, without its newline.
    pub fn read_line(&mut self, deadline: Instant) -> Result<Vec<u8>, LineError> {
        use std::io::Read;
        loop {
            if let Some(p) = self.buf[self.scanned..].iter().position(|b| *b == b'\n') {
                if self.scanned + p > self.cap {
                    return Err(LineError::TooLarge);
                }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_writer_learns_when_the_peer_has_read_everything() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(&[7u8; 1000]).unwrap();
        assert!(unread_by_peer(&a).unwrap() > 0);
        let reader = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let mut buf = [0u8; 1000];
            b.read_exact(&mut buf).unwrap();
            b
        });
        let waited = wait_read_by_peer(&a, Instant::now() + Duration::from_secs(10));
        assert_eq!(waited, Ok(()));
        assert_eq!(unread_by_peer(&a).unwrap(), 0);
        drop(reader.join().unwrap());
    }

    #[test]
    fn a_peer_that_never_reads_is_reported_with_what_it_left() {
        let (mut a, _b) = UnixStream::pair().unwrap();
        a.write_all(b"echo hi\r").unwrap();
        let waited = wait_read_by_peer(&a, Instant::now() + Duration::from_millis(30));
        assert!(matches!(waited, Err(n) if n > 0), "{waited:?}");
    }
}
