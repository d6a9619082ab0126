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

/// The SHA-256 of the file at `path`, as lower-case hex, read in 64 KiB pieces.
pub fn sha256_file(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(hex(ctx.finish().as_ref()));
        }
        ctx.update(&buf[..n]);
    }
}

/// A SHA-256 fed piece by piece (a stream checked as it is copied).
pub struct Sha256(ring::digest::Context);

impl Default for Sha256 {
    fn default() -> Self {
        Sha256(ring::digest::Context::new(&ring::digest::SHA256))
    }
}

impl Sha256 {
    /// Adds `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The digest as `sha256:` and lower-case hex.
    pub fn finish(self) -> String {
        format!("sha256:{}", hex(self.0.finish().as_ref()))
    }
}
