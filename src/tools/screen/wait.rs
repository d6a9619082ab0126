//! See: vm_screen_wait, the MCP side of [`crate::ops::screen::wait`].

use std::time::Duration;

use serde_json::json;

use crate::b64;
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::ops::screen::wait::{self as screen_wait, WaitRequest};
use crate::ops::screen::{hash_text, parse_hash};
use crate::ops::screen::{Rect, MAX_DIM};
use crate::tools::screen::params;
use crate::tools::{object, presets, vm_name_arg};

const DESCRIPTION: &str = "Wait until the VM's screen changes and then holds still, and return \
    it: instead of sleeping and polling screenshots after a key or click. Waits until the screen \
    differs from the last screenshot this server returned for the VM (vm_screenshot or \
    vm_screen_wait; none yet: from the screen as the call starts), or from since (a hash a \
    screenshot reported), then until it has not changed for stable_ms (a blinking cursor counts \
    as still). region {x, y, width, height} (screen pixels: divide a scaled image's coordinates \
    by its scale) limits what counts. Returns the final screen as vm_screenshot does (inline \
    PNG, same bounds and fields, hash), with changed, stable, waited_ms and, when it timed out \
    (timeout_s, at most 600), a reason. Sends progress while waiting. A paused or stopped VM is \
    an error at once.";

