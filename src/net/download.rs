//! Streams a URL to a temporary file beside the target, hashing as it goes, and renames it into
//! place only when it is complete and correct: a failure never leaves a file at the target.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use super::digest::hex;
pub use super::digest::Algo;
pub use super::error::DownloadError;
pub use super::http::{check_url, fetch_small};
use super::http::{get, header, request_error};
use super::resume::{lock_part, partial_for, range_start, resumable};

/// What the caller asked for.
pub struct Request<'a> {
    /// http:// or https:// URL.
    pub url: &'a str,
    /// Final path.
    pub dest: &'a Path,
    /// The digest computed over the body.
    pub algo: Algo,
    /// Expected digest (in `algo`) as lower-case hex.
    pub expect: Option<String>,
    /// Replace an existing file at `dest`.
    pub overwrite: bool,
    /// Refuse bodies larger than this.
    pub max_bytes: Option<u64>,
    /// Keep an interrupted download under a fixed temporary name and continue it next time
    /// with an HTTP Range request (a cancelled or corrupt one is still removed).
    pub resume: bool,
}

/// What a finished download produced.
#[derive(Debug)]
pub struct Done {
    /// Bytes in the file.
    pub bytes: u64,
    /// Digest (in the request's algorithm) of the file, lower-case hex.
    pub digest: String,
    /// HTTP status of the final response.
    pub status: u16,
    /// URL after redirects.
    pub final_url: String,
    /// Bytes kept from an earlier, interrupted download (0 when none were).
    pub resumed_from: u64,
}

/// Hooks into the caller: progress and cancellation.
pub trait Watcher {
    /// Bytes so far and the total when the server said.
    fn progress(&self, done: u64, total: Option<u64>);
    /// True when the request should stop.
    fn cancelled(&self) -> bool;
}

/// Checks a SHA-256 parameter and returns it lower-cased.
pub fn check_sha256(s: &str) -> Result<String, DownloadError> {
    let s = s.trim().to_ascii_lowercase();
    let s = s.strip_prefix("sha256:").unwrap_or(&s).to_string();
    if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(s)
    } else {
        Err(DownloadError::BadSha256)
    }
}

fn temp_for(dest: &Path) -> PathBuf {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    dest.with_file_name(format!(".{name}.part-{}-{nanos}", std::process::id()))
}

/// Downloads per `req`. On any error `dest` is untouched; the temporary file is removed, except
/// that a resumable download interrupted by the network keeps it for the next attempt.
pub fn download(req: &Request, watch: &dyn Watcher) -> Result<Done, DownloadError> {
    check_target(req)?;
    let (tmp, meta) = if req.resume {
        partial_for(req.dest)
    } else {
        (temp_for(req.dest), PathBuf::new())
    };
    // One resumable download per file at a time: a second would take the first one's live
    // part for an interrupted one, and the two would write over each other.
    let _lock = if req.resume {
        Some(lock_part(req.dest)?)
    } else {
        None
    };
    let (resp, final_url, from) = respond(req, &tmp, &meta)?;
    let status = resp.status().as_u16();
    let total = sized(req, &resp, from, &tmp)?;
    if req.resume {
        let validator = header(&resp, "ETag").or_else(|| header(&resp, "Last-Modified"));
        let info = serde_json::json!({"url": req.url, "validator": validator});
        // Never through a symlink left at that name.
        let _ = crate::state::beneath::write_replace(&meta, info.to_string().as_bytes());
    }
    let body = Box::new(resp.into_body().into_reader());
    let (bytes, digest) =
        stream(body, &tmp, from, total, req, watch).map_err(|e| failed(req, e, &tmp, &meta))?;
    place(req, &tmp, &meta, &digest)?;
    Ok(Done {
        bytes,
        digest,
        status,
        final_url,
        resumed_from: from,
    })
}

/// The URL's scheme, and a target that is free (unless overwritten) in a folder that exists.
fn check_target(req: &Request) -> Result<(), DownloadError> {
    check_url(req.url)?;
    if !req.overwrite && req.dest.exists() {
        return Err(DownloadError::Exists(req.dest.to_path_buf()));
    }
    req.dest
        .parent()
        .filter(|p| p.is_dir())
        .ok_or_else(|| DownloadError::NoFolder(req.dest.to_path_buf()))?;
    Ok(())
}

