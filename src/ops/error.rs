//! The operations' one error type: a message written for the agent (what happened, what to do
//! next). The tools layer turns it into an MCP tool error once, at its boundary.

/// An operation's failure, its message already for the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpError(pub String);

impl OpError {
    /// Builds an error from any message.
    pub fn new(msg: impl Into<String>) -> Self {
        OpError(msg.into())
    }
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OpError {}

impl From<String> for OpError {
    fn from(s: String) -> Self {
        OpError(s)
    }
}

impl From<&str> for OpError {
    fn from(s: &str) -> Self {
        OpError(s.to_string())
    }
}
