//! Pushes: blobs and then a manifest to a registry repository over the distribution API
//! (a blob the registry already holds is not sent again; a small one is one streamed PUT, a
//! large one goes in chunks that resume after a cut-off; the registry checks each against its
//! digest), or into an OCI image layout on the host. The manifest goes last, so a push that fails or is cancelled leaves no tag naming
//! anything partial.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::client::{enc, Client, Payload};
use super::error::OciError;
use super::origins::Origins;
use super::parallel::{self, Mover};
use super::reference::Reference;
use super::registry::{add_to_index, blob_path, keep, open_store};

/// A blob to push: content already checked into `path` under `digest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    /// `sha256:...`.
    pub digest: String,
    /// Its length.
    pub size: u64,
    /// Where its bytes are.
    pub path: PathBuf,
}

/// What a push did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pushed {
    /// Bytes sent.
    pub uploaded: u64,
    /// Bytes the destination already held.
    pub skipped: u64,
    /// Bytes the registry mounted from another of its repositories instead of receiving them.
    pub mounted: u64,
    /// Times a cut-off upload was resumed.
    pub resumed: u32,
}

/// Progress and cancellation of a transfer.
pub struct Watch<'a> {
    /// Bytes done of the total, and what is moving.
    pub progress: &'a dyn Fn(u64, u64, &str),
    /// True once the caller gave up.
    pub cancelled: &'a dyn Fn() -> bool,
}

/// Blobs up to this size go in one PUT. Larger ones go in chunks of this size, each a PATCH:
/// progress is said after each, and a chunk cut off on the way is resumed from what the
/// registry says it holds, not sent from the start.
pub const CHUNK: u64 = 32 << 20;
/// Times one blob's upload is resumed after a cut-off before the push fails.
const RESUMES: u32 = 3;

/// Pushes `blobs`, then `manifest` (of `media_type`) as `tag`, to `r`'s repository. A blob
/// `origins` knows in another repository of the registry is mounted from there.
pub fn to_registry(
    r: &Reference,
    tag: &str,
    manifest: &[u8],
    media_type: &str,
    blobs: &[Blob],
    origins: &Origins,
    watch: &Watch,
) -> Result<Pushed, OciError> {
    let mut c = Client::for_push(r)?;
    let repo = c.repo_path();
    // A blob named twice (two equal windows of memory) is sent once.
    let mut seen = std::collections::HashSet::new();
    let unique: Vec<&Blob> = blobs.iter().filter(|b| seen.insert(&b.digest)).collect();
    let total: u64 = unique.iter().map(|b| b.size).sum();
    let session = || Client::for_push(r);
    let one = |c: &mut Client, b: &&Blob, m: &Mover| -> Result<Pushed, OciError> {
        let head = c.send(
            "HEAD",
            &format!("{repo}/blobs/{}", b.digest),
            None,
            &Payload::Empty,
        )?;
        if head.status().as_u16() == 200 {
            m.moved(b.size);
            return Ok(Pushed {
                skipped: b.size,
                ..Pushed::default()
            });
        }
        let mut started = None;
        if let Some(from) = origins.elsewhere(&b.digest, r.api_host(), &r.repository) {
            match mount(c, &repo, &b.digest, &from) {
                Mount::Done => {
                    m.moved(b.size);
                    return Ok(Pushed {
                        mounted: b.size,
                        ..Pushed::default()
                    });
                }
                Mount::Upload(location) => started = Some(location),
                Mount::Not => {}
            }
        }
        let resumed = upload(c, &repo, b, m, started)?;
        Ok(Pushed {
            uploaded: b.size,
            resumed,
            ..Pushed::default()
        })
    };
    let said = |n: u64| (watch.progress)(n, total, "uploading");
    let each =
        parallel::each(&unique, &session, &one, &said, watch.cancelled).map_err(|e| match e {
            OciError::Cancelled(_) => cancelled(),
            e => e,
        })?;
    let done = each.iter().fold(Pushed::default(), |a, p| Pushed {
        uploaded: a.uploaded + p.uploaded,
        skipped: a.skipped + p.skipped,
        mounted: a.mounted + p.mounted,
        resumed: a.resumed + p.resumed,
    });
    if (watch.cancelled)() {
        return Err(cancelled());
    }
    let put = c.send(
        "PUT",
        &format!("{repo}/manifests/{tag}"),
        Some(media_type),
        &Payload::Bytes(manifest.to_vec()),
    )?;
    match put.status().as_u16() {
        201 | 204 => Ok(done),
        s => Err(refused(s, "the manifest", put)),
    }
}

