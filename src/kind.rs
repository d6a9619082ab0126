//! What kind of failure a call met: one enum for every layer (the operations make their
//! errors with it, a tool error carries it, `mcqemu call` exits by it), below them all so that
//! the protocol layer and the operations share it without knowing each other.

/// What kind of failure an operation met: what a caller can do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The VM, template, image, handle or file named does not exist.
    NotFound,
    /// Something else holds it right now (another call, a transfer, a monitor): retry shortly.
    Busy,
    /// Refused by policy: outside the roots, over a quota, held by a person, isolated, unsafe.
    Refused,
    /// The arguments are wrong, or do not fit together or the VM's state.
    InvalidArgument,
    /// The guest or its agent failed (a command's own failure, an agent that does not answer).
    GuestFailed,
    /// The host failed: QEMU, qemu-img, the file system, the network.
    HostFailed,
    /// A bounded wait ran out.
    TimedOut,
    /// The client cancelled the call.
    Cancelled,
}

impl ErrorKind {
    /// Every kind, in the order of their codes.
    pub const ALL: [ErrorKind; 8] = [
        ErrorKind::NotFound,
        ErrorKind::Busy,
        ErrorKind::Refused,
        ErrorKind::InvalidArgument,
        ErrorKind::GuestFailed,
        ErrorKind::HostFailed,
        ErrorKind::TimedOut,
        ErrorKind::Cancelled,
    ];

    /// The stable code a program reads (the tool error's `_meta`, `mcqemu call`'s stderr).
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::Busy => "busy",
            ErrorKind::Refused => "refused",
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::GuestFailed => "guest_failed",
            ErrorKind::HostFailed => "host_failed",
            ErrorKind::TimedOut => "timed_out",
            ErrorKind::Cancelled => "cancelled",
        }
    }

    /// The kind of a code (None for an unknown one).
    pub fn from_code(code: &str) -> Option<ErrorKind> {
        ErrorKind::ALL.into_iter().find(|k| k.code() == code)
    }

    /// `mcqemu call`'s exit status for a failure of this kind (0 is success, 2 a usage error).
    pub fn exit_code(self) -> i32 {
        match self {
            ErrorKind::NotFound => 3,
            ErrorKind::Busy => 4,
            ErrorKind::Refused => 5,
            ErrorKind::InvalidArgument => 6,
            ErrorKind::GuestFailed => 7,
            ErrorKind::HostFailed => 1,
            ErrorKind::TimedOut => 8,
            ErrorKind::Cancelled => 9,
        }
    }

    /// Whether the same call may well succeed if simply made again a little later.
    pub fn retryable(self) -> bool {
        matches!(self, ErrorKind::Busy | ErrorKind::TimedOut)
    }
}

/// A lower layer's failure that is a message and nothing more: its kind is chosen where it is
/// made, and the operations take both as they are (`ops/session.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// What happened and what to do next.
    pub msg: String,
}

impl Failed {
    /// A failure of `kind`.
    pub fn of(kind: ErrorKind, msg: impl Into<String>) -> Self {
        Failed {
            kind,
            msg: msg.into(),
        }
    }

    /// Wrong arguments, or arguments that do not fit this host.
    pub fn invalid(msg: impl Into<String>) -> Self {
        Failed::of(ErrorKind::InvalidArgument, msg)
    }

    /// Refused by policy.
    pub fn refused(msg: impl Into<String>) -> Self {
        Failed::of(ErrorKind::Refused, msg)
    }

    /// Nothing by that name.
    pub fn not_found(msg: impl Into<String>) -> Self {
        Failed::of(ErrorKind::NotFound, msg)
    }

    /// The host failed (QEMU, the file system, the network).
    pub fn host(msg: impl Into<String>) -> Self {
        Failed::of(ErrorKind::HostFailed, msg)
    }
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Failed {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_own_exit_status_and_none_is_a_usage_error() {
        let codes: Vec<i32> = ErrorKind::ALL.iter().map(|k| k.exit_code()).collect();
        let mut unique = codes.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), codes.len(), "{codes:?}");
        assert!(!codes.contains(&0) && !codes.contains(&2), "{codes:?}");
    }
}
