//! The serial console: read the tail of its log, type into it, wait for text to appear.

use crate::ops::vm::serial_write::By;
use std::time::Duration;

use serde_json::json;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::ops::vm::serial::{self, WaitRequest};
use crate::tools::{object, presets, vm_name_arg};

/// Longest text vm_serial_write accepts.
pub const MAX_TEXT: usize = 4096;

const READ_DESCRIPTION: &str = "The last tail_lines lines of the VM's serial console log (kernel \
    messages, login prompts, a shell on ttyS0). Reads at most the last 256 KiB of the log however \
    large it grows. offset in the result can be passed to vm_serial_wait.";

/// `vm_serial_read`.
pub const READ: ToolDef = ToolDef {
    name: "vm_serial_read",
    title: "Read the serial console",
    description: READ_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "tail_lines": {"type": "integer", "minimum": 1, "maximum": 100000, "default": 50}
            }),
            &["name"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "lines": {"type": "array", "items": {"type": "string"}},
                "text": {"type": "string"},
                "log_size": {"type": "integer"},
                "offset": {"type": "integer"}
            },
            "required": ["name", "lines", "text", "log_size", "offset"]
        })
    },
    annotations: presets::READ_ONLY,
    handler: read,
    ui: crate::mcp::tool::Ui::NONE,
};

fn read(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let want = args.int("tail_lines")?;
    crate::tools::to_output(&serial::read_tail(&name, want)?)
}

const WRITE_DESCRIPTION: &str = "Send text to the VM's serial console (ttyS0), e.g. a shell \
    command on a headless guest. enter=true sends a carriage return afterwards. At most 4096 \
    characters. Pair with vm_serial_wait to see the answer.";

/// `vm_serial_write`.
pub const WRITE: ToolDef = ToolDef {
    name: "vm_serial_write",
    title: "Type into the serial console",
    description: WRITE_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "text": {"type": "string", "maxLength": MAX_TEXT},
                "enter": {"type": "boolean", "default": false}
            }),
            &["name", "text"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "bytes": {"type": "integer"},
                "offset": {"type": "integer"}
            },
            "required": ["name", "bytes"]
        })
    },
    annotations: presets::DESTRUCTIVE,
    handler: write,
    ui: crate::mcp::tool::Ui::NONE,
};

fn write(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let mut text = args.str("text")?.to_string();
    if text.chars().count() > MAX_TEXT {
        return Err(ToolError::new(format!(
            "text is longer than {MAX_TEXT} characters; split it"
        )));
    }
    if args.bool_or("enter", false)? {
        text.push('\r');
    }
    let w = crate::ops::vm::serial_write::write(&name, &text, By::Tool("vm_serial_write"))?;
    Ok(ToolOutput::json(
        json!({"name": w.name, "bytes": w.bytes, "offset": w.offset}),
    ))
}

const WAIT_DESCRIPTION: &str = "Wait until pattern (a plain substring) appears in serial console \
    output written after this call began, or after offset (from an earlier \
    vm_serial_read/_write/_wait). Sends progress while waiting; returns the matching line and the \
    log offset just after it.";

/// `vm_serial_wait`.
pub const WAIT: ToolDef = ToolDef {
    name: "vm_serial_wait",
    title: "Wait for serial output",
    description: WAIT_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "pattern": {"type": "string", "minLength": 1, "maxLength": 4096},
                "timeout": {"type": "number", "minimum": 0, "maximum": 3600, "default": 30},
                "offset": {"type": "integer", "minimum": 0}
            }),
            &["name", "pattern"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "line": {"type": "string"},
                "offset": {"type": "integer"},
                "elapsed_ms": {"type": "integer"}
            },
            "required": ["name", "line", "offset"]
        })
    },
    annotations: presets::READ_ONLY_WAIT,
    handler: wait,
    ui: crate::mcp::tool::Ui::NONE,
};

fn wait(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let req = WaitRequest {
        name: vm_name_arg(args)?,
        pattern: args.str("pattern")?.as_bytes().to_vec(),
        timeout: Duration::from_secs_f64(args.number("timeout")?),
        offset: args.opt_i64("offset")?.map(|o| o.max(0) as u64),
    };
    crate::tools::to_output(&serial::wait(ctx, &req)?)
}
