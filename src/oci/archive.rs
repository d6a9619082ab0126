//! A `docker save` tarball (`docker-archive:FILE`) brought into the image store, so it is read
//! like any pulled image: in one pass every file of the archive is copied out and hashed, then
//! its `manifest.json` names the config and the layers, which are kept by digest beside an OCI
//! manifest written for them. Both of Docker's forms are read: the classic one (`ID/layer.tar`,
//! a layer shared by two images a symlink) and Docker 25's (an OCI layout inside, whose blobs
//! are what manifest.json names). Names are only looked up, never followed out of the archive.

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};

use super::error::OciError;
use super::registry::{add_to_index, blob_path, keep, open_store};
use crate::net::digest::hex;
use crate::state::tar::{Kind, Reader};

/// The largest manifest.json read.
const MAX_MANIFEST: u64 = 1 << 20;
/// Symlinks followed from one name at most.
const MAX_HOPS: usize = 8;
/// Entries an archive may hold (each file is copied out once): a `docker save` of one image
/// holds a few per layer.
const MAX_ENTRIES: usize = 100_000;

/// What an archive entry became.
enum Held {
    /// Copied out to a scratch file, with its digest and size.
    File(PathBuf, String, u64),
    /// A symlink to another entry (its target, relative to the archive's root).
    Link(String),
}

/// The image of the archive at `file` in the store at `store`; the name it has in the store's
/// index (as [`super::registry::fetch`] gives a pulled image's).
pub fn import(file: &Path, store: &Path, cancelled: &dyn Fn() -> bool) -> Result<String, OciError> {
    open_store(store)?;
    let scratch = store.join(format!("import-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)
        .map_err(|e| OciError::Host(format!("cannot create {}: {e}", scratch.display())))?;
    let result = import_in(file, store, &scratch, cancelled);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn import_in(
    file: &Path,
    store: &Path,
    scratch: &Path,
    cancelled: &dyn Fn() -> bool,
) -> Result<String, OciError> {
    let shown = file.display().to_string();
    let (held, manifest) = read_entries(file, scratch, cancelled)?;
    let v: serde_json::Value = serde_json::from_slice(&manifest)
        .map_err(|e| OciError::Invalid(format!("{shown}: manifest.json is not JSON: {e}")))?;
    let image = &v[0];
    let config_name = image["Config"]
        .as_str()
        .ok_or_else(|| OciError::Invalid(format!("{shown}: manifest.json names no Config")))?;
    let config = place(store, &held, config_name, &shown)?;
    let mut layers = Vec::new();
    for l in image["Layers"].as_array().into_iter().flatten() {
        let name = l
            .as_str()
            .ok_or_else(|| OciError::Invalid(format!("{shown}: a layer name is not text")))?;
        let (digest, size) = place(store, &held, name, &shown)?;
        let media_type = layer_type(&blob_path(store, &digest)?);
        layers.push(serde_json::json!({"mediaType": media_type, "digest": digest, "size": size}));
    }
    let m = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config.0, "size": config.1},
        "layers": layers,
    })
    .to_string();
    let digest = format!("sha256:{}", super::layout::sha256_hex(m.as_bytes()));
    keep(store, &digest, m.as_bytes())?;
    let tag = image["RepoTags"][0].as_str().unwrap_or("untagged");
    let name = format!("docker-archive:{shown}#{tag}");
    add_to_index(
        store,
        &name,
        &digest,
        "application/vnd.oci.image.manifest.v1+json",
        m.len() as u64,
    )?;
    Ok(name)
}

