//! Guest-agent tools: ping, info, exec, and file read/write through qemu-guest-agent.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::object;
use crate::b64;
use crate::mcp::tool::{Annotations, Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::ops::guest::{self as guest_ops, with_guest};
use crate::qemu::qga::{Qga, QgaError};

/// Bytes per guest-file-read / guest-file-write call: large, since every call is a round trip
/// into a TCG guest (qemu-ga allows reads of up to 48 MB), and a multiple of 3 so base64
/// chunks join without padding.
const FILE_CHUNK: usize = 1024 * 1024 - 1;
/// Cap on guest_file_read's max_bytes.
pub const MAX_READ: i64 = 8 * 1024 * 1024;

fn name_schema() -> Value {
    object(
        json!({"name": {"type": "string", "minLength": 1}}),
        &["name"],
    )
}

const PING_DESCRIPTION: &str = "Check that qemu-guest-agent answers inside the VM. The agent can \
    answer before the guest has finished booting.";

/// `guest_ping`.
pub const PING: ToolDef = ToolDef {
    name: "guest_ping",
    title: "Ping the guest agent",
    description: PING_DESCRIPTION,
    input_schema: name_schema,
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "ok": {"type": "boolean"},
                "latency_ms": {"type": "number"}
            },
            "required": ["name", "ok"]
        })
    },
    annotations: Annotations {
        read_only: true,
        destructive: false,
        idempotent: true,
        open_world: false,
    },
    handler: ping,
};

fn ping(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = args.str("name")?;
    let t = Instant::now();
    with_guest(name, "guest-ping", |q| {
        q.execute_within("guest-ping", None, Duration::from_secs(5))
    })?;
    Ok(ToolOutput::json(
        json!({"name": name, "ok": true, "latency_ms": t.elapsed().as_secs_f64() * 1000.0}),
    ))
}

const INFO_DESCRIPTION: &str = "The guest agent's version, the guest OS, and which agent commands \
    are enabled or disabled.";

/// `guest_info`.
pub const INFO: ToolDef = ToolDef {
    name: "guest_info",
    title: "Describe the guest agent",
    description: INFO_DESCRIPTION,
    input_schema: name_schema,
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "os": {"type": ["object", "null"]},
                "enabled_commands": {"type": "array", "items": {"type": "string"}},
                "disabled_commands": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["name", "version", "enabled_commands", "disabled_commands"]
        })
    },
    annotations: Annotations {
        read_only: true,
        destructive: false,
        idempotent: true,
        open_world: false,
    },
    handler: info,
};

fn info(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    guest_ops::info(args.str("name")?).map(ToolOutput::json)
}

const EXEC_DESCRIPTION: &str = "Run a program inside the guest through the agent (not a shell: \
    for pipes or globs run e.g. command=\"sh\", args=[\"-c\", \"...\"]). Waits up to timeout \
    seconds, sending progress, and returns exitcode (or signal), stdout, stderr (each capped at 1 \
    MiB) and truncation flags. On timeout the program is still running in the guest; the error \
    gives its guest PID.";

/// `guest_exec`.
pub const EXEC: ToolDef = ToolDef {
    name: "guest_exec",
    title: "Run a program in the guest",
    description: EXEC_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": {"type": "string", "minLength": 1},
                "command": {
                    "type": "string", "minLength": 1,
                    "description": "Program path or name (searched in the guest's PATH)."
                },
                "args": {"type": "array", "items": {"type": "string"}, "default": []},
                "stdin": {
                    "type": "string",
                    "description": "Text fed to the program's standard input."
                },
                "timeout": {"type": "number", "minimum": 1, "maximum": 3600, "default": 30}
            }),
            &["name", "command"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "pid": {"type": "integer"},
                "exitcode": {"type": ["integer", "null"]},
                "signal": {"type": ["integer", "null"]},
                "stdout": {"type": "string"},
                "stderr": {"type": "string"},
                "stdout_truncated": {"type": "boolean"},
                "stderr_truncated": {"type": "boolean"},
                "duration_ms": {"type": "integer"}
            },
            "required": [
                "name", "pid", "exitcode", "stdout", "stderr", "stdout_truncated",
                "stderr_truncated"
            ]
        })
    },
    annotations: Annotations {
        read_only: false,
        destructive: true,
        idempotent: false,
        open_world: false,
    },
    handler: exec,
};

fn exec(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let timeout =
        Duration::from_secs_f64(args.opt_f64("timeout")?.unwrap_or(30.0).clamp(1.0, 3600.0));
    let argv = args.str_list("args")?;
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    guest_ops::exec(
        ctx,
        args.str("name")?,
        args.str("command")?,
        &argv,
        args.opt_str("stdin")?,
        timeout,
    )
    .map(ToolOutput::json)
}

const FILE_READ_DESCRIPTION: &str = "Read a file inside the guest through the agent, in chunks, \
    up to max_bytes (default 1 MiB, at most 8 MiB). encoding=\"base64\" returns binary files \
    intact; utf-8 (default) refuses content that is not valid UTF-8.";

