//! The OCI distribution API over ureq: an image's manifests and blobs fetched from a registry
//! into a local OCI layout (the store), so that [`super::layout`] reads it like any other.
//! Every blob is checked against its digest before it is kept, and kept by digest, so a second
//! pull of anything already held downloads nothing; an interrupted blob resumes from its
//! partial file. Auth: anonymous bearer tokens from `WWW-Authenticate` (as Docker Hub and
//! ghcr answer), with the user's basic credentials from `~/.docker/config.json` `auths` when
//! it has some (credentials a helper keeps are named when the registry refuses an anonymous
//! pull). Plain http only for a registry on this machine.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::error::OciError;
use super::layout::{blob_name, platform_arch, sha256_hex};
use super::reference::Reference;
use crate::net::digest::hex;

/// Media types a manifest request accepts.
const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.docker.distribution.manifest.v2+json";
/// Largest manifest or index read.
const MAX_MANIFEST: u64 = 4 << 20;
/// Most redirects followed for one request.
const MAX_REDIRECTS: usize = 8;

/// What a fetch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The name the image has in the store's index (`org.opencontainers.image.ref.name`).
    pub name: String,
    /// Bytes downloaded (0 when the store held everything).
    pub downloaded: u64,
}

/// Fetches `r` (the variant for `guest_arch`) into the layout at `store`.
pub fn fetch(
    r: &Reference,
    store: &Path,
    guest_arch: &str,
    progress: &dyn Fn(u64, u64, &str),
    cancelled: &dyn Fn() -> bool,
) -> Result<Fetched, OciError> {
    open_store(store)?;
    let mut c = Client::new(r)?;
    let (top, top_type) = c.manifest(r.manifest_ref(), r.digest.as_deref())?;
    let top_digest = format!("sha256:{}", sha256_hex(&top));
    keep(store, &top_digest, &top)?;
    let mut manifest = top.clone();
    if is_index(&top_type, &top) {
        let arch = platform_arch(guest_arch);
        let digest = pick(&top, arch)?;
        let (m, _) = c.manifest(&digest, Some(&digest))?;
        keep(store, &digest, &m)?;
        manifest = m;
    }
    let m: serde_json::Value = serde_json::from_slice(&manifest)
        .map_err(|e| OciError::Invalid(format!("the manifest is not JSON: {e}")))?;
    let mut blobs = vec![&m["config"]];
    blobs.extend(m["layers"].as_array().into_iter().flatten());
    let total: u64 = blobs.iter().filter_map(|b| b["size"].as_u64()).sum();
    let mut downloaded = 0;
    let mut done = 0;
    for b in blobs {
        if cancelled() {
            return Err(OciError::Cancelled("cancelled by the client".into()));
        }
        let (Some(digest), Some(size)) = (b["digest"].as_str(), b["size"].as_u64()) else {
            return Err(OciError::Invalid(
                "the manifest names a blob without a digest or size".into(),
            ));
        };
        let path = blob_path(store, digest)?;
        if std::fs::metadata(&path).is_ok_and(|m| m.len() == size) {
            done += size;
            continue;
        }
        progress(done, total, &format!("downloading {digest}"));
        downloaded += c.blob(
            digest,
            size,
            &path,
            &|n| progress(done + n, total, digest),
            cancelled,
        )?;
        done += size;
    }
    let name = r.to_string();
    add_to_index(store, &name, &top_digest, &top_type, top.len() as u64)?;
    Ok(Fetched { name, downloaded })
}

