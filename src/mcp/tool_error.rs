//! The error a tool answers with: below the tool framework, so that everything taking tool
//! arguments ([`super::args`]) and the framework itself ([`super::tool`]) share it.

/// A tool failure: becomes a result with `isError: true`. The message says what happened and
/// what the agent can do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError(pub String);

impl ToolError {
    /// Builds an error from any message.
    pub fn new(msg: impl Into<String>) -> Self {
        ToolError(msg.into())
    }
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for ToolError {
    fn from(s: String) -> Self {
        ToolError(s)
    }
}
