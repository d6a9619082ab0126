//! mcqemu's own artifacts in OCI form: a saved guest (a template, a sandbox) as an image
//! manifest whose `artifactType` is ours, whose config is its typed record (JSON), and whose
//! layers are its files, each named by its `org.opencontainers.image.title`. Guest memory
//! travels packed ([`super::sparse`]); every other file as it is, so a disk image shared by
//! two artifacts is one blob (a registry holds it once, and a second push sends only what
//! changed).

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::error::OciError;
use super::push::{Blob, Watch};
use super::registry::{blob_path, open_store};
use super::sparse;
use crate::net::digest::Sha256;

/// The manifest's media type.
pub const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// A file as it is.
pub const FILE_TYPE: &str = "application/vnd.mcqemu.file.v1";
/// A file packed by [`sparse::pack`].
pub const SPARSE_TYPE: &str = "application/vnd.mcqemu.file.sparse.v1";
/// A window of a file packed by [`sparse::pack_window`], then gzipped (fast level): guest
/// memory without its zeros still compresses about threefold.
pub const SPARSE_GZ_TYPE: &str = "application/vnd.mcqemu.file.sparse.v1+gzip";
/// The annotation naming a layer's file.
const TITLE: &str = "org.opencontainers.image.title";
/// The annotation giving a packed file's whole length on each of its windows.
const LENGTH: &str = "vnd.mcqemu.file.length";
/// A packed file travels in windows of this size, each its own blob, so that a second push
/// of memory that changed in a few places sends only the windows that did (a window of
/// zeros is not sent at all). Measured on a guest forking five programs a second between
/// two pushes, the second push sent this share of the first: 2 MiB windows 26 %, 256 KiB
/// 10.6-11.5 %, 128 KiB 8.6-8.9 % (the bound is 10 %). A push of 256 MiB of memory
/// is then about 1,200 blobs, moved four at a time ([`super::parallel`]).
pub const WINDOW: u64 = 128 << 10;
/// Largest manifest or config read back.
const MAX_DOC: u64 = 4 << 20;

/// A file that goes into an artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Its name in the artifact (a file name: no `/`).
    pub title: String,
    /// Where it is.
    pub path: PathBuf,
    /// Packed as a sparse file (guest memory).
    pub sparse: bool,
}

/// An artifact ready to push: its manifest, the manifest's digest, and every blob it names.
#[derive(Debug, Clone)]
pub struct Built {
    /// The manifest.
    pub manifest: Vec<u8>,
    /// Its digest.
    pub digest: String,
    /// The config's blob, then each part's.
    pub blobs: Vec<Blob>,
}

/// Builds an artifact of `artifact_type` from `config` (JSON, of `config_type`) and `parts`:
/// packed parts and the config are written into the layout at `store` (by digest), the others
/// are hashed where they are.
pub fn build(
    store: &Path,
    artifact_type: &str,
    config_type: &str,
    config: &[u8],
    parts: &[Part],
    watch: &Watch,
) -> Result<Built, OciError> {
    open_store(store)?;
    let config_blob = keep_bytes(store, config)?;
    let mut blobs = vec![config_blob.clone()];
    let mut layers = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        if (watch.cancelled)() {
            return Err(OciError::Cancelled("cancelled by the client".into()));
        }
        (watch.progress)(
            i as u64,
            parts.len() as u64,
            &format!("hashing {}", p.title),
        );
        if p.sparse {
            let len = std::fs::metadata(&p.path)
                .map_err(|e| OciError::Host(format!("cannot read {}: {e}", p.path.display())))?
                .len();
            let starts: Vec<u64> = (0..len.max(1)).step_by(WINDOW as usize).collect();
            for (start, blob) in starts.iter().zip(pack_windows(store, &p.path, &starts)?) {
                // The first window always goes: it says the file's length.
                if let Some(blob) = blob {
                    layers.push(json!({
                        "mediaType": SPARSE_GZ_TYPE,
                        "digest": blob.digest,
                        "size": blob.size,
                        "annotations": {TITLE: format!("{}@{start}", p.title),
                                        LENGTH: len.to_string()},
                    }));
                    blobs.push(blob);
                }
            }
            continue;
        }
        let (digest, size) = hash_file(&p.path)?;
        let blob = Blob {
            digest,
            size,
            path: p.path.clone(),
        };
        layers.push(json!({
            "mediaType": FILE_TYPE,
            "digest": blob.digest,
            "size": blob.size,
            "annotations": {TITLE: p.title},
        }));
        blobs.push(blob);
    }
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "artifactType": artifact_type,
        "config": {"mediaType": config_type, "digest": config_blob.digest, "size": config_blob.size},
        "layers": layers,
    })
    .to_string()
    .into_bytes();
    let mut h = Sha256::default();
    h.update(&manifest);
    Ok(Built {
        digest: h.finish(),
        manifest,
        blobs,
    })
}

