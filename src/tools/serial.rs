//! The serial console: read the tail of its log, type into it, wait for text to appear.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{object, presets, vm_name_arg};
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::ops::vm::records::lookup;
use crate::qemu::vm;
use crate::state::registry::Record;
use crate::state::tail;

/// The most of the log ever read by one call.
pub const WINDOW: u64 = 256 * 1024;
/// Longest text vm_serial_write accepts.
pub const MAX_TEXT: usize = 4096;

fn log_path(name: &str, rec: &Record) -> Result<PathBuf, ToolError> {
    vm::field(rec, "serial_log")
        .map(PathBuf::from)
        .ok_or_else(|| {
            ToolError::new(format!(
                "VM {name:?} has no serial log (VMs adopted with attach_vm have none); use \
                 vm_screenshot instead"
            ))
        })
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

fn clean(line: &str) -> String {
    line.trim_end_matches('\r').to_string()
}

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
    let want = args.i64_or("tail_lines", 50)?;
    if want < 1 {
        return Err(ToolError::new("tail_lines must be at least 1"));
    }
    let rec = lookup(&name)?;
    let path = log_path(&name, &rec)?;
    let read = tail::read_last(&path, WINDOW)
        .map_err(|e| ToolError::new(format!("cannot read {}: {e}", path.display())))?;
    let size = read.size;
    let lines = read.last_lines(usize::try_from(want).unwrap_or(usize::MAX));
    Ok(ToolOutput::json(json!({
        "name": name, "text": lines.join("\n"), "lines": lines, "log_size": size, "offset": size
    })))
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
    crate::ops::screen::hold::check_agent(&name, "vm_serial_write")?;
    let mut text = args.str("text")?.to_string();
    if text.chars().count() > MAX_TEXT {
        return Err(ToolError::new(format!(
            "text is longer than {MAX_TEXT} characters; split it"
        )));
    }
    if args.bool_or("enter", false)? {
        text.push('\r');
    }
    let w = crate::ops::vm::serial_write::write(&name, &text)?;
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

/// Finds `pattern` in `buf`; returns the whole line around it and the index just past that line.
pub fn find_line(buf: &[u8], pattern: &[u8]) -> Option<(String, usize)> {
    let pos = buf.windows(pattern.len()).position(|w| w == pattern)?;
    let start = buf[..pos]
        .iter()
        .rposition(|b| *b == b'\n')
        .map(|i| i + 1)
        .unwrap_or(0);
    let end = buf[pos..]
        .iter()
        .position(|b| *b == b'\n')
        .map(|i| pos + i + 1)
        .unwrap_or(buf.len());
    Some((
        clean(String::from_utf8_lossy(&buf[start..end]).trim_end_matches('\n')),
        end,
    ))
}

fn wait(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let pattern = args.str("pattern")?.as_bytes().to_vec();
    let timeout =
        Duration::from_secs_f64(args.opt_f64("timeout")?.unwrap_or(30.0).clamp(0.0, 3600.0));
    let rec = lookup(&name)?;
    let path = log_path(&name, &rec)?;
    let started = Instant::now();
    let deadline = started + timeout;
    let mut from = match args.opt_i64("offset")? {
        Some(o) => o.max(0) as u64,
        None => file_len(&path),
    };
    let keep = pattern.len() as u64 + 4096;
    loop {
        let size = file_len(&path);
        if size < from {
            from = 0; // the log was truncated or replaced
        }
        if size > from {
            let read = tail::read_span(&path, from, Some(size), WINDOW)
                .map_err(|e| ToolError::new(format!("cannot read {}: {e}", path.display())))?;
            if let Some((line, end)) = find_line(&read.data, &pattern) {
                return Ok(ToolOutput::json(json!({
                    "name": name, "line": line, "offset": read.start + end as u64,
                    "elapsed_ms": started.elapsed().as_millis() as u64,
                })));
            }
            // Keep a tail so a pattern split across two reads is still found.
            from = size.saturating_sub(keep).max(from);
        }
        ctx.check_cancel()?;
        let now = Instant::now();
        if now >= deadline {
            let tail = tail::read_span(&path, 0, Some(size), 300)
                .map(|t| t.data)
                .unwrap_or_default();
            return Err(ToolError::new(format!(
                "{:?} did not appear on the serial console of {name:?} within {} s; the last \
                 output was: {:?}",
                String::from_utf8_lossy(&pattern),
                timeout.as_secs_f64(),
                String::from_utf8_lossy(&tail)
            )));
        }
        ctx.progress(
            started.elapsed().as_secs_f64(),
            Some(timeout.as_secs_f64()),
            "waiting for serial output",
        );
        std::thread::sleep(Duration::from_millis(50).min(deadline - now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_whole_line() {
        let buf = b"first\r\nsecond has MARK here\r\nthird";
        let (line, end) = find_line(buf, b"MARK").unwrap();
        assert_eq!(line, "second has MARK here");
        assert_eq!(&buf[end..], b"third");
        assert!(find_line(buf, b"nope").is_none());
    }
}
