//! A VM's serial console log: its last lines (vm_serial_read, the serial resource) and a wait
//! for a pattern in what it writes next (vm_serial_wait). Every read is bounded by [`WINDOW`].

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::ops::error::OpError;
use crate::ops::vm::records::lookup;
use crate::ops::work::Work;
use crate::state::record::text;
use crate::state::registry::Record;
use crate::state::tail;

/// The most of the log ever read by one call.
pub const WINDOW: u64 = 256 * 1024;

/// The VM's serial log file; attached VMs have none.
pub fn log_path(name: &str, rec: &Record) -> Result<PathBuf, OpError> {
    text(&rec.serial_log).map(PathBuf::from).ok_or_else(|| {
        OpError::invalid(format!(
            "VM {name:?} has no serial log (VMs adopted with attach_vm have none); use \
                 vm_screenshot instead"
        ))
    })
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

fn clean(line: &str) -> String {
    line.trim_end_matches('\r').to_string()
}

crate::described! {
    /// The last lines of a VM's serial log (vm_serial_read's result, in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct Tail {
        /// The VM.
        pub name: String,
        /// The lines joined by newlines.
        pub text: String,
        /// The lines.
        pub lines: Vec<String>,
        /// The log's size when read.
        pub log_size: u64,
        /// Where a vm_serial_wait for what comes next starts.
        pub offset: u64,
    }
}

/// A token that changes whenever VM `name`'s serial log grows or is replaced (for the serial
/// resource's subscribers); None for no such VM or no log.
pub fn log_version(name: &str) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let rec = crate::state::registry::shared().load().remove(name)?;
    let path = log_path(name, &rec).ok()?;
    let m = std::fs::metadata(path).ok()?;
    Some(format!("{}:{}:{}", m.ino(), m.len(), m.mtime_nsec()))
}

/// The last `want` lines (at least 1) of VM `name`'s serial log, within [`WINDOW`].
pub fn read_tail(name: &str, want: i64) -> Result<Tail, OpError> {
    if want < 1 {
        return Err(OpError::invalid("tail_lines must be at least 1"));
    }
    let rec = lookup(name)?;
    let path = log_path(name, &rec)?;
    let read = tail::read_last(&path, WINDOW)
        .map_err(|e| OpError::host(format!("cannot read {}: {e}", path.display())))?;
    let size = read.size;
    let lines = read.last_lines(usize::try_from(want).unwrap_or(usize::MAX));
    Ok(Tail {
        name: name.to_string(),
        text: lines.join("\n"),
        lines,
        log_size: size,
        offset: size,
    })
}

/// The last [`WINDOW`] bytes of the log at `path` as text, starting at a line when the log is
/// longer (the serial resource). A log not written yet reads as empty text.
pub fn tail_text(path: &Path) -> std::io::Result<String> {
    match tail::read_last(path, WINDOW) {
        Ok(t) => Ok(t.from_line().text()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(e),
    }
}

/// Finds `pattern` in `buf`; returns the whole line around it and the index just past that line.
pub fn find_line(buf: &[u8], pattern: &[u8]) -> Option<(String, usize)> {
    let pos = buf.windows(pattern.len()).position(|w| w == pattern)?;
    let start = buf[..pos]
        .iter()
        .rposition(|b| *b == b'\n')
        .map(|i| i + 1)
        .unwrap_or(0);
    let end = buf[pos..]
        .iter()
        .position(|b| *b == b'\n')
        .map(|i| pos + i + 1)
        .unwrap_or(buf.len());
    Some((
        clean(String::from_utf8_lossy(&buf[start..end]).trim_end_matches('\n')),
        end,
    ))
}

/// vm_serial_wait's request: a plain substring, from `offset` (default: the log's end now),
/// within `timeout`.
#[derive(Debug, Clone)]
pub struct WaitRequest {
    /// The VM.
    pub name: String,
    /// The bytes to find.
    pub pattern: Vec<u8>,
    /// Where to start looking (a previous result's offset).
    pub offset: Option<u64>,
    /// How long to wait.
    pub timeout: Duration,
}

crate::described! {
    /// Where the pattern appeared (vm_serial_wait's result, in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct Found {
        /// The VM.
        pub name: String,
        /// The whole line holding the pattern.
        pub line: String,
        /// Just past that line: where the next wait starts.
        pub offset: u64,
        /// How long the wait took.
        pub elapsed_ms: u64,
    }
}

/// Polls the log every 50 ms until the pattern appears, the timeout passes (an error quoting
/// the last output) or the call is cancelled.
pub fn wait(work: &dyn Work, req: &WaitRequest) -> Result<Found, OpError> {
    let (name, pattern, timeout) = (&req.name, &req.pattern, req.timeout);
    let rec = lookup(name)?;
    let path = log_path(name, &rec)?;
    let started = Instant::now();
    let deadline = started + timeout;
    let mut from = req.offset.unwrap_or_else(|| file_len(&path));
    let keep = pattern.len() as u64 + 4096;
    loop {
        let size = file_len(&path);
        if size < from {
            from = 0; // the log was truncated or replaced
        }
        if size > from {
            let read = tail::read_span(&path, from, Some(size), WINDOW)
                .map_err(|e| OpError::host(format!("cannot read {}: {e}", path.display())))?;
            if let Some((line, end)) = find_line(&read.data, pattern) {
                return Ok(Found {
                    name: name.clone(),
                    line,
                    offset: read.start + end as u64,
                    elapsed_ms: started.elapsed().as_millis() as u64,
                });
            }
            // Keep a tail so a pattern split across two reads is still found.
            from = size.saturating_sub(keep).max(from);
        }
        work.check_cancel()?;
        let now = Instant::now();
        if now >= deadline {
            let tail = tail::read_span(&path, 0, Some(size), 300)
                .map(|t| t.data)
                .unwrap_or_default();
            return Err(OpError::timed_out(format!(
                "{:?} did not appear on the serial console of {name:?} within {} s; the last \
                 output was: {:?}",
                String::from_utf8_lossy(pattern),
                timeout.as_secs_f64(),
                String::from_utf8_lossy(&tail)
            )));
        }
        work.progress(
            started.elapsed().as_secs_f64(),
            Some(timeout.as_secs_f64()),
            "waiting for serial output",
        );
        std::thread::sleep(Duration::from_millis(50).min(deadline - now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_whole_line() {
        let buf = b"first\r\nsecond has MARK here\r\nthird";
        let (line, end) = find_line(buf, b"MARK").unwrap();
        assert_eq!(line, "second has MARK here");
        assert_eq!(&buf[end..], b"third");
        assert!(find_line(buf, b"nope").is_none());
    }

    #[test]
    fn the_serial_tail_is_bounded_and_starts_at_a_line() {
        let dir = std::env::temp_dir().join(format!("mcq-serial-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("serial.log");
        assert_eq!(tail_text(&log).unwrap(), "", "a log not written yet");
        std::fs::write(&log, "boot\nlogin: ").unwrap();
        assert_eq!(tail_text(&log).unwrap(), "boot\nlogin: ");
        let mut big = Vec::new();
        for i in 0..40_000 {
            big.extend_from_slice(format!("line {i}\n").as_bytes());
        }
        std::fs::write(&log, &big).unwrap();
        let tail = tail_text(&log).unwrap();
        assert!(tail.len() as u64 <= WINDOW);
        assert!(tail.starts_with("line "), "{}", &tail[..20]);
        assert!(tail.ends_with("line 39999\n"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
