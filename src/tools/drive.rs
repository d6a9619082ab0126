//! See and drive: screenshots and the mouse through QMP (the keyboard is in
//! [`super::keyboard`]).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use super::{object, presets, vm_name_arg};
use crate::b64;
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::ops::session::{self, SessionError};
use crate::qemu::qmp::{Qmp, QmpError};
use crate::qemu::screen::{self, Bounds, CaptureError, Frame};
use crate::qemu::vm;
use crate::state::registry::Record;
use crate::state::roots::Access;

/// Largest |dx| or |dy| for vm_mouse_move.
pub const MAX_DELTA: i64 = 20000;

/// A VM that must be running, for the screen, keyboard and mouse tools.
pub fn live(name: &str) -> Result<Record, ToolError> {
    Ok(crate::ops::records::lookup_live(name, "launch it first")?)
}

/// The monitor session of a screen/keyboard/mouse tool: failures explained for VM `name`.
type Session<T> = Result<T, SessionError<QmpError>>;

/// Captures the screen within an open session (see [`screen::capture`]: a pipe, or a
/// temporary file in the VM's state folder, removed on every path).
fn capture(q: &mut Qmp, name: &str) -> Session<Frame> {
    screen::capture(q, &vm::state_dir(name)).map_err(|e| match e {
        CaptureError::Qmp(e) => SessionError::Channel(e),
        other => ToolError::new(format!("screenshot of {name:?} failed: {other}")).into(),
    })
}

/// Largest `max_edge`, `max_width` and `max_height`: the largest screen a capture accepts.
const MAX_BOUND: i64 = screen::MAX_DIM as i64;

/// Smallest `max_bytes`.
const MIN_BYTES: i64 = 16 * 1024;

const SCREENSHOT_DESCRIPTION: &str = "Capture the VM's screen as a PNG image. Returned inline \
    (MCP image content), a screen whose longer edge is over 1568 px is scaled down to 1568 \
    (area averaging, as hosts reject or shrink larger images), and the PNG is kept within \
    max_bytes (750000: its base64 stays within 1 MB) by scaling it further if needed; \
    max_edge, max_width and max_height set other bounds (max_edge 16384 returns the full \
    screen). The result gives the image's width and height, the screen's (screen_width, \
    screen_height) and scale (the image's size divided by the screen's). To click or point at \
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
                "max_edge": {
                    "type": "integer", "minimum": screen::MIN_EDGE, "maximum": MAX_BOUND,
                    "description": "Largest longer edge of the image (inline default 1568 when \
                        neither max_width nor max_height is given; with path, none)."
                },
                "max_width": {
                    "type": "integer", "minimum": screen::MIN_EDGE, "maximum": MAX_BOUND,
                    "description": "Largest image width."
                },
                "max_height": {
                    "type": "integer", "minimum": screen::MIN_EDGE, "maximum": MAX_BOUND,
                    "description": "Largest image height."
                },
                "max_bytes": {
                    "type": "integer", "minimum": MIN_BYTES,
                    "description": "Largest PNG in bytes: a larger one is scaled down until it \
                        fits (inline default 750000; with path, none)."
                }
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
};

/// A positive integer argument no larger than `max`, if given.
fn bound_arg(args: &Args, key: &str, min: i64, max: i64) -> Result<Option<u32>, ToolError> {
    match args.opt_i64(key)? {
        None => Ok(None),
        Some(v) if (min..=max).contains(&v) => Ok(Some(v as u32)),
        Some(v) => Err(ToolError::new(format!(
            "{key} must be between {min} and {max}, not {v}; nothing was captured"
        ))),
    }
}

