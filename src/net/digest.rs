//! The digests a download is checked with: which algorithm a published hex digest is in, and
//! the digest as hex.

/// A hash algorithm a download is checked with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algo {
    /// SHA-256 (64 hex digits).
    Sha256,
    /// SHA-512 (128 hex digits).
    Sha512,
}

impl Algo {
    /// The algorithm whose hex digest has `len` digits.
    pub fn from_hex_len(len: usize) -> Option<Algo> {
        match len {
            64 => Some(Algo::Sha256),
            128 => Some(Algo::Sha512),
            _ => None,
        }
    }

    /// Its usual name.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Sha256 => "sha256",
            Algo::Sha512 => "sha512",
        }
    }

    pub(super) fn ring(self) -> &'static ring::digest::Algorithm {
        match self {
            Algo::Sha256 => &ring::digest::SHA256,
            Algo::Sha512 => &ring::digest::SHA512,
        }
    }
}

/// Bytes as lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
