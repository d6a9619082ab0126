//! The keyboard tools: key chords (vm_send_keys) and exact text on a US layout (vm_type_text).
//! Both send their keys through [`crate::ops::screen::keyboard`], paced there.

use std::time::Duration;

use serde::Deserialize;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::screen::keyboard::{self, KeysRequest, TextRequest, MAX_TEXT};
use crate::schema::Param;
use crate::tools::names::VmName;
use crate::tools::presets;

const SEND_KEYS_DESCRIPTION: &str = "Press keys or chords in order, e.g. [\"ctrl-alt-del\"], \
    [\"alt-f4\", \"enter\"]: QEMU qcodes (a, 1, ret, f1, shift_r...) or enter, esc, space, tab, \
    backspace, win, pgup, up, del... Each chord is held hold_ms, then delay_ms. For text use \
    vm_type_text.";

/// `vm_send_keys`.
pub const SEND_KEYS: ToolDef = ToolDef {
    name: "vm_send_keys",
    title: "Press keys in a VM",
    description: SEND_KEYS_DESCRIPTION,
    input_schema: KeysArgs::param,
    output_schema: <crate::ops::screen::keyboard::KeysSent as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE,
    handler: send_keys,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct KeysArgs {
        name: VmName,
        keys: Vec<String> = {"minItems": 1, "maxItems": 256},
        hold_ms: u64 = {"minimum": 1, "maximum": 10000, "default": 100},
        delay_ms: u64 = {"minimum": 0, "maximum": 10000, "default": 50},
    }
}

fn send_keys(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: KeysArgs = args.parse()?;
    let req = KeysRequest {
        name: a.name.0,
        specs: a.keys,
        hold: Duration::from_millis(a.hold_ms),
        delay: Duration::from_millis(a.delay_ms),
    };
    crate::tools::to_output(&keyboard::send_keys(ctx, &req)?)
}

const TYPE_TEXT_DESCRIPTION: &str = "Type text (US layout, newlines and tabs; at most 4096 \
    characters) so that the guest gets exactly it, after earlier keys, about 100-200 characters a \
    second. enter presses Enter after.";

/// `vm_type_text`.
pub const TYPE_TEXT: ToolDef = ToolDef {
    name: "vm_type_text",
    title: "Type text into a VM",
    description: TYPE_TEXT_DESCRIPTION,
    input_schema: TextArgs::param,
    output_schema: <crate::ops::screen::keyboard::Typed as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE,
    handler: type_text,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct TextArgs {
        name: VmName,
        text: String = {"maxLength": MAX_TEXT},
        enter: bool = {"default": false},
        delay_ms: u64 = {"minimum": 0, "maximum": 1000, "default": 30},
    }
}

fn type_text(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: TextArgs = args.parse()?;
    let req = TextRequest {
        name: a.name.0,
        text: a.text,
        enter: a.enter,
        gap: Duration::from_millis(a.delay_ms),
    };
    crate::tools::to_output(&keyboard::type_text(ctx, &req)?)
}