/// Uploads one blob the registry does not hold: in one PUT (started again if it is cut off),
/// or in [`CHUNK`]s resumed after a cut-off; says the bytes sent after each piece. Returns how
/// many times it resumed. A cancelled chunked upload is deleted on the registry (no tag names
/// it either way).
fn upload(
    c: &mut Client,
    repo: &str,
    b: &Blob,
    m: &Mover,
    started: Option<String>,
) -> Result<u32, OciError> {
    let mut location = match started {
        Some(l) => l,
        None => start_upload(c, repo)?,
    };
    let mut offset = 0;
    let mut resumed = 0;
    loop {
        if b.size > CHUNK {
            (location, offset) = send_chunks(c, repo, b, m, location, offset, &mut resumed)?;
        }
        let sep = if location.contains('?') { '&' } else { '?' };
        let url = format!("{location}{sep}digest={}", enc(&b.digest));
        let body = if offset < b.size {
            Payload::File {
                path: b.path.clone(),
                offset: 0,
                size: b.size,
            }
        } else {
            Payload::Empty
        };
        match c.send("PUT", &url, Some("application/octet-stream"), &body) {
            Ok(put) if matches!(put.status().as_u16(), 201 | 204) => {
                m.moved(b.size);
                return Ok(resumed);
            }
            Ok(put) => {
                let s = put.status().as_u16();
                return Err(refused(s, &format!("the blob {}", b.digest), put));
            }
            // A whole blob cut off on its way: sent again from a new upload.
            Err(OciError::Host(why)) if offset < b.size => {
                if resumed >= RESUMES {
                    return Err(cut_off(b, 0, &format!("was sent {RESUMES} times ({why})")));
                }
                resumed += 1;
                let _ = c.send("DELETE", &location, None, &Payload::Empty);
                location = start_upload(c, repo)?;
            }
            Err(e) => return Err(e),
        }
    }
}

/// What a cross-repository mount did.
enum Mount {
    /// The registry holds the blob in the repository now.
    Done,
    /// It started an upload instead (it may not mount): where the bytes go.
    Upload(String),
    /// It refused or failed: upload as usual.
    Not,
}

/// Asks the registry to mount `digest` into `repo` from its repository `from`.
fn mount(c: &mut Client, repo: &str, digest: &str, from: &str) -> Mount {
    let target = format!(
        "{repo}/blobs/uploads/?mount={}&from={}",
        enc(digest),
        enc(from)
    );
    match c.send("POST", &target, None, &Payload::Empty) {
        Ok(resp) => match resp.status().as_u16() {
            201 => Mount::Done,
            202 => location_of(&resp).map_or(Mount::Not, Mount::Upload),
            _ => Mount::Not,
        },
        Err(_) => Mount::Not,
    }
}

/// Sends blob `b` from `offset` in [`CHUNK`]s to the upload at `location`, resuming after a
/// cut-off; the upload's location and the bytes it holds once all are sent.
fn send_chunks(
    c: &mut Client,
    repo: &str,
    b: &Blob,
    m: &Mover,
    mut location: String,
    mut offset: u64,
    resumed: &mut u32,
) -> Result<(String, u64), OciError> {
    while offset < b.size {
        if m.stopped() {
            let _ = c.send("DELETE", &location, None, &Payload::Empty);
            return Err(cancelled());
        }
        let len = CHUNK.min(b.size - offset);
        let chunk = Payload::File {
            path: b.path.clone(),
            offset,
            size: len,
        };
        match c.send_chunk(&location, offset, len, &chunk) {
            Ok(resp) if resp.status().as_u16() == 202 => {
                location = location_of(&resp)?;
                let now = held(&resp).unwrap_or(offset + len);
                if now <= offset {
                    // A registry that took nothing of the chunk: asked again, a bounded
                    // number of times, never in a loop.
                    (location, offset) = resume(c, repo, &location, b, offset, resumed)?;
                } else {
                    offset = now;
                }
            }
            Ok(resp) if resp.status().as_u16() >= 500 || resp.status().as_u16() == 416 => {
                (location, offset) = resume(c, repo, &location, b, offset, resumed)?;
            }
            Ok(resp) => {
                let s = resp.status().as_u16();
                return Err(refused(
                    s,
                    &format!("a chunk of the blob {}", b.digest),
                    resp,
                ));
            }
            Err(OciError::Host(_)) => {
                (location, offset) = resume(c, repo, &location, b, offset, resumed)?;
            }
            Err(e) => return Err(e),
        }
        m.moved(offset);
    }
    Ok((location, offset))
}

/// Starts an upload in `repo`: where its bytes go.
fn start_upload(c: &mut Client, repo: &str) -> Result<String, OciError> {
    let start = c.send(
        "POST",
        &format!("{repo}/blobs/uploads/"),
        None,
        &Payload::Empty,
    )?;
    match start.status().as_u16() {
        202 => location_of(&start),
        s => Err(refused(s, "an upload", start)),
    }
}

/// A blob's upload that stopped for good at `offset`, and why.
fn cut_off(b: &Blob, offset: u64, why: &str) -> OciError {
    OciError::Host(format!(
        "the upload of {} ({} bytes) was cut off after {offset} bytes and {why}; push again: \
         the blobs the registry holds are not sent twice",
        b.digest, b.size
    ))
}

