//! Where the operations meet MCP, in one place: an operation's error becomes a tool error, the
//! errors of the layers below that tools meet directly do too, and the MCP call's context is
//! the [`Work`] an operation runs under.

use crate::cloudinit::ConfigError;
use crate::mcp::tool::{ToolCtx, ToolError};
use crate::net::download::DownloadError;
use crate::ops::error::OpError;
use crate::ops::work::Work;
use crate::qemu::extra_args::ArgsError;
use crate::qemu::firmware::FirmwareError;
use crate::qemu::forwards::ForwardError;
use crate::qemu::img::{ImgError, SizeError};
use crate::qemu::keys::KeyError;
use crate::qemu::process::{KillError, SpawnError};
use crate::qemu::run::RunError;
use crate::qemu::untrusted::ImageError;
use crate::state::registry::RegistryError;
use crate::state::roots::RootsError;

impl From<OpError> for ToolError {
    fn from(e: OpError) -> Self {
        ToolError(e.0)
    }
}

impl From<ToolError> for OpError {
    fn from(e: ToolError) -> Self {
        OpError(e.0)
    }
}

/// `From<E> for ToolError` for errors whose messages are already written for the agent.
macro_rules! tool_error_from {
    ($($error:ty),* $(,)?) => {$(
        impl From<$error> for ToolError {
            fn from(e: $error) -> Self {
                ToolError(e.to_string())
            }
        }
    )*};
}

tool_error_from!(
    RegistryError,
    ImgError,
    RunError,
    SizeError,
    ArgsError,
    ForwardError,
    FirmwareError,
    SpawnError,
    KillError,
    KeyError,
    DownloadError,
    RootsError,
    ImageError,
    ConfigError,
);

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
    fn log(&self, level: &str, message: &str) {
        self.log.log(level, message);
    }
}

impl<E> From<ToolError> for crate::ops::session::SessionError<E> {
    fn from(e: ToolError) -> Self {
        crate::ops::session::SessionError::Tool(OpError(e.0))
    }
}
