//! See: vm_screenshot (the capture is [`crate::ops::screen::screenshot`]).

use serde::Deserialize;
use serde_json::json;

use crate::b64;
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::screen::{self as ops_screen, ScreenshotRequest};
use crate::ops::vm::checks::{checked_path, Access};
use crate::schema::Param;
use crate::tools::names::VmName;
use crate::tools::presets;
use crate::tools::screen::params::BoundArgs;

const SCREENSHOT_DESCRIPTION: &str = "The VM's screen as a PNG, inline and scaled to fit max_edge \
    (1568) and max_bytes, or saved full size to path. Returns width, height, the screen's size, \
    scale (image/screen: pass it to vm_click with image coordinates) and hash (for \
    vm_screen_wait). Works on paused VMs.";

/// `vm_screenshot`.
pub const SCREENSHOT: ToolDef = ToolDef {
    name: "vm_screenshot",
    title: "Screenshot a VM",
    description: SCREENSHOT_DESCRIPTION,
    input_schema: ShotArgs::param,
    output_schema: <crate::ops::screen::Screenshot as crate::schema::Schema>::schema,
    annotations: presets::READ_ONLY,
    handler: screenshot,
    ui: presets::OPENS_VIEW,
};

crate::params! {
    #[derive(Deserialize)]
    struct ShotArgs {
        name: VmName,
        /// Save here instead of inline.
        path: Option<String>,
        #[serde(flatten)]
        bounds: BoundArgs,
    }
}

fn screenshot(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: ShotArgs = args.parse()?;
    let save_to = a
        .path
        .map(|p| checked_path(&p, "path", Access::Write))
        .transpose()?;
    let bounds = a.bounds.bounds(save_to.is_none())?;
    let req = ScreenshotRequest {
        name: a.name.0,
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
