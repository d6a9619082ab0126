//! guest_copy_in and guest_copy_out: the MCP side of `ops::copy` (schemas, arguments,
//! progress, the result's shape).

use serde_json::{json, Value};

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolOutput, ToolResult};
use crate::ops::guest::copy::{self, Copied, CopyIn, CopyOut};
use crate::ops::guest::stream::Watch;
use crate::tools::{object, presets, vm_name_arg};

/// Progress and cancellation of a copy, as the call's context reports them.
struct CtxWatch<'a>(&'a ToolCtx, &'static str);

impl Watch for CtxWatch<'_> {
    fn progress(&self, bytes: u64, total: u64, files: u64) {
        let mib = |b: u64| b as f64 / 1048576.0;
        let total_f = (total >= bytes && total > 0).then_some(total as f64);
        self.0.progress(
            bytes as f64,
            total_f,
            &format!(
                "{}: {files} files, {:.1} of {:.1} MiB",
                self.1,
                mib(bytes),
                mib(total.max(bytes))
            ),
        );
    }

    fn cancelled(&self) -> bool {
        self.0.cancelled()
    }
}

fn output_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "host_path": {"type": "string"},
            "guest_path": {"type": "string"},
            "bytes": {"type": "integer"},
            "files": {"type": "integer"},
            "dirs": {"type": "integer"},
            "symlinks": {"type": "integer"},
            "skipped": {"type": "array", "items": {"type": "string"}},
            "skipped_total": {"type": "integer"},
            "duration_ms": {"type": "integer"},
            "via": {"type": "string", "enum": ["channel", "agent"],
                    "description": "How the bytes went: mcqemu's data channel (a virtio-serial port, at the device's speed) or the guest agent's file commands."},
            "via_reason": {"type": "string", "description": "Why the channel was not used."}
        },
        "required": [
            "name", "host_path", "guest_path", "bytes", "files", "dirs", "symlinks",
            "duration_ms", "via"
        ]
    })
}

fn result(name: &str, c: Copied) -> ToolOutput {
    let mut out = json!({
        "name": name,
        "host_path": c.host_path.display().to_string(),
        "guest_path": c.guest_path,
        "bytes": c.counts.bytes,
        "files": c.counts.files,
        "dirs": c.counts.dirs,
        "symlinks": c.counts.symlinks,
        "skipped": c.counts.skipped,
        "skipped_total": c.counts.skipped_total,
        "duration_ms": c.duration_ms,
        "via": c.via,
    });
    if let Some(why) = c.via_reason {
        out["via_reason"] = json!(why);
    }
    ToolOutput::json(out)
}

fn input_schema(first: &str, second: &str) -> Value {
    let mut props = serde_json::Map::new();
    props.insert("name".into(), presets::name_schema());
    for (key, what) in [(first, "source"), (second, "destination")] {
        let side = if key.starts_with("host") {
            "host"
        } else {
            "guest (absolute)"
        };
        props.insert(
            key.into(),
            json!({"type": "string", "minLength": 1, "description": format!("The {what}: a {side} path.")}),
        );
    }
    props.insert(
        "overwrite".into(),
        json!({"type": "boolean", "default": false,
               "description": "Replace an existing destination (file or whole folder)."}),
    );
    object(Value::Object(props), &["name", first, second])
}

const IN_DESCRIPTION: &str = "Copy a host file or a whole folder tree into the guest at \
    guest_path, as one tar stream over mcqemu's data channel (a virtio-serial port; the guest \
    agent's file commands when the VM has none: `via` says which). Modes and mtimes are kept; symlinks \
    are copied as links, never followed; hidden names (.git, .ssh) inside the tree are left out, \
    as the roots rule. host_path must be readable inside the server's roots; an existing \
    guest_path is refused unless overwrite=true; nothing partial is left on failure. The guest \
    needs sh, tar, mv, rm, mkdir and chmod (busybox has them). At most MCQEMU_MAX_COPY_MB \
    (default 2048) per call; sends progress.";

/// `guest_copy_in`.
pub const COPY_IN: ToolDef = ToolDef {
    name: "guest_copy_in",
    title: "Copy files into the guest",
    description: IN_DESCRIPTION,
    input_schema: || input_schema("host_path", "guest_path"),
    output_schema,
    annotations: presets::DESTRUCTIVE_IDEMPOTENT,
    handler: copy_in,
    ui: crate::mcp::tool::Ui::NONE,
};

fn copy_in(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let req = CopyIn {
        name: name.clone(),
        host_path: args.str("host_path")?.to_string(),
        guest_path: args.str("guest_path")?.to_string(),
        overwrite: args.bool_or("overwrite", false)?,
    };
    let copied = copy::copy_in(&req, &CtxWatch(ctx, "guest_copy_in"))?;
    Ok(result(&name, copied))
}

const OUT_DESCRIPTION: &str = "Copy a guest file or a whole folder tree to the host at \
    host_path, as one tar stream over mcqemu's data channel (a virtio-serial port, no archive \
    in the guest; the guest agent's file commands when the VM has none: `via` says which). Modes (without setuid/setgid) and \
    mtimes are kept; symlinks arrive as links, and an entry under a symlink or outside the \
    destination is refused; hidden names inside the tree are left out. host_path must be \
    writable inside the server's roots; an existing host_path is refused unless \
    overwrite=true; nothing partial is left on failure. The guest needs sh, tar and rm \
    (busybox has them), and room for the archive in /var/tmp or /tmp only through the agent. At most \
    MCQEMU_MAX_COPY_MB (default 2048) per call; sends progress.";

/// `guest_copy_out`.
pub const COPY_OUT: ToolDef = ToolDef {
    name: "guest_copy_out",
    title: "Copy files out of the guest",
    description: OUT_DESCRIPTION,
    input_schema: || input_schema("guest_path", "host_path"),
    output_schema,
    annotations: presets::DESTRUCTIVE_IDEMPOTENT,
    handler: copy_out,
    ui: crate::mcp::tool::Ui::NONE,
};

fn copy_out(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let req = CopyOut {
        name: name.clone(),
        guest_path: args.str("guest_path")?.to_string(),
        host_path: args.str("host_path")?.to_string(),
        overwrite: args.bool_or("overwrite", false)?,
    };
    let copied = copy::copy_out(&req, &CtxWatch(ctx, "guest_copy_out"))?;
    Ok(result(&name, copied))
}
