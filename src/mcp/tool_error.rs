//! The error a tool answers with: below the tool framework, so that everything taking tool
//! arguments ([`super::args`]) and the framework itself ([`super::tool`]) share it.

/// Where a tool error's kind goes in the result: `_meta[ERROR_META].kind`.
pub const ERROR_META: &str = "mcqemu/error";

/// The kind of an argument that the tool layer refused (its own checks and the schema's).
pub const INVALID_ARGUMENT: &str = "invalid_argument";

/// A tool failure: becomes a result with `isError: true`. The message says what happened and
/// what the agent can do next; the kind (a stable code, `ops::error::ErrorKind`'s) says it to
/// a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    /// What happened and what to do next.
    pub msg: String,
    /// The stable code of its kind.
    pub kind: &'static str,
}

impl ToolError {
    /// An argument the tool refused.
    pub fn new(msg: impl Into<String>) -> Self {
        ToolError::of(INVALID_ARGUMENT, msg)
    }

    /// A failure of the kind whose code is `kind`.
    pub fn of(kind: &'static str, msg: impl Into<String>) -> Self {
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

impl From<String> for ToolError {
    fn from(s: String) -> Self {
        ToolError::new(s)
    }
}