/// Makes `store` an OCI layout if it is not one yet.
pub(super) fn open_store(store: &Path) -> Result<(), OciError> {
    std::fs::create_dir_all(store.join("blobs/sha256"))
        .map_err(|e| OciError::Host(format!("cannot create {}: {e}", store.display())))?;
    let marker = store.join("oci-layout");
    if !marker.exists() {
        std::fs::write(&marker, br#"{"imageLayoutVersion":"1.0.0"}"#)
            .map_err(|e| OciError::Host(format!("cannot write {}: {e}", marker.display())))?;
    }
    Ok(())
}

fn is_index(media_type: &str, body: &[u8]) -> bool {
    media_type.contains("index")
        || media_type.contains("manifest.list")
        || (media_type.is_empty()
            && serde_json::from_slice::<serde_json::Value>(body)
                .is_ok_and(|v| v.get("manifests").is_some()))
}

/// The digest of the index's linux/`arch` manifest.
fn pick(index: &[u8], arch: &str) -> Result<String, OciError> {
    let v: serde_json::Value = serde_json::from_slice(index)
        .map_err(|e| OciError::Invalid(format!("the image index is not JSON: {e}")))?;
    v["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["platform"]["os"] == "linux" && m["platform"]["architecture"] == arch)
        .and_then(|m| m["digest"].as_str())
        .map(str::to_string)
        .ok_or_else(|| OciError::NotFound(format!("the image has no linux/{arch} variant")))
}

pub(super) fn blob_path(store: &Path, digest: &str) -> Result<PathBuf, OciError> {
    Ok(store.join("blobs/sha256").join(blob_name(digest)?))
}

/// Keeps a small blob already checked against `digest`.
pub(super) fn keep(store: &Path, digest: &str, bytes: &[u8]) -> Result<(), OciError> {
    let path = blob_path(store, digest)?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| OciError::Host(format!("cannot keep {digest}: {e}")))
}

/// Names the image `name` in the store's index (replacing an older entry of that name).
pub(super) fn add_to_index(
    store: &Path,
    name: &str,
    digest: &str,
    media_type: &str,
    size: u64,
) -> Result<(), OciError> {
    let path = store.join("index.json");
    let mut index: serde_json::Value = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| serde_json::json!({"schemaVersion": 2, "manifests": []}));
    let media_type = if media_type.is_empty() {
        "application/vnd.oci.image.manifest.v1+json"
    } else {
        media_type
    };
    let entry = serde_json::json!({"mediaType": media_type, "digest": digest, "size": size,
        "annotations": {"org.opencontainers.image.ref.name": name}});
    let list = index["manifests"]
        .as_array_mut()
        .ok_or_else(|| OciError::Host("the store's index.json is damaged".into()))?;
    list.retain(|m| m["annotations"]["org.opencontainers.image.ref.name"] != name);
    list.push(entry);
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, index.to_string())
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| OciError::Host(format!("cannot write {}: {e}", path.display())))
}

/// What the Docker config says of a host's credentials.
#[derive(Debug, PartialEq, Eq)]
enum Creds {
    /// None: pull anonymously.
    None,
    /// The `auths` entry's base64 `user:password`.
    Basic(String),
    /// Kept by a credential helper, which mcqemu does not run: said when the registry refuses
    /// an anonymous pull.
    Helper(String),
}

/// Credentials for `host` from the Docker config (`$DOCKER_CONFIG/config.json`, else
/// `~/.docker/config.json`).
fn credentials(host: &str) -> Result<Creds, OciError> {
    let file = match std::env::var_os("DOCKER_CONFIG") {
        Some(d) => PathBuf::from(d).join("config.json"),
        None => match std::env::var_os("HOME") {
            Some(h) => PathBuf::from(h).join(".docker/config.json"),
            None => return Ok(Creds::None),
        },
    };
    creds_in(&file, host)
}

/// [`credentials`] from the config file `file`.
fn creds_in(file: &Path, host: &str) -> Result<Creds, OciError> {
    let Ok(bytes) = std::fs::read(file) else {
        return Ok(Creds::None);
    };
    let v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| OciError::Invalid(format!("{} is not JSON: {e}", file.display())))?;
    let keys = [
        host.to_string(),
        format!("https://{host}"),
        format!("http://{host}"),
    ];
    let hub = host == "registry-1.docker.io";
    for (k, a) in v["auths"].as_object().into_iter().flatten() {
        let k = k.trim_end_matches('/');
        let ok = keys.iter().any(|x| x == k)
            || (hub && (k.contains("index.docker.io") || k == "docker.io"));
        if let (true, Some(auth)) = (ok, a["auth"].as_str()) {
            return Ok(Creds::Basic(auth.to_string()));
        }
    }
    let helper = v["credHelpers"][host].as_str().or(v["credsStore"].as_str());
    Ok(match helper {
        Some(h) => Creds::Helper(format!(
            "{} keeps the credentials for {host} in the helper docker-credential-{h}, which \
             mcqemu does not run; add an auths entry for {host} (base64 of user:password)",
            file.display()
        )),
        None => Creds::None,
    })
}

/// One registry session: the agent, the repository, and the token once one is granted.
struct Client {
    agent: ureq::Agent,
    base: String,
    host: String,
    repo: String,
    auth: Option<String>,
    basic: Option<String>,
    /// Why there are no credentials although the user has some (a helper keeps them).
    helper: Option<String>,
}

