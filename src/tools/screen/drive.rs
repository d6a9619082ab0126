//! Drive the mouse: vm_click through the absolute tablet and vm_mouse_move through the
//! relative mouse (the operations are [`crate::ops::screen::mouse`]'s; the keyboard is in
//! [`crate::tools::screen::keyboard`], the screen in [`crate::tools::screen::screenshot`]).

use serde_json::json;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::screen::mouse::{self, ClickRequest, MoveRequest, MAX_DELTA};
use crate::tools::params::{scale_arg, scale_param};
use crate::tools::{object, presets, vm_name_arg};

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

fn click(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let req = ClickRequest {
        name: vm_name_arg(args)?,
        x: args.opt_i64("x")?.unwrap_or(-1),
        y: args.opt_i64("y")?.unwrap_or(-1),
        scale: scale_arg(args)?,
        button: args.str_or("button", "left")?.to_string(),
        double: args.bool_or("double", false)?,
        hold: crate::tools::params::hold_arg(args)?,
    };
    crate::tools::to_output(&mouse::click(&req)?)
}

fn mouse_move(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let req = MoveRequest {
        name: vm_name_arg(args)?,
        dx: args.int("dx")?,
        dy: args.int("dy")?,
        scale: scale_arg(args)?,
        step: args.int("step")?,
        home: args.opt_str("home")?.map(str::to_string),
        click: args.opt_str("click")?.map(str::to_string),
        double: args.bool_or("double", false)?,
    };
    crate::tools::to_output(&mouse::mouse_move(&req, ctx)?)
}
