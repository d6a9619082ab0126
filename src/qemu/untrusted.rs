//! Disk images are data an agent (or a guest) controls. Before an image is used, its header is
//! read with qemu-img under a pinned format, one level of the backing chain at a time, and the
//! image is refused when any backing file or qcow2 external data file lies outside the roots, or
//! names a protocol or a `json:` pseudo-filename (which would make QEMU open network URLs or
//! arbitrary host files).
//!
//! The chain is walked level by level instead of with `--backing-chain`: that option makes
//! qemu-img open every backing file, so a `json:` or `nbd://` backing name would already have
//! been followed by the time its name could be checked.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::img::{self, ImgError};
use crate::state::roots::{self, Access, RootsError};

/// Deepest backing chain accepted.
pub const MAX_CHAIN: usize = 16;

/// Why an image was refused.
#[derive(Debug)]
pub enum ImageError {
    /// qemu-img could not read it.
    Img(ImgError),
    /// A file it names lies outside the roots (or is hidden, or is not a plain path).
    Reaches {
        /// The image that names it.
        image: PathBuf,
        /// What kind of reference: "backing file" or "external data file".
        what: &'static str,
        /// The reference as written in the image.
        target: String,
        /// Why it is refused.
        why: RootsError,
    },
    /// The chain is deeper than [`MAX_CHAIN`] (or loops).
    TooDeep(PathBuf),
}

impl std::fmt::Display for ImageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImageError::Img(e) => write!(f, "{e}"),
            ImageError::Reaches {
                image,
                what,
                target,
                why,
            } => write!(
                f,
                "refusing {}: it names {what} {target:?}, which is refused: {why}",
                image.display()
            ),
            ImageError::TooDeep(p) => write!(
                f,
                "refusing {}: its backing chain is deeper than {MAX_CHAIN} images (or loops)",
                p.display()
            ),
        }
    }
}

impl std::error::Error for ImageError {}

impl From<ImgError> for ImageError {
    fn from(e: ImgError) -> Self {
        ImageError::Img(e)
    }
}

/// What the check found: the image's format and every file its chain reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// The top image's format (as pinned, or as probed once).
    pub format: String,
    /// The top image's virtual size in bytes (what a guest sees as its disk).
    pub virtual_size: u64,
    /// The backing files, top first, each with its format.
    pub backing: Vec<(PathBuf, String)>,
    /// The top image's `qemu-img info` as the check read it: image_info answers from it
    /// rather than running qemu-img a second time (half its time).
    pub top: Value,
}

/// The files one level of `qemu-img info` names, as written in the image: (what, name).
pub fn references(info: &Value) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let Some(b) = info.get("backing-filename").and_then(Value::as_str) {
        out.push(("backing file", b.to_string()));
    }
    if let Some(d) = info
        .pointer("/format-specific/data/data-file")
        .and_then(Value::as_str)
    {
        out.push(("external data file", d.to_string()));
    }
    out
}

/// Resolves a reference the way QEMU does (relative to the folder of the image naming it) and
/// checks it against the roots.
pub fn check_reference(
    image: &Path,
    what: &'static str,
    target: &str,
) -> Result<PathBuf, ImageError> {
    let refused = |why| ImageError::Reaches {
        image: image.to_path_buf(),
        what,
        target: target.to_string(),
        why,
    };
    let raw = roots::parse(target).map_err(refused)?;
    let path = if Path::new(target).is_absolute() {
        raw
    } else {
        image.parent().unwrap_or(Path::new("/")).join(target)
    };
    roots::check(&path, Access::Read).map_err(refused)
}

/// Checks `image` (already inside the roots) and its whole chain. `format` pins the top
/// image's format; None probes it (only for images no guest has written yet: record the
/// result and pin it from then on).
pub fn check(image: &Path, format: Option<&str>) -> Result<Checked, ImageError> {
    let top = img::info_as(image, format)?;
    let top_format = top
        .get("format")
        .and_then(Value::as_str)
        .ok_or_else(|| ImgError::BadOutput("no \"format\" in qemu-img info".into()))?
        .to_string();
    let mut checked = Checked {
        format: top_format,
        virtual_size: top.get("virtual-size").and_then(Value::as_u64).unwrap_or(0),
        backing: Vec::new(),
        top: top.clone(),
    };
    let mut current = image.to_path_buf();
    let mut info = top;
    for _ in 0..MAX_CHAIN {
        let mut next = None;
        for (what, target) in references(&info) {
            let resolved = check_reference(&current, what, &target)?;
            if what == "backing file" {
                next = Some(resolved);
            }
        }
        let Some(backing) = next else {
            return Ok(checked);
        };
        // The backing format as the image records it; an image that records none gets its
        // backing file probed here, once, like a new image.
        let bf = info
            .get("backing-filename-format")
            .and_then(Value::as_str)
            .map(str::to_string);
        info = img::info_as(&backing, bf.as_deref())?;
        let fmt = info
            .get("format")
            .and_then(Value::as_str)
            .unwrap_or("raw")
            .to_string();
        checked.backing.push((backing.clone(), fmt));
        current = backing;
    }
    Err(ImageError::TooDeep(image.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn references_cover_backing_and_external_data_files() {
        let info = json!({
            "format": "qcow2",
            "backing-filename": "base.qcow2",
            "format-specific": {"type": "qcow2", "data": {"data-file": "/etc/shadow"}}
        });
        assert_eq!(
            references(&info),
            vec![
                ("backing file", "base.qcow2".to_string()),
                ("external data file", "/etc/shadow".to_string())
            ]
        );
        assert!(references(&json!({"format": "raw"})).is_empty());
    }

    #[test]
    fn pseudo_filenames_are_refused_before_anything_opens_them() {
        let r = check_reference(
            Path::new("/tmp/x.qcow2"),
            "backing file",
            "json:{\"driver\":\"nbd\",\"host\":\"10.0.0.1\"}",
        );
        assert!(matches!(
            r,
            Err(ImageError::Reaches {
                why: RootsError::Invalid(_),
                ..
            })
        ));
        let r = check_reference(Path::new("/tmp/x.qcow2"), "backing file", "nbd://h/x");
        assert!(matches!(r, Err(ImageError::Reaches { .. })));
    }
}
