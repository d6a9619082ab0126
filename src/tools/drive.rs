//! See and drive: screenshots and the mouse through QMP (the keyboard is in
//! [`super::keyboard`]).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use super::object;
use super::session::{self, SessionError};
use crate::b64;
use crate::mcp::tool::{Annotations, Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::qemu::qmp::{Qmp, QmpError};
use crate::qemu::screen::{self, Png, TempCapture};
use crate::qemu::vm;
use crate::state::registry::Record;
use crate::state::roots::Access;

/// Largest |dx| or |dy| for vm_mouse_move.
pub const MAX_DELTA: i64 = 20000;

/// A VM that must be running, for the screen, keyboard and mouse tools.
pub fn live(name: &str) -> Result<Record, ToolError> {
    super::lifecycle::lookup_live(name, "launch it first")
}

/// The monitor session of a screen/keyboard/mouse tool: failures explained for VM `name`.
type Session<T> = Result<T, SessionError<QmpError>>;

/// Dumps the screen as PPM into a unique temporary file (removed on every path) and reads it.
/// PPM rather than QEMU's own PNG: measured on QEMU 7.2, a PNG screendump of a 720x400 screen
/// takes 8.7 ms, a PPM dump 2.9 ms, and encoding it here 0.1 ms.
fn dump_ppm(q: &mut Qmp, name: &str) -> Session<Vec<u8>> {
    let dir = vm::state_dir(name);
    std::fs::create_dir_all(&dir)
        .map_err(|e| ToolError::new(format!("cannot create {}: {e}", dir.display())))?;
    let file = TempCapture::new(&dir, "ppm");
    q.execute(
        "screendump",
        Some(json!({"filename": file.0.display().to_string()})),
    )?;
    Ok(std::fs::read(&file.0).map_err(|e| {
        ToolError::new(format!(
            "screenshot of {name:?} failed: QEMU wrote no screenshot: {e}"
        ))
    })?)
}

/// Captures the screen as PNG within an open session.
fn capture(q: &mut Qmp, name: &str) -> Session<Png> {
    let data = dump_ppm(q, name)?;
    Ok(screen::ppm_to_png(&data)
        .map_err(|e| ToolError::new(format!("screenshot of {name:?} failed: {e}")))?)
}

/// The current screen size, from a capture's header only.
fn screen_size(q: &mut Qmp, name: &str) -> Session<(u32, u32)> {
    let data = dump_ppm(q, name)?;
    Ok(screen::ppm_header(&data)
        .map(|(w, h, _)| (w, h))
        .map_err(|e| ToolError::new(format!("cannot read the screen size of {name:?}: {e}")))?)
}

const SCREENSHOT_DESCRIPTION: &str = "Capture the VM's screen as PNG, returned as MCP image \
    content with its width and height. With path, the PNG is saved to that file instead (useful \
    for large screens). Works on paused VMs.";

/// `vm_screenshot`.
pub const SCREENSHOT: ToolDef = ToolDef {
    name: "vm_screenshot",
    title: "Screenshot a VM",
    description: SCREENSHOT_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": {"type": "string", "minLength": 1},
                "path": {
                    "type": "string",
                    "description": "Save the PNG here instead of returning it inline."
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
                "width": {"type": "integer"},
                "height": {"type": "integer"},
                "bytes": {"type": "integer"},
                "format": {"type": "string"},
                "path": {"type": ["string", "null"]}
            },
            "required": ["name", "width", "height", "bytes"]
        })
    },
    annotations: Annotations {
        read_only: true,
        destructive: false,
        idempotent: true,
        open_world: false,
    },
    handler: screenshot,
};