/// The screenshot's bounds from its arguments: inline, the longer edge defaults to
/// [`screen::DEFAULT_MAX_EDGE`] unless a width or height bound is given, and the PNG to
/// [`screen::DEFAULT_MAX_BYTES`]; saved to a file, only the bounds given apply.
fn bounds(args: &Args, inline: bool) -> Result<Bounds, ToolError> {
    let max_width = bound_arg(args, "max_width", i64::from(screen::MIN_EDGE), MAX_BOUND)?;
    let max_height = bound_arg(args, "max_height", i64::from(screen::MIN_EDGE), MAX_BOUND)?;
    let mut max_edge = bound_arg(args, "max_edge", i64::from(screen::MIN_EDGE), MAX_BOUND)?;
    if inline && max_edge.is_none() && max_width.is_none() && max_height.is_none() {
        max_edge = Some(screen::DEFAULT_MAX_EDGE);
    }
    let max_bytes = match args.opt_i64("max_bytes")? {
        Some(v) if v < MIN_BYTES => {
            return Err(ToolError::new(format!(
                "max_bytes must be at least {MIN_BYTES}, not {v}; nothing was captured"
            )))
        }
        Some(v) => Some(usize::try_from(v).unwrap_or(usize::MAX)),
        None if inline => Some(screen::DEFAULT_MAX_BYTES),
        None => None,
    };
    Ok(Bounds {
        max_width,
        max_height,
        max_edge,
        max_bytes,
    })
}

fn screenshot(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let save_to: Option<PathBuf> = match args.opt_str("path")? {
        Some(_) => Some(super::path_arg(args, "path", Access::Write)?),
        None => None,
    };
    let bounds = bounds(args, save_to.is_none())?;
    let rec = live(&name)?;
    // The monitor is held for the capture only; scaling and encoding happen after it.
    let frame = session::monitor(&name, &rec, |q| capture(q, &name))?;
    let shot = screen::render(&frame, &bounds)
        .map_err(|e| ToolError::new(format!("screenshot of {name:?} failed: {e}")))?;
    let png = &shot.png;
    let mut out = json!({
        "name": name, "width": png.width, "height": png.height, "scale": shot.scale,
        "screen_width": frame.width, "screen_height": frame.height,
        "bytes": png.data.len(), "format": "png", "path": null
    });
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

/// The `scale` parameter of vm_click and vm_mouse_move.
fn scale_param() -> Value {
    json!({
        "type": "number", "minimum": MIN_SCALE, "maximum": 1,
        "description": "The scale of the vm_screenshot the coordinates were read from (as it \
            returned it): they are then pixels of that image, mapped to the screen. Default 1: \
            screen pixels."
    })
}

/// Smallest `scale` accepted (below any vm_screenshot gives: a 32 px image of a 16384 px screen
/// is 0.0019).
const MIN_SCALE: f64 = 0.0001;

/// The `scale` argument: 1 when absent.
fn scale_arg(args: &Args) -> Result<f64, ToolError> {
    match args.opt_f64("scale")? {
        None => Ok(1.0),
        Some(s) if (MIN_SCALE..=1.0).contains(&s) => Ok(s),
        Some(s) => Err(ToolError::new(format!(
            "scale must be between {MIN_SCALE} and 1 (a screenshot's size divided by the \
             screen's, as vm_screenshot returns it), not {s}; nothing was sent"
        ))),
    }
}

/// Maps a coordinate of a scaled image of the screen (`image` pixels along this axis for
/// `screen` screen pixels) to the screen pixel under the image pixel's centre.
pub fn to_screen(pos: i64, image: u32, screen: u32) -> i64 {
    if image >= screen || image == 0 {
        return pos;
    }
    let p = ((pos as f64 + 0.5) * f64::from(screen) / f64::from(image)).floor() as i64;
    p.min(i64::from(screen) - 1)
}

fn button_event(button: &str, down: bool) -> Value {
    json!({"type": "btn", "data": {"down": down, "button": button}})
}

/// Pause between mouse commands the guest must see separately. QEMU's PS/2 mouse queue holds
/// four packets; a button change that finds it full (say, behind relative motion) is merged
/// into the next one, so a down and an up sent back to back can vanish as a whole click.
const MOUSE_PACE: Duration = Duration::from_millis(20);

fn click_cmds(q: &mut Qmp, button: &str, double: bool) -> Result<(), QmpError> {
    for i in 0..if double { 2 } else { 1 } {
        if i > 0 {
            std::thread::sleep(MOUSE_PACE);
        }
        // Down and up in separate commands: in one command both are lost on PS/2 and USB tablets.
        q.execute(
            "input-send-event",
            Some(json!({"events": [button_event(button, true)]})),
        )?;
        std::thread::sleep(MOUSE_PACE);
        q.execute(
            "input-send-event",
            Some(json!({"events": [button_event(button, false)]})),
        )?;
    }
    Ok(())
}

const CLICK_DESCRIPTION: &str = "Move the pointer to (x, y) through the absolute tablet and \
    click. Coordinates are screen pixels, or, with scale (the scale a vm_screenshot returned), \
    pixels of that screenshot: each is mapped to the screen pixel under it, and the result \
    gives both. They are checked against the current screen size (take a vm_screenshot to see \
    it). For guests without a tablet driver use vm_mouse_move.";

/// `vm_click`.
pub const CLICK: ToolDef = ToolDef {
    name: "vm_click",
    title: "Click in a VM",
    description: CLICK_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "x": {"type": "integer", "minimum": 0},
                "y": {"type": "integer", "minimum": 0},
                "scale": scale_param(),
                "button": {
                    "type": "string", "enum": ["left", "right", "middle"], "default": "left"
                },
                "double": {"type": "boolean", "default": false}
            }),
            &["name", "x", "y"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "x": {"type": "integer"},
                "y": {"type": "integer"},
                "scale": {"type": "number"},
                "screen_x": {"type": "integer", "description": "The screen pixel clicked."},
                "screen_y": {"type": "integer"},
                "button": {"type": "string"},
                "screen_width": {"type": "integer"},
                "screen_height": {"type": "integer"}
            },
            "required": ["name", "x", "y", "button"]
        })
    },
    annotations: presets::DESTRUCTIVE,
    handler: click,
};

