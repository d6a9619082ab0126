//! Guest-agent tools: ping, info, exec, and file read/write through qemu-guest-agent.

use std::time::Duration;

use serde_json::json;

use crate::b64;
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::ops::guest::files::{self, MAX_READ};
use crate::ops::guest::{self as guest_ops, exec as exec_ops, listing};
use crate::tools::{object, presets, vm_name_arg};

const PING_DESCRIPTION: &str = "Check that qemu-guest-agent answers inside the VM. The agent can \
    answer before the guest has finished booting.";

/// `guest_ping`.
pub const PING: ToolDef = ToolDef {
    name: "guest_ping",
    title: "Ping the guest agent",
    description: PING_DESCRIPTION,
    input_schema: presets::name_only,
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
    annotations: presets::READ_ONLY,
    handler: ping,
    ui: crate::mcp::tool::Ui::NONE,
};

fn ping(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    crate::tools::to_output(&files::ping(&vm_name_arg(args)?)?)
}

const INFO_DESCRIPTION: &str = "The guest agent's version, the guest OS, and which agent commands \
    are enabled or disabled.";

/// `guest_info`.
pub const INFO: ToolDef = ToolDef {
    name: "guest_info",
    title: "Describe the guest agent",
    description: INFO_DESCRIPTION,
    input_schema: presets::name_only,
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
    annotations: presets::READ_ONLY,
    handler: info,
    ui: crate::mcp::tool::Ui::NONE,
};

fn info(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    crate::tools::to_output(&guest_ops::info(&vm_name_arg(args)?)?)
}

const EXEC_DESCRIPTION: &str = "Run a program inside the guest through the agent (not a shell: \
    for pipes or globs run e.g. command=\"sh\", args=[\"-c\", \"...\"]), with env added to \
    its environment and cwd as its folder. Waits up to timeout seconds and returns exitcode (or \
    signal), stdout, stderr (each capped at 1 MiB) and truncation flags. live=true sends its new \
    output lines in the call's progress while it runs (ask for it on builds, tests and long \
    installs; a progress token alone sends only heartbeats). On timeout the program is still \
    running in the guest; the error gives its guest PID. background=true returns at once with a \
    handle for guest_exec_status and guest_exec_kill (for servers, builds and long tests). env, \
    cwd, live output and background need /bin/sh in the guest.";

/// `guest_exec`.
pub const EXEC: ToolDef = ToolDef {
    name: "guest_exec",
    title: "Run a program in the guest",
    description: EXEC_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "command": {
                    "type": "string", "minLength": 1,
                    "description": "Program path or name (searched in the guest's PATH)."
                },
                "args": {"type": "array", "items": {"type": "string"}, "default": []},
                "stdin": {
                    "type": "string",
                    "description": "Text fed to the program's standard input."
                },
                "timeout": {"type": "number", "minimum": 1, "maximum": 3600, "default": 30},
                "env": {
                    "type": "object", "additionalProperties": {"type": "string"},
                    "description": "Variables added to the program's environment."
                },
                "cwd": {
                    "type": "string", "minLength": 1,
                    "description": "The program's working folder (absolute); a missing one is \
                                    an error and nothing runs."
                },
                "background": {
                    "type": "boolean", "default": false,
                    "description": "Start it and return at once with a handle: read its output \
                                    by offsets with guest_exec_status, end it with \
                                    guest_exec_kill."
                },
                "live": {
                    "type": "boolean", "default": false,
                    "description": "Send the program's new output lines in the call's progress \
                                    notifications while it runs (builds, tests, long installs). \
                                    Costs a few ms per call; without it a progress token gets \
                                    heartbeats only."
                }
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
                "duration_ms": {"type": "integer"},
                "handle": {"type": "string"},
                "background": {"type": "boolean"}
            },
            "required": ["name", "pid"]
        })
    },
    annotations: presets::DESTRUCTIVE,
    handler: exec,
    ui: crate::mcp::tool::Ui::NONE,
};

/// guest_exec's `env`: an object of strings.
fn env_arg(args: &Args) -> Result<Vec<(String, String)>, ToolError> {
    let Some(v) = args.get("env") else {
        return Ok(Vec::new());
    };
    let m = v
        .as_object()
        .ok_or_else(|| ToolError::new("env must be an object of strings"))?;
    let env: Vec<(String, String)> = m
        .iter()
        .map(|(k, v)| {
            v.as_str()
                .map(|s| (k.clone(), s.to_string()))
                .ok_or_else(|| ToolError::new(format!("env {k} must be a string")))
        })
        .collect::<Result<_, _>>()?;
    Ok(env)
}

