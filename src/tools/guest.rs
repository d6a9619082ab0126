//! Guest-agent tools: ping, info, exec, and file read/write through qemu-guest-agent.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::lifecycle::lookup;
use super::object;
use super::session;
use crate::b64;
use crate::mcp::tool::{Annotations, Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::qemu::qga::{Qga, QgaError};

/// Bytes per guest-file-read / guest-file-write call: large, since every call is a round trip
/// into a TCG guest (qemu-ga allows reads of up to 48 MB), and a multiple of 3 so base64
/// chunks join without padding.
const FILE_CHUNK: usize = 1024 * 1024 - 1;
/// How long guest_exec holds one agent session while polling before letting others in. While
/// no host is connected qemu-ga drains the program's output slowly, so stay connected most of
/// the time, but never keep other agent calls to this VM waiting for more than about a second.
const EXEC_POLL_WINDOW: Duration = Duration::from_secs(1);
/// Cap on guest_file_read's max_bytes.
pub const MAX_READ: i64 = 8 * 1024 * 1024;

/// Runs `f` on a synced agent session of VM `name`; failures are explained for that VM.
pub fn with_guest<T>(
    name: &str,
    cmd: &str,
    f: impl FnOnce(&mut Qga) -> Result<T, QgaError>,
) -> Result<T, ToolError> {
    let rec = lookup(name)?;
    session::agent(name, &rec, cmd, |q| Ok(f(q)?))
}

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
    let name = args.str("name")?;
    let (info, os) = with_guest(name, "guest-info", |q| {
        let info = q.execute_within("guest-info", None, Duration::from_secs(10))?;
        let os = q
            .execute_within("guest-get-osinfo", None, Duration::from_secs(10))
            .ok();
        Ok((info, os))
    })?;
    let mut enabled = Vec::new();
    let mut disabled = Vec::new();
    for c in info
        .get("supported_commands")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let n = c
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if c.get("enabled").and_then(Value::as_bool).unwrap_or(true) {
            enabled.push(n);
        } else {
            disabled.push(n);
        }
    }
    Ok(ToolOutput::json(json!({
        "name": name,
        "version": info.get("version").and_then(Value::as_str).unwrap_or(""),
        "os": os,
        "enabled_commands": enabled,
        "disabled_commands": disabled,
    })))
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
                    "type": ["string", "null"], "default": null,
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

/// Most bytes of stdout or stderr that guest_exec returns; the rest is cut and flagged.
/// The agent itself keeps 16 MiB, far more than an agent can read in a tool result.
pub const MAX_OUTPUT: usize = 1024 * 1024;

/// Decodes one captured stream, capped at [`MAX_OUTPUT`]; true when it was cut here or by the
/// agent.
fn decode_stream(v: &Value, data: &str, flag: &str) -> (String, bool) {
    let mut bytes = v
        .get(data)
        .and_then(Value::as_str)
        .and_then(|s| b64::decode(s).ok())
        .unwrap_or_default();
    let mut cut = v.get(flag).and_then(Value::as_bool).unwrap_or(false);
    if bytes.len() > MAX_OUTPUT {
        bytes.truncate(MAX_OUTPUT);
        cut = true;
    }
    (String::from_utf8_lossy(&bytes).into_owned(), cut)
}

fn exec(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = args.str("name")?.to_string();
    let command = args.str("command")?;
    let argv = args.str_list("args")?;
    let timeout =
        Duration::from_secs_f64(args.opt_f64("timeout")?.unwrap_or(30.0).clamp(1.0, 3600.0));
    let mut req = json!({"path": command, "arg": argv, "capture-output": true});
    if let Some(input) = args.opt_str("stdin")? {
        req["input-data"] = json!(b64::encode(input.as_bytes()));
    }
    let started = Instant::now();
    let deadline = started + timeout;
    let mut slice = Duration::from_millis(5);
    let mut pid: Option<i64> = None;
    loop {
        // Poll over one session held for a window, sleeping while connected: while no host
        // client is connected, qemu-ga throttles its main loop (it sleeps on every wake-up of
        // the disconnected virtio port), and drains the program's output pipes so slowly that
        // 1 MB of stdout takes ~10 s instead of ~0.4 s and a chatty program stalls on a full
        // pipe. The first window also starts the program, so a quick command needs one
        // session (a reconnect right after a hang-up costs ~100 ms). Releasing the session
        // between windows lets other callers take turns.
        let label = if pid.is_none() {
            "guest-exec"
        } else {
            "guest-exec-status"
        };
        let window_end = Instant::now() + EXEC_POLL_WINDOW;
        let step = with_guest(&name, label, |q| {
            let pid = match pid {
                Some(p) => p,
                None => {
                    let r =
                        q.execute_within("guest-exec", Some(req.clone()), Duration::from_secs(30))?;
                    let p = r.get("pid").and_then(Value::as_i64).ok_or_else(|| {
                        QgaError::Garbage(format!("guest-exec returned no pid: {r}"))
                    })?;
                    ctx.log.log(
                        "info",
                        &format!("guest_exec in {name}: {command} (guest pid {p})"),
                    );
                    pid = Some(p);
                    p
                }
            };
            loop {
                // The final status carries the whole capture (up to 16 MiB of stdout and of
                // stderr, in base64): under TCG that reply alone can take several seconds.
                let status = q.execute_within(
                    "guest-exec-status",
                    Some(json!({"pid": pid})),
                    crate::qemu::qga::COMMAND_TIMEOUT,
                )?;
                if status.get("exited").and_then(Value::as_bool) == Some(true) {
                    return Ok(Some(status));
                }
                ctx.progress(
                    started.elapsed().as_secs_f64(),
                    Some(timeout.as_secs_f64()),
                    &format!("{command} running in the guest (pid {pid})"),
                );
                let now = Instant::now();
                if ctx.cancelled() || now >= deadline || now >= window_end {
                    return Ok(None);
                }
                std::thread::sleep(slice.min(deadline - now));
                slice = (slice * 2).min(Duration::from_millis(250));
            }
        })?;
        let pid = pid.unwrap_or(0);
        if let Some(status) = step {
            let stdout = decode_stream(&status, "out-data", "out-truncated");
            let stderr = decode_stream(&status, "err-data", "err-truncated");
            return Ok(ToolOutput::json(json!({
                "name": name,
                "pid": pid,
                "exitcode": status.get("exitcode").and_then(Value::as_i64),
                "signal": status.get("signal").and_then(Value::as_i64),
                "stdout": stdout.0,
                "stderr": stderr.0,
                "stdout_truncated": stdout.1,
                "stderr_truncated": stderr.1,
                "duration_ms": started.elapsed().as_millis() as u64,
            })));
        }
        if ctx.cancelled() {
            return Err(ToolError::new(format!(
                "cancelled; {command} is still running in the guest as pid {pid}"
            )));
        }
        if Instant::now() >= deadline {
            return Err(ToolError::new(format!(
                "{command} did not finish within {} s; it is still running in the guest as pid \
                 {pid} (stop it with guest_exec command=\"kill\" args=[\"{pid}\"])",
                timeout.as_secs_f64()
            )));
        }
        // Between windows, give other agent callers a moment to take the session.
        std::thread::sleep(
            Duration::from_millis(20).min(deadline.saturating_duration_since(Instant::now())),
        );
    }
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