/// Maps a screen pixel to QEMU's absolute axis range 0..=32767.
pub fn abs_axis(pos: u32, size: u32) -> i64 {
    if size <= 1 {
        return 0;
    }
    (i64::from(pos) * 32767) / i64::from(size - 1)
}

fn click(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let x = args.opt_i64("x")?.unwrap_or(-1);
    let y = args.opt_i64("y")?.unwrap_or(-1);
    let scale = scale_arg(args)?;
    let button = args.str_or("button", "left")?.to_string();
    let double = args.bool_or("double", false)?;
    let rec = live(&name)?;
    // The image the coordinates were read from: the screen at `scale`, sized as vm_screenshot
    // sized it, so that its pixels map back exactly.
    let within = |w: u32, h: u32| {
        let (iw, ih) = screen::scaled_size(w, h, scale);
        let inside = x >= 0 && y >= 0 && x < i64::from(iw) && y < i64::from(ih);
        (inside, iw, ih)
    };
    let (w, h, sx, sy) = session::monitor(&name, &rec, |q| {
        let frame = capture(q, &name)?;
        let (w, h) = (frame.width, frame.height);
        drop(frame);
        let (inside, iw, ih) = within(w, h);
        if !inside {
            return Ok((w, h, -1, -1));
        }
        let (sx, sy) = (to_screen(x, iw, w), to_screen(y, ih, h));
        q.execute(
            "input-send-event",
            Some(json!({"events": [
                {"type": "abs", "data": {"axis": "x", "value": abs_axis(sx as u32, w)}},
                {"type": "abs", "data": {"axis": "y", "value": abs_axis(sy as u32, h)}}
            ]})),
        )?;
        click_cmds(q, &button, double)?;
        Ok((w, h, sx, sy))
    })?;
    if sx < 0 {
        let (_, iw, ih) = within(w, h);
        return Err(ToolError::new(if scale < 1.0 {
            format!(
                "({x}, {y}) is outside the {iw}x{ih} screenshot (scale {scale}) of the {w}x{h} \
                 screen; nothing was sent"
            )
        } else {
            format!("({x}, {y}) is outside the {w}x{h} screen; nothing was sent")
        }));
    }
    Ok(ToolOutput::json(json!({
        "name": name, "x": x, "y": y, "scale": scale, "screen_x": sx, "screen_y": sy,
        "button": button, "screen_width": w, "screen_height": h
    })))
}

const MOUSE_MOVE_DESCRIPTION: &str = "Relative (PS/2-style) mouse motion for guests without a \
    tablet driver: optionally home to a corner first, then move by (dx, dy) in chunks of step \
    pixels (|dx|, |dy| <= 20000), then optionally click. With scale (the scale a vm_screenshot \
    returned), dx and dy are pixels of that screenshot, divided by scale into screen pixels. \
    The guest's pointer acceleration may scale the distance.";

