//! Disk images over qemu-img: create (an overlay's backing format probed and recorded), info
//! (optionally the whole backing chain), convert and resize. Every image read is checked as
//! untrusted first; every new file is made beside its path and placed only on success.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use super::snapshots::{snapshots_of, SnapshotItem};
use crate::ops::error::OpError;
use crate::ops::vm::checks::{checked_image, checked_path, must_exist, refuse_in_use, Access};
use crate::ops::work::Work;
use crate::qemu::img::ImageInfo;
use crate::qemu::img::{self, ImgError};

/// The formats the image tools write.
pub use crate::qemu::img::FORMATS;

crate::described! {
    /// What every image tool reports of an image (the start of each result, in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct Summary {
        /// The image.
        pub path: String,
        /// Its format.
        pub format: Option<String>,
        /// Its virtual size.
        pub virtual_size: Option<u64>,
        /// Its size on disk.
        pub actual_size: Option<u64>,
        /// Its backing file.
        pub backing_file: Option<String>,
        /// The backing file's format.
        pub backing_format: Option<String>,
    }
}

fn summary(path: &Path, info: &ImageInfo) -> Summary {
    Summary {
        path: path.display().to_string(),
        format: info.format.clone(),
        virtual_size: info.virtual_size,
        actual_size: info.actual_size,
        backing_file: info.backing().map(str::to_string),
        backing_format: info.backing_format.clone(),
    }
}

fn refuse_existing(path: &Path, overwrite: bool) -> Result<(), OpError> {
    if !overwrite && std::fs::symlink_metadata(path).is_ok() {
        return Err(OpError::invalid(format!(
            "{} already exists; pass overwrite=true to replace it, or choose another path",
            path.display()
        )));
    }
    if let Some(parent) = path.parent() {
        if !parent.is_dir() {
            return Err(OpError::not_found(format!(
                "folder {} does not exist; create it first or choose another path",
                parent.display()
            )));
        }
    }
    Ok(())
}

/// A temporary sibling of `path` for write-then-rename, unique per process and call.
fn temp_sibling(path: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = N.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.mcqemu-tmp-{}-{n}", std::process::id()))
}

/// image_create's request; `path` is already checked against the roots.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    /// Where the image goes.
    pub path: PathBuf,
    /// Its virtual size, as given ("20G").
    pub size: String,
    /// Its format.
    pub format: String,
    /// A base image for a copy-on-write overlay (checked here).
    pub backing_file: Option<String>,
    /// Replace an existing file.
    pub overwrite: bool,
}

/// Creates the image beside its path and places it only on success.
pub fn create(req: &CreateRequest) -> Result<Summary, OpError> {
    let path = &req.path;
    let size = img::parse_size(&req.size)?;
    refuse_existing(path, req.overwrite)?;
    let backing = match &req.backing_file {
        None => None,
        Some(b) => {
            let b = checked_path(b, "backing_file", Access::Read)?;
            if &b == path {
                return Err(OpError::invalid(
                    "backing_file and path are the same file; an image cannot back itself",
                ));
            }
            let fmt = checked_image(&b, "backing file", None)?.format;
            Some((b, fmt))
        }
    };
    // Always create beside the target and place it only on success: qemu-img leaves an empty
    // file behind when it refuses (e.g. a size too large for the format), which would then
    // block a retry with "already exists".
    let target = temp_sibling(path);
    let backing_ref = backing.as_ref().map(|(b, f)| (b.as_path(), f.as_str()));
    if let Err(e) = img::create(&target, &req.format, Some(size), backing_ref) {
        let _ = std::fs::remove_file(&target);
        // Name the file the caller asked for, not the temporary one.
        let msg = e
            .to_string()
            .replace(&target.display().to_string(), &path.display().to_string());
        return Err(OpError::host(msg));
    }
    // hard_link refuses an existing path, so overwrite=false never clobbers even in a race.
    let placed = if req.overwrite {
        std::fs::rename(&target, path)
    } else {
        std::fs::hard_link(&target, path)
    };
    let _ = std::fs::remove_file(&target);
    if let Err(e) = placed {
        return Err(OpError::host(format!(
            "could not place the new image at {}: {e}",
            path.display()
        )));
    }
    let info = img::info(path, &req.format)?;
    Ok(summary(path, &info))
}

crate::described! {
    /// image_info's result: the summary, the snapshots, qemu-img's own JSON, and the chain.
    #[derive(Debug, Clone, Serialize)]
    pub struct Info {
        /// The summary.
        #[serde(flatten)]
        pub summary: Summary,
        /// Its internal snapshots.
        pub snapshots: Vec<SnapshotItem>,
        /// qemu-img info's JSON of the image, as it is.
        pub info: Value,
        /// qemu-img info's JSON of every image in the backing chain, when asked for.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub chain: Option<Vec<Value>>,
    }
}

