//! image_pull: distribution cloud images downloaded and verified (against the catalog's
//! pinned digest, or the publisher's own checksum file), resumable, and checked like any
//! untrusted image before they are offered for use.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::json;

use crate::net::download::{Algo, DownloadError};
use crate::net::{catalog, checksums, download};
use crate::ops::error::OpError;
use crate::ops::vm::checks::checked_image;
use crate::ops::watch::CtxWatch;
use crate::ops::work::Work;
use crate::state::paths;
use crate::state::roots::{self, Access};

/// The folder pulled images go to unless `path` says otherwise.
pub fn images_dir() -> PathBuf {
    paths::state_dir().join("images")
}

/// The file name a URL names (its last path segment, without query or fragment).
pub fn url_file_name(url: &str) -> Option<String> {
    let no_frag = url.split('#').next().unwrap_or(url);
    let no_query = no_frag.split('?').next().unwrap_or(no_frag);
    let after_scheme = no_query.split_once("://").map_or(no_query, |(_, r)| r);
    let (_, path) = after_scheme.split_once('/')?;
    let name = path.rsplit('/').next()?;
    let ok = !name.is_empty() && name != "." && name != ".." && !name.starts_with('.');
    ok.then(|| name.to_string())
}

/// The record kept beside a pulled image: what was verified, and when.
pub fn sidecar(image: &Path) -> PathBuf {
    let name = image
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    image.with_file_name(format!(".{name}.pulled.json"))
}

/// How a source is verified.
enum Check {
    /// Against the catalog's pinned digest.
    Pinned(Algo, String),
    /// Against the digest its checksum file (this URL, fetched first) lists.
    Sums(String),
}

/// One URL a pull may download, in the order tried.
struct Candidate {
    /// "pinned", "latest" or "url".
    kind: &'static str,
    /// The URL as the catalog or the caller names it.
    url: String,
    /// The URL fetched (the catalog's under `MCQEMU_CATALOG_MIRROR`).
    fetch: String,
    /// How it is verified.
    check: Check,
}

/// A candidate with the path it goes to.
struct Source {
    /// What is downloaded, and how it is verified.
    what: Candidate,
    /// Where it goes.
    dest: PathBuf,
}

/// What a pull by name tries, in order: the pinned URL, then the moving one when the catalog
/// knows its checksum file. Also the moving URL the catalog cannot verify, for the message
/// when the pinned one is gone.
fn plan_entry(e: &catalog::Entry) -> Result<(Vec<Candidate>, Option<&'static str>), OpError> {
    let mut candidates = Vec::new();
    if let Some(p) = e.pinned {
        let (algo, hex) = p.algo_and_hex().ok_or_else(|| {
            OpError::host(format!(
                "the catalog's digest for {} is malformed: {:?}",
                e.name, p.digest
            ))
        })?;
        candidates.push(Candidate {
            kind: "pinned",
            url: p.url.to_string(),
            fetch: catalog::fetch_url(p.url),
            check: Check::Pinned(algo, hex),
        });
    }
    let mut unverifiable = None;
    if let Some(l) = e.latest {
        match l.checksums_url {
            Some(sums) => candidates.push(Candidate {
                kind: "latest",
                url: l.url.to_string(),
                fetch: catalog::fetch_url(l.url),
                check: Check::Sums(catalog::fetch_url(sums)),
            }),
            None => unverifiable = Some(l.url),
        }
    }
    Ok((candidates, unverifiable))
}

/// The HTTP status of a download refused because the URL is gone (404 Not Found, 410 Gone).
fn gone_status(e: &DownloadError) -> Option<u16> {
    match e {
        DownloadError::Status {
            code: c @ (404 | 410),
            ..
        } => Some(*c),
        DownloadError::Kept { error, .. } => gone_status(error),
        _ => None,
    }
}

/// Why one source failed.
enum Failure {
    /// Its URL is gone (HTTP 404/410): the next source may be tried.
    Gone(u16, DownloadError),
    /// Anything else: the pull fails.
    Other(OpError),
}

impl From<OpError> for Failure {
    fn from(e: OpError) -> Self {
        Failure::Other(e)
    }
}

/// What one source gave.
struct Got {
    algo: Algo,
    checksums_url: Option<String>,
    done: download::Done,
    format: String,
}