/// `guest_file_read`.
pub const FILE_READ: ToolDef = ToolDef {
    name: "guest_file_read",
    title: "Read a file in the guest",
    description: FILE_READ_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": {"type": "string", "minLength": 1},
                "path": {"type": "string", "minLength": 1},
                "max_bytes": {
                    "type": "integer", "minimum": 1, "maximum": MAX_READ, "default": 1048576
                },
                "encoding": {"type": "string", "enum": ["utf-8", "base64"], "default": "utf-8"}
            }),
            &["name", "path"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "path": {"type": "string"},
                "content": {"type": "string"},
                "encoding": {"type": "string"},
                "size": {"type": "integer"},
                "truncated": {"type": "boolean"}
            },
            "required": ["path", "content", "encoding", "size", "truncated"]
        })
    },
    annotations: Annotations {
        read_only: true,
        destructive: false,
        idempotent: true,
        open_world: false,
    },
    handler: file_read,
};

fn file_read(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = args.str("name")?;
    let path = args.str("path")?;
    let max = args.i64_or("max_bytes", 1_048_576)?.clamp(1, MAX_READ) as usize;
    let encoding = args.str_or("encoding", "utf-8")?;
    let (data, truncated) = with_guest(name, "guest-file-read", |q| {
        let handle = q.execute("guest-file-open", Some(json!({"path": path, "mode": "r"})))?;
        let result = read_all(q, &handle, max);
        let _ = q.execute_within(
            "guest-file-close",
            Some(json!({"handle": handle})),
            Duration::from_secs(10),
        );
        result
    })?;
    let content = if encoding == "base64" {
        b64::encode(&data)
    } else {
        String::from_utf8(data.clone()).map_err(|_| {
            ToolError::new(format!(
                "{path} is not valid UTF-8 text; read it with encoding=\"base64\""
            ))
        })?
    };
    Ok(ToolOutput::json(json!({
        "name": name, "path": path, "content": content, "encoding": encoding,
        "size": data.len(), "truncated": truncated
    })))
}

fn read_all(q: &mut Qga, handle: &Value, max: usize) -> Result<(Vec<u8>, bool), QgaError> {
    let mut data = Vec::new();
    let mut idle = 0;
    loop {
        // Ask for one byte past the cap, so a file of exactly max bytes is not called truncated.
        let want = (max + 1 - data.len()).min(FILE_CHUNK);
        let r = q.execute(
            "guest-file-read",
            Some(json!({"handle": handle, "count": want})),
        )?;
        let chunk = r
            .get("buf-b64")
            .and_then(Value::as_str)
            .map(b64::decode)
            .transpose()
            .map_err(|e| QgaError::Garbage(e.to_string()))?
            .unwrap_or_default();
        let eof = r.get("eof").and_then(Value::as_bool).unwrap_or(false);
        if chunk.is_empty() {
            idle += 1;
        } else {
            idle = 0;
        }
        data.extend_from_slice(&chunk);
        if data.len() > max {
            data.truncate(max);
            return Ok((data, true));
        }
        if eof || idle >= 3 {
            return Ok((data, false));
        }
    }
}

const FILE_WRITE_DESCRIPTION: &str = "Write (or with append=true, append to) a file inside the \
    guest through the agent, in chunks. encoding=\"base64\" writes binary content given as base64.";

/// `guest_file_write`.
pub const FILE_WRITE: ToolDef = ToolDef {
    name: "guest_file_write",
    title: "Write a file in the guest",
    description: FILE_WRITE_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": {"type": "string", "minLength": 1},
                "path": {"type": "string", "minLength": 1},
                "content": {"type": "string"},
                "append": {"type": "boolean", "default": false},
                "encoding": {"type": "string", "enum": ["utf-8", "base64"], "default": "utf-8"}
            }),
            &["name", "path", "content"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "path": {"type": "string"},
                "bytes_written": {"type": "integer"},
                "append": {"type": "boolean"}
            },
            "required": ["path", "bytes_written"]
        })
    },
    annotations: Annotations {
        read_only: false,
        destructive: true,
        idempotent: false,
        open_world: false,
    },
    handler: file_write,
};

fn file_write(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = args.str("name")?;
    let path = args.str("path")?;
    let append = args.bool_or("append", false)?;
    let content = args.str("content")?;
    let data = if args.str_or("encoding", "utf-8")? == "base64" {
        b64::decode(content)
            .map_err(|e| ToolError::new(format!("content is not valid base64: {e}")))?
    } else {
        content.as_bytes().to_vec()
    };
    let written = with_guest(name, "guest-file-write", |q| {
        let mode = if append { "a" } else { "w" };
        let handle = q.execute("guest-file-open", Some(json!({"path": path, "mode": mode})))?;
        let result = write_all(q, &handle, &data);
        let closed = q.execute_within(
            "guest-file-close",
            Some(json!({"handle": handle})),
            Duration::from_secs(10),
        );
        let n = result?;
        closed?;
        Ok(n)
    })?;
    Ok(ToolOutput::json(
        json!({"name": name, "path": path, "bytes_written": written, "append": append}),
    ))
}

fn write_all(q: &mut Qga, handle: &Value, data: &[u8]) -> Result<usize, QgaError> {
    let mut done = 0;
    let mut idle = 0;
    while done < data.len() {
        let end = (done + FILE_CHUNK).min(data.len());
        let r = q.execute(
            "guest-file-write",
            Some(json!({"handle": handle, "buf-b64": b64::encode(&data[done..end])})),
        )?;
        let n = r.get("count").and_then(Value::as_u64).unwrap_or(0) as usize;
        if n == 0 {
            idle += 1;
            if idle >= 3 {
                return Err(QgaError::Command {
                    class: "GenericError".into(),
                    desc: format!("the guest accepted no bytes after {done}; is the disk full?"),
                });
            }
        } else {
            idle = 0;
        }
        done += n.min(end - done);
    }
    Ok(done)
}
