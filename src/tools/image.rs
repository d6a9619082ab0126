//! Disk-image tools over qemu-img: create, info, convert, resize, and internal snapshots of
//! images at rest.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::params::{out_object, path_schema, snapshot_item_schema, snapshots_of};
use super::{checked_image, object, path_arg, presets};
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::ops::vm::checks::{must_exist, refuse_in_use};
use crate::qemu::img::{self, ImgError, FORMATS};
use crate::state::roots::{self, Access};

fn formats_schema(desc: &str) -> Value {
    json!({"type": "string", "enum": FORMATS, "default": "qcow2", "description": desc})
}

fn refuse_existing(path: &Path, overwrite: bool) -> Result<(), ToolError> {
    if !overwrite && std::fs::symlink_metadata(path).is_ok() {
        return Err(ToolError::new(format!(
            "{} already exists; pass overwrite=true to replace it, or choose another path",
            path.display()
        )));
    }
    if let Some(parent) = path.parent() {
        if !parent.is_dir() {
            return Err(ToolError::new(format!(
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

fn summary(path: &Path, info: &Value) -> Value {
    let backing = info
        .get("full-backing-filename")
        .or_else(|| info.get("backing-filename"));
    json!({
        "path": path.display().to_string(),
        "format": info.get("format").cloned().unwrap_or(Value::Null),
        "virtual_size": info.get("virtual-size").cloned().unwrap_or(Value::Null),
        "actual_size": info.get("actual-size").cloned().unwrap_or(Value::Null),
        "backing_file": backing.cloned().unwrap_or(Value::Null),
        "backing_format": info.get("backing-filename-format").cloned().unwrap_or(Value::Null)
    })
}

fn image_out_props() -> Value {
    json!({
        "path": {"type": "string"},
        "format": {"type": ["string", "null"]},
        "virtual_size": {"type": ["integer", "null"]},
        "actual_size": {"type": ["integer", "null"]},
        "backing_file": {"type": ["string", "null"]},
        "backing_format": {"type": ["string", "null"]}
    })
}

// ---- image_create ----

const CREATE_DESCRIPTION: &str = "Create a disk image with qemu-img. size is bytes or a number \
    with K/M/G/T (binary units), e.g. \"20G\". With backing_file, creates a copy-on-write overlay \
    whose backing format is probed and recorded explicitly. Refuses to replace an existing file \
    unless overwrite=true.";

/// `image_create`.
pub const CREATE: ToolDef = ToolDef {
    name: "image_create",
    title: "Create a disk image",
    description: CREATE_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "path": path_schema("Where to create the image (~ is expanded)."),
                "size": {
                    "type": "string", "minLength": 1,
                    "description": "Virtual size, e.g. \"20G\", \"512M\" or bytes."
                },
                "format": formats_schema("Image format."),
                "backing_file": {
                    "type": "string",
                    "description": "Base image for a copy-on-write overlay; left untouched."
                },
                "overwrite": {
                    "type": "boolean", "default": false,
                    "description": "Replace an existing file at path."
                }
            }),
            &["path", "size"],
        )
    },
    output_schema: || out_object(image_out_props(), &["path", "format", "virtual_size"]),
    annotations: presets::DESTRUCTIVE,
    handler: create,
    ui: crate::mcp::tool::Ui::NONE,
};

fn create(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let path = path_arg(args, "path", Access::Write)?;
    let size = img::parse_size(args.str("size")?)?;
    let format = args.str_or("format", "qcow2")?;
    let overwrite = args.bool_or("overwrite", false)?;
    refuse_existing(&path, overwrite)?;
    let backing = match args.opt_str("backing_file")? {
        None => None,
        Some(b) => {
            let b = roots::check_str(b, Access::Read)
                .map_err(|e| ToolError::new(format!("parameter 'backing_file': {e}")))?;
            if b == path {
                return Err(ToolError::new(
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
    let target = temp_sibling(&path);
    let backing_ref = backing.as_ref().map(|(b, f)| (b.as_path(), f.as_str()));
    if let Err(e) = img::create(&target, format, Some(size), backing_ref) {
        let _ = std::fs::remove_file(&target);
        // Name the file the caller asked for, not the temporary one.
        let msg = e
            .to_string()
            .replace(&target.display().to_string(), &path.display().to_string());
        return Err(ToolError::new(msg));
    }
    // hard_link refuses an existing path, so overwrite=false never clobbers even in a race.
    let placed = if overwrite {
        std::fs::rename(&target, &path)
    } else {
        std::fs::hard_link(&target, &path)
    };
    let _ = std::fs::remove_file(&target);
    if let Err(e) = placed {
        return Err(ToolError::new(format!(
            "could not place the new image at {}: {e}",
            path.display()
        )));
    }
    let info = img::info(&path, format, false)?;
    Ok(ToolOutput::json(summary(&path, &info)))
}

// ---- image_info ----

const INFO_DESCRIPTION: &str = "Show a disk image's format, virtual and on-disk size, backing \
    file and snapshots (qemu-img info, structured). Works on images a running VM holds. \
    backing_chain=true adds every image in the backing chain.";

/// `image_info`.
pub const INFO: ToolDef = ToolDef {
    name: "image_info",
    title: "Inspect a disk image",
    description: INFO_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "path": path_schema("The image to inspect."),
                "backing_chain": {
                    "type": "boolean", "default": false,
                    "description": "Also describe every backing image."
                }
            }),
            &["path"],
        )
    },
    output_schema: || {
        let mut props = image_out_props();
        props["snapshots"] = json!({"type": "array", "items": snapshot_item_schema()});
        props["info"] = json!({"type": "object", "description": "qemu-img info's JSON as is."});
        props["chain"] = json!({
            "type": "array",
            "items": {"type": "object"},
            "description": "With backing_chain: one qemu-img info object per image, top first."
        });
        out_object(props, &["path", "format", "info"])
    },
    annotations: presets::READ_ONLY,
    handler: info,
    ui: crate::mcp::tool::Ui::NONE,
};

fn info(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let path = path_arg(args, "path", Access::Read)?;
    must_exist(&path, "image")?;
    let chain = args.bool_or("backing_chain", false)?;
    // Checked (and its format pinned or probed once) before it is read: with backing_chain
    // every file in the chain is opened below.
    let format = checked_image(&path, "image", None)?.format;
    let (top, chain_v) = if chain {
        let all = img::info(&path, &format, true)?;
        let top = all
            .as_array()
            .and_then(|a| a.first())
            .cloned()
            .ok_or_else(|| ImgError::BadOutput("empty backing chain".into()))?;
        (top, Some(all))
    } else {
        (img::info(&path, &format, false)?, None)
    };
    let mut out = summary(&path, &top);
    out["snapshots"] = json!(snapshots_of(&top));
    out["info"] = top;
    if let Some(c) = chain_v {
        out["chain"] = c;
    }
    Ok(ToolOutput::json(out))
}

// ---- image_convert ----

const CONVERT_DESCRIPTION: &str = "Convert an image to another format (or flatten an overlay) \
    with qemu-img convert. The source format is probed, never assumed. Writes to a temporary file \
    beside dest and renames it into place only on success; refuses to replace an existing dest \
    unless overwrite=true.";

/// `image_convert`.
pub const CONVERT: ToolDef = ToolDef {
    name: "image_convert",
    title: "Convert a disk image",
    description: CONVERT_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "source": path_schema("The image to read."),
                "dest": path_schema("Where to write the converted image."),
                "format": formats_schema("Output format."),
                "compress": {
                    "type": "boolean", "default": false, "description": "Compress (qcow2 only)."
                },
                "overwrite": {
                    "type": "boolean", "default": false,
                    "description": "Replace an existing file at dest."
                }
            }),
            &["source", "dest"],
        )
    },
    output_schema: || {
        let mut props = image_out_props();
        props["source"] = json!({"type": "string"});
        props["source_format"] = json!({"type": "string"});
        props["compressed"] = json!({"type": "boolean"});
        out_object(props, &["path", "source", "format"])
    },
    annotations: presets::DESTRUCTIVE,
    handler: convert,
    ui: crate::mcp::tool::Ui::NONE,
};

