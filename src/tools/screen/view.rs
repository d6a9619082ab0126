//! The live view (an MCP App, `ui://mcqemu/view`, and the same page from `mcqemu view`): the
//! tool that opens it (vm_view), the person's hold (vm_takeover), and the two calls only the
//! view makes (vm_view_frame, vm_view_input). The page itself is `view.html`.

use std::time::Duration;

use serde_json::{json, Value};

use crate::b64;
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult, Ui};
use crate::ops::screen::parse_hash;
use crate::ops::{screen::view, vm::hold};
use crate::tools::{object, presets, vm_name_arg};

/// The view's resource.
pub const URI: &str = presets::VIEW_URI;

const APP_ONLY: Ui = Ui {
    resource: Some(URI),
    app_only: true,
};

const VIEW_DESCRIPTION: &str = "Open the live view of a VM for the person you work for: its \
    screen as it changes, its run state and serial console, and a Take over button that lets \
    them type and click themselves (a password, a dialog you misread), then hand back. Hosts \
    that render MCP Apps show it beside this result; elsewhere `mcqemu view NAME` prints a \
    local URL with the same page. Returns the VM's name, run state and any hold.";

/// `vm_view`.
pub const VIEW: ToolDef = ToolDef {
    name: "vm_view",
    title: "Open the live view of a VM",
    description: VIEW_DESCRIPTION,
    input_schema: || object(json!({"name": presets::name_schema()}), &["name"]),
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"}, "status": {"type": "string"},
                "view": {"type": "string"}, "held": {"type": ["object", "null"]},
                "cli": {"type": "string"}
            },
            "required": ["name", "status", "view"]
        })
    },
    annotations: presets::READ_ONLY,
    handler: open_view,
    ui: presets::OPENS_VIEW,
};

fn open_view(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let rec = crate::ops::vm::records::lookup(&name)?;
    let status = crate::ops::vm::records::status_within(&rec, Duration::from_secs(2));
    Ok(ToolOutput::json(json!({
        "name": name, "status": status, "view": URI, "held": hold::of(&rec),
        "cli": format!("mcqemu view {name}"),
    })))
}

const TAKEOVER_DESCRIPTION: &str = "A person's hold on a VM's screen, keyboard and mouse. {name} \
    starts a hold and returns its secret (hold); while it stands, vm_click, vm_mouse_move, \
    vm_drag, vm_scroll, vm_send_keys, vm_type_text and vm_serial_write refuse (guest_exec and \
    the file tools still work) and only the live view types and clicks. {name, release: true, \
    hold} ends it; a release without the hold's secret is refused, so an agent cannot end a \
    person's hold. The live view (vm_view) calls this when the person presses Take over and \
    Hand back. If you need a person (a password, a CAPTCHA), say so and open vm_view.";

/// `vm_takeover`.
pub const TAKEOVER: ToolDef = ToolDef {
    name: "vm_takeover",
    title: "Take over a VM's screen and input",
    description: TAKEOVER_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "release": {"type": "boolean", "default": false},
                "hold": {"type": "string", "maxLength": 128,
                         "description": "The hold's secret, to release it."}
            }),
            &["name"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"}, "held": {"type": "boolean"},
                "hold": {"type": "string"}, "since": {"type": "string"},
                "released": {"type": "boolean"}
            },
            "required": ["name", "held"]
        })
    },
    annotations: presets::ADDITIVE,
    handler: takeover,
    ui: presets::OPENS_VIEW,
};

fn takeover(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    if args.bool_or("release", false)? {
        let secret = args.opt_str("hold")?.ok_or_else(|| {
            ToolError::new(
                "release needs hold: the secret vm_takeover returned when the hold began; \
                 only the person who took over can hand back",
            )
        })?;
        let released = hold::release(&name, secret)?;
        return Ok(ToolOutput::json(
            json!({"name": name, "held": false, "released": released}),
        ));
    }
    crate::ops::vm::records::lookup_live(&name, "launch it first")?;
    let (secret, h) = hold::take(&name)?;
    Ok(ToolOutput::json(
        json!({"name": name, "held": true, "hold": secret, "since": h.since_iso}),
    ))
}

/// `vm_view_frame` (the view's only).
pub const FRAME: ToolDef = ToolDef {
    name: "vm_view_frame",
    title: "Next frame for the live view",
    description: "For the live view: waits (up to wait_ms) until the VM's screen differs from \
        since, then returns it scaled to max_width, with its hash, scale, run state and hold. \
        Unchanged: no image.",
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "since": {"type": "string", "pattern": "^[0-9a-f]{1,16}$"},
                "wait_ms": {"type": "integer", "minimum": 0, "maximum": 25000, "default": 20000},
                "max_width": {"type": "integer", "minimum": 64, "maximum": 8192}
            }),
            &["name"],
        )
    },
    output_schema: || json!({"type": "object"}),
    annotations: presets::READ_ONLY_WAIT,
    handler: frame,
    ui: APP_ONLY,
};

fn frame(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let since = match args.opt_str("since")? {
        Some(s) => Some(parse_hash(s).ok_or_else(|| ToolError::new("since is not a hash"))?),
        None => None,
    };
    let req = view::FrameRequest {
        name,
        since,
        wait: Duration::from_millis(args.int("wait_ms")? as u64),
        max_width: args.opt_i64("max_width")?.map(|w| w as u32),
    };
    let f = view::frame(ctx, &req)?;
    let extra = if f.png.is_empty() {
        Vec::new()
    } else {
        vec![json!({"type": "image", "data": b64::encode(&f.png), "mimeType": "image/png"})]
    };
    let structured = serde_json::to_value(&f).unwrap_or(Value::Null);
    Ok(ToolOutput { structured, extra })
}

/// `vm_view_input` (the view's only).
pub const INPUT: ToolDef = ToolDef {
    name: "vm_view_input",
    title: "The person's input from the live view",
    description: "For the live view: sends the person's clicks, text, key chords and console \
        text, in order. While a person holds the VM, hold (the secret) must be given. Characters \
        with no key on the US layout are left out of the text, the rest typed, and named in \
        not_typed.",
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "hold": {"type": "string", "maxLength": 128},
                "events": {"type": "array", "maxItems": view::MAX_EVENTS, "items": {"type": "object"}}
            }),
            &["name", "events"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "clicks": {"type": "integer"},
                "characters": {"type": "integer"},
                "chords": {"type": "integer"},
                "serial_bytes": {"type": "integer"},
                "not_typed": {
                    "type": "string",
                    "description": "Characters of the text left out (no key on the US layout)."
                }
            },
            "required": ["name", "clicks", "characters", "chords", "serial_bytes", "not_typed"]
        })
    },
    annotations: presets::DESTRUCTIVE,
    handler: input,
    ui: APP_ONLY,
};

fn input(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let raw = args.0.get("events").cloned().unwrap_or(json!([]));
    let events: Vec<view::Event> =
        serde_json::from_value(raw).map_err(|e| ToolError::new(format!("events: {e}")))?;
    let done = view::input(ctx, &name, args.opt_str("hold")?, &events)?;
    Ok(ToolOutput::json(
        serde_json::to_value(&done).unwrap_or(Value::Null),
    ))
}