fn pull_source(work: &dyn Work, src: &Source, overwrite: bool) -> Result<Got, Failure> {
    let (algo, expect, checksums_url) = match &src.what.check {
        Check::Pinned(algo, hex) => {
            work.progress(0.0, None, "downloading the pinned image");
            (*algo, hex.clone(), None)
        }
        Check::Sums(sums_url) => {
            work.progress(0.0, None, "fetching the checksum file");
            let file_name = url_file_name(&src.what.fetch).ok_or_else(|| {
                OpError::host(format!(
                    "{} names no file to look up in the checksum file",
                    src.what.fetch
                ))
            })?;
            let sums =
                download::fetch_small(sums_url, checksums::MAX_BYTES).map_err(OpError::from)?;
            let text = String::from_utf8_lossy(&sums);
            let (algo, digest) = checksums::find(&text, &file_name).ok_or_else(|| {
                OpError::host(format!(
                    "{sums_url} lists no SHA-256 or SHA-512 checksum for {file_name:?}; check \
                     the URL and the checksum file (nothing was downloaded)"
                ))
            })?;
            (algo, digest, Some(sums_url.clone()))
        }
    };
    work.check_cancel()?;
    let req = download::Request {
        url: &src.what.fetch,
        dest: &src.dest,
        algo,
        expect: Some(expect),
        overwrite,
        max_bytes: None,
        resume: true,
    };
    let done = match download::download(&req, &CtxWatch(work)) {
        Ok(done) => done,
        Err(e) => {
            return Err(match gone_status(&e) {
                Some(code) => Failure::Gone(code, e),
                None => Failure::Other(e.into()),
            })
        }
    };
    work.progress(done.bytes as f64, Some(done.bytes as f64), "verified");
    // A pulled image is data from the network: checked like any other before it is offered.
    let checked = match checked_image(&src.dest, "pulled image", None) {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_file(&src.dest);
            return Err(OpError::host(format!("{e}; the pulled file was removed")).into());
        }
    };
    Ok(Got {
        algo,
        checksums_url,
        done,
        format: checked.format,
    })
}

/// Where a source's image goes: `path`, or the default folder and the URL's file name.
fn dest_for(path: Option<&str>, file_name: &str) -> Result<PathBuf, OpError> {
    if let Some(p) = path {
        return roots::check_str(p, Access::Write)
            .map_err(|e| OpError::invalid(format!("parameter 'path': {e}")));
    }
    let dir = images_dir();
    std::fs::create_dir_all(&dir)
        .map_err(|e| OpError::host(format!("cannot create {}: {e}", dir.display())))?;
    Ok(roots::check(&dir.join(file_name), Access::Write)?)
}

/// image_pull's request: a catalog entry by name, or a URL with its publisher's checksum file;
/// where to put it (default: the images folder under the state folder).
#[derive(Debug, Clone, Default)]
pub struct PullRequest {
    /// A catalog entry's name.
    pub image: Option<String>,
    /// A URL to pull instead.
    pub url: Option<String>,
    /// The checksum file listing `url`'s digest.
    pub checksums_url: Option<String>,
    /// The file to write (checked against the roots).
    pub path: Option<String>,
    /// Replace an existing file.
    pub overwrite: bool,
}

/// Pulls, verifies and checks an image; the record kept beside it says what was verified.
pub fn pull(work: &dyn Work, req: &PullRequest) -> Result<Pulled, OpError> {
    let (entry, plan, unverifiable) = plan_for(req)?;
    let sources = checked_sources(plan, req.path.as_deref())?;
    let name = entry.map(|e| e.name);
    let mut gone: Option<(String, u16)> = None;
    for (i, src) in sources.iter().enumerate() {
        match pull_source(work, src, req.overwrite) {
            Ok(p) => return Ok(finish(src, p, name, gone)),
            Err(Failure::Other(e)) => return Err(e),
            Err(Failure::Gone(code, e)) => {
                if src.what.kind == "pinned" && i + 1 < sources.len() {
                    gone = Some((src.what.fetch.clone(), code));
                    continue;
                }
                if src.what.kind != "pinned" {
                    return Err(e.into());
                }
                let name = name.unwrap_or_default();
                return Err(pin_gone(name, unverifiable, &src.what.fetch, code));
            }
        }
    }
    Err(OpError::host(format!(
        "the catalog entry {} has no source to pull",
        name.unwrap_or_default()
    )))
}

/// What to try, in order: a catalog entry's sources (and its moving URL when the catalog
/// knows no checksum file for it), or one URL checked against its publisher's checksum file.
type Plan = (
    Option<&'static catalog::Entry>,
    Vec<Candidate>,
    Option<&'static str>,
);