/// After a chunk was cut off at `offset`: asks the registry what the upload holds (the
/// distribution API's upload status), and goes on from there; from a new upload when it holds
/// nothing it can say (its `Range: 0-0` is both no byte and one). Fails, saying where it
/// stopped, after [`RESUMES`] tries or when the registry cannot say.
fn resume(
    c: &mut Client,
    repo: &str,
    location: &str,
    b: &Blob,
    offset: u64,
    resumed: &mut u32,
) -> Result<(String, u64), OciError> {
    if *resumed >= RESUMES {
        return Err(cut_off(
            b,
            offset,
            &format!("was resumed {RESUMES} times already"),
        ));
    }
    *resumed += 1;
    let status = c
        .send("GET", location, None, &Payload::Empty)
        .map_err(|e| cut_off(b, offset, &format!("its status could not be read: {e}")))?;
    match (status.status().as_u16(), held(&status)) {
        (204, Some(n)) if n > 1 => Ok((location_of(&status)?, n)),
        (204 | 404, _) => {
            let _ = c.send("DELETE", location, None, &Payload::Empty);
            let again = start_upload(c, repo)
                .map_err(|e| cut_off(b, offset, &format!("a new upload could not start: {e}")))?;
            Ok((again, 0))
        }
        (s, _) => Err(cut_off(
            b,
            offset,
            &format!("the registry answered HTTP {s} for its status"),
        )),
    }
}

/// Where an upload goes on: the response's Location.
fn location_of(resp: &ureq::http::Response<ureq::Body>) -> Result<String, OciError> {
    resp.headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .ok_or_else(|| OciError::Host("the registry answered an upload without a Location".into()))
}

/// The bytes an upload holds, from its `Range: 0-LAST` header: LAST + 1.
fn held(resp: &ureq::http::Response<ureq::Body>) -> Option<u64> {
    let range = resp.headers().get("range")?.to_str().ok()?;
    range_end(range)
}

/// `0-LAST` (or `bytes=0-LAST`) as LAST + 1.
fn range_end(range: &str) -> Option<u64> {
    let r = range.trim().trim_start_matches("bytes=");
    let (_, last) = r.split_once('-')?;
    let last: u64 = last.trim().parse().ok()?;
    Some(last + 1)
}

/// Copies `blobs` and `manifest` (of `media_type`, digest `digest`) into the layout at `dir`,
/// named `tag` in its index (an older entry of that name replaced).
pub fn to_layout(
    dir: &Path,
    tag: &str,
    manifest: &[u8],
    media_type: &str,
    digest: &str,
    blobs: &[Blob],
    watch: &Watch,
) -> Result<Pushed, OciError> {
    open_store(dir)?;
    let total: u64 = blobs.iter().map(|b| b.size).sum();
    let mut done = Pushed::default();
    for b in blobs {
        if (watch.cancelled)() {
            return Err(cancelled());
        }
        let dest = blob_path(dir, &b.digest)?;
        if std::fs::metadata(&dest).is_ok_and(|m| m.len() == b.size) {
            done.skipped += b.size;
            continue;
        }
        (watch.progress)(
            done.uploaded + done.skipped,
            total,
            &format!("copying {}", b.digest),
        );
        let tmp = dest.with_extension("partial");
        std::fs::copy(&b.path, &tmp)
            .and_then(|_| std::fs::rename(&tmp, &dest))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                OciError::Host(format!("cannot write {}: {e}", dest.display()))
            })?;
        done.uploaded += b.size;
    }
    keep(dir, digest, manifest)?;
    add_to_index(dir, tag, digest, media_type, manifest.len() as u64)?;
    Ok(done)
}

fn cancelled() -> OciError {
    OciError::Cancelled(
        "cancelled by the client: no tag was written, so nothing names the partial push".into(),
    )
}

/// A status the push did not expect for `what`, with the registry's own words.
fn refused(status: u16, what: &str, resp: ureq::http::Response<ureq::Body>) -> OciError {
    let mut body = String::new();
    let _ = resp
        .into_body()
        .into_reader()
        .take(4096)
        .read_to_string(&mut body);
    let said = body.trim();
    let theirs = if said.is_empty() {
        String::new()
    } else {
        format!(": {said}")
    };
    OciError::Host(format!(
        "the registry answered HTTP {status} for {what}{theirs}"
    ))
}

#[cfg(test)]
mod tests {
    use super::range_end;

    #[test]
    fn an_upload_s_range_says_how_many_bytes_it_holds() {
        assert_eq!(range_end("0-33554431"), Some(32 << 20));
        assert_eq!(range_end("bytes=0-9"), Some(10));
        assert_eq!(range_end("0-"), None);
        assert_eq!(range_end("garbage"), None);
    }
}