/// The response to stream from, its final URL and the bytes of `tmp` it continues after: a
/// resumable download asks for the rest of a kept part, and starts over from the first byte
/// when the server does not continue exactly there.
fn respond(
    req: &Request,
    tmp: &Path,
    meta: &Path,
) -> Result<(ureq::http::Response<ureq::Body>, String, u64), DownloadError> {
    let earlier = if req.resume {
        resumable(tmp, meta, req.url)
    } else {
        None
    };
    if req.resume && earlier.is_none() {
        let _ = std::fs::remove_file(tmp);
    }
    let range = earlier.as_ref().map(|(n, v)| (*n, v.as_deref()));
    let (resp, final_url) = get(req.url, range)?;
    match (resp.status().as_u16(), &earlier) {
        // The server continues where the last attempt stopped.
        (206, Some((n, _))) if range_start(&resp) == Some(*n) => Ok((resp, final_url, *n)),
        // Anything else (the file changed, ranges unsupported, a range past the end): start
        // again from the first byte.
        (200, _) => Ok((resp, final_url, 0)),
        _ => {
            drop(resp);
            let _ = std::fs::remove_file(tmp);
            let (resp, final_url) = get(req.url, None)?;
            if resp.status().as_u16() != 200 {
                let e = ureq::Error::StatusCode(resp.status().as_u16());
                return Err(request_error(req.url, e));
            }
            Ok((resp, final_url, 0))
        }
    }
}

/// The whole file's size when the server says it, refused (and `tmp` removed) over the cap.
fn sized(
    req: &Request,
    resp: &ureq::http::Response<ureq::Body>,
    from: u64,
    tmp: &Path,
) -> Result<Option<u64>, DownloadError> {
    let total: Option<u64> = header(resp, "Content-Length")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|len| len + from);
    if let (Some(t), Some(max)) = (total, req.max_bytes) {
        if t > max {
            let _ = std::fs::remove_file(tmp);
            return Err(DownloadError::TooBig { size: t, max });
        }
    }
    Ok(total)
}

/// A failed stream's error, after the part is removed, or kept when a resumable download was
/// interrupted by the network.
fn failed(req: &Request, e: DownloadError, tmp: &Path, meta: &Path) -> DownloadError {
    let keep = req.resume
        && matches!(
            e,
            DownloadError::Connection { .. }
                | DownloadError::Stopped(_)
                | DownloadError::Short { .. }
        );
    if !keep {
        let _ = std::fs::remove_file(tmp);
        let _ = std::fs::remove_file(meta);
        return e;
    }
    DownloadError::Kept {
        error: Box::new(e),
        part: tmp.to_path_buf(),
    }
}

/// Checks the complete file's digest and moves it to the target (a link when the target must
/// not be replaced); on failure nothing is left behind.
fn place(req: &Request, tmp: &Path, meta: &Path, digest: &str) -> Result<(), DownloadError> {
    let discard = || {
        let _ = std::fs::remove_file(tmp);
        let _ = std::fs::remove_file(meta);
    };
    if let Some(want) = &req.expect {
        if want != digest {
            discard();
            return Err(DownloadError::Checksum {
                algo: req.algo,
                want: want.clone(),
                got: digest.to_string(),
            });
        }
    }
    let placed = if req.overwrite {
        std::fs::rename(tmp, req.dest)
    } else {
        std::fs::hard_link(tmp, req.dest).and_then(|_| std::fs::remove_file(tmp))
    };
    if let Err(error) = placed {
        discard();
        return Err(DownloadError::Place {
            dest: req.dest.to_path_buf(),
            error,
        });
    }
    if req.resume {
        let _ = std::fs::remove_file(meta);
    }
    Ok(())
}

