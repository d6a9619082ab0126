//! Why a download was refused or failed, in words for the agent.

use std::path::PathBuf;

use super::digest::Algo;

/// Why a download was refused or failed. Every failure after the checks has already removed
/// the temporary file.
#[derive(Debug)]
pub enum DownloadError {
    /// A URL whose scheme is not http or https.
    Scheme(String),
    /// A URL with nothing after `//`.
    NoHost,
    /// A sha256 parameter that is not 64 hex digits.
    BadSha256,
    /// The target exists and overwrite was not asked for.
    Exists(PathBuf),
    /// The target's folder does not exist.
    NoFolder(PathBuf),
    /// The request failed (DNS, TLS, connection...); says how, for the URL.
    Request(String),
    /// The server answered with an HTTP error status.
    Status {
        /// The status.
        code: u16,
        /// The URL that answered.
        url: String,
    },
    /// A redirect without a Location header.
    NoLocation {
        /// The HTTP status.
        status: u16,
        /// The URL that answered.
        url: String,
    },
    /// More than the redirects followed for one download.
    TooManyRedirects(String),
    /// A redirect to a URL that [`check_url`] refuses.
    RedirectRefused {
        /// The URL that redirected.
        from: String,
        /// Where it pointed.
        to: String,
        /// Why that is refused.
        why: Box<DownloadError>,
    },
    /// The announced size is over `max_bytes`.
    TooBig {
        /// Content-Length.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// The reader thread could not be started.
    Thread(std::io::Error),
    /// The temporary file could not be created, written or flushed.
    File {
        /// "create", "write" or "flush".
        op: &'static str,
        /// The temporary file.
        path: PathBuf,
        /// What went wrong.
        error: std::io::Error,
    },
    /// The client cancelled.
    Cancelled,
    /// Reading the body failed.
    Connection {
        /// Bytes received before.
        done: u64,
        /// The read error.
        error: std::io::Error,
    },
    /// The reader ended without a result.
    Stopped(u64),
    /// The body passed `max_bytes`.
    PassedMax(u64),
    /// The body ended before its Content-Length.
    Short {
        /// Bytes received.
        done: u64,
        /// Content-Length.
        total: u64,
    },
    /// The digest of the body is not the one expected.
    Checksum {
        /// The algorithm.
        algo: Algo,
        /// Expected.
        want: String,
        /// Received.
        got: String,
    },
    /// A resumable download was interrupted; its part is kept for the next attempt.
    Kept {
        /// What interrupted it.
        error: Box<DownloadError>,
        /// Where the part is.
        part: PathBuf,
    },
    /// Another resumable download to the same file is running.
    Busy(PathBuf),
    /// The finished file could not be moved into place.
    Place {
        /// The target.
        dest: PathBuf,
        /// Why.
        error: std::io::Error,
    },
}

impl std::fmt::Display for DownloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DownloadError::Thread(e) => {
                write!(f, "could not start the download ({e}); retry shortly")
            }
            DownloadError::File { op, path, error } => {
                write!(f, "cannot {op} {}: {error}", path.display())
            }
            DownloadError::Cancelled => {
                f.write_str("cancelled by the client; the partial file was removed")
            }
            DownloadError::Connection { done, error } => write!(
                f,
                "the connection failed after {done} bytes: {error}; retry the download"
            ),
            DownloadError::Stopped(done) => write!(
                f,
                "the download stopped after {done} bytes; retry the download"
            ),
            DownloadError::PassedMax(max) => write!(
                f,
                "the download passed max_bytes={max}; the partial file was removed"
            ),
            DownloadError::Short { done, total } => write!(
                f,
                "the connection closed after {done} of {total} bytes; retry the download"
            ),
            DownloadError::Checksum { algo, want, got } => write!(
                f,
                "checksum mismatch: expected {} {want}, got {got}; the file was discarded. \
                 Check the URL and the checksum",
                algo.name()
            ),
            DownloadError::Kept { error, part } => write!(
                f,
                "{}; the {} bytes received so far are kept in {}: pull again to continue",
                error.to_string().trim_end_matches("; retry the download"),
                std::fs::metadata(part).map(|m| m.len()).unwrap_or(0),
                part.display()
            ),
            DownloadError::Busy(dest) => write!(
                f,
                "another pull to {} is running; wait for it to finish",
                dest.display()
            ),
            DownloadError::Place { dest, error } => write!(
                f,
                "could not move the download into {}: {error}",
                dest.display()
            ),
            _ => self.fmt_request(f),
        }
    }
}

impl DownloadError {
    /// The errors found before any byte is written: the request, the target, the server's
    /// answer.
    fn fmt_request(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DownloadError::Scheme(scheme) => write!(
                f,
                "only http and https URLs can be downloaded, not {scheme:?}; for a local file use \
                 image_convert"
            ),
            DownloadError::NoHost => f.write_str("the URL has no host"),
            DownloadError::BadSha256 => f.write_str("sha256 must be 64 hexadecimal characters"),
            DownloadError::Exists(dest) => write!(
                f,
                "{} already exists; pass overwrite=true to replace it, or choose another path",
                dest.display()
            ),
            DownloadError::NoFolder(dest) => write!(
                f,
                "the folder of {} does not exist; create it first",
                dest.display()
            ),
            DownloadError::Request(msg) => f.write_str(msg),
            DownloadError::Status { code, url } => {
                write!(
                    f,
                    "the server answered HTTP {code} for {url}; check the URL"
                )
            }
            DownloadError::NoLocation { status, url } => write!(
                f,
                "the server answered HTTP {status} for {url} without a Location to follow"
            ),
            DownloadError::TooManyRedirects(url) => write!(f, "too many redirects from {url}"),
            DownloadError::RedirectRefused { from, to, why } => {
                write!(f, "{from} redirects to {to:?}, which is refused: {why}")
            }
            DownloadError::TooBig { size, max } => write!(
                f,
                "the server says the file is {size} bytes, over max_bytes={max}; raise max_bytes \
                 to accept it"
            ),
            // The transfer's own errors are written by `fmt`.
            other => write!(f, "{other:?}"),
        }
    }
}

impl std::error::Error for DownloadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DownloadError::RedirectRefused { why, .. } => Some(why.as_ref()),
            DownloadError::Thread(error)
            | DownloadError::File { error, .. }
            | DownloadError::Connection { error, .. }
            | DownloadError::Place { error, .. } => Some(error),
            _ => None,
        }
    }
}
