//! One session with a registry's distribution API: its agent, repository and token. Requests
//! answer one auth challenge (a bearer token from the challenge's realm, with the user's basic
//! credentials when there are some, or those credentials themselves), follow redirects one by
//! one (the registry's credentials never go to another host; plain http only for a registry
//! on this machine), and say a refusal in words the agent can act on. Pulls read manifests and
//! blobs through it ([`super::registry`]); pushes send blobs and manifests ([`super::push`]).

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::auth::{credentials, registry_words, Basic, Creds};
use super::error::OciError;
use super::layout::sha256_hex;
use super::reference::Reference;

/// Media types a manifest request accepts.
pub(super) const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.docker.distribution.manifest.v2+json";
/// Largest manifest or index read.
const MAX_MANIFEST: u64 = 4 << 20;
/// Most redirects followed for one request.
const MAX_REDIRECTS: usize = 8;

/// What a request sends.
pub(super) enum Payload {
    /// Nothing.
    Empty,
    /// These bytes (a manifest).
    Bytes(Vec<u8>),
    /// `size` bytes of a file from `offset` (a blob, or a chunk of one), opened afresh for
    /// each try.
    File {
        /// The file.
        path: PathBuf,
        /// Where the bytes start.
        offset: u64,
        /// How many.
        size: u64,
    },
}

/// One registry session: the agent, the repository, and the token once one is granted.
pub(super) struct Client {
    agent: ureq::Agent,
    base: String,
    host: String,
    repo: String,
    auth: Option<String>,
    basic: Option<Basic>,
    /// Why there are no credentials although the user has some (a helper keeps them).
    helper: Option<String>,
    /// A push: tokens are asked for with push scope, whatever the challenge names.
    push: bool,
}

impl Client {
    pub(super) fn new(r: &Reference) -> Result<Client, OciError> {
        let scheme = if r.is_loopback() { "http" } else { "https" };
        let agent = crate::net::http::agent();
        let host = r.api_host().to_string();
        let (basic, helper) = match credentials(&host)? {
            Creds::None => (None, None),
            Creds::Basic(b) => (Some(b), None),
            Creds::Helper(why) => (None, Some(why)),
        };
        Ok(Client {
            agent,
            base: format!("{scheme}://{host}"),
            basic,
            helper,
            host,
            repo: r.repository.clone(),
            auth: None,
            push: false,
        })
    }

    /// A session that pushes to `r`'s repository.
    pub(super) fn for_push(r: &Reference) -> Result<Client, OciError> {
        let mut c = Client::new(r)?;
        c.push = true;
        Ok(c)
    }

    /// GETs `path` on the registry, answering one auth challenge and following redirects
    /// (the registry's credentials never go to another host).
    fn get(
        &mut self,
        path: &str,
        accept: Option<&str>,
        from: u64,
    ) -> Result<ureq::http::Response<ureq::Body>, OciError> {
        let mut url = format!("{}{path}", self.base);
        let mut challenged = false;
        let mut hops = 0;
        loop {
            let same_host = url.starts_with(&format!("{}/", self.base));
            let mut rb = self.agent.get(&url);
            if let Some(a) = accept {
                rb = rb.header("Accept", a);
            }
            if from > 0 {
                rb = rb.header("Range", &format!("bytes={from}-"));
            }
            if let (true, Some(a)) = (same_host, &self.auth) {
                rb = rb.header("Authorization", a);
            }
            let resp = rb.call().map_err(|e| {
                OciError::Host(format!("the registry {} did not answer: {e}", self.host))
            })?;
            let status = resp.status().as_u16();
            match status {
                401 if same_host && !challenged => {
                    challenged = true;
                    self.authenticate(&challenge_of(&resp))?;
                }
                300..=399 => {
                    if hops >= MAX_REDIRECTS {
                        return Err(OciError::Host(format!("too many redirects for {path}")));
                    }
                    url = self.redirect(&resp)?;
                    hops += 1;
                }
                401 => {
                    let said = registry_words(resp);
                    return Err(self.denied(said.as_deref()));
                }
                404 => {
                    return Err(OciError::NotFound(format!(
                        "{}{path} is not in the registry (HTTP 404)",
                        self.host
                    )))
                }
                200..=299 => return Ok(resp),
                s => {
                    return Err(OciError::Host(format!(
                        "the registry {} answered HTTP {s} for {path}",
                        self.host
                    )))
                }
            }
        }
    }

