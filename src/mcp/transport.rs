//! Lines in, lines out: newline-delimited JSON over stdio with a size cap on input and one
//! writer lock on output so messages never interleave.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use serde_json::Value;

/// Largest accepted input line. Big enough for an 8 MiB file written through the guest agent
/// in base64, small enough that a runaway client cannot exhaust memory.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// One line read from the client.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A complete line, without its newline.
    Data(Vec<u8>),
    /// A line longer than the cap; its bytes were consumed and dropped.
    TooLong(usize),
    /// End of input.
    Eof,
}

/// Reads newline-delimited lines, never holding more than `cap` bytes of one line in memory.
pub struct LineReader<R> {
    inner: R,
    cap: usize,
}

impl<R: BufRead> LineReader<R> {
    /// Wraps a buffered reader with the given per-line cap.
    pub fn new(inner: R, cap: usize) -> Self {
        LineReader { inner, cap }
    }

    /// Reads the next line. An I/O error is reported as end of input: stdin is gone either way.
    pub fn next_line(&mut self) -> Line {
        let mut buf = Vec::new();
        let mut total = 0usize;
        loop {
            let chunk = match self.inner.fill_buf() {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return Line::Eof,
            };
            if chunk.is_empty() {
                if total == 0 {
                    return Line::Eof;
                }
                return self.finish(buf, total);
            }
            let (take, done) = match chunk.iter().position(|b| *b == b'\n') {
                Some(i) => (i, true),
                None => (chunk.len(), false),
            };
            if total + take <= self.cap {
                buf.extend_from_slice(&chunk[..take]);
            } else {
                buf = Vec::new();
            }
            total += take;
            self.inner.consume(if done { take + 1 } else { take });
            if done {
                return self.finish(buf, total);
            }
        }
    }

    fn finish(&self, mut buf: Vec<u8>, total: usize) -> Line {
        if total > self.cap {
            return Line::TooLong(total);
        }
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
        Line::Data(buf)
    }
}

/// The single writer: every message goes out as one whole line under one lock. Once the peer
/// has closed its end, writes are dropped quietly instead of panicking the process.
pub struct Output {
    sink: Mutex<Box<dyn Write + Send>>,
    closed: AtomicBool,
}

impl Output {
    /// Wraps a sink (stdout in the server, a buffer in tests).
    pub fn new(sink: Box<dyn Write + Send>) -> Self {
        Output {
            sink: Mutex::new(sink),
            closed: AtomicBool::new(false),
        }
    }

    /// Sends one JSON message as one line. Returns false when the peer is gone.
    pub fn send(&self, msg: &Value) -> bool {
        match serde_json::to_vec(msg) {
            Ok(line) => self.send_line(line),
            Err(_) => true,
        }
    }

    /// Sends one already serialized JSON message (without its newline) as one line.
    pub fn send_line(&self, mut line: Vec<u8>) -> bool {
        if self.closed.load(Ordering::Relaxed) {
            return false;
        }
        line.push(b'\n');
        let mut sink = match self.sink.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        if sink.write_all(&line).and_then(|_| sink.flush()).is_err() {
            self.closed.store(true, Ordering::Relaxed);
            crate::log::stderr("warn", "stdout is closed; dropping further output");
            return false;
        }
        true
    }

    /// True once a write has failed because the peer closed stdout.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], cap: usize) -> Vec<Line> {
        let mut r = LineReader::new(std::io::BufReader::with_capacity(4, input), cap);
        let mut out = Vec::new();
        loop {
            let l = r.next_line();
            if l == Line::Eof {
                return out;
            }
            out.push(l);
        }
    }

    #[test]
    fn splits_lines_and_strips_cr() {
        let got = lines(b"ab\r\ncd\nlast", 100);
        assert_eq!(
            got,
            vec![
                Line::Data(b"ab".to_vec()),
                Line::Data(b"cd".to_vec()),
                Line::Data(b"last".to_vec())
            ]
        );
    }

    #[test]
    fn oversize_line_is_dropped_and_next_line_survives() {
        let got = lines(b"0123456789abc\nok\n", 5);
        assert_eq!(got, vec![Line::TooLong(13), Line::Data(b"ok".to_vec())]);
    }

    #[test]
    fn empty_line_is_data() {
        assert_eq!(lines(b"\n", 5), vec![Line::Data(vec![])]);
    }
}
