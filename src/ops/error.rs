//! The operations' one error type: a kind a program can act on (retry, fix the arguments, give
//! up) and a message written for the agent (what happened, what to do next). The layers below
//! convert into it once (`session.rs`); the tools layer turns it into an MCP tool error once, at
//! its boundary, with the kind's code beside the message.

pub use crate::kind::ErrorKind;

/// An operation's failure: its kind, and its message already for the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpError {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// What happened and what to do next.
    pub msg: String,
}

impl OpError {
    /// A failure of `kind`.
    pub fn of(kind: ErrorKind, msg: impl Into<String>) -> Self {
        OpError {
            kind,
            msg: msg.into(),
        }
    }

    /// A failure of the host's side: QEMU, qemu-img, the file system, the network.
    pub fn host(msg: impl Into<String>) -> Self {
        OpError::of(ErrorKind::HostFailed, msg)
    }

    /// Nothing by that name.
    pub fn not_found(msg: impl Into<String>) -> Self {
        OpError::of(ErrorKind::NotFound, msg)
    }

    /// Held by something else right now; retry shortly.
    pub fn busy(msg: impl Into<String>) -> Self {
        OpError::of(ErrorKind::Busy, msg)
    }

    /// Refused by policy.
    pub fn refused(msg: impl Into<String>) -> Self {
        OpError::of(ErrorKind::Refused, msg)
    }

    /// Wrong arguments.
    pub fn invalid(msg: impl Into<String>) -> Self {
        OpError::of(ErrorKind::InvalidArgument, msg)
    }

    /// The guest or its agent failed.
    pub fn guest(msg: impl Into<String>) -> Self {
        OpError::of(ErrorKind::GuestFailed, msg)
    }

    /// A bounded wait ran out.
    pub fn timed_out(msg: impl Into<String>) -> Self {
        OpError::of(ErrorKind::TimedOut, msg)
    }

    /// The client cancelled.
    pub fn cancelled(msg: impl Into<String>) -> Self {
        OpError::of(ErrorKind::Cancelled, msg)
    }

    /// The same failure with its message prefixed (`what: message`), its kind kept.
    pub fn context(self, what: impl std::fmt::Display) -> Self {
        OpError::of(self.kind, format!("{what}: {}", self.msg))
    }
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for OpError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_stable_distinct_and_read_back() {
        let codes: Vec<&str> = ErrorKind::ALL.iter().map(|k| k.code()).collect();
        assert_eq!(
            codes,
            [
                "not_found",
                "busy",
                "refused",
                "invalid_argument",
                "guest_failed",
                "host_failed",
                "timed_out",
                "cancelled"
            ]
        );
        for k in ErrorKind::ALL {
            assert_eq!(ErrorKind::from_code(k.code()), Some(k));
        }
        assert_eq!(ErrorKind::from_code("nope"), None);
        assert!(ErrorKind::Busy.retryable() && !ErrorKind::Refused.retryable());
    }

    #[test]
    fn context_keeps_the_kind() {
        let e = OpError::busy("held").context("vm_pause");
        assert_eq!(
            (e.kind, e.msg.as_str()),
            (ErrorKind::Busy, "vm_pause: held")
        );
    }
}