    /// Sends `method` to `target` (a path on the registry, or a URL it gave, such as an
    /// upload's Location) with `body`, answering one auth challenge (the body is sent again,
    /// from its start) and following redirects. Returns the response of any status that is
    /// neither a challenge nor a redirect: the caller says what a refusal means.
    pub(super) fn send(
        &mut self,
        method: &str,
        target: &str,
        content_type: Option<&str>,
        body: &Payload,
    ) -> Result<ureq::http::Response<ureq::Body>, OciError> {
        let headers: Vec<(&str, String)> = content_type
            .map(|t| ("Content-Type", t.to_string()))
            .into_iter()
            .collect();
        self.send_with(method, target, &headers, body)
    }

    /// A chunk of an upload: `body`'s bytes, which start at `offset` of the blob, PATCHed to
    /// the upload's `location` with their Content-Range.
    pub(super) fn send_chunk(
        &mut self,
        location: &str,
        offset: u64,
        size: u64,
        body: &Payload,
    ) -> Result<ureq::http::Response<ureq::Body>, OciError> {
        let headers = [
            ("Content-Type", "application/octet-stream".to_string()),
            (
                "Content-Range",
                format!("{offset}-{}", (offset + size).saturating_sub(1)),
            ),
        ];
        self.send_with("PATCH", location, &headers, body)
    }

    /// [`Client::send`] with these headers.
    fn send_with(
        &mut self,
        method: &str,
        target: &str,
        headers: &[(&str, String)],
        body: &Payload,
    ) -> Result<ureq::http::Response<ureq::Body>, OciError> {
        let mut url = if target.starts_with("http://") || target.starts_with("https://") {
            target.to_string()
        } else {
            format!("{}{target}", self.base)
        };
        let mut challenged = false;
        let mut hops = 0;
        loop {
            let same_host = url.starts_with(&format!("{}/", self.base));
            if !same_host && hops == 0 {
                return Err(OciError::Refused(format!(
                    "the registry {} sent an upload to another host ({url}); refused",
                    self.host
                )));
            }
            let mut req = ureq::http::Request::builder().method(method).uri(&url);
            for (k, v) in headers {
                req = req.header(*k, v);
            }
            if let (true, Some(a)) = (same_host, &self.auth) {
                req = req.header("Authorization", a);
            }
            let sent = match body {
                Payload::Empty => req
                    .header("Content-Length", "0")
                    .body(())
                    .map_err(|e| OciError::Host(format!("cannot make the request: {e}")))
                    .and_then(|r| self.run(r)),
                Payload::Bytes(b) => req
                    .header("Content-Length", b.len().to_string())
                    .body(b.as_slice())
                    .map_err(|e| OciError::Host(format!("cannot make the request: {e}")))
                    .and_then(|r| self.run(r)),
                Payload::File { path, offset, size } => {
                    let mut file = std::fs::File::open(path).map_err(|e| {
                        OciError::Host(format!("cannot read {}: {e}", path.display()))
                    })?;
                    file.seek(SeekFrom::Start(*offset)).map_err(|e| {
                        OciError::Host(format!("cannot read {}: {e}", path.display()))
                    })?;
                    let reader = ureq::SendBody::from_owned_reader(file.take(*size));
                    req.header("Content-Length", size.to_string())
                        .body(reader)
                        .map_err(|e| OciError::Host(format!("cannot make the request: {e}")))
                        .and_then(|r| self.run(r))
                }
            };
            let resp = sent?;
            match resp.status().as_u16() {
                401 if same_host && !challenged => {
                    challenged = true;
                    self.authenticate(&challenge_of(&resp))?;
                }
                401 | 403 => {
                    let status = resp.status().as_u16();
                    let said = registry_words(resp);
                    return Err(self.push_denied(status, said.as_deref()));
                }
                301 | 302 | 303 | 307 | 308 => {
                    if hops >= MAX_REDIRECTS {
                        return Err(OciError::Host(format!("too many redirects for {target}")));
                    }
                    url = self.redirect(&resp)?;
                    hops += 1;
                }
                _ => return Ok(resp),
            }
        }
    }

