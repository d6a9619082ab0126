//! image_download: a file fetched over http(s) into a temporary beside its path, verified
//! (sha256 when given) and renamed into place only when complete and correct.

use std::path::PathBuf;

use serde::Serialize;

use crate::net::download::{self, Request};
use crate::ops::error::OpError;
use crate::ops::vm::checks::{checked_path, Access};
use crate::ops::watch::CtxWatch;
use crate::ops::work::Work;

/// image_download's request (nothing checked yet).
#[derive(Debug, Clone)]
pub struct DownloadRequest {
    /// http or https.
    pub url: String,
    /// Where the file goes (checked against the roots).
    pub path: String,
    /// The digest it must have, hex.
    pub sha256: Option<String>,
    /// The most bytes accepted.
    pub max_bytes: Option<u64>,
    /// Replace an existing file.
    pub overwrite: bool,
}

crate::described! {
    /// What was downloaded (image_download's result, in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct Downloaded {
        /// Where it is.
        pub path: String,
        /// The URL asked for.
        pub url: String,
        /// The URL after redirects.
        pub final_url: String,
        /// Its size.
        pub bytes: u64,
        /// Its SHA-256.
        pub sha256: String,
        /// Whether it was checked against a given digest.
        pub verified: bool,
        /// The final response's HTTP status.
        pub http_status: u16,
    }
}

/// Checks the URL, the path and the digest's form, then downloads.
pub fn download(work: &dyn Work, req: &DownloadRequest) -> Result<Downloaded, OpError> {
    download::check_url(&req.url)?;
    let path: PathBuf = checked_path(&req.path, "path", Access::Write)?;
    let sha256 = match &req.sha256 {
        Some(s) => Some(download::check_sha256(s)?),
        None => None,
    };
    let request = Request {
        url: &req.url,
        dest: &path,
        algo: download::Algo::Sha256,
        expect: sha256.clone(),
        resume: false,
        overwrite: req.overwrite,
        max_bytes: req.max_bytes,
    };
    let done = download::download(&request, &CtxWatch(work))?;
    work.progress(done.bytes as f64, Some(done.bytes as f64), "done");
    Ok(Downloaded {
        path: path.display().to_string(),
        url: req.url.clone(),
        final_url: done.final_url,
        bytes: done.bytes,
        sha256: done.digest,
        verified: sha256.is_some(),
        http_status: done.status,
    })
}
