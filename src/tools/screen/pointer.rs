//! Pointer gestures beyond a click: vm_drag (button down at one point, moves, up at another)
//! and vm_scroll (wheel clicks at a point), both through the absolute tablet and with
//! modifier keys optionally held (`hold`); the plans are [`crate::ops::screen::pointer`]'s. The
//! coordinates and `scale` mean what they mean for vm_click ([`crate::tools::screen::drive`]).

use std::time::Duration;

use serde_json::json;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::ops::screen::mouse;
use crate::ops::screen::pointer::{self, Wheel};
use crate::tools::params::{scale_arg, scale_param};
use crate::tools::{object, presets, vm_name_arg};

const DRAG_DESCRIPTION: &str = "Drag with the absolute tablet: move to (x, y), press button, \
    move in steps to (to_x, to_y), release; hold keeps modifier keys down throughout (e.g. \
    [\"ctrl\"] for a ctrl-drag). Coordinates are screen pixels, or, with scale (as a \
    vm_screenshot returned it), pixels of that screenshot. Use it for sliders, text selection, \
    moving windows and drawing.";

/// `vm_drag`.
pub const DRAG: ToolDef = ToolDef {
    name: "vm_drag",
    title: "Drag the mouse in a VM",
    description: DRAG_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "x": {"type": "integer", "minimum": 0},
                "y": {"type": "integer", "minimum": 0},
                "to_x": {"type": "integer", "minimum": 0},
                "to_y": {"type": "integer", "minimum": 0},
                "scale": scale_param(),
                "button": {
                    "type": "string", "enum": ["left", "right", "middle"], "default": "left"
                },
                "hold": crate::tools::params::hold_param(),
                "steps": {
                    "type": "integer", "minimum": 1, "maximum": pointer::MAX_STEPS,
                    "default": 12, "description": "Moves between press and release."
                },
                "step_ms": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 20}
            }),
            &["name", "x", "y", "to_x", "to_y"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "from": {"type": "array", "items": {"type": "integer"},
                         "description": "The screen pixel pressed on."},
                "to": {"type": "array", "items": {"type": "integer"},
                       "description": "The screen pixel released on."},
                "button": {"type": "string"},
                "hold": {"type": "array", "items": {"type": "string"}},
                "commands": {"type": "integer"},
                "screen_width": {"type": "integer"},
                "screen_height": {"type": "integer"}
            },
            "required": ["name", "from", "to", "button", "commands"]
        })
    },
    annotations: presets::DESTRUCTIVE,
    handler: drag,
    ui: crate::mcp::tool::Ui::NONE,
};

fn drag(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let coord = |k: &str| -> Result<i64, ToolError> { Ok(args.opt_i64(k)?.unwrap_or(-1)) };
    let (x, y, tx, ty) = (coord("x")?, coord("y")?, coord("to_x")?, coord("to_y")?);
    let scale = scale_arg(args)?;
    let button = args.str_or("button", "left")?.to_string();
    if !["left", "right", "middle"].contains(&button.as_str()) {
        return Err(ToolError::new(format!(
            "button must be left, right or middle, not {button:?}; nothing was sent"
        )));
    }
    let hold = crate::tools::params::hold_arg(args)?;
    let steps = args.int("steps")? as u32;
    let pause = Duration::from_millis(args.int("step_ms")? as u64);
    let sent = mouse::gesture(
        ctx,
        (&name, "vm_drag"),
        &[(x, y), (tx, ty)],
        scale,
        |p, s| pointer::drag_plan(p[0], p[1], s, &button, &hold, steps, pause),
    )?;
    Ok(ToolOutput::json(json!({
        "name": name, "from": [sent.points[0].x, sent.points[0].y],
        "to": [sent.points[1].x, sent.points[1].y],
        "button": button, "hold": hold, "commands": sent.commands,
        "screen_width": sent.screen.0, "screen_height": sent.screen.1
    })))
}

