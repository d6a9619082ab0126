//! `image_download`: fetch a disk image over http(s), verified, never leaving a partial file.

use serde::Deserialize;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::image::download::{self, DownloadRequest};
use crate::schema::Param;
use crate::tools::presets;

const DOWNLOAD_DESCRIPTION: &str = "Download a file over http(s) to path, checked against sha256 \
    when given; path appears only when complete and correct. Sends progress.";

/// `image_download`.
pub const DOWNLOAD: ToolDef = ToolDef {
    name: "image_download",
    title: "Download a disk image",
    description: DOWNLOAD_DESCRIPTION,
    input_schema: DownloadArgs::param,
    output_schema: <crate::ops::image::download::Downloaded as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE_OPEN_WORLD,
    handler: run,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct DownloadArgs {
        /// http:// or https:// URL.
        url: String = {"minLength": 1},
        /// ~ is expanded.
        path: String = {"minLength": 1},
        /// Expected SHA-256.
        sha256: Option<String>,
        /// Replace an existing file at path.
        overwrite: bool = {"default": false},
        /// Size cap.
        max_bytes: Option<u64> = {"minimum": 1},
    }
}

fn run(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: DownloadArgs = args.parse()?;
    let req = DownloadRequest {
        url: a.url,
        path: a.path,
        sha256: a.sha256,
        max_bytes: a.max_bytes,
        overwrite: a.overwrite,
    };
    crate::tools::to_output(&download::download(ctx, &req)?)
}
