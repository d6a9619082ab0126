//! The error a tool answers with: below the tool framework, so that everything taking tool
//! arguments ([`super::args`]) and the framework itself ([`super::tool`]) share it.

/// Where a tool error's kind goes in the result: `_meta[ERROR_META].kind`.
pub const ERROR_META: &str = "mcqemu/error";

pub use crate::kind::ErrorKind;

/// A tool failure: becomes a result with `isError: true`. The message says what happened and
/// what the agent can do next; the kind (its stable code in `_meta`) says it to a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    /// What happened and what to do next.
    pub msg: String,
    /// Its kind.
    pub kind: ErrorKind,
}

impl ToolError {
    /// An argument the tool refused (its own checks and the schema's).
    pub fn new(msg: impl Into<String>) -> Self {
        ToolError::of(ErrorKind::InvalidArgument, msg)
    }

    /// A failure of `kind`.
    pub fn of(kind: ErrorKind, msg: impl Into<String>) -> Self {
        ToolError {
            msg: msg.into(),
            kind,
        }
    }

    /// The same failure with `what: ` before its message.
    pub fn context(self, what: &str) -> Self {
        ToolError::of(self.kind, format!("{what}: {}", self.msg))
    }
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

/// A bare message from the tool layer's argument helpers is a refused argument.
impl From<String> for ToolError {
    fn from(s: String) -> Self {
        ToolError::new(s)
    }
}