fn screenshot(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = args.str("name")?.to_string();
    let save_to: Option<PathBuf> = match args.opt_str("path")? {
        Some(_) => Some(super::path_arg(args, "path", Access::Write)?),
        None => None,
    };
    let rec = live(&name)?;
    let png = session::monitor(&name, &rec, |q| capture(q, &name))?;
    let mut out = json!({
        "name": name, "width": png.width, "height": png.height, "bytes": png.data.len(),
        "format": "png", "path": null
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

const CLICK_DESCRIPTION: &str = "Move the pointer to screen pixel (x, y) through the absolute \
    tablet and click. Coordinates are checked against the current screen size (take a \
    vm_screenshot to see it). For guests without a tablet driver use vm_mouse_move.";

/// `vm_click`.
pub const CLICK: ToolDef = ToolDef {
    name: "vm_click",
    title: "Click in a VM",
    description: CLICK_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": {"type": "string", "minLength": 1},
                "x": {"type": "integer", "minimum": 0},
                "y": {"type": "integer", "minimum": 0},
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
                "button": {"type": "string"},
                "screen_width": {"type": "integer"},
                "screen_height": {"type": "integer"}
            },
            "required": ["name", "x", "y", "button"]
        })
    },
    annotations: Annotations {
        read_only: false,
        destructive: true,
        idempotent: false,
        open_world: false,
    },
    handler: click,
};

/// Scales a pixel coordinate to QEMU's absolute axis range 0..=32767.
pub fn scale(pos: u32, size: u32) -> i64 {
    if size <= 1 {
        return 0;
    }
    (i64::from(pos) * 32767) / i64::from(size - 1)
}

fn click(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = args.str("name")?.to_string();
    let x = args.opt_i64("x")?.unwrap_or(-1);
    let y = args.opt_i64("y")?.unwrap_or(-1);
    let button = args.str_or("button", "left")?.to_string();
    let double = args.bool_or("double", false)?;
    let rec = live(&name)?;
    let (w, h) = session::monitor(&name, &rec, |q| {
        let (w, h) = screen_size(q, &name)?;
        if x < 0 || y < 0 || x >= i64::from(w) || y >= i64::from(h) {
            return Ok((w, h));
        }
        q.execute(
            "input-send-event",
            Some(json!({"events": [
                {"type": "abs", "data": {"axis": "x", "value": scale(x as u32, w)}},
                {"type": "abs", "data": {"axis": "y", "value": scale(y as u32, h)}}
            ]})),
        )?;
        click_cmds(q, &button, double)?;
        Ok((w, h))
    })?;
    if x < 0 || y < 0 || x >= i64::from(w) || y >= i64::from(h) {
        return Err(ToolError::new(format!(
            "({x}, {y}) is outside the {w}x{h} screen; nothing was sent"
        )));
    }
    Ok(ToolOutput::json(json!({
        "name": name, "x": x, "y": y, "button": button, "screen_width": w, "screen_height": h
    })))
}

const MOUSE_MOVE_DESCRIPTION: &str = "Relative (PS/2-style) mouse motion for guests without a \
    tablet driver: optionally home to a corner first, then move by (dx, dy) in chunks of step \
    pixels (|dx|, |dy| <= 20000), then optionally click. The guest's pointer acceleration may \
    scale the distance.";

/// `vm_mouse_move`.
pub const MOUSE_MOVE: ToolDef = ToolDef {
    name: "vm_mouse_move",
    title: "Move the mouse relatively",
    description: MOUSE_MOVE_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": {"type": "string", "minLength": 1},
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
                "step": {"type": "integer", "minimum": 1, "maximum": 120, "default": 32}
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
                "home": {"type": ["string", "null"]},
                "click": {"type": ["string", "null"]}
            },
            "required": ["name", "dx", "dy", "commands"]
        })
    },
    annotations: Annotations {
        read_only: false,
        destructive: true,
        idempotent: false,
        open_world: false,
    },
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
    let name = args.str("name")?.to_string();
    let dx = args.i64_or("dx", 0)?;
    let dy = args.i64_or("dy", 0)?;
    if dx.abs() > MAX_DELTA || dy.abs() > MAX_DELTA {
        return Err(ToolError::new(format!(
            "|dx| and |dy| must be at most {MAX_DELTA}; nothing was sent"
        )));
    }
    let step = args.i64_or("step", 32)?.clamp(1, 120);
    let home = args.opt_str("home")?.map(str::to_string);
    let click_btn = args.opt_str("click")?.map(str::to_string);
    let double = args.bool_or("double", false)?;
    let rec = live(&name)?;
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
    plan.extend(rel_steps(dx, dy, step));
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
        "name": name, "dx": dx, "dy": dy, "commands": commands, "home": home, "click": click_btn
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
    fn scales_to_qemu_range() {
        assert_eq!(scale(0, 1024), 0);
        assert_eq!(scale(1023, 1024), 32767);
        assert_eq!(scale(512, 1025), 16383);
    }
}
