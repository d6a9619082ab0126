//! The keyboard tools: key chords (vm_send_keys) and exact text on a US layout (vm_type_text).
//! Both send their keys through [`crate::ops::screen::keyboard`], paced there.

use std::time::Duration;

use serde_json::json;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::screen::keyboard::{self, KeysRequest, TextRequest, MAX_TEXT};
use crate::tools::{object, presets, vm_name_arg};

const SEND_KEYS_DESCRIPTION: &str = "Press keys or chords in order, e.g. [\"ctrl-alt-del\"], \
    [\"esc\"], [\"alt-f4\", \"enter\"]. Names are QEMU qcodes (a, 1, ret, f1, ctrl, shift_r, ...) \
    or aliases (enter, esc, space, tab, backspace, win/super, pgup/pgdn, up/down/left/right, del, \
    ins). Unknown names are rejected before anything is sent. Each chord's keys are held hold_ms, \
    then released, then delay_ms passes; the call returns once the last key is released, so keys \
    from the next call (vm_type_text included) come after them. For text use vm_type_text.";

/// `vm_send_keys`.
pub const SEND_KEYS: ToolDef = ToolDef {
    name: "vm_send_keys",
    title: "Press keys in a VM",
    description: SEND_KEYS_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "keys": {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": 1,
                    "maxItems": 256
                },
                "hold_ms": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 100},
                "delay_ms": {"type": "integer", "minimum": 0, "maximum": 10000, "default": 50}
            }),
            &["name", "keys"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "sent": {"type": "integer"},
                "chords": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}}
            },
            "required": ["name", "sent"]
        })
    },
    annotations: presets::DESTRUCTIVE,
    handler: send_keys,
    ui: crate::mcp::tool::Ui::NONE,
};

fn send_keys(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let req = KeysRequest {
        name: vm_name_arg(args)?,
        specs: args.str_list("keys")?,
        hold: Duration::from_millis(args.int("hold_ms")? as u64),
        delay: Duration::from_millis(args.int("delay_ms")? as u64),
    };
    crate::tools::to_output(&keyboard::send_keys(ctx, &req)?)
}

const TYPE_TEXT_DESCRIPTION: &str = "Type text on a US keyboard layout (shifted characters as \
    chords; newline and tab allowed; at most 4096 characters). Keys are sent in batches the \
    emulated keyboard cannot drop, in order after the keys of earlier vm_send_keys calls, so the \
    guest receives exactly the text (about 100-200 characters a second). enter=true presses \
    Enter afterwards. delay_ms pauses after each batch of up to 8 characters (at least 10 ms).";

/// `vm_type_text`.
pub const TYPE_TEXT: ToolDef = ToolDef {
    name: "vm_type_text",
    title: "Type text into a VM",
    description: TYPE_TEXT_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "text": {"type": "string", "maxLength": MAX_TEXT},
                "enter": {"type": "boolean", "default": false},
                "delay_ms": {"type": "integer", "minimum": 0, "maximum": 1000, "default": 30}
            }),
            &["name", "text"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "characters": {"type": "integer"},
                "commands": {"type": "integer"}
            },
            "required": ["name", "characters"]
        })
    },
    annotations: presets::DESTRUCTIVE,
    handler: type_text,
    ui: crate::mcp::tool::Ui::NONE,
};

fn type_text(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let req = TextRequest {
        name: vm_name_arg(args)?,
        text: args.str("text")?.to_string(),
        enter: args.bool_or("enter", false)?,
        gap: Duration::from_millis(args.int("delay_ms")? as u64),
    };
    crate::tools::to_output(&keyboard::type_text(ctx, &req)?)
}
