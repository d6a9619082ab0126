//! image_pull's `oci`: a container image made into a VM root, once per image digest. The
//! image is read (every blob checked against its digest), its layers are applied into a
//! folder and that folder becomes an ext4 image with the image's owners, modes and file
//! capabilities; it is cached as `<state>/oci/<digest>/root.ext4`, so a second pull of the
//! same image builds nothing (only its manifest and config are read again).
//!
//! Sources: registries (their blobs kept by digest in `<state>/oci/store`, an OCI layout, so
//! nothing held is downloaded twice) and OCI image layouts (`oci:DIR[:tag]`, what `skopeo
//! copy` and umoci write). `docker save` tarballs are parsed and refused with the way round
//! (`skopeo copy docker-archive:FILE oci:DIR:TAG`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::oci::layout::{self, RunConfig};
use crate::oci::reference::{self, Reference, Source};
use crate::oci::{registry, rootfs, unpack};
use crate::ops::error::OpError;
use crate::ops::work::Work;
use crate::state::lockfile;
use crate::state::paths;
use crate::state::roots::{self, Access};
use crate::state::tree::Folder;

/// Largest unpacked image, in MiB, unless `MCQEMU_MAX_IMAGE_MB` says otherwise.
const DEFAULT_MAX_MB: u64 = 16 * 1024;
/// How long a pull waits for another server building the same image.
const BUILD_WAIT: Duration = Duration::from_secs(1800);

/// What to pull.
#[derive(Debug, Clone)]
pub struct OciRequest {
    /// The reference as the user wrote it.
    pub reference: String,
    /// The guest architecture whose variant is wanted.
    pub arch: String,
}

crate::described! {
    /// A container image made a root.
    #[derive(Debug, Clone, Serialize)]
    pub struct OciPulled {
        /// The root's ext4 image (raw).
        pub path: String,
        /// The reference pulled.
        pub url: String,
        /// Always `oci`.
        pub source: &'static str,
        /// The root image's size.
        pub bytes: u64,
        /// `sha256`.
        pub algorithm: &'static str,
        /// The image's manifest digest (its identity).
        pub digest: String,
        /// Every blob matched its digest.
        pub verified: bool,
        /// `raw` (an ext4 file system).
        pub format: &'static str,
        /// `linux/amd64` or `linux/arm64`.
        pub platform: String,
        /// Layers applied.
        pub layers: usize,
        /// True when the root was already built (nothing was read but the image's manifest).
        pub cached: bool,
        /// Bytes downloaded from the registry (0 for a layout, or when the store held it all).
        pub downloaded: u64,
        /// The image's program defaults.
        pub config: RunConfig,
        /// Entries left out (device nodes, fifos).
        pub skipped: Vec<String>,
    }
}

/// The folder built roots are cached in.
pub fn cache_dir() -> PathBuf {
    paths::state_dir().join("oci")
}

/// The bytes an image may unpack to.
fn max_bytes() -> u64 {
    std::env::var("MCQEMU_MAX_IMAGE_MB")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(DEFAULT_MAX_MB)
        .saturating_mul(1 << 20)
}

/// Pulls `req.reference` and makes it a root (or finds it made).
pub fn pull(work: &dyn Work, req: &OciRequest) -> Result<OciPulled, OpError> {
    let (dir, tag) = match reference::parse(&req.reference)? {
        Source::Layout { dir, tag } => (dir, tag),
        Source::Registry(r) => return from_registry(work, req, &r),
        Source::DockerArchive(f) => return from_archive(work, req, &f),
    };
    let dir = roots::check(&dir, Access::Read).map_err(|e| OpError::refused(e.to_string()))?;
    made_root(work, req, &dir, tag.as_deref(), 0)
}

/// The store, locked against other servers pulling into it.
pub fn locked_store(work: &dyn Work) -> Result<(PathBuf, lockfile::FileLock), OpError> {
    let store = cache_dir().join("store");
    std::fs::create_dir_all(&store)
        .map_err(|e| OpError::host(format!("cannot create {}: {e}", store.display())))?;
    let lock_path = cache_dir().join("store.lock");
    let lock = lockfile::lock_within(&lock_path, BUILD_WAIT, &|| work.cancelled())
        .map_err(|e| OpError::host(format!("cannot lock {}: {e}", lock_path.display())))?
        .ok_or_else(|| {
            OpError::busy("another server is pulling into the image store; pull again in a moment")
        })?;
    Ok((store, lock))
}

/// Brings a `docker save` tarball into the store, then makes its root.
fn from_archive(work: &dyn Work, req: &OciRequest, file: &Path) -> Result<OciPulled, OpError> {
    let file = roots::check(file, Access::Read).map_err(|e| OpError::refused(e.to_string()))?;
    let (store, _lock) = locked_store(work)?;
    work.progress_phase("reading the docker-archive");
    let name = crate::oci::archive::import(&file, &store, &|| work.cancelled())?;
    made_root(work, req, &store, Some(&name), 0)
}