/// Reads `body` on its own thread and hands chunks over a small channel, so the download loop
/// can check for cancellation while a read is blocked on a silent server (ureq's read timeout
/// is 60 s). After a cancel the reader is abandoned: it ends at its next read or timeout.
fn spawn_reader(
    mut body: Box<dyn Read + Send + Sync>,
) -> Result<mpsc::Receiver<std::io::Result<Vec<u8>>>, DownloadError> {
    let (tx, rx) = mpsc::sync_channel(4);
    std::thread::Builder::new()
        .name("download-read".into())
        .spawn(move || loop {
            let mut buf = vec![0u8; 256 * 1024];
            match body.read(&mut buf) {
                Ok(n) => {
                    buf.truncate(n);
                    if tx.send(Ok(buf)).is_err() || n == 0 {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            }
        })
        .map_err(DownloadError::Thread)?;
    Ok(rx)
}

/// An I/O error on `path` during `op`, as a download error.
fn file_error<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl Fn(std::io::Error) -> DownloadError + 'a {
    move |error| DownloadError::File {
        op,
        path: path.to_path_buf(),
        error,
    }
}

/// Opens `tmp` to write at byte `from`: a new file (0), or the kept part cut to `from` bytes
/// after they went into `ctx`, so the digest covers the whole file.
fn open_part(
    tmp: &Path,
    from: u64,
    ctx: &mut ring::digest::Context,
) -> Result<File, DownloadError> {
    if from == 0 {
        // Never through a symlink someone left at the temporary name.
        return File::options()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(tmp)
            .map_err(file_error("create", tmp));
    }
    let mut kept = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(tmp)
        .map_err(file_error("read", tmp))?;
    let mut buf = vec![0u8; 1024 * 1024];
    let mut read = 0u64;
    while read < from {
        let n = kept.read(&mut buf).map_err(file_error("read", tmp))?;
        if n == 0 {
            break;
        }
        let n = n.min((from - read) as usize);
        ctx.update(&buf[..n]);
        read += n as u64;
    }
    let mut f = File::options()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(tmp)
        .map_err(file_error("open", tmp))?;
    f.set_len(from).map_err(file_error("truncate", tmp))?;
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(from)).map_err(file_error("seek", tmp))?;
    Ok(f)
}

/// A hashing thread: where its chunks go, and its hex digest once that sender is dropped.
type Hasher = (mpsc::SyncSender<Vec<u8>>, std::thread::JoinHandle<String>);

/// Hashes the chunks sent to it on its own thread, while the next chunk is written.
fn spawn_hasher(mut ctx: ring::digest::Context) -> Result<Hasher, DownloadError> {
    let (htx, hrx) = mpsc::sync_channel::<Vec<u8>>(8);
    let hasher = std::thread::Builder::new()
        .name("download-hash".into())
        .spawn(move || {
            while let Ok(buf) = hrx.recv() {
                ctx.update(&buf);
            }
            hex(ctx.finish().as_ref())
        })
        .map_err(DownloadError::Thread)?;
    Ok((htx, hasher))
}

/// Writes the body after the first `from` bytes already in `tmp` (0: a new file), hashing the
/// whole file as it goes.
fn stream(
    body: Box<dyn Read + Send + Sync>,
    tmp: &Path,
    from: u64,
    total: Option<u64>,
    req: &Request,
    watch: &dyn Watcher,
) -> Result<(u64, String), DownloadError> {
    let mut ctx = ring::digest::Context::new(req.algo.ring());
    let mut file = open_part(tmp, from, &mut ctx)?;
    let chunks = spawn_reader(body)?;
    let (htx, hasher) = spawn_hasher(ctx)?;
    let mut done: u64 = from;
    watch.progress(done, total);
    loop {
        if watch.cancelled() {
            return Err(DownloadError::Cancelled);
        }
        let buf = match chunks.recv_timeout(Duration::from_millis(100)) {
            Ok(Ok(buf)) => buf,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Ok(Err(error)) => return Err(DownloadError::Connection { done, error }),
            Err(mpsc::RecvTimeoutError::Disconnected) => return Err(DownloadError::Stopped(done)),
        };
        if buf.is_empty() {
            break;
        }
        done += buf.len() as u64;
        if let Some(max) = req.max_bytes {
            if done > max {
                return Err(DownloadError::PassedMax(max));
            }
        }
        file.write_all(&buf).map_err(file_error("write", tmp))?;
        if htx.send(buf).is_err() {
            return Err(DownloadError::Stopped(done));
        }
        watch.progress(done, total);
    }
    drop(htx);
    if let Some(t) = total {
        if done != t {
            return Err(DownloadError::Short { done, total: t });
        }
    }
    file.sync_all().map_err(file_error("flush", tmp))?;
    let digest = hasher.join().map_err(|_| DownloadError::Stopped(done))?;
    Ok((done, digest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_digests() {
        let d = "E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855";
        assert_eq!(check_sha256(d).unwrap(), d.to_ascii_lowercase());
        assert!(check_sha256("abc").is_err());
    }
}
