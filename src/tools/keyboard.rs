//! The keyboard: key chords (vm_send_keys) and exact text typing on a US layout
//! (vm_type_text), paced so the guest's PS/2 queue never overflows.

use std::time::Duration;

use serde_json::{json, Value};

use super::{object, presets, vm_name_arg};
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::ops::records;
use crate::ops::session;
use crate::qemu::keys::{self, KeyEvent};
use crate::state::registry::Record;

/// Longest text vm_type_text accepts.
pub const MAX_TEXT: usize = 4096;
/// Key events per input-send-event command: the PS/2 keyboard queue holds 16; more are lost.
const EVENTS_PER_COMMAND: usize = 16;
/// The shortest pause after a batch of key events: the guest must drain the keyboard queue
/// before the next batch arrives, or keys are lost (measured: 0 ms loses keys under TCG).
const MIN_BATCH_GAP: Duration = Duration::from_millis(10);

fn key_event(q: &str, down: bool) -> Value {
    json!({"type": "key", "data": {"down": down, "key": {"type": "qcode", "data": q}}})
}

const SEND_KEYS_DESCRIPTION: &str = "Press keys or chords in order, e.g. [\"ctrl-alt-del\"], \
    [\"esc\"], [\"alt-f4\", \"enter\"]. Names are QEMU qcodes (a, 1, ret, f1, ctrl, shift_r, ...) \
    or aliases (enter, esc, space, tab, backspace, win/super, pgup/pgdn, up/down/left/right, del, \
    ins). Unknown names are rejected before anything is sent. For text use vm_type_text.";

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
};

/// A running VM that has a keyboard: keys sent to a VM without one would go nowhere, and the
/// tool would report a success that did not happen.
fn live(name: &str) -> Result<Record, ToolError> {
    let rec = records::lookup_live(name, "launch it first")?;
    if records::input(&rec, "keyboard").is_none() {
        return Err(ToolError::new(format!(
            "VM {name:?} has no keyboard device (machine {}), so keys would go nowhere; launch \
             it with one, e.g. extra_args [\"-device\", \"virtio-keyboard-pci\"]",
            rec.get("machine").and_then(Value::as_str).unwrap_or("?")
        )));
    }
    Ok(rec)
}

fn send_keys(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let specs = args.str_list("keys")?;
    if specs.is_empty() {
        return Err(ToolError::new(
            "keys is empty; give at least one key or chord",
        ));
    }
    let chords: Vec<Vec<&'static str>> = specs
        .iter()
        .map(|s| keys::chord(s))
        .collect::<Result<_, _>>()?;
    let hold = args.i64_or("hold_ms", 100)?.clamp(1, 10_000) as u64;
    let delay = args.i64_or("delay_ms", 50)?.clamp(0, 10_000) as u64;
    let rec = live(&name)?;
    session::monitor(&name, &rec, |q| {
        for (i, c) in chords.iter().enumerate() {
            let keys: Vec<Value> = c
                .iter()
                .map(|k| json!({"type": "qcode", "data": k}))
                .collect();
            q.execute("send-key", Some(json!({"keys": keys, "hold-time": hold})))?;
            // send-key returns at once; QEMU releases the keys after hold-time. Wait for that,
            // so chords never overlap and QEMU's key queue never overflows.
            std::thread::sleep(Duration::from_millis(hold + delay));
            if ctx.cancelled() {
                return Err(ToolError::new(format!("cancelled after {i} chords")).into());
            }
        }
        Ok(())
    })?;
    Ok(ToolOutput::json(
        json!({"name": name, "sent": chords.len(), "chords": chords}),
    ))
}

const TYPE_TEXT_DESCRIPTION: &str = "Type text on a US keyboard layout (shifted characters as \
    chords; newline and tab allowed; at most 4096 characters). Keys are sent in batches the \
    emulated keyboard cannot drop, so the guest receives exactly the text. enter=true presses \
    Enter afterwards. delay_ms pauses after each batch of keys (at least 10 ms).";

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
};

/// Groups per-character events into commands of at most 16 events, never splitting a character.
pub fn batches(chars: &[Vec<KeyEvent>]) -> Vec<Vec<KeyEvent>> {
    let mut out: Vec<Vec<KeyEvent>> = Vec::new();
    for c in chars {
        match out.last_mut() {
            Some(last) if last.len() + c.len() <= EVENTS_PER_COMMAND => {
                last.extend(c.iter().copied())
            }
            _ => out.push(c.clone()),
        }
    }
    out
}

fn type_text(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let mut text = args.str("text")?.to_string();
    if text.chars().count() > MAX_TEXT {
        return Err(ToolError::new(format!(
            "text is longer than {MAX_TEXT} characters; split it into several calls"
        )));
    }
    if args.bool_or("enter", false)? {
        text.push('\n');
    }
    let delay = Duration::from_millis(args.i64_or("delay_ms", 30)?.clamp(0, 1000) as u64)
        .max(MIN_BATCH_GAP);
    let events = keys::type_events(&text)?;
    let plan = batches(&events);
    let rec = live(&name)?;
    let commands = plan.len();
    session::monitor(&name, &rec, |q| {
        for (i, batch) in plan.iter().enumerate() {
            let evs: Vec<Value> = batch.iter().map(|(k, d)| key_event(k, *d)).collect();
            q.execute("input-send-event", Some(json!({"events": evs})))?;
            if ctx.cancelled() {
                return Err(ToolError::new(format!(
                    "cancelled after {i} of {commands} key batches"
                ))
                .into());
            }
            // Also after the last batch, so a following call cannot overflow the queue.
            std::thread::sleep(delay);
        }
        Ok(())
    })?;
    Ok(ToolOutput::json(
        json!({"name": name, "characters": events.len(), "commands": commands}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_never_exceed_sixteen_events_or_split_a_character() {
        let ev = keys::type_events("Hello, World! \"quoted\" \\ back").unwrap();
        let b = batches(&ev);
        assert!(b.iter().all(|c| c.len() <= 16));
        let flat: Vec<KeyEvent> = b.into_iter().flatten().collect();
        let orig: Vec<KeyEvent> = ev.into_iter().flatten().collect();
        assert_eq!(flat, orig);
    }
}
