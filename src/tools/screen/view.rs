//! The live view (an MCP App, `ui://mcqemu/view`, and the same page from `mcqemu view`): the
//! tool that opens it (vm_view), the person's hold (vm_takeover), and the two calls only the
//! view makes (vm_view_frame, vm_view_input). The page itself is `view.html`.

use std::time::Duration;

use serde::Deserialize;
use serde_json::json;

use crate::b64;
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolResult, Ui};
use crate::ops::screen::parse_hash;
use crate::ops::{screen::view, vm::hold};
use crate::schema::Param;
use crate::tools::names::{VmName, VmOnly};
use crate::tools::presets;

/// The view's resource.
pub const URI: &str = presets::VIEW_URI;

const APP_ONLY: Ui = Ui {
    resource: Some(URI),
    app_only: true,
};

const VIEW_DESCRIPTION: &str = "Open a VM's live view for the person you work for: its screen, \
    state and console, and a Take over button to type and click themselves (a password, a dialog), \
    then hand back. Shown beside this result by MCP Apps hosts; elsewhere `mcqemu view NAME` \
    prints a URL.";

/// `vm_view`.
pub const VIEW: ToolDef = ToolDef {
    name: "vm_view",
    title: "Open the live view of a VM",
    description: VIEW_DESCRIPTION,
    input_schema: VmOnly::param,
    output_schema: <view::Opened as crate::schema::Schema>::schema,
    annotations: presets::READ_ONLY,
    handler: open_view,
    ui: presets::OPENS_VIEW,
};

fn open_view(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = args.parse::<VmOnly>()?.name();
    crate::tools::to_output(&view::open(&name, URI)?)
}

const TAKEOVER_DESCRIPTION: &str =
    "A person's hold on a VM's input: {name} starts one and returns \
    its secret; while it stands the input tools refuse (guest_* still work). {name, release, hold} \
    ends it; only the secret's holder can. vm_view's buttons call it. If you need a person, say so \
    and open vm_view.";

/// `vm_takeover`.
pub const TAKEOVER: ToolDef = ToolDef {
    name: "vm_takeover",
    title: "Take over a VM's screen and input",
    description: TAKEOVER_DESCRIPTION,
    input_schema: TakeoverArgs::param,
    output_schema: <hold::Takeover as crate::schema::Schema>::schema,
    annotations: presets::ADDITIVE,
    handler: takeover,
    ui: presets::OPENS_VIEW,
};

crate::params! {
    #[derive(Deserialize)]
    struct TakeoverArgs {
        name: VmName,
        release: bool = {"default": false},
        /// To release it.
        hold: Option<String> = {"maxLength": 128},
    }
}

fn takeover(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: TakeoverArgs = args.parse()?;
    crate::tools::to_output(&hold::takeover(&a.name.0, a.release, a.hold.as_deref())?)
}

/// `vm_view_frame` (the view's only).
pub const FRAME: ToolDef = ToolDef {
    name: "vm_view_frame",
    title: "Next frame for the live view",
    description:
        "For the live view: the screen once it differs from since (up to wait_ms), scaled \
        to max_width.",
    input_schema: FrameArgs::param,
    output_schema: <view::Frame as crate::schema::Schema>::schema,
    annotations: presets::READ_ONLY_WAIT,
    handler: frame,
    ui: APP_ONLY,
};

crate::params! {
    #[derive(Deserialize)]
    struct FrameArgs {
        name: VmName,
        since: Option<String> = {"pattern": "^[0-9a-f]{1,16}$"},
        wait_ms: u64 = {"minimum": 0, "maximum": 25000, "default": 20000},
        max_width: Option<u32> = {"minimum": 64, "maximum": 8192},
    }
}

fn frame(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: FrameArgs = args.parse()?;
    let since = match a.since {
        Some(s) => Some(parse_hash(&s).ok_or_else(|| ToolError::new("since is not a hash"))?),
        None => None,
    };
    let req = view::FrameRequest {
        name: a.name.0,
        since,
        wait: Duration::from_millis(a.wait_ms),
        max_width: a.max_width,
    };
    let f = view::frame(ctx, &req)?;
    let extra = if f.png.is_empty() {
        Vec::new()
    } else {
        vec![json!({"type": "image", "data": b64::encode(&f.png), "mimeType": "image/png"})]
    };
    let mut out = crate::tools::to_output(&f)?;
    out.extra = extra;
    Ok(out)
}

/// `vm_view_input` (the view's only).
pub const INPUT: ToolDef = ToolDef {
    name: "vm_view_input",
    title: "The person's input from the live view",
    description: "For the live view: the person's clicks, text, keys and console text, in order \
        (hold when held).",
    input_schema: InputArgs::param,
    output_schema: <view::Done as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE,
    handler: input,
    ui: APP_ONLY,
};

crate::params! {
    #[derive(Deserialize)]
    struct InputArgs {
        name: VmName,
        hold: Option<String> = {"maxLength": 128},
        events: Vec<view::Event> = {"maxItems": view::MAX_EVENTS},
    }
}

fn input(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: InputArgs = args.parse()?;
    crate::tools::to_output(&view::input(ctx, &a.name.0, a.hold.as_deref(), &a.events)?)
}