    /// Runs one request on the session's agent.
    fn run<B: ureq::AsSendBody>(
        &self,
        req: ureq::http::Request<B>,
    ) -> Result<ureq::http::Response<ureq::Body>, OciError> {
        self.agent
            .run(req)
            .map_err(|e| OciError::Host(format!("the registry {} did not answer: {e}", self.host)))
    }

    /// A push refused after the challenge was answered, with what to do.
    fn push_denied(&self, status: u16, said: Option<&str>) -> OciError {
        let theirs = said.map(|m| format!(": {m:?}")).unwrap_or_default();
        OciError::Refused(match &self.basic {
            Some(b) => format!(
                "the registry {} refused a push to {} (HTTP {status}{theirs}) for {}: that user \
                 may not write this repository, or its password or token is wrong (docker login \
                 {} writes them again)",
                self.host,
                self.repo,
                b.said(),
                self.host
            ),
            None => format!(
                "the registry {} refused a push to {} (HTTP {status}{theirs}); log in with a \
                 user that may write it (docker login {} writes ~/.docker/config.json)",
                self.host, self.repo, self.host
            ),
        })
    }

    /// The repository's path on the registry (`/v2/NAME`).
    pub(super) fn repo_path(&self) -> String {
        format!("/v2/{}", self.repo)
    }

