//! Pointer gestures beyond a click: vm_drag (button down at one point, moves, up at another)
//! and vm_scroll (wheel clicks at a point), both through the absolute tablet and with
//! modifier keys optionally held (`hold`); the plans are [`crate::ops::screen::pointer`]'s. The
//! coordinates and `scale` mean what they mean for vm_click ([`crate::tools::screen::drive`]).

use std::time::Duration;

use serde::Deserialize;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolResult};
use crate::ops::screen::mouse;
use crate::ops::screen::pointer::{self, Wheel};
use crate::schema::Param;
use crate::tools::names::VmName;
use crate::tools::params::{hold_extra, hold_of, scale_extra, scale_of, BUTTONS};
use crate::tools::presets;

const DRAG_DESCRIPTION: &str = "Drag with the absolute tablet from (x, y) to (to_x, to_y) with \
    button down: sliders, selections, windows, drawing.";

/// `vm_drag`.
pub const DRAG: ToolDef = ToolDef {
    name: "vm_drag",
    title: "Drag the mouse in a VM",
    description: DRAG_DESCRIPTION,
    input_schema: DragArgs::param,
    output_schema: <crate::ops::screen::mouse::Dragged as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE,
    handler: drag,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct DragArgs {
        name: VmName,
        x: i64 = {"minimum": 0},
        y: i64 = {"minimum": 0},
        to_x: i64 = {"minimum": 0},
        to_y: i64 = {"minimum": 0},
        scale: Option<f64> = (scale_extra()),
        button: String = {"enum": BUTTONS, "default": "left"},
        hold: Option<Vec<String>> = (hold_extra()),
        /// Moves between press and release.
        steps: u32 = {"minimum": 1, "maximum": pointer::MAX_STEPS, "default": 12},
        step_ms: u64 = {"minimum": 1, "maximum": 1000, "default": 20},
    }
}

fn drag(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: DragArgs = args.parse()?;
    let scale = scale_of(a.scale)?;
    let button = a.button;
    if !BUTTONS.contains(&button.as_str()) {
        return Err(ToolError::new(format!(
            "button must be left, right or middle, not {button:?}; nothing was sent"
        )));
    }
    let req = mouse::DragRequest {
        name: a.name.0,
        from: (a.x, a.y),
        to: (a.to_x, a.to_y),
        scale,
        button,
        hold: hold_of(a.hold)?,
        steps: a.steps,
        step_pause: Duration::from_millis(a.step_ms),
    };
    crate::tools::to_output(&mouse::drag(ctx, &req)?)
}

const SCROLL_DESCRIPTION: &str = "Turn the mouse wheel at (x, y) by clicks notches (down: towards \
    the end). Coordinates as vm_click's.";

/// `vm_scroll`.
pub const SCROLL: ToolDef = ToolDef {
    name: "vm_scroll",
    title: "Scroll the mouse wheel in a VM",
    description: SCROLL_DESCRIPTION,
    input_schema: ScrollArgs::param,
    output_schema: <crate::ops::screen::mouse::Scrolled as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE,
    handler: scroll,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct ScrollArgs {
        name: VmName,
        x: i64 = {"minimum": 0},
        y: i64 = {"minimum": 0},
        scale: Option<f64> = (scale_extra()),
        direction: String = {"enum": ["up", "down"], "default": "down"},
        clicks: u32 = {"minimum": 1, "maximum": pointer::MAX_STEPS, "default": 1},
        hold: Option<Vec<String>> = (hold_extra()),
    }
}

fn scroll(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: ScrollArgs = args.parse()?;
    let scale = scale_of(a.scale)?;
    let dir = match a.direction.as_str() {
        "up" => Wheel::Up,
        "down" => Wheel::Down,
        d => {
            return Err(ToolError::new(format!(
                "direction must be up or down, not {d:?}; nothing was sent"
            )))
        }
    };
    let clicks = a.clicks;
    if !(1..=pointer::MAX_STEPS).contains(&clicks) {
        return Err(ToolError::new(format!(
            "clicks must be 1 to {}, not {clicks}; nothing was sent",
            pointer::MAX_STEPS
        )));
    }
    let req = mouse::ScrollRequest {
        name: a.name.0,
        at: (a.x, a.y),
        scale,
        direction: dir,
        clicks,
        hold: hold_of(a.hold)?,
    };
    crate::tools::to_output(&mouse::scroll(ctx, &req)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

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