/// `vm_mouse_move`.
pub const MOUSE_MOVE: ToolDef = ToolDef {
    name: "vm_mouse_move",
    title: "Move the mouse relatively",
    description: MOUSE_MOVE_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "dx": {
                    "type": "integer", "minimum": -MAX_DELTA, "maximum": MAX_DELTA, "default": 0
                },
                "dy": {
                    "type": "integer", "minimum": -MAX_DELTA, "maximum": MAX_DELTA, "default": 0
                },
                "home": {
                    "type": "string",
                    "enum": ["top-left", "top-right", "bottom-left", "bottom-right", null]
                },
                "click": {
                    "type": "string", "enum": ["left", "right", "middle", null]
                },
                "double": {"type": "boolean", "default": false},
                "step": {"type": "integer", "minimum": 1, "maximum": 120, "default": 32},
                "scale": scale_param()
            }),
            &["name"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "dx": {"type": "integer"},
                "dy": {"type": "integer"},
                "commands": {"type": "integer"},
                "screen_dx": {"type": "integer", "description": "dx in screen pixels."},
                "screen_dy": {"type": "integer"},
                "home": {"type": ["string", "null"]},
                "click": {"type": ["string", "null"]}
            },
            "required": ["name", "dx", "dy", "commands"]
        })
    },
    annotations: presets::DESTRUCTIVE,
    handler: mouse_move,
};

/// Splits a relative move into per-command steps of at most `step` on each axis.
pub fn rel_steps(dx: i64, dy: i64, step: i64) -> Vec<(i64, i64)> {
    let step = step.clamp(1, 127);
    let n = ((dx.abs().max(dy.abs()) + step - 1) / step).max(0);
    let mut out = Vec::with_capacity(n as usize);
    let (mut sx, mut sy) = (0i64, 0i64);
    for i in 1..=n {
        let tx = dx * i / n;
        let ty = dy * i / n;
        out.push((tx - sx, ty - sy));
        sx = tx;
        sy = ty;
    }
    out
}