/// Keeps `bytes` in the store as a blob.
fn keep_bytes(store: &Path, bytes: &[u8]) -> Result<Blob, OciError> {
    let mut h = Sha256::default();
    h.update(bytes);
    let digest = h.finish();
    super::registry::keep(store, &digest, bytes)?;
    Ok(Blob {
        path: blob_path(store, &digest)?,
        size: bytes.len() as u64,
        digest,
    })
}

/// Packs the windows of the file at `src` that start at `starts` into the store, on as many
/// threads as the host has cores (at most four; gzip is most of a push's own time): each
/// window's blob, or None for one of zeros (never the first, which says the file's length).
fn pack_windows(store: &Path, src: &Path, starts: &[u64]) -> Result<Vec<Option<Blob>>, OciError> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 4);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<Option<Blob>> = starts.iter().map(|_| None).collect();
    let done = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&start) = starts.get(i) else { break };
                let r = pack_into(store, src, start, i == 0);
                let failed = r.is_err();
                if let Ok(mut d) = done.lock() {
                    d.push((i, r));
                }
                if failed {
                    next.store(starts.len(), std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    let done = done
        .into_inner()
        .map_err(|_| OciError::Host("a packing thread failed".into()))?;
    for (i, r) in done {
        out[i] = r?;
    }
    Ok(out)
}

/// Packs the window of the file at `src` from `start` into the store, gzipped; None when it
/// holds only zeros (and `always` is false).
fn pack_into(store: &Path, src: &Path, start: u64, always: bool) -> Result<Option<Blob>, OciError> {
    let tmp = store.join(format!(
        "blobs/sha256/.packing-{}-{start}",
        std::process::id()
    ));
    let write = |e: std::io::Error| OciError::Host(format!("cannot write {}: {e}", tmp.display()));
    let file = std::io::BufWriter::new(File::create(&tmp).map_err(write)?);
    let mut out = HashedWriter {
        inner: file,
        hash: Sha256::default(),
        written: 0,
    };
    let packed = {
        let mut gz = flate2::write::GzEncoder::new(&mut out, flate2::Compression::fast());
        sparse::pack_window(src, start, WINDOW, &mut gz)
            .and_then(|(_, _, any)| gz.finish().map(|_| any).map_err(write))
    };
    let flushed = out.inner.flush().map_err(write);
    let any = match packed.and_then(|any| flushed.map(|()| any)) {
        Ok(any) => any,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    if !any && !always {
        let _ = std::fs::remove_file(&tmp);
        return Ok(None);
    }
    let (digest, size) = (out.hash.finish(), out.written);
    let path = blob_path(store, &digest)?;
    std::fs::rename(&tmp, &path).map_err(write)?;
    Ok(Some(Blob { digest, size, path }))
}

/// A writer that hashes and counts what goes through it.
struct HashedWriter<W: Write> {
    inner: W,
    hash: Sha256,
    written: u64,
}

impl<W: Write> Write for HashedWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that hashes what comes through it.
struct HashedReader<R: Read> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Read for HashedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// The digest and length of the file at `path`.
fn hash_file(path: &Path) -> Result<(String, u64), OciError> {
    let read = |e: std::io::Error| OciError::Host(format!("cannot read {}: {e}", path.display()));
    let mut f = File::open(path).map_err(read)?;
    let mut h = Sha256::default();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(read)?;
        if n == 0 {
            return Ok((h.finish(), size));
        }
        h.update(&buf[..n]);
        size += n as u64;
    }
}

/// One layer of an artifact read back: a file, or a window of a packed one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    /// The file's name.
    pub title: String,
    /// For a window of a packed file: where it starts, and the file's whole length.
    pub window: Option<(u64, u64)>,
    /// Its blob's digest.
    pub digest: String,
    /// Its blob's length.
    pub size: u64,
    /// Packed (guest memory).
    pub sparse: bool,
    /// Gzipped after packing.
    pub gzip: bool,
    /// Its blob in the layout.
    pub blob: PathBuf,
}

/// An artifact read back from a layout.
#[derive(Debug, Clone)]
pub struct Opened {
    /// Its manifest's digest.
    pub digest: String,
    /// Its config (JSON).
    pub config: Vec<u8>,
    /// Its files.
    pub layers: Vec<Layer>,
}

