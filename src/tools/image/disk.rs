//! Disk-image tools over qemu-img: create, info, convert, resize, and internal snapshots of
//! images at rest.

use serde::Deserialize;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::image::disk::{self, ConvertRequest, CreateRequest, FORMATS};
use crate::ops::vm::checks::{checked_path, Access};
use crate::schema::Param;
use crate::tools::presets;

// ---- image_create ----

const CREATE_DESCRIPTION: &str = "Create a disk image, or with backing_file a copy-on-write \
    overlay (its format probed and recorded).";

/// `image_create`.
pub const CREATE: ToolDef = ToolDef {
    name: "image_create",
    title: "Create a disk image",
    description: CREATE_DESCRIPTION,
    input_schema: CreateArgs::param,
    output_schema: <crate::ops::image::disk::Summary as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE,
    handler: create,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct CreateArgs {
        /// Where to create the image (~ is expanded).
        path: String = {"minLength": 1},
        /// Virtual size, e.g. "20G", "512M" or bytes.
        size: String = {"minLength": 1},
        /// Image format.
        format: String = {"enum": FORMATS, "default": "qcow2"},
        /// Left untouched.
        backing_file: Option<String>,
        /// Replace an existing file at path.
        overwrite: bool = {"default": false},
    }
}

fn create(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: CreateArgs = args.parse()?;
    let req = CreateRequest {
        path: checked_path(&a.path, "path", Access::Write)?,
        size: a.size,
        format: a.format,
        overwrite: a.overwrite,
        backing_file: a.backing_file,
    };
    crate::tools::to_output(&disk::create(&req)?)
}

// ---- image_info ----

const INFO_DESCRIPTION: &str =
    "A disk image's format, sizes, backing file and snapshots (qemu-img \
    info), also in use by a VM.";

/// `image_info`.
pub const INFO: ToolDef = ToolDef {
    name: "image_info",
    title: "Inspect a disk image",
    description: INFO_DESCRIPTION,
    input_schema: InfoArgs::param,
    output_schema: <crate::ops::image::disk::Info as crate::schema::Schema>::schema,
    annotations: presets::READ_ONLY,
    handler: info,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct InfoArgs {
        /// The image to inspect.
        path: String = {"minLength": 1},
        /// Every image in the chain.
        backing_chain: bool = {"default": false},
    }
}

fn info(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: InfoArgs = args.parse()?;
    let path = checked_path(&a.path, "path", Access::Read)?;
    crate::tools::to_output(&disk::info(&path, a.backing_chain)?)
}

// ---- image_convert ----

const CONVERT_DESCRIPTION: &str = "Convert an image to another format or flatten an overlay \
    (qemu-img convert); dest appears only on success.";

/// `image_convert`.
pub const CONVERT: ToolDef = ToolDef {
    name: "image_convert",
    title: "Convert a disk image",
    description: CONVERT_DESCRIPTION,
    input_schema: ConvertArgs::param,
    output_schema: <crate::ops::image::disk::Converted as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE,
    handler: convert,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct ConvertArgs {
        /// The image to read.
        source: String = {"minLength": 1},
        /// Where to write the converted image.
        dest: String = {"minLength": 1},
        /// Output format.
        format: String = {"enum": FORMATS, "default": "qcow2"},
        /// Compress (qcow2 only).
        compress: bool = {"default": false},
        /// Replace an existing file at dest.
        overwrite: bool = {"default": false},
    }
}

fn convert(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: ConvertArgs = args.parse()?;
    let req = ConvertRequest {
        source: checked_path(&a.source, "source", Access::Read)?,
        dest: checked_path(&a.dest, "dest", Access::Write)?,
        format: a.format,
        compress: a.compress,
        overwrite: a.overwrite,
    };
    crate::tools::to_output(&disk::convert(ctx, &req)?)
}

// ---- image_resize ----

const RESIZE_DESCRIPTION: &str = "Grow an image's virtual size, or shrink it with shrink. Refused \
    while a VM uses it; partitions are not resized.";

/// `image_resize`.
pub const RESIZE: ToolDef = ToolDef {
    name: "image_resize",
    title: "Resize a disk image",
    description: RESIZE_DESCRIPTION,
    input_schema: ResizeArgs::param,
    output_schema: <crate::ops::image::disk::Resized as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE,
    handler: resize,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct ResizeArgs {
        /// The image to resize.
        path: String = {"minLength": 1},
        /// New size ("20G") or a change ("+5G", "-1G").
        size: String = {"minLength": 1},
        /// Allow making the image smaller.
        shrink: bool = {"default": false},
    }
}

fn resize(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: ResizeArgs = args.parse()?;
    let path = checked_path(&a.path, "path", Access::Write)?;
    crate::tools::to_output(&disk::resize(&path, &a.size, a.shrink)?)
}