/// Every file of the archive copied out to `scratch` and hashed, every symlink noted, and
/// manifest.json's bytes.
fn read_entries(
    file: &Path,
    scratch: &Path,
    cancelled: &dyn Fn() -> bool,
) -> Result<(HashMap<String, Held>, Vec<u8>), OciError> {
    let shown = file.display();
    let f = std::fs::File::open(file)
        .map_err(|e| OciError::NotFound(format!("cannot open the archive {shown}: {e}")))?;
    let bad =
        |e: std::io::Error| OciError::Invalid(format!("{shown} is not a docker save tarball: {e}"));
    let mut r = Reader::new(BufReader::with_capacity(1 << 20, f));
    let mut held: HashMap<String, Held> = HashMap::new();
    let mut manifest = None;
    while let Some(e) = r.next_entry().map_err(bad)? {
        if cancelled() {
            return Err(OciError::Cancelled("cancelled by the client".into()));
        }
        if held.len() >= MAX_ENTRIES {
            return Err(OciError::Refused(format!(
                "{shown} holds more than {MAX_ENTRIES} entries: not a docker save of one image"
            )));
        }
        let name = clean(&String::from_utf8_lossy(&e.path));
        match e.kind {
            Kind::File if name == "manifest.json" => {
                if e.size > MAX_MANIFEST {
                    return Err(OciError::Invalid(format!(
                        "{shown}: manifest.json is too large"
                    )));
                }
                let mut v = Vec::new();
                r.data(&mut v).map_err(bad)?;
                manifest = Some(v);
            }
            Kind::File => {
                let path = scratch.join(held.len().to_string());
                let out = std::fs::File::create(&path)
                    .map_err(|e| OciError::Host(format!("cannot write {}: {e}", path.display())))?;
                let mut w = Hashing {
                    out,
                    ctx: ring::digest::Context::new(&ring::digest::SHA256),
                };
                let size = r.data(&mut w).map_err(bad)?;
                let digest = format!("sha256:{}", hex(w.ctx.finish().as_ref()));
                held.insert(name, Held::File(path, digest, size));
            }
            Kind::Symlink => {
                let link = String::from_utf8_lossy(&e.link).into_owned();
                let dir = name.rsplit_once('/').map_or("", |(d, _)| d);
                held.insert(name.clone(), Held::Link(clean(&format!("{dir}/{link}"))));
            }
            _ => {}
        }
    }
    let manifest = manifest.ok_or_else(|| {
        OciError::Invalid(format!(
            "{shown} has no manifest.json: not a docker save tarball"
        ))
    })?;
    Ok((held, manifest))
}

/// Moves the entry `name` names (through symlinks in the archive) into the store's blobs; its
/// digest and size.
fn place(
    store: &Path,
    held: &HashMap<String, Held>,
    name: &str,
    archive: &str,
) -> Result<(String, u64), OciError> {
    let mut at = clean(name);
    for _ in 0..MAX_HOPS {
        match held.get(&at) {
            Some(Held::Link(to)) => at = to.clone(),
            Some(Held::File(path, digest, size)) => {
                let dest = blob_path(store, digest)?;
                // A second name for the same file finds it moved already.
                if !dest.exists() {
                    std::fs::rename(path, &dest)
                        .map_err(|e| OciError::Host(format!("cannot keep {digest}: {e}")))?;
                }
                return Ok((digest.clone(), *size));
            }
            None => break,
        }
    }
    Err(OciError::Invalid(format!(
        "{archive}: manifest.json names {name:?}, which the archive does not hold"
    )))
}

/// A layer's media type, from its first bytes.
fn layer_type(path: &Path) -> &'static str {
    let mut head = [0u8; 4];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    match &head[..n] {
        [0x1f, 0x8b, ..] => "application/vnd.oci.image.layer.v1.tar+gzip",
        [0x28, 0xb5, 0x2f, 0xfd] => "application/vnd.oci.image.layer.v1.tar+zstd",
        _ => "application/vnd.oci.image.layer.v1.tar",
    }
}

/// A name inside the archive with `.`, empty parts and `..` resolved (never above its root).
fn clean(name: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for p in name.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.join("/")
}

/// A writer that hashes what passes through.
struct Hashing {
    out: std::fs::File,
    ctx: ring::digest::Context,
}

impl Write for Hashing {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.ctx.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_inside_the_archive_only() {
        assert_eq!(clean("./abc/layer.tar"), "abc/layer.tar");
        assert_eq!(clean("abc/../def/layer.tar"), "def/layer.tar");
        assert_eq!(clean("../../etc/passwd"), "etc/passwd");
        assert_eq!(clean("blobs//sha256/x"), "blobs/sha256/x");
    }
}
