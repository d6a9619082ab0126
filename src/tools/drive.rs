//! Drive the mouse: vm_click through the absolute tablet and vm_mouse_move through the
//! relative mouse (the keyboard is in [`super::keyboard`], the screen in [`super::screenshot`]).

use std::time::Duration;

use serde_json::{json, Value};

use super::params::{outside_screenshot, scale_arg, scale_param};
use super::screenshot::{capture, live, Session};
use super::{object, presets, vm_name_arg};
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::ops::screen::pointer::screen_point;
use crate::ops::session;
use crate::qemu::qmp::{Qmp, QmpError};

/// Largest |dx| or |dy| for vm_mouse_move.
pub const MAX_DELTA: i64 = 20000;

/// The `scale` parameter of vm_click and vm_mouse_move.
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
            std::thread::sleep(crate::ops::screen::pointer::CLICK_GAP);
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
                "double": {"type": "boolean", "default": false},
                "hold": super::params::hold_param()
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
                "hold": {"type": "array", "items": {"type": "string"}},
                "screen_width": {"type": "integer"},
                "screen_height": {"type": "integer"}
            },
            "required": ["name", "x", "y", "button"]
        })
    },
    annotations: presets::DESTRUCTIVE,
    handler: click,
    ui: crate::mcp::tool::Ui::NONE,
};

pub use crate::ops::screen::pointer::abs_axis;

fn click(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    crate::ops::screen::hold::check_agent(&name, "vm_click")?;
    let x = args.opt_i64("x")?.unwrap_or(-1);
    let y = args.opt_i64("y")?.unwrap_or(-1);
    let scale = scale_arg(args)?;
    let button = args.str_or("button", "left")?.to_string();
    let double = args.bool_or("double", false)?;
    let hold = super::params::hold_arg(args)?;
    let rec = live(&name)?;
    // The image the coordinates were read from: the screen at `scale`, sized as vm_screenshot
    // sized it, so that its pixels map back exactly.
    let (w, h, at) = session::monitor(&name, &rec, |q| {
        let frame = capture(q, &name)?;
        let (w, h) = (frame.width, frame.height);
        drop(frame);
        let Some(at) = screen_point(x, y, scale, w, h) else {
            return Ok((w, h, None));
        };
        q.execute(
            "input-send-event",
            Some(json!({"events": [
                {"type": "abs", "data": {"axis": "x", "value": abs_axis(at.x, w)}},
                {"type": "abs", "data": {"axis": "y", "value": abs_axis(at.y, h)}}
            ]})),
        )?;
        press_keys(q, &hold, true)?;
        click_cmds(q, &button, double)?;
        press_keys(q, &hold, false)?;
        Ok((w, h, Some(at)))
    })?;
    let Some(at) = at else {
        return Err(outside_screenshot(x, y, scale, w, h));
    };
    let (sx, sy) = (at.x, at.y);
    Ok(ToolOutput::json(json!({
        "name": name, "x": x, "y": y, "scale": scale, "screen_x": sx, "screen_y": sy,
        "button": button, "hold": hold, "screen_width": w, "screen_height": h
    })))
}

/// Presses (or releases) the `hold` modifiers around a click, paced like the buttons.
fn press_keys(q: &mut Qmp, hold: &[&str], down: bool) -> Result<(), QmpError> {
    if hold.is_empty() {
        return Ok(());
    }
    let events: Vec<Value> = hold
        .iter()
        .map(
            |k| json!({"type": "key", "data": {"down": down, "key": {"type": "qcode", "data": k}}}),
        )
        .collect();
    std::thread::sleep(MOUSE_PACE);
    q.execute("input-send-event", Some(json!({ "events": events })))?;
    std::thread::sleep(MOUSE_PACE);
    Ok(())
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
    ui: crate::mcp::tool::Ui::NONE,
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
    crate::ops::screen::hold::check_agent(&name, "vm_mouse_move")?;
    let dx = args.i64_or("dx", 0)?;
    let dy = args.i64_or("dy", 0)?;
    let scale = scale_arg(args)?;
    let (sdx, sdy) = screen_delta(dx, dy, scale)?;
    // Relative motion needs a relative mouse (a PC's PS/2 one); the virt boards have only the
    // absolute tablet, where this motion would go nowhere.
    let rec = live(&name)?;
    if crate::ops::vm::records::input(&rec, "relative_pointer").is_none() {
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
    let plan = move_plan(home.as_deref(), sdx, sdy, step);
    let commands = plan.len();
    session::monitor(&name, &rec, |q| {
        send_moves(ctx, q, &plan)?;
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

/// (dx, dy) of a screenshot at `scale` in screen pixels; either past [`MAX_DELTA`] is refused.
fn screen_delta(dx: i64, dy: i64, scale: f64) -> Result<(i64, i64), ToolError> {
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
    Ok((sdx, sdy))
}

/// The relative steps to send: far towards the `home` corner first (if asked), then the move.
fn move_plan(home: Option<&str>, sdx: i64, sdy: i64, step: i64) -> Vec<(i64, i64)> {
    let mut plan = Vec::new();
    if let Some(h) = home {
        let far = 4000;
        let (hx, hy) = match h {
            "top-left" => (-far, -far),
            "top-right" => (far, -far),
            "bottom-left" => (-far, far),
            _ => (far, far),
        };
        plan.extend(rel_steps(hx, hy, step));
    }
    plan.extend(rel_steps(sdx, sdy, step));
    plan
}

/// Sends the steps, one command each (a cancel is noticed every 64), then flushes QEMU's
/// held-back motion.
fn send_moves(ctx: &ToolCtx, q: &mut Qmp, plan: &[(i64, i64)]) -> Session<()> {
    let rel = |x: i64, y: i64| {
        json!({"events": [
            {"type": "rel", "data": {"axis": "x", "value": x}},
            {"type": "rel", "data": {"axis": "y", "value": y}}
        ]})
    };
    for (i, (sx, sy)) in plan.iter().enumerate() {
        q.execute("input-send-event", Some(rel(*sx, *sy)))?;
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
            q.execute("input-send-event", Some(rel(0, 0)))?;
        }
        std::thread::sleep(MOUSE_PACE);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::screen::pointer::to_screen;
    use crate::qemu::screen;

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
    fn scales_to_qemu_range() {
        assert_eq!(abs_axis(0, 1024), 0);
        assert_eq!(abs_axis(1023, 1024), 32767);
        assert_eq!(abs_axis(512, 1025), 16383);
    }
}