/// Fetches `r` into the store, then makes its root.
fn from_registry(work: &dyn Work, req: &OciRequest, r: &Reference) -> Result<OciPulled, OpError> {
    let (store, _lock) = locked_store(work)?;
    let progress = |done: u64, total: u64, what: &str| {
        work.progress(done as f64, Some(total as f64), what);
    };
    let fetched = registry::fetch(r, &store, &req.arch, &progress, &|| work.cancelled())?;
    made_root(work, req, &store, Some(&fetched.name), fetched.downloaded)
}

/// The root of the image `tag` of the layout at `dir`, built unless cached.
fn made_root(
    work: &dyn Work,
    req: &OciRequest,
    dir: &Path,
    tag: Option<&str>,
    downloaded: u64,
) -> Result<OciPulled, OpError> {
    let image = layout::read(dir, tag, &req.arch)?;
    let hex = image
        .manifest_digest
        .trim_start_matches("sha256:")
        .to_string();
    let home = cache_dir().join(&hex);
    let root = home.join("root.ext4");
    std::fs::create_dir_all(cache_dir())
        .map_err(|e| OpError::host(format!("cannot create {}: {e}", cache_dir().display())))?;
    let lock_path = cache_dir().join(format!("{hex}.lock"));
    let _lock = lockfile::lock_within(&lock_path, BUILD_WAIT, &|| work.cancelled())
        .map_err(|e| OpError::host(format!("cannot lock {}: {e}", lock_path.display())))?
        .ok_or_else(|| {
            OpError::busy(format!(
                "another server is building the root of {}; pull again in a moment",
                image.manifest_digest
            ))
        })?;
    let mut pulled = OciPulled {
        path: root.display().to_string(),
        url: req.reference.clone(),
        source: "oci",
        bytes: 0,
        algorithm: "sha256",
        digest: image.manifest_digest.clone(),
        verified: true,
        format: "raw",
        platform: image.platform.clone(),
        layers: image.layers.len(),
        cached: root.is_file(),
        downloaded,
        config: image.config.clone(),
        skipped: Vec::new(),
    };
    if !pulled.cached {
        pulled.skipped = build(work, &image, &home)?;
    }
    pulled.bytes = std::fs::metadata(&root).map(|m| m.len()).unwrap_or(0);
    Ok(pulled)
}

/// Builds `home`/root.ext4 from `image`'s layers; on failure nothing is left.
fn build(work: &dyn Work, image: &layout::Image, home: &Path) -> Result<Vec<String>, OpError> {
    let scratch = home.with_extension(format!("build-{}", std::process::id()));
    let _ = remove_tree(&scratch);
    let result = build_in(work, image, home, &scratch);
    let _ = remove_tree(&scratch);
    result
}

fn build_in(
    work: &dyn Work,
    image: &layout::Image,
    home: &Path,
    scratch: &Path,
) -> Result<Vec<String>, OpError> {
    let tree = scratch.join("tree");
    std::fs::create_dir_all(&tree)
        .map_err(|e| OpError::host(format!("cannot create {}: {e}", tree.display())))?;
    let folder = Folder::open_following(&tree)
        .map_err(|e| OpError::host(format!("cannot open {}: {e}", tree.display())))?;
    let mut u = unpack::Unpacker::new(folder, max_bytes());
    let total: u64 = image.layers.iter().map(|l| l.size).sum();
    let mut done = 0;
    for layer in &image.layers {
        work.check_cancel()?;
        let what = format!("applying layer {}", layer.digest);
        let watch = |n: u64| {
            work.progress((done + n) as f64, Some(total as f64), &what);
            !work.cancelled()
        };
        work.progress(done as f64, Some(total as f64), &what);
        u.apply(layer, &watch)?;
        done += layer.size;
    }
    let mut out = u.finish();
    let root = Folder::open_following(&tree)
        .map_err(|e| OpError::host(format!("cannot open {}: {e}", tree.display())))?;
    crate::oci::guest::place(&root, &mut out.meta, &image.config)?;
    work.progress_phase("making the ext4 root");
    let tmp = scratch.join("root.ext4");
    rootfs::build(rootfs::ROOT, &tree, &out.meta, out.bytes, &tmp, &|| {
        work.cancelled()
    })?;
    std::fs::create_dir_all(home)
        .map_err(|e| OpError::host(format!("cannot create {}: {e}", home.display())))?;
    std::fs::rename(&tmp, home.join("root.ext4"))
        .map_err(|e| OpError::host(format!("cannot place the root in {}: {e}", home.display())))?;
    Ok(out.skipped)
}

/// Removes a scratch folder (never following symlinks in it).
fn remove_tree(path: &Path) -> std::io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Ok(());
    };
    match Folder::open_following(parent) {
        Ok(f) => f.remove_all(name),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}