/// The (checked) image at `path`, with its backing chain when `chain`.
pub fn info(path: &Path, chain: bool) -> Result<Info, OpError> {
    must_exist(path, "image")?;
    // Checked (and its format pinned or probed once) before it is read: with backing_chain
    // every file in the chain is opened below.
    let checked = checked_image(path, "image", None)?;
    let (top, chain_v) = if chain {
        let all = img::info_chain(path, &checked.format)?;
        let top = all
            .first()
            .cloned()
            .ok_or_else(|| ImgError::BadOutput("empty backing chain".into()))?;
        (top, Some(all.into_iter().map(|i| i.raw).collect()))
    } else {
        // The check's own reading of the top image, not a second qemu-img run.
        (img::ImageInfo::of(checked.top)?, None)
    };
    Ok(Info {
        summary: summary(path, &top),
        snapshots: snapshots_of(&top),
        info: top.raw,
        chain: chain_v,
    })
}

/// image_convert's request; both paths already checked against the roots.
#[derive(Debug, Clone)]
pub struct ConvertRequest {
    /// The image read.
    pub source: PathBuf,
    /// The image written.
    pub dest: PathBuf,
    /// The format written.
    pub format: String,
    /// qcow2 compression.
    pub compress: bool,
    /// Replace an existing dest.
    pub overwrite: bool,
}

crate::described! {
    /// image_convert's result.
    #[derive(Debug, Clone, Serialize)]
    pub struct Converted {
        /// The new image's summary.
        #[serde(flatten)]
        pub summary: Summary,
        /// The image read.
        pub source: String,
        /// Its format, probed.
        pub source_format: String,
        /// Whether it was compressed.
        pub compressed: bool,
    }
}

/// Converts into a temporary beside dest (cancellable), placed only on success.
pub fn convert(work: &dyn Work, req: &ConvertRequest) -> Result<Converted, OpError> {
    let (source, dest, format) = (&req.source, &req.dest, req.format.as_str());
    must_exist(source, "source image")?;
    if source == dest {
        return Err(OpError::invalid(
            "source and dest are the same file; choose another dest",
        ));
    }
    if req.compress && format != "qcow2" {
        return Err(OpError::invalid(format!(
            "compress=true needs format \"qcow2\", not {format:?}"
        )));
    }
    refuse_existing(dest, req.overwrite)?;
    let src_format = checked_image(source, "source image", None)?.format;
    let tmp = temp_sibling(dest);
    work.progress(0.0, Some(1.0), "converting");
    let result = img::convert(source, &src_format, &tmp, format, req.compress, &|| {
        work.cancelled()
    });
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.into());
    }
    let placed = if req.overwrite {
        std::fs::rename(&tmp, dest)
    } else {
        std::fs::hard_link(&tmp, dest).and_then(|_| std::fs::remove_file(&tmp))
    };
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(OpError::host(format!(
            "could not move the result into {}: {e}",
            dest.display()
        )));
    }
    work.progress(1.0, Some(1.0), "done");
    let info = img::info(dest, format)?;
    Ok(Converted {
        summary: summary(dest, &info),
        source: source.display().to_string(),
        source_format: src_format,
        compressed: req.compress,
    })
}

crate::described! {
    /// image_resize's result.
    #[derive(Debug, Clone, Serialize)]
    pub struct Resized {
        /// The image's summary after.
        #[serde(flatten)]
        pub summary: Summary,
        /// The virtual size before.
        pub old_size: u64,
        /// The virtual size after.
        pub new_size: u64,
    }
}

/// Resizes the (checked) image at `path` to `size`: absolute ("20G") or relative ("+5G",
/// "-1G"); shrinking only with `shrink`, and never while a running VM uses it.
pub fn resize(path: &Path, size: &str, shrink: bool) -> Result<Resized, OpError> {
    let size_s = size.trim();
    let format = checked_image(path, "image", None)?.format;
    refuse_in_use(path)?;
    let old = img::info(path, &format)?
        .virtual_size
        .ok_or_else(|| ImgError::BadOutput("no virtual-size".into()))?;
    let new = if let Some(rest) = size_s.strip_prefix('+') {
        old.checked_add(img::parse_size(rest)?)
            .ok_or_else(|| OpError::invalid("size overflows"))?
    } else if let Some(rest) = size_s.strip_prefix('-') {
        let d = img::parse_size(rest)?;
        old.checked_sub(d).filter(|n| *n > 0).ok_or_else(|| {
            OpError::invalid(format!(
                "cannot shrink by {rest}: the image is only {old} bytes"
            ))
        })?
    } else {
        img::parse_size(size_s)?
    };
    if new < old && !shrink {
        return Err(OpError::guest(format!(
            "refusing to shrink {} from {old} to {new} bytes: data past the new end is lost. \
             Shrink the guest's filesystems and partitions first, then pass shrink=true",
            path.display()
        )));
    }
    if new != old {
        img::resize(path, &format, new, new < old)?;
    }
    let after = img::info(path, &format)?;
    Ok(Resized {
        summary: summary(path, &after),
        old_size: old,
        new_size: after.virtual_size.unwrap_or(new),
    })
}