const SCROLL_DESCRIPTION: &str = "Turn the mouse wheel at (x, y) with the absolute tablet: \
    clicks notches towards direction (down: towards the end of a list or page). hold keeps \
    modifier keys down (e.g. [\"ctrl\"] to zoom). Coordinates as for vm_click (scale: that of \
    the vm_screenshot they were read from).";

/// `vm_scroll`.
pub const SCROLL: ToolDef = ToolDef {
    name: "vm_scroll",
    title: "Scroll the mouse wheel in a VM",
    description: SCROLL_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "x": {"type": "integer", "minimum": 0},
                "y": {"type": "integer", "minimum": 0},
                "scale": scale_param(),
                "direction": {"type": "string", "enum": ["up", "down"], "default": "down"},
                "clicks": {
                    "type": "integer", "minimum": 1, "maximum": pointer::MAX_STEPS, "default": 1
                },
                "hold": crate::tools::params::hold_param()
            }),
            &["name", "x", "y"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "at": {"type": "array", "items": {"type": "integer"},
                       "description": "The screen pixel scrolled at."},
                "direction": {"type": "string"},
                "clicks": {"type": "integer"},
                "hold": {"type": "array", "items": {"type": "string"}},
                "screen_width": {"type": "integer"},
                "screen_height": {"type": "integer"}
            },
            "required": ["name", "at", "direction", "clicks"]
        })
    },
    annotations: presets::DESTRUCTIVE,
    handler: scroll,
    ui: crate::mcp::tool::Ui::NONE,
};

fn scroll(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let x = args.opt_i64("x")?.unwrap_or(-1);
    let y = args.opt_i64("y")?.unwrap_or(-1);
    let scale = scale_arg(args)?;
    let dir = match args.str_or("direction", "down")? {
        "up" => Wheel::Up,
        "down" => Wheel::Down,
        d => {
            return Err(ToolError::new(format!(
                "direction must be up or down, not {d:?}; nothing was sent"
            )))
        }
    };
    let clicks = args.int("clicks")?;
    if !(1..=i64::from(pointer::MAX_STEPS)).contains(&clicks) {
        return Err(ToolError::new(format!(
            "clicks must be 1 to {}, not {clicks}; nothing was sent",
            pointer::MAX_STEPS
        )));
    }
    let hold = crate::tools::params::hold_arg(args)?;
    let sent = mouse::gesture(ctx, (&name, "vm_scroll"), &[(x, y)], scale, |p, s| {
        pointer::scroll_plan(p[0], s, dir, clicks as u32, &hold)
    })?;
    Ok(ToolOutput::json(json!({
        "name": name, "at": [sent.points[0].x, sent.points[0].y],
        "direction": if dir == Wheel::Up { "up" } else { "down" }, "clicks": clicks,
        "hold": hold, "screen_width": sent.screen.0, "screen_height": sent.screen.1
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn refusal(tool: &ToolDef, args: Value) -> String {
        let map = args.as_object().cloned().unwrap_or_default();
        match (tool.handler)(&ToolCtx::detached(), &Args::new(map)) {
            Ok(_) => panic!("{} took {args}", tool.name),
            Err(e) => e.msg,
        }
    }

    #[test]
    fn bad_gestures_are_refused_before_any_vm_is_looked_up() {
        let at = json!({"name": "no-such-vm", "x": 1, "y": 1, "to_x": 2, "to_y": 2});
        let mut a = at.clone();
        a["hold"] = json!(["a"]);
        assert!(refusal(&DRAG, a).contains("not a modifier"));
        let mut a = at.clone();
        a["button"] = json!("wheel-up");
        assert!(refusal(&DRAG, a).contains("left, right or middle"));
        let mut a = at.clone();
        a["direction"] = json!("left");
        assert!(refusal(&SCROLL, a).contains("up or down"));
        let mut a = at.clone();
        a["clicks"] = json!(0);
        assert!(refusal(&SCROLL, a).contains("clicks must be"));
        let mut a = at.clone();
        a["scale"] = json!(2);
        assert!(refusal(&SCROLL, a).contains("scale must be"));
    }
}