fn convert(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let source = path_arg(args, "source", Access::Read)?;
    let dest = path_arg(args, "dest", Access::Write)?;
    let format = args.str_or("format", "qcow2")?;
    let compress = args.bool_or("compress", false)?;
    let overwrite = args.bool_or("overwrite", false)?;
    must_exist(&source, "source image")?;
    if source == dest {
        return Err(ToolError::new(
            "source and dest are the same file; choose another dest",
        ));
    }
    if compress && format != "qcow2" {
        return Err(ToolError::new(format!(
            "compress=true needs format \"qcow2\", not {format:?}"
        )));
    }
    refuse_existing(&dest, overwrite)?;
    let src_format = checked_image(&source, "source image", None)?.format;
    let tmp = temp_sibling(&dest);
    ctx.progress_now(0.0, Some(1.0), "converting");
    let result = img::convert(&source, &src_format, &tmp, format, compress, &|| {
        ctx.cancelled()
    });
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.into());
    }
    let placed = if overwrite {
        std::fs::rename(&tmp, &dest)
    } else {
        std::fs::hard_link(&tmp, &dest).and_then(|_| std::fs::remove_file(&tmp))
    };
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(ToolError::new(format!(
            "could not move the result into {}: {e}",
            dest.display()
        )));
    }
    ctx.progress_now(1.0, Some(1.0), "done");
    let info = img::info(&dest, format, false)?;
    let mut out = summary(&dest, &info);
    out["source"] = json!(source.display().to_string());
    out["source_format"] = json!(src_format);
    out["compressed"] = json!(compress);
    Ok(ToolOutput::json(out))
}

