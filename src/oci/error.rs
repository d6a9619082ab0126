//! Why a container image could not be read, fetched or made a root: one error for the oci
//! layer, its kind decided where the failure is found (ops turns each kind into its own).

use std::fmt;

/// A failure with its kind; the message is written for the agent reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OciError {
    /// The reference or the image is not well formed (a bad name, an unknown media type,
    /// JSON of the wrong shape, a layout missing its files).
    Invalid(String),
    /// The tag, platform variant or repository is not there.
    NotFound(String),
    /// Refused for safety: a blob that does not match its digest, a hostile layer entry, a
    /// cap passed, access the registry denies.
    Refused(String),
    /// The host failed: its files, its tools (mke2fs, debugfs), the network.
    Host(String),
    /// The caller cancelled.
    Cancelled(String),
}

impl OciError {
    /// The message.
    pub fn msg(&self) -> &str {
        match self {
            OciError::Invalid(m)
            | OciError::NotFound(m)
            | OciError::Refused(m)
            | OciError::Host(m)
            | OciError::Cancelled(m) => m,
        }
    }
}

impl fmt::Display for OciError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.msg())
    }
}