/// The plan `image` or `url` + `checksums_url` asks for.
fn plan_for(req: &PullRequest) -> Result<Plan, OpError> {
    match (req.image.as_deref(), req.url.as_deref()) {
        (Some(name), None) => {
            let e = catalog::find(name).ok_or_else(|| {
                OpError::not_found(format!(
                    "no catalog image {name:?}; image_catalog lists: {}",
                    catalog::names().join(", ")
                ))
            })?;
            let (plan, unverifiable) = plan_entry(e)?;
            Ok((Some(e), plan, unverifiable))
        }
        (None, Some(url)) => {
            let sums = req.checksums_url.as_deref().ok_or_else(|| {
                OpError::invalid(
                    "url needs checksums_url: the publisher's checksum file that lists it \
                     (every pulled image is verified)",
                )
            })?;
            let plan = vec![Candidate {
                kind: "url",
                url: url.to_string(),
                fetch: url.to_string(),
                check: Check::Sums(sums.to_string()),
            }];
            Ok((None, plan, None))
        }
        (Some(_), Some(_)) => Err(OpError::invalid("give image or url, not both")),
        (None, None) => Err(OpError::invalid(
            "give image (a catalog entry; image_catalog lists them) or url + checksums_url",
        )),
    }
}

/// Every URL and destination of the plan, checked before the first request.
fn checked_sources(plan: Vec<Candidate>, path: Option<&str>) -> Result<Vec<Source>, OpError> {
    let mut sources = Vec::new();
    for what in plan {
        let fetch = &what.fetch;
        download::check_url(fetch)?;
        if let Check::Sums(sums) = &what.check {
            download::check_url(sums)?;
        }
        let file_name = url_file_name(fetch).ok_or_else(|| {
            OpError::host(format!(
                "{fetch} names no file to look up in the checksum file"
            ))
        })?;
        let dest = dest_for(path, &file_name)?;
        sources.push(Source { what, dest });
    }
    Ok(sources)
}

/// The pinned image `fetch` of catalog entry `name` is gone (HTTP `code`) and nothing is left
/// to try: what happened, and how to pull a current image instead.
fn pin_gone(name: &str, unverifiable: Option<&str>, fetch: &str, code: u16) -> OpError {
    let next = match unverifiable {
        Some(latest) => format!(
            "the catalog knows no checksum file for {name}'s moving URL {latest}: pull it with \
             url + checksums_url (the publisher's checksum file that lists it)"
        ),
        None => format!(
            "{name} has no moving URL to fall back to: pull a current image with url + \
             checksums_url"
        ),
    };
    OpError::invalid(format!(
        "{fetch} answered HTTP {code}: the publisher has removed the dated image the catalog \
         pins for {name} (the catalog needs a newer pin); {next}"
    ))
}

crate::described! {
    /// A pinned URL found gone before the pull fell back to the moving one.
    #[derive(Debug, Clone, Serialize)]
    pub struct Gone {
        /// The pinned URL.
        pub url: String,
        /// Its HTTP status (404 or 410).
        pub status: u16,
    }
}

crate::described! {
    /// What image_pull reports (its structured result, in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct Pulled {
        /// Where the image is.
        pub path: String,
        /// The URL fetched.
        pub url: String,
        /// "pinned", "latest" or "url".
        pub source: &'static str,
        /// The catalog entry, when pulled by name.
        pub image: Option<&'static str>,
        /// The URL as the catalog names it, when pulled by name.
        pub catalog_url: Option<String>,
        /// The checksum file the digest came from.
        pub checksums_url: Option<String>,
        /// The pinned URL found gone first, if one was.
        pub pinned_gone: Option<Gone>,
        /// The image's size.
        pub bytes: u64,
        /// The digest's algorithm.
        pub algorithm: &'static str,
        /// The verified digest.
        pub digest: String,
        /// Always true: an unverified image is never kept.
        pub verified: bool,
        /// The byte a resumed download continued from.
        pub resumed_from: u64,
        /// The image's format, as the untrusted-image check read it.
        pub format: String,
    }
}

/// What image_pull is asked for: a cloud image, or a container image to make a root of.
#[derive(Debug, Clone)]
pub enum Wanted {
    /// A cloud image by catalog name or URL.
    Image(PullRequest),
    /// A container image.
    Oci(crate::ops::container::pull::OciRequest),
}

/// image_pull's result.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Fetched {
    /// A verified cloud image.
    Image(Pulled),
    /// A container image made a root.
    Oci(crate::ops::container::pull::OciPulled),
}

impl crate::schema::Schema for Fetched {
    fn schema() -> serde_json::Value {
        crate::schema::any_of(vec![
            Pulled::schema(),
            crate::ops::container::pull::OciPulled::schema(),
        ])
    }
}