/// `vm_screen_wait`.
pub const SCREEN_WAIT: ToolDef = ToolDef {
    name: "vm_screen_wait",
    title: "Wait for the screen",
    description: DESCRIPTION,
    input_schema: || {
        let edge = |d: &str| json!({"type": "integer", "minimum": 0, "maximum": MAX_DIM, "description": d});
        object(
            json!({
                "name": presets::name_schema(),
                "stable_ms": {
                    "type": "integer", "minimum": 100, "maximum": 60000, "default": 1000,
                    "description": "How long the changed screen must hold still."
                },
                "timeout_s": {
                    "type": "number", "minimum": 0,
                    "maximum": screen_wait::MAX_TIMEOUT.as_secs(), "default": 30,
                    "description": "The longest wait; then the screen as it is, with a reason."
                },
                "since": {
                    "type": "string", "pattern": "^[0-9a-f]{16}$",
                    "description": "Wait for a change from this screen (a screenshot's hash)."
                },
                "region": {
                    "type": "object",
                    "properties": {
                        "x": edge("Left edge, screen pixels."),
                        "y": edge("Top edge, screen pixels."),
                        "width": edge("Width, screen pixels."),
                        "height": edge("Height, screen pixels.")
                    },
                    "required": ["x", "y", "width", "height"],
                    "additionalProperties": false,
                    "description": "Only changes in this rectangle count."
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
                "changed": {"type": "boolean", "description": "The screen differs from the baseline."},
                "stable": {"type": "boolean", "description": "It held still for stable_ms."},
                "waited_ms": {"type": "integer"},
                "polls": {"type": "integer"},
                "reason": {"type": "string", "description": "Why it ended without a settled change."},
                "hash": {"type": "string"},
                "width": {"type": "integer"},
                "height": {"type": "integer"},
                "scale": {"type": "number"},
                "screen_width": {"type": "integer"},
                "screen_height": {"type": "integer"},
                "bytes": {"type": "integer"},
                "format": {"type": "string"}
            },
            "required": [
                "name", "changed", "stable", "waited_ms", "hash", "width", "height", "scale",
                "screen_width", "screen_height", "bytes"
            ]
        })
    },
    annotations: presets::READ_ONLY_WAIT,
    handler: screen_wait,
    ui: presets::OPENS_VIEW,
};

/// The `region` argument, if given: a non-empty rectangle.
fn region_arg(args: &Args) -> Result<Option<Rect>, ToolError> {
    let Some(r) = args.get("region") else {
        return Ok(None);
    };
    let field = |k: &str| -> Result<u32, ToolError> {
        r[k].as_u64()
            .filter(|v| *v <= u64::from(MAX_DIM))
            .map(|v| v as u32)
            .ok_or_else(|| {
                ToolError::new(format!(
                    "region.{k} must be an integer from 0 to {MAX_DIM}; nothing was waited for"
                ))
            })
    };
    let rect = Rect {
        x: field("x")?,
        y: field("y")?,
        width: field("width")?,
        height: field("height")?,
    };
    if rect.width == 0 || rect.height == 0 {
        return Err(ToolError::new(
            "region must be at least 1x1 pixels; nothing was waited for",
        ));
    }
    Ok(Some(rect))
}

/// The typed request from a call's arguments.
fn request(args: &Args) -> Result<WaitRequest, ToolError> {
    let stable_ms = args.int("stable_ms")? as u64;
    let timeout = Duration::from_secs_f64(args.number("timeout_s")?);
    let since = match args.opt_str("since")? {
        None => None,
        Some(s) => Some(parse_hash(s).ok_or_else(|| {
            ToolError::new(format!(
                "since {s:?} is not a screenshot's hash (16 hex digits); nothing was waited for"
            ))
        })?),
    };
    Ok(WaitRequest {
        stable_ms,
        timeout,
        region: region_arg(args)?,
        since,
        bounds: params::bounds(args, true)?,
    })
}

fn screen_wait(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let req = request(args)?;
    let rec = crate::ops::vm::records::lookup_live(&name, "launch it first")?;
    let got = screen_wait::wait(ctx, &name, &rec, &req)?;
    let (cap, png) = (&got.capture, &got.capture.shot.png);
    let mut out = json!({
        "name": name, "changed": got.changed, "stable": got.stable,
        "waited_ms": got.waited_ms, "polls": got.polls, "hash": hash_text(cap.hash),
        "width": png.width, "height": png.height, "scale": cap.shot.scale,
        "screen_width": cap.screen_width, "screen_height": cap.screen_height,
        "bytes": png.data.len(), "format": "png"
    });
    if let Some(r) = &got.reason {
        out["reason"] = json!(r);
    }
    Ok(ToolOutput {
        structured: out,
        extra: vec![
            json!({"type": "image", "data": b64::encode(&png.data), "mimeType": "image/png"}),
        ],
    })
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    #[test]
    fn arguments_become_a_request_and_bad_ones_are_named() {
        let schema = (SCREEN_WAIT.input_schema)();
        let args = |v: Value| Args::checked(v.as_object().unwrap().clone(), &schema);
        let checked =
            |v: Value| crate::mcp::call::check(&SCREEN_WAIT, v.as_object().unwrap().clone());
        let r = request(&args(json!({"name": "a"}))).unwrap();
        assert_eq!((r.stable_ms, r.timeout), (1000, Duration::from_secs(30)));
        assert_eq!((r.region, r.since), (None, None));
        // The bounds are the schema's, checked before the handler runs.
        let e = checked(json!({"name": "a", "timeout_s": 9999}))
            .err()
            .unwrap();
        assert_eq!(e.kind, "invalid_argument", "{}", e.msg);
        assert!(e.msg.contains("timeout_s"), "{}", e.msg);
        let r = request(
            &checked(json!({
                "name": "a", "stable_ms": 250, "timeout_s": 600, "since": "00000000000000ff",
                "region": {"x": 1, "y": 2, "width": 3, "height": 4}
            }))
            .unwrap(),
        )
        .unwrap();
        assert_eq!(r.timeout, screen_wait::MAX_TIMEOUT);
        assert_eq!((r.stable_ms, r.since), (250, Some(255)));
        assert_eq!(
            r.region,
            Some(Rect {
                x: 1,
                y: 2,
                width: 3,
                height: 4
            })
        );
        let err = |v: Value| request(&args(v)).err().unwrap().msg;
        assert!(err(json!({"since": "xyz"})).contains("since"));
        let e = err(json!({"region": {"x": 0, "y": 0, "width": 0, "height": 5}}));
        assert!(e.contains("1x1"), "{e}");
        assert!(
            err(json!({"region": {"x": -1, "y": 0, "width": 1, "height": 1}})).contains("region.x")
        );
    }
}
