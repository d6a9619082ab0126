//! What an operation gets from whoever runs it besides its request: cancellation, progress and
//! a log. The MCP layer's call context implements it (in `tools/`); a detached run (the CLI, a
//! pool's refill thread) uses [`Detached`].

use super::error::OpError;

/// The running call, seen from an operation.
pub trait Work: Sync {
    /// True once the caller cancelled (or the server is shutting down).
    fn cancelled(&self) -> bool;
    /// True when the caller listens to progress: worth reading a running program's output for.
    fn has_progress(&self) -> bool;
    /// Reports progress (rate-limited by the caller; a no-op when nobody listens).
    fn progress(&self, done: f64, total: Option<f64>, message: &str);
    /// Reports the next phase of a long call (one step past the last progress value).
    fn progress_phase(&self, message: &str);
    /// Reports output the caller asked to follow as it comes: like [`Work::progress`], but
    /// the first goes out at once.
    fn progress_output(&self, done: f64, total: Option<f64>, message: &str) {
        self.progress(done, total, message);
    }
    /// Logs a line for the caller (and stderr).
    fn log(&self, level: &str, message: &str);

    /// Fails with a clear error once cancelled; call between slices of a long wait.
    fn check_cancel(&self) -> Result<(), OpError> {
        if self.cancelled() {
            Err(OpError::cancelled("cancelled by the client"))
        } else {
            Ok(())
        }
    }
}

/// A run nobody watches: never cancelled, progress to nowhere, logs to stderr.
pub struct Detached;

impl Work for Detached {
    fn cancelled(&self) -> bool {
        false
    }
    fn has_progress(&self) -> bool {
        false
    }
    fn progress(&self, _done: f64, _total: Option<f64>, _message: &str) {}
    fn progress_phase(&self, _message: &str) {}
    fn log(&self, level: &str, message: &str) {
        crate::log::stderr(level, message);
    }
}
