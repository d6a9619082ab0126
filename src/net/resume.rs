//! Resumable downloads: the fixed temporary name an interrupted download is kept under, the
//! record of what it is a part of, the lock that keeps two downloads of one file apart, and the
//! server's answer to a Range request.

use std::path::{Path, PathBuf};

use super::error::DownloadError;
use super::http::header;

/// The fixed temporary name an interrupted resumable download is kept under, and the file
/// beside it that says what it is a part of (the URL and the server's validator).
pub fn partial_for(dest: &Path) -> (PathBuf, PathBuf) {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    (
        dest.with_file_name(format!(".{name}.partial")),
        dest.with_file_name(format!(".{name}.partial.json")),
    )
}

/// Takes the lock of a resumable download to `dest` (a lock file beside it, held while the
/// returned file is open); Busy when another download holds it.
pub fn lock_part(dest: &Path) -> Result<PartLock, DownloadError> {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let path = dest.with_file_name(format!(".{name}.partial.lock"));
    let lock = crate::state::lockfile::try_lock(&path)
        .map_err(|error| DownloadError::File {
            op: "lock",
            path: path.clone(),
            error,
        })?
        .ok_or_else(|| DownloadError::Busy(dest.to_path_buf()))?;
    Ok(PartLock { _lock: lock, path })
}

/// The held lock of a resumable download; its file goes when the download ends.
pub struct PartLock {
    _lock: crate::state::lockfile::FileLock,
    path: PathBuf,
}

impl Drop for PartLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What an earlier attempt left to continue: its length and the validator to send with
/// `If-Range`, or None when there is nothing usable for this URL.
pub fn resumable(part: &Path, meta: &Path, url: &str) -> Option<(u64, Option<String>)> {
    let len = std::fs::metadata(part).ok()?.len();
    let info: serde_json::Value = serde_json::from_slice(&std::fs::read(meta).ok()?).ok()?;
    if len == 0 || info.get("url").and_then(serde_json::Value::as_str) != Some(url) {
        return None;
    }
    let validator = info
        .get("validator")
        .and_then(serde_json::Value::as_str)
        .map(str::to_string);
    Some((len, validator))
}

/// The start offset of a `Content-Range: bytes START-END/TOTAL` header.
pub fn range_start(resp: &ureq::http::Response<ureq::Body>) -> Option<u64> {
    let v = header(resp, "Content-Range")?;
    let rest = v.trim().strip_prefix("bytes")?.trim();
    rest.split('-').next()?.trim().parse().ok()
}
