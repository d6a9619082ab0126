//! Drive the mouse: vm_click through the absolute tablet and vm_mouse_move through the
//! relative mouse (the operations are [`crate::ops::screen::mouse`]'s; the keyboard is in
//! [`crate::tools::screen::keyboard`], the screen in [`crate::tools::screen::screenshot`]).

use serde::Deserialize;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::screen::mouse::{self, ClickRequest, MoveRequest, MAX_DELTA};
use crate::schema::Param;
use crate::tools::names::VmName;
use crate::tools::params::{hold_extra, hold_of, scale_extra, scale_of, BUTTONS};
use crate::tools::presets;

const CLICK_DESCRIPTION: &str = "Click at (x, y) with the absolute tablet: screen pixels, or \
    pixels of a screenshot with its scale. Checked against the screen size. Guests without a \
    tablet: vm_mouse_move.";

/// `vm_click`.
pub const CLICK: ToolDef = ToolDef {
    name: "vm_click",
    title: "Click in a VM",
    description: CLICK_DESCRIPTION,
    input_schema: ClickArgs::param,
    output_schema: <crate::ops::screen::mouse::Clicked as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE,
    handler: click,
    ui: crate::mcp::tool::Ui::NONE,
};

const MOUSE_MOVE_DESCRIPTION: &str = "Relative mouse motion for guests without a tablet: \
    optionally home to a corner, move by (dx, dy) in steps, optionally click. The guest's \
    acceleration may scale it. Every 3 steps wait until the guest read them (20 ms or more).";

/// `vm_mouse_move`.
pub const MOUSE_MOVE: ToolDef = ToolDef {
    name: "vm_mouse_move",
    title: "Move the mouse relatively",
    description: MOUSE_MOVE_DESCRIPTION,
    input_schema: MoveArgs::param,
    output_schema: <crate::ops::screen::mouse::Moved as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE,
    handler: mouse_move,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct ClickArgs {
        name: VmName,
        x: i64 = {"minimum": 0},
        y: i64 = {"minimum": 0},
        scale: Option<f64> = (scale_extra()),
        button: String = {"enum": BUTTONS, "default": "left"},
        double: bool = {"default": false},
        hold: Option<Vec<String>> = (hold_extra()),
    }
}

fn click(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: ClickArgs = args.parse()?;
    let req = ClickRequest {
        name: a.name.0,
        x: a.x,
        y: a.y,
        scale: scale_of(a.scale)?,
        button: a.button,
        double: a.double,
        hold: hold_of(a.hold)?,
    };
    crate::tools::to_output(&mouse::click(&req)?)
}

crate::params! {
    #[derive(Deserialize)]
    struct MoveArgs {
        name: VmName,
        dx: i64 = {"minimum": -MAX_DELTA, "maximum": MAX_DELTA, "default": 0},
        dy: i64 = {"minimum": -MAX_DELTA, "maximum": MAX_DELTA, "default": 0},
        home: Option<String> = {"enum": ["top-left", "top-right", "bottom-left", "bottom-right", null]},
        click: Option<String> = {"enum": ["left", "right", "middle", null]},
        double: bool = {"default": false},
        step: i64 = {"minimum": 1, "maximum": 120, "default": 32},
        scale: Option<f64> = (scale_extra()),
    }
}

fn mouse_move(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: MoveArgs = args.parse()?;
    let req = MoveRequest {
        name: a.name.0,
        dx: a.dx,
        dy: a.dy,
        scale: scale_of(a.scale)?,
        step: a.step,
        home: a.home,
        click: a.click,
        double: a.double,
    };
    crate::tools::to_output(&mouse::mouse_move(&req, ctx)?)
}
