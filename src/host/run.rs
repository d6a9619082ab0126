//! Runs an external program with a time bound, capped output and cancellation.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Most stdout bytes kept from one run (qemu-img JSON of a long backing chain fits easily).
pub const STDOUT_CAP: usize = 8 * 1024 * 1024;
/// Most stderr bytes kept from one run; error text beyond this is not useful.
pub const STDERR_CAP: usize = 64 * 1024;

/// What a finished run produced.
#[derive(Debug)]
pub struct RunOutput {
    /// Exit status.
    pub status: ExitStatus,
    /// Captured stdout (capped).
    pub stdout: Vec<u8>,
    /// Captured stderr (capped).
    pub stderr: Vec<u8>,
}

/// Why a run did not produce output.
#[derive(Debug)]
pub enum RunError {
    /// The program is not installed (not on PATH).
    NotFound(String),
    /// It could not be started for another reason.
    Spawn(String, std::io::Error),
    /// It ran past its bound and was killed.
    Timeout(String, Duration),
    /// The request was cancelled and the program killed.
    Cancelled(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::NotFound(p) => write!(
                f,
                "{p} is not installed or not on PATH; install it (Debian: apt-get install \
                 qemu-utils / qemu-system-x86)"
            ),
            RunError::Spawn(p, e) => write!(f, "could not start {p}: {e}"),
            RunError::Timeout(p, d) => write!(
                f,
                "{p} did not finish within {} s and was killed; retry, or check the host for I/O \
                 trouble",
                d.as_secs()
            ),
            RunError::Cancelled(p) => write!(f, "{p} was cancelled by the client and killed"),
        }
    }
}

impl std::error::Error for RunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::Spawn(_, e) => Some(e),
            _ => None,
        }
    }
}

fn reader<R: Read + Send + 'static>(mut r: R, cap: usize) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        loop {
            match r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let room = cap.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        kept
    })
}

/// Runs `cmd` to completion within `timeout`, checking `cancelled` every 50 ms. A waiter
/// thread blocks in wait(2), so completion is noticed at once rather than at the next poll.
pub fn run(
    cmd: &mut Command,
    timeout: Duration,
    cancelled: &dyn Fn() -> bool,
) -> Result<RunOutput, RunError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child: Child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                RunError::NotFound(program.clone())
            } else {
                RunError::Spawn(program.clone(), e)
            }
        })?;
    let out = child.stdout.take().map(|s| reader(s, STDOUT_CAP));
    let err = child.stderr.take().map(|s| reader(s, STDERR_CAP));
    let pid = child.id() as i32;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let deadline = Instant::now() + timeout;
    let kill = |rx: &mpsc::Receiver<std::io::Result<ExitStatus>>| {
        // SAFETY: kill(2) on our own child's PID, which the waiter has not reaped yet
        // (it reaps only after the process exits, and then the send below completes).
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let _ = rx.recv_timeout(Duration::from_secs(5));
    };
    let status = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.min(Duration::from_millis(50))) {
            Ok(Ok(status)) => break status,
            Ok(Err(e)) => return Err(RunError::Spawn(program, e)),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(RunError::Spawn(
                    program,
                    std::io::Error::other("waiter thread ended"),
                ))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if Instant::now() >= deadline {
            kill(&rx);
            return Err(RunError::Timeout(program, timeout));
        }
        if cancelled() {
            kill(&rx);
            return Err(RunError::Cancelled(program));
        }
    };
    let stdout = out.and_then(|h| h.join().ok()).unwrap_or_default();
    let stderr = err.and_then(|h| h.join().ok()).unwrap_or_default();
    Ok(RunOutput {
        status,
        stdout,
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_output_and_status() {
        let out = run(
            Command::new("sh").args(["-c", "echo hi; echo oops >&2; exit 3"]),
            Duration::from_secs(5),
            &|| false,
        )
        .unwrap();
        assert_eq!(out.stdout, b"hi\n");
        assert_eq!(out.stderr, b"oops\n");
        assert_eq!(out.status.code(), Some(3));
    }

    #[test]
    fn times_out_and_reports_missing_programs() {
        let e = run(
            Command::new("sleep").arg("5"),
            Duration::from_millis(100),
            &|| false,
        )
        .unwrap_err();
        assert!(matches!(e, RunError::Timeout(..)));
        let e = run(
            &mut Command::new("/nonexistent/prog"),
            Duration::from_secs(1),
            &|| false,
        )
        .unwrap_err();
        assert!(matches!(e, RunError::NotFound(_)));
    }
}
