//! Logging to stderr only: stdout carries the protocol and nothing else.

use std::io::Write;

/// Writes one line to stderr, prefixed so it is easy to tell apart from QEMU's own output.
pub fn stderr(level: &str, msg: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "mcqemu [{level}] {msg}");
}