/// image_pull: the cloud image or the container image asked for.
pub fn pull_wanted(work: &dyn Work, wanted: &Wanted) -> Result<Fetched, OpError> {
    match wanted {
        Wanted::Image(req) => pull(work, req).map(Fetched::Image),
        Wanted::Oci(req) => crate::ops::container::pull::pull(work, req).map(Fetched::Oci),
    }
}

/// Writes the record beside the image and builds the result.
fn finish(
    src: &Source,
    p: Got,
    image: Option<&'static str>,
    gone: Option<(String, u16)>,
) -> Pulled {
    let catalog_url = image.map(|_| src.what.url.clone());
    let record = json!({
        "url": src.what.fetch, "catalog_url": catalog_url, "image": image, "source": src.what.kind,
        "checksums_url": p.checksums_url, "algorithm": p.algo.name(), "digest": p.done.digest,
        "bytes": p.done.bytes, "format": p.format,
        "pulled_at": crate::clock::iso8601(crate::clock::now_secs()),
    });
    let _ =
        crate::state::beneath::write_replace(&sidecar(&src.dest), record.to_string().as_bytes());
    Pulled {
        path: src.dest.display().to_string(),
        url: src.what.fetch.clone(),
        source: src.what.kind,
        image,
        catalog_url,
        checksums_url: p.checksums_url,
        pinned_gone: gone.map(|(url, status)| Gone { url, status }),
        bytes: p.done.bytes,
        algorithm: p.algo.name(),
        digest: p.done.digest,
        verified: true,
        resumed_from: p.done.resumed_from,
        format: p.format,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_come_from_the_url_path() {
        assert_eq!(
            url_file_name("https://h/a/b/disk.qcow2?x=1#y").as_deref(),
            Some("disk.qcow2")
        );
        assert_eq!(
            url_file_name("http://h:8080/disk.img").as_deref(),
            Some("disk.img")
        );
        assert_eq!(url_file_name("https://h/"), None);
        assert_eq!(url_file_name("https://h"), None);
        assert_eq!(url_file_name("https://h/a/.."), None);
        for e in catalog::ENTRIES {
            let urls = e
                .pinned
                .map(|p| p.url)
                .into_iter()
                .chain(e.latest.map(|l| l.url));
            for url in urls {
                assert!(url_file_name(url).is_some(), "{url}");
            }
        }
    }

    #[test]
    fn a_pull_by_name_tries_the_pinned_url_then_the_latest_one() {
        let e = catalog::find("debian-12").unwrap();
        let (plan, unverifiable) = plan_entry(e).unwrap();
        assert_eq!(unverifiable, None);
        let kinds: Vec<&str> = plan.iter().map(|c| c.kind).collect();
        assert_eq!(kinds, ["pinned", "latest"]);
        assert_eq!(plan[0].url, e.pinned.unwrap().url);
        assert_eq!(plan[1].url, e.latest.unwrap().url);
        let Check::Pinned(algo, hex) = &plan[0].check else {
            panic!("the pinned source is checked against its digest")
        };
        assert_eq!(format!("{}:{hex}", algo.name()), e.pinned.unwrap().digest);
        let Check::Sums(sums) = &plan[1].check else {
            panic!("the latest source is checked against its checksum file")
        };
        assert_eq!(Some(sums.as_str()), e.latest.unwrap().checksums_url);
        // Pinned only: Fedora keeps the release folder, and there is no moving URL.
        let (plan, unverifiable) = plan_entry(catalog::find("fedora-44").unwrap()).unwrap();
        assert_eq!(plan.len(), 1);
        assert_eq!(unverifiable, None);
        // A moving URL without a known checksum file is not pulled by name.
        let (plan, unverifiable) = plan_entry(catalog::find("rocky-10").unwrap()).unwrap();
        assert_eq!(plan.len(), 1);
        assert!(unverifiable.is_some_and(|u| u.contains(".latest.")));
    }

    #[test]
    fn only_404_and_410_count_as_gone() {
        let status = |code| DownloadError::Status {
            code,
            url: "https://h/x.img".into(),
        };
        assert_eq!(gone_status(&status(404)), Some(404));
        assert_eq!(gone_status(&status(410)), Some(410));
        let kept = DownloadError::Kept {
            error: Box::new(status(404)),
            part: "/p".into(),
        };
        assert_eq!(gone_status(&kept), Some(404));
        assert_eq!(gone_status(&status(500)), None);
        assert_eq!(
            gone_status(&DownloadError::Request(
                "cannot connect to https://h/x.img".into()
            )),
            None
        );
        assert_eq!(gone_status(&DownloadError::Cancelled), None);
    }
}