fn mouse_move(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let dx = args.i64_or("dx", 0)?;
    let dy = args.i64_or("dy", 0)?;
    let scale = scale_arg(args)?;
    if dx.abs() > MAX_DELTA || dy.abs() > MAX_DELTA {
        return Err(ToolError::new(format!(
            "|dx| and |dy| must be at most {MAX_DELTA}; nothing was sent"
        )));
    }
    let (sdx, sdy) = (
        (dx as f64 / scale).round() as i64,
        (dy as f64 / scale).round() as i64,
    );
    if sdx.abs() > MAX_DELTA || sdy.abs() > MAX_DELTA {
        return Err(ToolError::new(format!(
            "({dx}, {dy}) at scale {scale} is ({sdx}, {sdy}) screen pixels, past {MAX_DELTA}; \
             nothing was sent"
        )));
    }
    // Relative motion needs a relative mouse (a PC's PS/2 one); the virt boards have only the
    // absolute tablet, where this motion would go nowhere.
    let rec = live(&name)?;
    if crate::ops::records::input(&rec, "relative_pointer").is_none() {
        return Err(ToolError::new(format!(
            "VM {name:?} has no relative mouse (machine {}), so the motion would go nowhere; \
             use vm_click with x and y (the absolute tablet) instead",
            rec.get("machine").and_then(Value::as_str).unwrap_or("?")
        )));
    }
    let step = args.i64_or("step", 32)?.clamp(1, 120);
    let home = args.opt_str("home")?.map(str::to_string);
    let click_btn = args.opt_str("click")?.map(str::to_string);
    let double = args.bool_or("double", false)?;
    let mut plan = Vec::new();
    if let Some(h) = &home {
        let far = 4000;
        let (hx, hy) = match h.as_str() {
            "top-left" => (-far, -far),
            "top-right" => (far, -far),
            "bottom-left" => (-far, far),
            _ => (far, far),
        };
        plan.extend(rel_steps(hx, hy, step));
    }
    plan.extend(rel_steps(sdx, sdy, step));
    let commands = plan.len();
    session::monitor(&name, &rec, |q| {
        for (i, (sx, sy)) in plan.iter().enumerate() {
            q.execute(
                "input-send-event",
                Some(json!({"events": [
                    {"type": "rel", "data": {"axis": "x", "value": sx}},
                    {"type": "rel", "data": {"axis": "y", "value": sy}}
                ]})),
            )?;
            if i % 64 == 63 && ctx.cancelled() {
                return Err(ToolError::new("cancelled").into());
            }
        }
        if !plan.is_empty() {
            // QEMU holds back motion while the PS/2 queue is full and sends it with the next
            // event: give the guest time to drain, then flush with empty motion, so all of it
            // arrives (and before any click, not merged into it).
            for _ in 0..2 {
                std::thread::sleep(MOUSE_PACE);
                q.execute(
                    "input-send-event",
                    Some(json!({"events": [
                        {"type": "rel", "data": {"axis": "x", "value": 0}},
                        {"type": "rel", "data": {"axis": "y", "value": 0}}
                    ]})),
                )?;
            }
            std::thread::sleep(MOUSE_PACE);
        }
        if let Some(b) = &click_btn {
            click_cmds(q, b, double)?;
        }
        Ok(())
    })?;
    Ok(ToolOutput::json(json!({
        "name": name, "dx": dx, "dy": dy, "screen_dx": sdx, "screen_dy": sdy,
        "commands": commands, "home": home, "click": click_btn
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_steps_sum_and_stay_small() {
        for (dx, dy, step) in [
            (1000, -333, 32),
            (-5, 7, 120),
            (0, 0, 10),
            (20000, 20000, 1),
        ] {
            let s = rel_steps(dx, dy, step);
            assert_eq!(s.iter().map(|p| p.0).sum::<i64>(), dx);
            assert_eq!(s.iter().map(|p| p.1).sum::<i64>(), dy);
            assert!(s.iter().all(|p| p.0.abs() <= step && p.1.abs() <= step));
        }
    }

    #[test]
    fn screenshot_pixels_map_back_to_the_screen_pixels_under_them() {
        // 1920 screen pixels shown as 1568 (scale 0.8166): the edges map to the edges, and
        // every image pixel to the screen pixel under its centre.
        let (iw, _) = screen::scaled_size(1920, 1080, 0.8166);
        assert_eq!(iw, 1568);
        assert_eq!(to_screen(0, iw, 1920), 0);
        assert_eq!(to_screen(1567, iw, 1920), 1919);
        assert_eq!(to_screen(784, iw, 1920), 960);
        for x in 0..1568 {
            let sx = to_screen(x, iw, 1920);
            let centre = (x as f64 + 0.5) * 1920.0 / 1568.0;
            assert!(
                sx as f64 <= centre && centre < (sx + 1) as f64,
                "{x} -> {sx}"
            );
        }
        // Full size: unchanged.
        assert_eq!(to_screen(719, 720, 720), 719);
    }

    #[test]
    fn inline_screenshots_are_bounded_by_default_and_files_are_not() {
        let args = |v: Value| Args(v.as_object().unwrap().clone());
        let b = bounds(&args(json!({"name": "a"})), true).unwrap();
        assert_eq!(b.max_edge, Some(screen::DEFAULT_MAX_EDGE));
        assert_eq!(b.max_bytes, Some(screen::DEFAULT_MAX_BYTES));
        let b = bounds(&args(json!({"name": "a"})), false).unwrap();
        assert_eq!(b, Bounds::default());
        // A width or height bound replaces the default edge; bytes keep theirs.
        let b = bounds(&args(json!({"name": "a", "max_width": 1024})), true).unwrap();
        assert_eq!((b.max_width, b.max_edge), (Some(1024), None));
        assert_eq!(b.max_bytes, Some(screen::DEFAULT_MAX_BYTES));
        assert!(bounds(&args(json!({"max_edge": 5})), true).is_err());
        assert!(bounds(&args(json!({"max_bytes": 100})), true).is_err());
    }

    #[test]
    fn scales_to_qemu_range() {
        assert_eq!(abs_axis(0, 1024), 0);
        assert_eq!(abs_axis(1023, 1024), 32767);
        assert_eq!(abs_axis(512, 1025), 16383);
    }
}
