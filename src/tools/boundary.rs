//! Where the operations meet MCP, in one place: an operation's error becomes a tool error, and
//! the MCP call's context is the [`Work`] an operation runs under. Tools meet no error of the
//! layers below: the operations convert those (`ops/session.rs`).

use crate::mcp::tool::{ToolCtx, ToolError};
use crate::ops::error::OpError;
use crate::ops::work::Work;

impl From<OpError> for ToolError {
    fn from(e: OpError) -> Self {
        ToolError::of(e.kind, e.msg)
    }
}

impl Work for ToolCtx {
    fn cancelled(&self) -> bool {
        ToolCtx::cancelled(self)
    }
    fn has_progress(&self) -> bool {
        ToolCtx::has_progress(self)
    }
    fn progress(&self, done: f64, total: Option<f64>, message: &str) {
        ToolCtx::progress(self, done, total, message);
    }
    fn progress_phase(&self, message: &str) {
        ToolCtx::progress_phase(self, message);
    }
    fn progress_output(&self, done: f64, total: Option<f64>, message: &str) {
        ToolCtx::progress_output(self, done, total, message);
    }
    fn log(&self, level: &str, message: &str) {
        self.log.log(level, message);
    }
}
