//! Disk-image tools over qemu-img: create, info, convert, resize, and internal snapshots of
//! images at rest.

use serde_json::{json, Value};

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::image::disk::{self, ConvertRequest, CreateRequest, FORMATS};
use crate::ops::vm::checks::Access;
use crate::tools::params::{out_object, path_schema, snapshot_item_schema};
use crate::tools::{object, path_arg, presets};

fn formats_schema(desc: &str) -> Value {
    json!({"type": "string", "enum": FORMATS, "default": "qcow2", "description": desc})
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
    let req = CreateRequest {
        path: path_arg(args, "path", Access::Write)?,
        size: args.str("size")?.to_string(),
        format: args.str_or("format", "qcow2")?.to_string(),
        overwrite: args.bool_or("overwrite", false)?,
        backing_file: args.opt_str("backing_file")?.map(str::to_string),
    };
    crate::tools::to_output(&disk::create(&req)?)
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
    let chain = args.bool_or("backing_chain", false)?;
    crate::tools::to_output(&disk::info(&path, chain)?)
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
    let req = ConvertRequest {
        source: path_arg(args, "source", Access::Read)?,
        dest: path_arg(args, "dest", Access::Write)?,
        format: args.str_or("format", "qcow2")?.to_string(),
        compress: args.bool_or("compress", false)?,
        overwrite: args.bool_or("overwrite", false)?,
    };
    crate::tools::to_output(&disk::convert(ctx, &req)?)
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
    let size = args.str("size")?;
    let shrink = args.bool_or("shrink", false)?;
    crate::tools::to_output(&disk::resize(&path, size, shrink)?)
}
