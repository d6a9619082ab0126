//! Streams a URL to a temporary file beside the target, hashing as it goes, and renames it into
//! place only when it is complete and correct: a failure never leaves a file at the target.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What the caller asked for.
pub struct Request<'a> {
    /// http:// or https:// URL.
    pub url: &'a str,
    /// Final path.
    pub dest: &'a Path,
    /// Expected SHA-256 as lower-case hex.
    pub sha256: Option<String>,
    /// Replace an existing file at `dest`.
    pub overwrite: bool,
    /// Refuse bodies larger than this.
    pub max_bytes: Option<u64>,
}

/// What a finished download produced.
#[derive(Debug)]
pub struct Done {
    /// Bytes written.
    pub bytes: u64,
    /// SHA-256 of what was written, lower-case hex.
    pub sha256: String,
    /// HTTP status of the final response.
    pub status: u16,
    /// URL after redirects.
    pub final_url: String,
}

/// Hooks into the caller: progress and cancellation.
pub trait Watcher {
    /// Bytes so far and the total when the server said.
    fn progress(&self, done: u64, total: Option<u64>);
    /// True when the request should stop.
    fn cancelled(&self) -> bool;
}

/// Checks the URL's scheme before any connection is made.
pub fn check_url(url: &str) -> Result<(), String> {
    let lower = url.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or(url);
        return Err(format!(
            "only http and https URLs can be downloaded, not {scheme:?}; for a local file use image_convert"
        ));
    }
    if url.len() <= lower.find("//").map(|i| i + 2).unwrap_or(0) {
        return Err("the URL has no host".into());
    }
    Ok(())
}

/// Checks a SHA-256 parameter and returns it lower-cased.
pub fn check_sha256(s: &str) -> Result<String, String> {
    let s = s.trim().to_ascii_lowercase();
    let s = s.strip_prefix("sha256:").unwrap_or(&s).to_string();
    if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(s)
    } else {
        Err("sha256 must be 64 hexadecimal characters".into())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn describe(url: &str, e: ureq::Error) -> String {
    match e {
        ureq::Error::Status(code, resp) => format!(
            "the server answered HTTP {code} {} for {url}; check the URL",
            resp.status_text()
        ),
        ureq::Error::Transport(t) => {
            let msg = t.to_string();
            let lower = msg.to_ascii_lowercase();
            match t.kind() {
                ureq::ErrorKind::Dns => format!("cannot resolve the host of {url} (DNS): {msg}; check the host name and the network"),
                ureq::ErrorKind::ConnectionFailed if lower.contains("tls") || lower.contains("certificate") => {
                    format!("TLS failed for {url}: {msg}; the server's certificate is not trusted or the handshake failed")
                }
                ureq::ErrorKind::ConnectionFailed => format!("cannot connect to {url}: {msg}; is the server up and reachable?"),
                ureq::ErrorKind::TooManyRedirects => format!("too many redirects from {url}"),
                _ if lower.contains("tls") || lower.contains("certificate") => format!("TLS failed for {url}: {msg}"),
                _ => format!("download of {url} failed: {msg}"),
            }
        }
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

/// Downloads per `req`. On any error the temporary file is removed and `dest` is untouched.
pub fn download(req: &Request, watch: &dyn Watcher) -> Result<Done, String> {
    check_url(req.url)?;
    if !req.overwrite && req.dest.exists() {
        return Err(format!(
            "{} already exists; pass overwrite=true to replace it, or choose another path",
            req.dest.display()
        ));
    }
    let parent = req.dest.parent().filter(|p| p.is_dir()).ok_or_else(|| {
        format!(
            "the folder of {} does not exist; create it first",
            req.dest.display()
        )
    })?;
    let _ = parent;
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(20))
        .timeout_read(Duration::from_secs(60))
        .redirects(8)
        .user_agent(concat!("mcqemu/", env!("CARGO_PKG_VERSION")))
        .build();
    let resp = agent
        .get(req.url)
        .call()
        .map_err(|e| describe(req.url, e))?;
    let status = resp.status();
    let final_url = resp.get_url().to_string();
    let total: Option<u64> = resp
        .header("Content-Length")
        .and_then(|v| v.trim().parse().ok());
    if let (Some(t), Some(max)) = (total, req.max_bytes) {
        if t > max {
            return Err(format!("the server says the file is {t} bytes, over max_bytes={max}; raise max_bytes to accept it"));
        }
    }
    let tmp = temp_for(req.dest);
    let result = stream(resp.into_reader(), &tmp, total, req, watch);
    let done = match result {
        Ok((bytes, digest)) => (bytes, digest),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    let (bytes, digest) = done;
    if let Some(want) = &req.sha256 {
        if *want != digest {
            let _ = std::fs::remove_file(&tmp);
            return Err(format!(
                "checksum mismatch: expected sha256 {want}, got {digest}; the file was discarded. Check the URL and the checksum"
            ));
        }
    }
    let placed = if req.overwrite {
        std::fs::rename(&tmp, req.dest)
    } else {
        std::fs::hard_link(&tmp, req.dest).and_then(|_| std::fs::remove_file(&tmp))
    };
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!(
            "could not move the download into {}: {e}",
            req.dest.display()
        ));
    }
    Ok(Done {
        bytes,
        sha256: digest,
        status,
        final_url,
    })
}

fn stream(
    mut body: Box<dyn Read + Send + Sync>,
    tmp: &Path,
    total: Option<u64>,
    req: &Request,
    watch: &dyn Watcher,
) -> Result<(u64, String), String> {
    let mut file = File::options()
        .write(true)
        .create_new(true)
        .open(tmp)
        .map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 256 * 1024];
    let mut done: u64 = 0;
    watch.progress(0, total);
    loop {
        if watch.cancelled() {
            return Err("cancelled by the client; the partial file was removed".into());
        }
        let n = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(format!(
                    "the connection failed after {done} bytes: {e}; the partial file was removed, retry the download"
                ))
            }
        };
        done += n as u64;
        if let Some(max) = req.max_bytes {
            if done > max {
                return Err(format!(
                    "the download passed max_bytes={max}; the partial file was removed"
                ));
            }
        }
        ctx.update(&buf[..n]);
        file.write_all(&buf[..n])
            .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
        watch.progress(done, total);
    }
    if let Some(t) = total {
        if done != t {
            return Err(format!(
                "the connection closed after {done} of {t} bytes; the partial file was removed, retry the download"
            ));
        }
    }
    file.sync_all()
        .map_err(|e| format!("cannot flush {}: {e}", tmp.display()))?;
    Ok((done, hex(ctx.finish().as_ref())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_other_schemes() {
        assert!(check_url("file:///etc/passwd")
            .unwrap_err()
            .contains("\"file\""));
        assert!(check_url("ftp://x/y").is_err());
        assert!(check_url("https://").is_err());
        assert!(check_url("HTTPS://example.org/a.img").is_ok());
    }

    #[test]
    fn checks_digests() {
        let d = "E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855";
        assert_eq!(check_sha256(d).unwrap(), d.to_ascii_lowercase());
        assert!(check_sha256("abc").is_err());
    }
}