fn exec(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let req = exec_ops::ExecRequest {
        name: vm_name_arg(args)?,
        command: args.str("command")?.to_string(),
        args: args.str_list("args")?,
        stdin: args.opt_str("stdin")?.map(str::to_string),
        env: env_arg(args)?,
        cwd: args.opt_str("cwd")?.map(str::to_string),
        timeout: Duration::from_secs_f64(args.number("timeout")?),
        // Live output only when asked for (and only where someone listens): a progress token
        // alone gets heartbeats, so a fast call costs what it costs without one.
        live: args.bool_or("live", false)? && ctx.has_progress(),
    };
    if args.bool_or("background", false)? {
        return crate::tools::to_output(&exec_ops::start(&req)?);
    }
    crate::tools::to_output(&exec_ops::run(ctx, &req)?)
}

const FILE_READ_DESCRIPTION: &str = "Read a file inside the guest through the agent, in chunks, \
    up to max_bytes (default 1 MiB, at most 8 MiB) from offset on (file_size says how large \
    the file is, to read it in pieces). encoding=\"base64\" returns binary files \
    intact; utf-8 (default) refuses content that is not valid UTF-8.";

/// `guest_file_read`.
pub const FILE_READ: ToolDef = ToolDef {
    name: "guest_file_read",
    title: "Read a file in the guest",
    description: FILE_READ_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "path": {"type": "string", "minLength": 1},
                "max_bytes": {
                    "type": "integer", "minimum": 1, "maximum": MAX_READ, "default": 1048576
                },
                "offset": {
                    "type": "integer", "minimum": 0, "default": 0,
                    "description": "Where to start reading (read a large file in pieces; \
                                    the result's file_size says how large it is)."
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
                "truncated": {"type": "boolean"},
                "offset": {"type": "integer"},
                "file_size": {"type": "integer"}
            },
            "required": ["path", "content", "encoding", "size", "truncated"]
        })
    },
    annotations: presets::READ_ONLY,
    handler: file_read,
    ui: crate::mcp::tool::Ui::NONE,
};

fn file_read(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let req = files::ReadRequest {
        name: vm_name_arg(args)?,
        path: args.str("path")?.to_string(),
        max: args.int("max_bytes")? as usize,
        base64: args.str_or("encoding", "utf-8")? == "base64",
        offset: u64::try_from(args.int("offset")?)
            .map_err(|_| ToolError::new("offset must be 0 or more"))?,
    };
    crate::tools::to_output(&files::read(&req)?)
}

const LIST_DIR_DESCRIPTION: &str = "List a folder inside the guest: each entry's name, type \
    (file, dir, symlink, fifo, socket, char, block), size, mode and modification time, sorted by \
    name, at most max_entries (truncated says when there were more). Links are not followed. \
    Needs sh and stat in the guest.";

/// `guest_list_dir`.
pub const LIST_DIR: ToolDef = ToolDef {
    name: "guest_list_dir",
    title: "List a folder in the guest",
    description: LIST_DIR_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "path": {"type": "string", "minLength": 1,
                         "description": "An absolute folder path in the guest."},
                "max_entries": {"type": "integer", "minimum": 1,
                                "maximum": listing::MAX_ENTRIES, "default": 1000}
            }),
            &["name", "path"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"}, "path": {"type": "string"},
                "entries": {"type": "array", "items": {"type": "object"}},
                "truncated": {"type": "boolean"}
            },
            "required": ["name", "path", "entries", "truncated"]
        })
    },
    annotations: presets::READ_ONLY,
    handler: list_dir,
    ui: crate::mcp::tool::Ui::NONE,
};

fn list_dir(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let req = listing::Request {
        name: vm_name_arg(args)?,
        path: args.str("path")?.to_string(),
        max_entries: args.int("max_entries")? as usize,
    };
    let out = listing::list(&req)?;
    serde_json::to_value(out)
        .map(ToolOutput::json)
        .map_err(|e| ToolError::new(format!("cannot shape the result: {e}")))
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
                "name": presets::name_schema(),
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
    annotations: presets::DESTRUCTIVE,
    handler: file_write,
    ui: crate::mcp::tool::Ui::NONE,
};

fn file_write(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let content = args.str("content")?;
    let req = files::WriteRequest {
        name: vm_name_arg(args)?,
        path: args.str("path")?.to_string(),
        append: args.bool_or("append", false)?,
        data: if args.str_or("encoding", "utf-8")? == "base64" {
            b64::decode(content)
                .map_err(|e| ToolError::new(format!("content is not valid base64: {e}")))?
        } else {
            content.as_bytes().to_vec()
        },
    };
    crate::tools::to_output(&files::write(&req)?)
}