    /// Where a redirect goes: https, or plain http only from a loopback registry; a path on
    /// the registry itself.
    fn redirect(&self, resp: &ureq::http::Response<ureq::Body>) -> Result<String, OciError> {
        let status = resp.status().as_u16();
        let loc = resp
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                OciError::Host(format!("the registry answered {status} without a Location"))
            })?;
        if loc.starts_with("https://")
            || (loc.starts_with("http://") && self.base.starts_with("http://"))
        {
            Ok(loc.to_string())
        } else if loc.starts_with("http://") {
            Err(OciError::Refused(format!(
                "the registry {} redirected to plain http ({loc}); refused",
                self.host
            )))
        } else if loc.starts_with('/') {
            Ok(format!("{}{loc}", self.base))
        } else {
            Err(OciError::Host(format!(
                "the registry redirected to {loc:?}"
            )))
        }
    }

    /// Access refused after the challenge was answered, with what to do; `said` is the
    /// registry's own message, when it sent one.
    fn denied(&self, said: Option<&str>) -> OciError {
        let theirs = said.map(|m| format!(": {m:?}")).unwrap_or_default();
        let token_granted = self
            .auth
            .as_deref()
            .is_some_and(|a| a.starts_with("Bearer "));
        OciError::Refused(match (&self.basic, &self.helper) {
            // The token service took the login: the token does not reach this repository.
            (Some(b), _) if token_granted => format!(
                "the registry {} refused access to {} (HTTP 401{theirs}) for {}, whose login \
                 its token service took: that user may not read this repository, or the name \
                 is wrong",
                self.host,
                self.repo,
                b.said()
            ),
            (Some(b), _) => self.bad_login(b, "the registry", 401, said),
            (None, Some(why)) => format!(
                "the registry {} refused access to {} (HTTP 401{theirs}): {why}",
                self.host, self.repo
            ),
            (None, None) => format!(
                "the registry {} refused access to {} (HTTP 401{theirs}); log in (docker login \
                 writes ~/.docker/config.json) or check the name",
                self.host, self.repo
            ),
        })
    }

    /// A refusal of the credentials `b` by `who` (the registry or its token service).
    fn bad_login(&self, b: &Basic, who: &str, status: u16, said: Option<&str>) -> String {
        let theirs = said.map(|m| format!(", saying {m:?}")).unwrap_or_default();
        format!(
            "authentication failed for the registry {}: {who} refused {} for {} (HTTP \
             {status}{theirs}). Check that user and its password or token (docker login {} \
             writes them again), then pull again",
            self.host,
            b.said(),
            self.repo,
            self.host
        )
    }

    /// Answers a `WWW-Authenticate` challenge: a bearer token from its realm (with the basic
    /// credentials when there are some), or the basic credentials themselves.
    fn authenticate(&mut self, challenge: &str) -> Result<(), OciError> {
        let (scheme, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            let b = self.basic.clone().ok_or_else(|| self.denied(None))?;
            self.auth = Some(format!("Basic {}", b.auth));
            return Ok(());
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(OciError::Refused(format!(
                "the registry {} asks for {scheme:?} auth, which mcqemu does not speak",
                self.host
            )));
        }
        self.bearer(params)
    }

    /// A bearer token from the challenge's realm, for its service and scope.
    fn bearer(&mut self, params: &str) -> Result<(), OciError> {
        let param = |k: &str| {
            params.split(',').find_map(|p| {
                let (key, v) = p.trim().split_once('=')?;
                (key.eq_ignore_ascii_case(k)).then(|| v.trim_matches('"').to_string())
            })
        };
        let realm = param("realm").ok_or_else(|| {
            OciError::Refused("the registry's bearer challenge names no realm".into())
        })?;
        if !(realm.starts_with("https://")
            || (realm.starts_with("http://") && self.base.starts_with("http://")))
        {
            return Err(OciError::Refused(format!(
                "the registry's token realm {realm:?} is not https"
            )));
        }
        let scope = match (self.push, param("scope")) {
            (true, _) => format!("repository:{}:pull,push", self.repo),
            (false, Some(s)) => s,
            (false, None) => format!("repository:{}:pull", self.repo),
        };
        let mut url = format!("{realm}?scope={}", enc(&scope));
        if let Some(s) = param("service") {
            url.push_str(&format!("&service={}", enc(&s)));
        }
        let mut rb = self.agent.get(&url);
        if let Some(b) = &self.basic {
            rb = rb.header("Authorization", &format!("Basic {}", b.auth));
        }
        let mut resp = rb.call().map_err(|e| {
            OciError::Host(format!("the token service {realm} did not answer: {e}"))
        })?;
        let status = resp.status().as_u16();
        if status != 200 {
            let said = registry_words(resp);
            let theirs = said
                .as_deref()
                .map(|m| format!(", saying {m:?}"))
                .unwrap_or_default();
            return Err(match (status, &self.basic) {
                (401 | 403, Some(b)) => OciError::Refused(self.bad_login(
                    b,
                    &format!("its token service {realm}"),
                    status,
                    said.as_deref(),
                )),
                (401 | 403, None) => OciError::Refused(format!(
                    "the registry {}'s token service {realm} refused an anonymous pull of {} \
                     (HTTP {status}{theirs}); log in (docker login {} writes \
                     ~/.docker/config.json) or check the name",
                    self.host, self.repo, self.host
                )),
                _ => OciError::Host(format!(
                    "the token service {realm} answered HTTP {status}{theirs}"
                )),
            });
        }
        let body = resp
            .body_mut()
            .with_config()
            .limit(1 << 20)
            .read_to_vec()
            .map_err(|e| OciError::Host(format!("cannot read the token: {e}")))?;
        let v: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| OciError::Invalid(format!("the token is not JSON: {e}")))?;
        let token = v["token"]
            .as_str()
            .or(v["access_token"].as_str())
            .ok_or_else(|| OciError::Host("the token service gave no token".into()))?;
        self.auth = Some(format!("Bearer {token}"));
        Ok(())
    }

    /// A manifest or index, with its media type; checked against `digest` when given.
    pub(super) fn manifest(
        &mut self,
        reference: &str,
        digest: Option<&str>,
    ) -> Result<(Vec<u8>, String), OciError> {
        let path = format!("/v2/{}/manifests/{reference}", self.repo);
        let mut resp = self.get(&path, Some(ACCEPT), 0)?;
        let media_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        let body = resp
            .body_mut()
            .with_config()
            .limit(MAX_MANIFEST)
            .read_to_vec()
            .map_err(|e| OciError::Host(format!("cannot read the manifest {reference}: {e}")))?;
        if let Some(d) = digest {
            let got = format!("sha256:{}", sha256_hex(&body));
            if got != d {
                return Err(OciError::Refused(format!(
                    "the manifest {d} does not match its digest (it hashes to {got})"
                )));
            }
        }
        Ok((body, media_type))
    }

    /// Downloads blob `digest` of `size` bytes to `dest`, through `dest.partial` (resumed when
    /// there), checked before it is renamed into place. Returns the bytes downloaded.
    pub(super) fn blob(
        &mut self,
        digest: &str,
        size: u64,
        dest: &Path,
        progress: &dyn Fn(u64),
        cancelled: &dyn Fn() -> bool,
    ) -> Result<u64, OciError> {
        let partial = dest.with_extension("partial");
        let mut have = std::fs::metadata(&partial).map(|m| m.len()).unwrap_or(0);
        if have > size {
            let _ = std::fs::remove_file(&partial);
            have = 0;
        }
        let path = format!("/v2/{}/blobs/{digest}", self.repo);
        let resp = self.get(&path, None, have)?;
        let resumed = have > 0 && resp.status().as_u16() == 206;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(resumed)
            .write(true)
            .truncate(!resumed)
            .open(&partial)
            .map_err(|e| OciError::Host(format!("cannot write {}: {e}", partial.display())))?;
        let start = if resumed { have } else { 0 };
        let mut body = resp.into_body().into_reader().take(size - start);
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0u64;
        loop {
            if cancelled() {
                return Err(OciError::Cancelled(
                    "cancelled by the client (the partial blob is kept for the next pull)".into(),
                ));
            }
            let n = body.read(&mut buf).map_err(|e| {
                OciError::Host(format!(
                    "the download of {digest} broke off after {} bytes: {e}; pull again to resume",
                    start + got
                ))
            })?;
            if n == 0 {
                break;
            }
            file.write_all(&buf[..n])
                .map_err(|e| OciError::Host(format!("cannot write {}: {e}", partial.display())))?;
            got += n as u64;
            progress(start + got);
        }
        drop(file);
        if start + got != size {
            return Err(OciError::Host(format!(
                "the download of {digest} ended at {} of {size} bytes; pull again to resume",
                start + got
            )));
        }
        let hex = file_sha256(&partial)?;
        if format!("sha256:{hex}") != digest {
            let _ = std::fs::remove_file(&partial);
            return Err(OciError::Refused(format!(
                "the blob {digest} does not match its digest (it hashes to sha256:{hex}); nothing \
                 of it is kept"
            )));
        }
        std::fs::rename(&partial, dest)
            .map_err(|e| OciError::Host(format!("cannot keep {digest}: {e}")))?;
        Ok(got)
    }
}

/// A 401's `WWW-Authenticate` challenge (empty when it sent none).
fn challenge_of(resp: &ureq::http::Response<ureq::Body>) -> String {
    resp.headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

fn file_sha256(path: &Path) -> Result<String, OciError> {
    crate::net::digest::sha256_file(path)
        .map_err(|e| OciError::Host(format!("cannot read {}: {e}", path.display())))
}

/// Percent-encodes a query value.
pub(super) fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(
            enc("repository:library/python:pull"),
            "repository%3Alibrary%2Fpython%3Apull"
        );
    }
}