impl Client {
    fn new(r: &Reference) -> Result<Client, OciError> {
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
        })
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
                    let how = resp
                        .headers()
                        .get("www-authenticate")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string();
                    self.authenticate(&how)?;
                }
                300..=399 => {
                    if hops >= MAX_REDIRECTS {
                        return Err(OciError::Host(format!("too many redirects for {path}")));
                    }
                    url = self.redirect(&resp)?;
                    hops += 1;
                }
                401 => return Err(self.denied()),
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

    /// Access refused after the challenge was answered, with what to do.
    fn denied(&self) -> OciError {
        OciError::Refused(match &self.helper {
            Some(why) => format!(
                "the registry {} refused access to {} (HTTP 401): {why}",
                self.host, self.repo
            ),
            None => format!(
                "the registry {} refused access to {} (HTTP 401); log in (docker login writes \
                 ~/.docker/config.json) or check the name",
                self.host, self.repo
            ),
        })
    }

    /// Answers a `WWW-Authenticate` challenge: a bearer token from its realm (with the basic
    /// credentials when there are some), or the basic credentials themselves.
    fn authenticate(&mut self, challenge: &str) -> Result<(), OciError> {
        let (scheme, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            let b = self.basic.clone().ok_or_else(|| self.denied())?;
            self.auth = Some(format!("Basic {b}"));
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
        let scope = param("scope").unwrap_or_else(|| format!("repository:{}:pull", self.repo));
        let mut url = format!("{realm}?scope={}", enc(&scope));
        if let Some(s) = param("service") {
            url.push_str(&format!("&service={}", enc(&s)));
        }
        let mut rb = self.agent.get(&url);
        if let Some(b) = &self.basic {
            rb = rb.header("Authorization", &format!("Basic {b}"));
        }
        let mut resp = rb.call().map_err(|e| {
            OciError::Host(format!("the token service {realm} did not answer: {e}"))
        })?;
        if resp.status().as_u16() != 200 {
            return Err(OciError::Host(format!(
                "the token service {realm} answered HTTP {}",
                resp.status().as_u16()
            )));
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
    fn manifest(
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
    fn blob(
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

fn file_sha256(path: &Path) -> Result<String, OciError> {
    let mut f = std::fs::File::open(path)
        .map_err(|e| OciError::Host(format!("cannot read {}: {e}", path.display())))?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| OciError::Host(format!("cannot read {}: {e}", path.display())))?;
        if n == 0 {
            break;
        }
        ctx.update(&buf[..n]);
    }
    Ok(hex(ctx.finish().as_ref()))
}

/// Percent-encodes a query value.
fn enc(s: &str) -> String {
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
    fn credentials_come_from_auths_and_a_helper_is_named() {
        let f = std::env::temp_dir().join(format!("mcq-docker-config-{}.json", std::process::id()));
        std::fs::write(
            &f,
            r#"{"auths": {"https://ghcr.io": {"auth": "dTpw"}, "https://index.docker.io/v1/": {"auth": "aHViOnB3"}},
                "credHelpers": {"quay.io": "secretservice"}}"#,
        )
        .unwrap();
        assert_eq!(
            creds_in(&f, "ghcr.io").unwrap(),
            Creds::Basic("dTpw".into())
        );
        assert_eq!(
            creds_in(&f, "registry-1.docker.io").unwrap(),
            Creds::Basic("aHViOnB3".into())
        );
        match creds_in(&f, "quay.io").unwrap() {
            Creds::Helper(why) => assert!(why.contains("docker-credential-secretservice"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(creds_in(&f, "127.0.0.1:5000").unwrap(), Creds::None);
        let _ = std::fs::remove_file(&f);
        assert_eq!(
            creds_in(&f, "ghcr.io").unwrap(),
            Creds::None,
            "no config: anonymous"
        );
    }

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(
            enc("repository:library/python:pull"),
            "repository%3Alibrary%2Fpython%3Apull"
        );
    }

    #[test]
    fn an_index_names_the_guests_platform() {
        let idx = br#"{"manifests":[{"digest":"sha256:a","platform":{"os":"linux","architecture":"amd64"}},
                                    {"digest":"sha256:b","platform":{"os":"linux","architecture":"arm64"}}]}"#;
        assert_eq!(pick(idx, "arm64").unwrap(), "sha256:b");
        assert!(pick(idx, "s390x")
            .unwrap_err()
            .msg()
            .contains("linux/s390x"));
        assert!(is_index("", idx));
        assert!(!is_index(
            "application/vnd.oci.image.manifest.v1+json",
            b"{}"
        ));
    }
}