// ---- image_resize ----

const RESIZE_DESCRIPTION: &str = "Grow (or, with shrink=true, shrink) an image's virtual size. \
    size is absolute (\"20G\") or relative (\"+5G\", \"-1G\"). Shrinking cuts data at the end of \
    the disk, so it is refused unless shrink=true. Refused while a running VM uses the image. The \
    guest's partitions and filesystems are not resized.";

/// `image_resize`.
pub const RESIZE: ToolDef = ToolDef {
    name: "image_resize",
    title: "Resize a disk image",
    description: RESIZE_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "path": path_schema("The image to resize."),
                "size": {
                    "type": "string", "minLength": 1,
                    "description": "New size (\"20G\") or a change (\"+5G\", \"-1G\")."
                },
                "shrink": {
                    "type": "boolean", "default": false,
                    "description": "Allow making the image smaller."
                }
            }),
            &["path", "size"],
        )
    },
    output_schema: || {
        let mut props = image_out_props();
        props["old_size"] = json!({"type": "integer"});
        props["new_size"] = json!({"type": "integer"});
        out_object(props, &["path", "old_size", "new_size"])
    },
    annotations: presets::DESTRUCTIVE,
    handler: resize,
    ui: crate::mcp::tool::Ui::NONE,
};

fn resize(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let path = path_arg(args, "path", Access::Write)?;
    let size_s = args.str("size")?.trim();
    let shrink = args.bool_or("shrink", false)?;
    let format = checked_image(&path, "image", None)?.format;
    refuse_in_use(&path)?;
    let info = img::info(&path, &format, false)?;
    let old = info
        .get("virtual-size")
        .and_then(Value::as_u64)
        .ok_or_else(|| ImgError::BadOutput("no virtual-size".into()))?;
    let new = if let Some(rest) = size_s.strip_prefix('+') {
        old.checked_add(img::parse_size(rest)?)
            .ok_or_else(|| ToolError::new("size overflows"))?
    } else if let Some(rest) = size_s.strip_prefix('-') {
        let d = img::parse_size(rest)?;
        old.checked_sub(d).filter(|n| *n > 0).ok_or_else(|| {
            ToolError::new(format!(
                "cannot shrink by {rest}: the image is only {old} bytes"
            ))
        })?
    } else {
        img::parse_size(size_s)?
    };
    if new < old && !shrink {
        return Err(ToolError::new(format!(
            "refusing to shrink {} from {old} to {new} bytes: data past the new end is lost. \
             Shrink the guest's filesystems and partitions first, then pass shrink=true",
            path.display()
        )));
    }
    if new != old {
        img::resize(&path, &format, new, new < old)?;
    }
    let after = img::info(&path, &format, false)?;
    let mut out = summary(&path, &after);
    out["old_size"] = json!(old);
    out["new_size"] = after.get("virtual-size").cloned().unwrap_or(json!(new));
    Ok(ToolOutput::json(out))
}
