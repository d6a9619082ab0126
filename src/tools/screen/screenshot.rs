//! See: vm_screenshot (the capture is [`crate::ops::screen::screenshot`]).

use serde_json::json;

use crate::b64;
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::screen::{self as ops_screen, ScreenshotRequest};
use crate::ops::vm::checks::Access;
use crate::tools::screen::params;
use crate::tools::{object, presets, vm_name_arg};

const SCREENSHOT_DESCRIPTION: &str = "Capture the VM's screen as a PNG image. Returned inline \
    (MCP image content), a screen whose longer edge is over 1568 px is scaled down to 1568 \
    (area averaging, as hosts reject or shrink larger images), and the PNG is kept within \
    max_bytes (750000: its base64 stays within 1 MB) by scaling it further if needed; \
    max_edge, max_width and max_height set other bounds (max_edge 16384 returns the full \
    screen). The result gives the image's width and height, the screen's (screen_width, \
    screen_height), scale (the image's size divided by the screen's) and hash (a digest of the \
    screen's pixels, for vm_screen_wait's since). To click or point at \
    something seen in a scaled image, pass that scale to vm_click or vm_mouse_move with \
    coordinates read off the image. With path, the PNG is saved to that file instead, at the \
    screen's full size unless bounds are given. Works on paused VMs.";

/// `vm_screenshot`.
pub const SCREENSHOT: ToolDef = ToolDef {
    name: "vm_screenshot",
    title: "Screenshot a VM",
    description: SCREENSHOT_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "path": {
                    "type": "string",
                    "description": "Save the PNG here instead of returning it inline."
                },
                "max_edge": params::max_edge_schema(),
                "max_width": params::max_width_schema(),
                "max_height": params::max_height_schema(),
                "max_bytes": params::max_bytes_schema(),
            }),
            &["name"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "width": {"type": "integer", "description": "The image's width."},
                "height": {"type": "integer", "description": "The image's height."},
                "scale": {
                    "type": "number",
                    "description": "The image's size divided by the screen's: 1 for the full \
                        screen. Pass it to vm_click / vm_mouse_move with coordinates read off \
                        this image."
                },
                "screen_width": {"type": "integer"},
                "screen_height": {"type": "integer"},
                "bytes": {"type": "integer"},
                "hash": {
                    "type": "string",
                    "description": "A digest of the screen's pixels: vm_screen_wait's since."
                },
                "format": {"type": "string"},
                "path": {"type": ["string", "null"]}
            },
            "required": [
                "name", "width", "height", "scale", "screen_width", "screen_height", "bytes"
            ]
        })
    },
    annotations: presets::READ_ONLY,
    handler: screenshot,
    ui: presets::OPENS_VIEW,
};

fn screenshot(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let save_to = match args.opt_str("path")? {
        Some(_) => Some(crate::tools::path_arg(args, "path", Access::Write)?),
        None => None,
    };
    let bounds = params::bounds(args, save_to.is_none())?;
    let req = ScreenshotRequest {
        name,
        bounds,
        save_to,
    };
    let (shot, png) = ops_screen::screenshot(&req)?;
    let mut out = crate::tools::to_output(&shot)?;
    if let Some(png) = png {
        out.extra
            .push(json!({"type": "image", "data": b64::encode(&png), "mimeType": "image/png"}));
    }
    Ok(out)
}
