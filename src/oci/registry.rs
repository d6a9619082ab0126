//! The OCI distribution API over ureq: an image's manifests and blobs fetched from a registry
//! into a local OCI layout (the store), so that [`super::layout`] reads it like any other.
//! Every blob is checked against its digest before it is kept, and kept by digest, so a second
//! pull of anything already held downloads nothing; an interrupted blob resumes from its
//! partial file. Auth: anonymous bearer tokens from `WWW-Authenticate` (as Docker Hub and
//! ghcr answer), with the user's basic credentials from `~/.docker/config.json` `auths` when
//! it has some (credentials a helper keeps are named when the registry refuses an anonymous
//! pull; [`super::auth`] reads them and the registry's words when it refuses). Plain http only
//! for a registry on this machine.

use std::path::{Path, PathBuf};

use super::client::Client;
use super::error::OciError;
use super::layout::{blob_name, platform_arch, sha256_hex};
use super::origins::Origins;
use super::parallel::{self, Mover};
use super::reference::Reference;

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
    let mut listed = vec![&m["config"]];
    listed.extend(m["layers"].as_array().into_iter().flatten());
    let mut blobs: Vec<(String, u64)> = Vec::new();
    for b in listed {
        let (Some(digest), Some(size)) = (b["digest"].as_str(), b["size"].as_u64()) else {
            return Err(OciError::Invalid(
                "the manifest names a blob without a digest or size".into(),
            ));
        };
        if !blobs.iter().any(|(d, _)| d == digest) {
            blobs.push((digest.to_string(), size));
        }
    }
    let total: u64 = blobs.iter().map(|(_, size)| size).sum();
    let mut held = 0;
    let mut missing = Vec::new();
    for (digest, size) in blobs {
        let path = blob_path(store, &digest)?;
        if std::fs::metadata(&path).is_ok_and(|m| m.len() == size) {
            held += size;
        } else {
            missing.push((digest, size, path));
        }
    }
    progress(held, total, "downloading");
    let session = || Client::new(r);
    let one = |c: &mut Client, (digest, size, path): &(String, u64, PathBuf), m: &Mover| {
        c.blob(digest, *size, path, &|n| m.moved(n), &|| m.stopped())
    };
    let said = |n: u64| progress(held + n, total, "downloading");
    let downloaded = parallel::each(&missing, &session, &one, &said, cancelled)?
        .into_iter()
        .sum();
    if !missing.is_empty() {
        let mut origins = Origins::load(store);
        origins.add(
            missing.iter().map(|(d, _, _)| d.as_str()),
            r.api_host(),
            &r.repository,
        );
        // Losing what is remembered costs bytes on a later push, never the pull.
        let _ = origins.save();
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

#[cfg(test)]
mod tests {
    use super::*;

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