/// Reads the artifact named `name` in the layout at `dir` (its index's ref name; None: the
/// only manifest there), refusing one of another type.
pub fn open(dir: &Path, name: Option<&str>, artifact_type: &str) -> Result<Opened, OciError> {
    let index: Value = serde_json::from_slice(&read_small(&dir.join("index.json"))?)
        .map_err(|e| OciError::Invalid(format!("{}/index.json is not JSON: {e}", dir.display())))?;
    let entries = index["manifests"].as_array().cloned().unwrap_or_default();
    let named = |m: &&Value| match name {
        Some(n) => m["annotations"]["org.opencontainers.image.ref.name"] == n,
        None => true,
    };
    let found: Vec<&Value> = entries.iter().filter(named).collect();
    let entry = match found.as_slice() {
        [one] => *one,
        [] => {
            return Err(OciError::NotFound(format!(
                "{} holds nothing named {}",
                dir.display(),
                name.unwrap_or("(any)")
            )))
        }
        _ => {
            return Err(OciError::Invalid(format!(
                "{} holds several manifests; name one with :TAG",
                dir.display()
            )))
        }
    };
    let digest = entry["digest"]
        .as_str()
        .ok_or_else(|| OciError::Invalid("an index entry has no digest".into()))?
        .to_string();
    let manifest = read_checked(&blob_path(dir, &digest)?, &digest)?;
    let m: Value = serde_json::from_slice(&manifest)
        .map_err(|e| OciError::Invalid(format!("the manifest is not JSON: {e}")))?;
    if m["artifactType"] != artifact_type {
        return Err(OciError::Invalid(format!(
            "{} is a {} artifact, not a {artifact_type}; pull it with the tool for what it is",
            name.unwrap_or("the manifest"),
            m["artifactType"]
                .as_str()
                .unwrap_or("container image or other")
        )));
    }
    let config_digest = m["config"]["digest"]
        .as_str()
        .ok_or_else(|| OciError::Invalid("the manifest's config has no digest".into()))?;
    let config = read_checked(&blob_path(dir, config_digest)?, config_digest)?;
    let mut layers = Vec::new();
    for l in m["layers"].as_array().into_iter().flatten() {
        let named = l["annotations"][TITLE].as_str().unwrap_or("");
        let gzip = l["mediaType"] == SPARSE_GZ_TYPE;
        let sparse = gzip || l["mediaType"] == SPARSE_TYPE;
        let (title, window) = match (sparse, named.split_once('@')) {
            (true, Some((t, at))) => {
                let at: u64 = at.parse().map_err(|_| bad_title(named))?;
                let len: u64 = l["annotations"][LENGTH]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .filter(|len: &u64| *len <= sparse::MAX_LEN && at < (*len).max(1))
                    .ok_or_else(|| bad_title(named))?;
                (t, Some((at, len)))
            }
            _ => (named, None),
        };
        if title.is_empty() || title.contains(['/', '@']) || title.starts_with('.') {
            return Err(bad_title(named));
        }
        let (Some(d), Some(size)) = (l["digest"].as_str(), l["size"].as_u64()) else {
            return Err(OciError::Invalid("a layer has no digest or size".into()));
        };
        layers.push(Layer {
            title: title.to_string(),
            window,
            digest: d.to_string(),
            size,
            sparse,
            gzip,
            blob: blob_path(dir, d)?,
        });
    }
    Ok(Opened {
        digest,
        config,
        layers,
    })
}

fn bad_title(title: &str) -> OciError {
    OciError::Refused(format!(
        "a layer's title {title:?} is not a plain file name (or a window of one)"
    ))
}

impl Opened {
    /// The names of its files, each once, in order.
    pub fn titles(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for l in &self.layers {
            if !out.contains(&l.title.as_str()) {
                out.push(&l.title);
            }
        }
        out
    }

    /// Writes its file `title` to `dest`: its one layer, or every window of a packed one.
    pub fn extract(&self, title: &str, dest: &Path) -> Result<(), OciError> {
        let parts: Vec<&Layer> = self.layers.iter().filter(|l| l.title == title).collect();
        match parts.as_slice() {
            [one] if one.window.is_none() => extract(one, dest),
            _ => extract_windows(&parts, dest),
        }
    }
}

/// Writes the windows of a packed file to `dest` (created at its whole length, sparse), each
/// checked against its digest; on any failure nothing is left at `dest`.
fn extract_windows(parts: &[&Layer], dest: &Path) -> Result<(), OciError> {
    let Some((_, len)) = parts.first().and_then(|l| l.window) else {
        return Err(OciError::Invalid(
            "a file is given twice, not in windows".into(),
        ));
    };
    let write = |e: std::io::Error| OciError::Host(format!("cannot write {}: {e}", dest.display()));
    let mut out = File::create(dest).map_err(write)?;
    let done = fill_windows(parts, &mut out, len).and_then(|()| out.sync_all().map_err(write));
    if done.is_err() {
        let _ = std::fs::remove_file(dest);
    }
    done
}

