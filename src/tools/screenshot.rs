//! See: vm_screenshot, and the capture and live-VM check the mouse tools
//! ([`super::drive`]) share.

use std::path::PathBuf;

use serde_json::json;

use super::{object, presets, screen_params, vm_name_arg};
use crate::b64;
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::ops::screen::{self as ops_screen, Wait};
use crate::ops::session::{self, SessionError};
use crate::qemu::qmp::{Qmp, QmpError};
use crate::qemu::screen::{self, CaptureError, Frame};
use crate::qemu::vm;
use crate::state::registry::Record;
use crate::state::roots::Access;

/// A VM that must be running, for the screen, keyboard and mouse tools.
pub fn live(name: &str) -> Result<Record, ToolError> {
    Ok(crate::ops::vm::records::lookup_live(
        name,
        "launch it first",
    )?)
}

/// The monitor session of a screen/keyboard/mouse tool: failures explained for VM `name`.
pub type Session<T> = Result<T, SessionError<QmpError>>;

/// Captures the screen within an open session (see [`screen::capture`]: a pipe, or a
/// temporary file in the VM's state folder, removed on every path).
pub fn capture(q: &mut Qmp, name: &str) -> Session<Frame> {
    screen::capture(q, &vm::state_dir(name)).map_err(|e| match e {
        CaptureError::Qmp(e) => SessionError::Channel(e),
        other => ToolError::new(format!("screenshot of {name:?} failed: {other}")).into(),
    })
}

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
                "max_edge": screen_params::max_edge_schema(),
                "max_width": screen_params::max_width_schema(),
                "max_height": screen_params::max_height_schema(),
                "max_bytes": screen_params::max_bytes_schema(),
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
    let save_to: Option<PathBuf> = match args.opt_str("path")? {
        Some(_) => Some(super::path_arg(args, "path", Access::Write)?),
        None => None,
    };
    let bounds = screen_params::bounds(args, save_to.is_none())?;
    let rec = live(&name)?;
    // The one capture path (the screen resource takes it too): the monitor is held for the
    // capture only; scaling and encoding happen after it.
    let got = ops_screen::capture(&name, &rec, &bounds, Wait::Queue).map_err(|e| match e {
        CaptureError::Qmp(e) => ToolError::new(session::explain_qmp(&name, &rec, &e)),
        other => ToolError::new(format!("screenshot of {name:?} failed: {other}")),
    })?;
    let (shot, png) = (&got.shot, &got.shot.png);
    let mut out = json!({
        "name": name, "width": png.width, "height": png.height, "scale": shot.scale,
        "screen_width": got.screen_width, "screen_height": got.screen_height,
        "bytes": png.data.len(), "format": "png", "path": null,
        "hash": ops_screen::hash_text(got.hash)
    });
    crate::ops::screen::memory::remember(&name, vec![got.frame.clone()]);
    if let Some(p) = save_to {
        // A temporary file beside the target, renamed into place, all relative to the folder
        // opened beneath its root: no symlink is followed, and a failed write leaves nothing.
        crate::state::beneath::write_replace(&p, &png.data).map_err(|e| {
            ToolError::new(format!(
                "cannot save the screenshot to {}: {e}",
                p.display()
            ))
        })?;
        out["path"] = json!(p.display().to_string());
        return Ok(ToolOutput::json(out));
    }
    Ok(ToolOutput {
        structured: out,
        extra: vec![
            json!({"type": "image", "data": b64::encode(&png.data), "mimeType": "image/png"}),
        ],
    })
}
