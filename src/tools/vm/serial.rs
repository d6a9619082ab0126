//! The serial console: read the tail of its log, type into it, wait for text to appear.

use crate::ops::vm::serial_write::By;
use std::time::Duration;

use serde::Deserialize;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolResult};
use crate::ops::vm::serial::{self, WaitRequest};
use crate::schema::Param;
use crate::tools::names::VmName;
use crate::tools::presets;

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
    input_schema: ReadArgs::param,
    output_schema: <crate::ops::vm::serial::Tail as crate::schema::Schema>::schema,
    annotations: presets::READ_ONLY,
    handler: read,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct ReadArgs {
        name: VmName,
        tail_lines: i64 = {"minimum": 1, "maximum": 100000, "default": 50},
    }
}

fn read(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: ReadArgs = args.parse()?;
    crate::tools::to_output(&serial::read_tail(&a.name.0, a.tail_lines)?)
}

const WRITE_DESCRIPTION: &str = "Send text to the VM's serial console (ttyS0), e.g. a shell \
    command on a headless guest. enter=true sends a carriage return afterwards. At most 4096 \
    characters. Pair with vm_serial_wait to see the answer.";

/// `vm_serial_write`.
pub const WRITE: ToolDef = ToolDef {
    name: "vm_serial_write",
    title: "Type into the serial console",
    description: WRITE_DESCRIPTION,
    input_schema: WriteArgs::param,
    output_schema: <crate::ops::vm::serial_write::Written as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE,
    handler: write,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct WriteArgs {
        name: VmName,
        text: String = {"maxLength": MAX_TEXT},
        enter: bool = {"default": false},
    }
}

fn write(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let WriteArgs {
        name,
        mut text,
        enter,
    } = args.parse()?;
    if text.chars().count() > MAX_TEXT {
        return Err(ToolError::new(format!(
            "text is longer than {MAX_TEXT} characters; split it"
        )));
    }
    if enter {
        text.push('\r');
    }
    let w = crate::ops::vm::serial_write::write(&name.0, &text, By::Tool("vm_serial_write"))?;
    crate::tools::to_output(&w)
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
    input_schema: WaitArgs::param,
    output_schema: <crate::ops::vm::serial::Found as crate::schema::Schema>::schema,
    annotations: presets::READ_ONLY_WAIT,
    handler: wait,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct WaitArgs {
        name: VmName,
        pattern: String = {"minLength": 1, "maxLength": 4096},
        timeout: f64 = {"minimum": 0, "maximum": 3600, "default": 30},
        offset: Option<u64> = {"minimum": 0},
    }
}

fn wait(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: WaitArgs = args.parse()?;
    let req = WaitRequest {
        name: a.name.0,
        pattern: a.pattern.into_bytes(),
        timeout: Duration::from_secs_f64(a.timeout),
        offset: a.offset,
    };
    crate::tools::to_output(&serial::wait(ctx, &req)?)
}