fn fill_windows(parts: &[&Layer], out: &mut File, len: u64) -> Result<(), OciError> {
    out.set_len(len)
        .map_err(|e| OciError::Host(format!("cannot write the unpacked file: {e}")))?;
    let mut seen = Vec::new();
    for l in parts {
        let Some((at, total)) = l.window.filter(|(at, t)| *t == len && at % WINDOW == 0) else {
            return Err(OciError::Refused(format!(
                "{}'s windows disagree on its length or start off their grid",
                l.title
            )));
        };
        if seen.contains(&at) {
            return Err(OciError::Refused(format!(
                "{} has two windows at {at}",
                l.title
            )));
        }
        seen.push(at);
        let src = File::open(&l.blob).map_err(|e| {
            OciError::NotFound(format!("the blob {} is not in the layout: {e}", l.digest))
        })?;
        let room = (total - at).min(WINDOW);
        let got = if l.gzip {
            unpack_gzipped(src, out, at, room)?
        } else {
            sparse::unpack_into(&mut { src }, out, at, Some(room), &|_| Ok(()))?
        };
        if got != l.digest {
            return Err(OciError::Refused(format!(
                "the blob {} ({} at {at}) does not match its digest (it hashes to {got}); \
                 nothing of it is used",
                l.digest, l.title
            )));
        }
    }
    Ok(())
}

/// Unpacks a gzipped window read from `src` into `out` at `at` (at most `room` bytes); returns
/// the digest of the gzipped bytes. What the window inflates to is bounded: its records and
/// data cannot be more than twice its room (a bomb stops there, damaged).
fn unpack_gzipped(src: File, out: &mut File, at: u64, room: u64) -> Result<String, OciError> {
    let mut hashed = HashedReader {
        inner: src,
        hash: Sha256::default(),
    };
    let limit = room.saturating_mul(2).saturating_add(4096);
    {
        let mut inflated = flate2::read::GzDecoder::new(&mut hashed).take(limit);
        sparse::unpack_into(&mut inflated, out, at, Some(room), &|_| Ok(()))?;
    }
    // The rest of the blob (its gzip trailer, anything after it) counts in its digest too.
    std::io::copy(&mut hashed, &mut std::io::sink())
        .map_err(|e| OciError::Host(format!("cannot read a blob: {e}")))?;
    Ok(hashed.hash.finish())
}

/// A small document of the layout (an index, a manifest, a config).
fn read_small(path: &Path) -> Result<Vec<u8>, OciError> {
    let f = File::open(path)
        .map_err(|e| OciError::NotFound(format!("cannot read {}: {e}", path.display())))?;
    let mut out = Vec::new();
    f.take(MAX_DOC)
        .read_to_end(&mut out)
        .map_err(|e| OciError::Host(format!("cannot read {}: {e}", path.display())))?;
    Ok(out)
}

/// A small blob, checked against its digest.
fn read_checked(path: &Path, digest: &str) -> Result<Vec<u8>, OciError> {
    let bytes = read_small(path)?;
    let mut h = Sha256::default();
    h.update(&bytes);
    let got = h.finish();
    if got != digest {
        return Err(OciError::Refused(format!(
            "the blob {digest} does not match its digest (it hashes to {got})"
        )));
    }
    Ok(bytes)
}

/// Writes layer `l` to `dest` (unpacking a packed one), checking its digest as it goes; on a
/// mismatch nothing is left at `dest`.
fn extract(l: &Layer, dest: &Path) -> Result<(), OciError> {
    let read = |e: std::io::Error| OciError::Host(format!("cannot read {}: {e}", l.blob.display()));
    let mut src = File::open(&l.blob).map_err(|e| {
        OciError::NotFound(format!("the blob {} is not in the layout: {e}", l.digest))
    })?;
    let got = if l.sparse {
        sparse::unpack(&mut src, dest)
    } else {
        copy_hashed(&mut src, dest).map_err(|e| match e {
            Copy::Read(e) => read(e),
            Copy::Write(e) => OciError::Host(format!("cannot write {}: {e}", dest.display())),
        })
    };
    match got {
        Ok(d) if d == l.digest => Ok(()),
        Ok(d) => {
            let _ = std::fs::remove_file(dest);
            Err(OciError::Refused(format!(
                "the blob {} ({}) does not match its digest (it hashes to {d}); nothing of it \
                 is used",
                l.digest, l.title
            )))
        }
        Err(e) => {
            let _ = std::fs::remove_file(dest);
            Err(e)
        }
    }
}

enum Copy {
    Read(std::io::Error),
    Write(std::io::Error),
}

/// Copies `src` to a new file `dest`, hashing it.
fn copy_hashed(src: &mut File, dest: &Path) -> Result<String, Copy> {
    let mut out = File::create(dest).map_err(Copy::Write)?;
    let mut h = Sha256::default();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = src.read(&mut buf).map_err(Copy::Read)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(Copy::Write)?;
    }
    out.sync_all().map_err(Copy::Write)?;
    Ok(h.finish())
}
