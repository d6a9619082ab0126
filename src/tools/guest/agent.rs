//! Guest-agent tools: ping, info, exec, and file read/write through qemu-guest-agent.

use std::time::Duration;

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::b64;
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolResult};
use crate::ops::guest::files::{self, MAX_READ};
use crate::ops::guest::{self as guest_ops, exec as exec_ops, listing};
use crate::schema::Param;
use crate::tools::names::{VmName, VmOnly};
use crate::tools::presets;

const PING_DESCRIPTION: &str = "Check that the guest agent answers (it may before the boot is \
    done).";

/// `guest_ping`.
pub const PING: ToolDef = ToolDef {
    name: "guest_ping",
    title: "Ping the guest agent",
    description: PING_DESCRIPTION,
    input_schema: VmOnly::param,
    output_schema: <crate::ops::guest::files::Pong as crate::schema::Schema>::schema,
    annotations: presets::READ_ONLY,
    handler: ping,
    ui: crate::mcp::tool::Ui::NONE,
};

fn ping(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    crate::tools::to_output(&files::ping(&args.parse::<VmOnly>()?.name())?)
}

const INFO_DESCRIPTION: &str = "The guest agent's version, the guest OS and the agent's enabled \
    commands.";

/// `guest_info`.
pub const INFO: ToolDef = ToolDef {
    name: "guest_info",
    title: "Describe the guest agent",
    description: INFO_DESCRIPTION,
    input_schema: VmOnly::param,
    output_schema: <crate::ops::guest::AgentInfo as crate::schema::Schema>::schema,
    annotations: presets::READ_ONLY,
    handler: info,
    ui: crate::mcp::tool::Ui::NONE,
};

fn info(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    crate::tools::to_output(&guest_ops::info(&args.parse::<VmOnly>()?.name())?)
}

const EXEC_DESCRIPTION: &str = "Run a program in the guest (not a shell: use command=\"sh\", \
    args=[\"-c\", \"...\"] for pipes). Waits up to timeout seconds; returns exitcode or signal, \
    stdout and stderr (1 MiB each). On timeout it keeps running (the error gives its PID). live \
    streams output lines as progress (use it for builds and tests); background returns a handle \
    for guest_exec_status and guest_exec_kill. env, cwd, live and background need /bin/sh.";

/// `guest_exec`.
pub const EXEC: ToolDef = ToolDef {
    name: "guest_exec",
    title: "Run a program in the guest",
    description: EXEC_DESCRIPTION,
    input_schema: ExecArgs::param,
    output_schema: <exec_ops::Execution as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE,
    handler: exec,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct ExecArgs {
        name: VmName,
        /// Searched in the guest's PATH.
        command: String = {"minLength": 1},
        args: Vec<String> = {"default": []},
        /// Standard input.
        stdin: Option<String>,
        timeout: f64 = {"minimum": 1, "maximum": 3600, "default": 30},
        /// Added to its environment.
        env: Option<BTreeMap<String, String>>,
        /// Absolute; must exist.
        cwd: Option<String> = {"minLength": 1},
        /// Return at once with a handle.
        background: bool = {"default": false},
        /// Stream output lines as progress.
        live: bool = {"default": false},
    }
}

fn exec(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: ExecArgs = args.parse()?;
    let req = exec_ops::ExecRequest {
        name: a.name.0,
        command: a.command,
        args: a.args,
        stdin: a.stdin,
        env: a.env.unwrap_or_default().into_iter().collect(),
        cwd: a.cwd,
        timeout: Duration::from_secs_f64(a.timeout),
        // Live output only when asked for (and only where someone listens): a progress token
        // alone gets heartbeats, so a fast call costs what it costs without one.
        live: a.live && ctx.has_progress(),
    };
    crate::tools::to_output(&exec_ops::exec(ctx, &req, a.background)?)
}

const FILE_READ_DESCRIPTION: &str = "Read a guest file: max_bytes (at most 8 MiB) from offset; \
    file_size gives its size. encoding base64 for binary files; utf-8 refuses invalid text.";

/// `guest_file_read`.
pub const FILE_READ: ToolDef = ToolDef {
    name: "guest_file_read",
    title: "Read a file in the guest",
    description: FILE_READ_DESCRIPTION,
    input_schema: ReadArgs::param,
    output_schema: <crate::ops::guest::files::FileRead as crate::schema::Schema>::schema,
    annotations: presets::READ_ONLY,
    handler: file_read,
    ui: crate::mcp::tool::Ui::NONE,
};

/// How file content travels in a JSON string.
const ENCODINGS: [&str; 2] = ["utf-8", "base64"];

crate::params! {
    #[derive(Deserialize)]
    struct ReadArgs {
        name: VmName,
        path: String = {"minLength": 1},
        max_bytes: usize = {"minimum": 1, "maximum": MAX_READ, "default": 1048576},
        offset: u64 = {"minimum": 0, "default": 0},
        encoding: String = {"enum": ENCODINGS, "default": "utf-8"},
    }
}

fn file_read(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: ReadArgs = args.parse()?;
    let req = files::ReadRequest {
        name: a.name.0,
        path: a.path,
        max: a.max_bytes,
        base64: a.encoding == "base64",
        offset: a.offset,
    };
    crate::tools::to_output(&files::read(&req)?)
}

const LIST_DIR_DESCRIPTION: &str = "List a guest folder: name, type, size, mode and mtime of each \
    entry, sorted, at most max_entries (truncated says if more). Links are not followed. Needs sh \
    and stat.";

/// `guest_list_dir`.
pub const LIST_DIR: ToolDef = ToolDef {
    name: "guest_list_dir",
    title: "List a folder in the guest",
    description: LIST_DIR_DESCRIPTION,
    input_schema: ListArgs::param,
    output_schema: <crate::ops::guest::listing::Listing as crate::schema::Schema>::schema,
    annotations: presets::READ_ONLY,
    handler: list_dir,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct ListArgs {
        name: VmName,
        /// Absolute.
        path: String = {"minLength": 1},
        max_entries: usize = {"minimum": 1, "maximum": listing::MAX_ENTRIES, "default": 1000},
    }
}

fn list_dir(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: ListArgs = args.parse()?;
    let req = listing::Request {
        name: a.name.0,
        path: a.path,
        max_entries: a.max_entries,
    };
    crate::tools::to_output(&listing::list(&req)?)
}

const FILE_WRITE_DESCRIPTION: &str = "Write or append to a guest file; encoding base64 for binary \
    content.";

/// `guest_file_write`.
pub const FILE_WRITE: ToolDef = ToolDef {
    name: "guest_file_write",
    title: "Write a file in the guest",
    description: FILE_WRITE_DESCRIPTION,
    input_schema: WriteArgs::param,
    output_schema: <crate::ops::guest::files::Written as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE,
    handler: file_write,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct WriteArgs {
        name: VmName,
        path: String = {"minLength": 1},
        content: String,
        append: bool = {"default": false},
        encoding: String = {"enum": ENCODINGS, "default": "utf-8"},
    }
}

fn file_write(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: WriteArgs = args.parse()?;
    let req = files::WriteRequest {
        name: a.name.0,
        path: a.path,
        append: a.append,
        data: if a.encoding == "base64" {
            b64::decode(&a.content)
                .map_err(|e| ToolError::new(format!("content is not valid base64: {e}")))?
        } else {
            a.content.into_bytes()
        },
    };
    crate::tools::to_output(&files::write(&req)?)
}
