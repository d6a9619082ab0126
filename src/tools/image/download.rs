//! `image_download`: fetch a disk image over http(s), verified, never leaving a partial file.

use serde_json::json;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::image::download::{self, DownloadRequest};
use crate::tools::presets;

const DOWNLOAD_DESCRIPTION: &str = "Download a file (typically a cloud or installer image) over \
    http or https to path. Streams to a temporary file beside path, verifies sha256 when given, \
    and renames into place only when complete and correct, so a failure never leaves a partial or \
    wrong file at path. Sends progress notifications. max_bytes caps the size.";

/// `image_download`.
pub const DOWNLOAD: ToolDef = ToolDef {
    name: "image_download",
    title: "Download a disk image",
    description: DOWNLOAD_DESCRIPTION,
    input_schema: || {
        json!({
            "type": "object",
            "properties": {
                "url": {
                    "type": "string", "minLength": 1, "description": "http:// or https:// URL."
                },
                "path": {
                    "type": "string", "minLength": 1,
                    "description": "Where to save the file (~ is expanded)."
                },
                "sha256": {
                    "type": "string",
                    "description": "Expected SHA-256 (64 hex characters)."
                },
                "overwrite": {
                    "type": "boolean", "default": false,
                    "description": "Replace an existing file at path."
                },
                "max_bytes": {
                    "type": "integer", "minimum": 1,
                    "description": "Refuse downloads larger than this."
                }
            },
            "required": ["url", "path"],
            "additionalProperties": false
        })
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "url": {"type": "string"},
                "final_url": {"type": "string"},
                "bytes": {"type": "integer"},
                "sha256": {"type": "string"},
                "verified": {"type": "boolean"}
            },
            "required": ["path", "bytes", "sha256", "verified"]
        })
    },
    annotations: presets::DESTRUCTIVE_OPEN_WORLD,
    handler: run,
    ui: crate::mcp::tool::Ui::NONE,
};

fn run(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let req = DownloadRequest {
        url: args.str("url")?.to_string(),
        path: args.str("path")?.to_string(),
        sha256: args.opt_str("sha256")?.map(str::to_string),
        max_bytes: args.opt_i64("max_bytes")?.map(|n| n.max(0) as u64),
        overwrite: args.bool_or("overwrite", false)?,
    };
    crate::tools::to_output(&download::download(ctx, &req)?)
}
