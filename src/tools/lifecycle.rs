//! Lifecycle tools besides launch and stop: pause, resume, attach and forget.

use std::path::PathBuf;

use serde::Serialize;
use serde_json::{json, Value};

use crate::ops::vm::records;
// Until drive.rs names them in `ops`.
use super::{object, path_arg, presets, vm_name_arg};
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::ops::session;
pub use crate::ops::vm::records::{lookup, lookup_live};
use crate::qemu::qmp::{self, QmpError};
use crate::qemu::vm::{self, measure};
use crate::qemu::{process, sock};
use crate::state::registry::to_record;
use crate::state::roots::Access;

fn run_state_out() -> Value {
    json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "status": {"type": "string"}},
        "required": ["name", "status"]
    })
}

const PAUSE_DESCRIPTION: &str = "Freeze a running VM's vCPUs (QMP stop); reports the resulting \
    run state. The guest agent does not answer while paused.";

/// `pause_vm`.
pub const PAUSE: ToolDef = ToolDef {
    name: "pause_vm",
    title: "Pause a VM",
    description: PAUSE_DESCRIPTION,
    input_schema: presets::name_only,
    output_schema: run_state_out,
    annotations: presets::IDEMPOTENT,
    handler: |_ctx, args| run_state_change(args, "stop"),
    ui: crate::mcp::tool::Ui::NONE,
};

const RESUME_DESCRIPTION: &str = "Resume a paused VM (QMP cont); reports the resulting run state.";

/// `resume_vm`.
pub const RESUME: ToolDef = ToolDef {
    name: "resume_vm",
    title: "Resume a VM",
    description: RESUME_DESCRIPTION,
    input_schema: presets::name_only,
    output_schema: run_state_out,
    annotations: presets::IDEMPOTENT,
    handler: |_ctx, args| run_state_change(args, "cont"),
    ui: crate::mcp::tool::Ui::NONE,
};

fn run_state_change(args: &Args, cmd: &str) -> ToolResult {
    let name = vm_name_arg(args)?;
    let rec = lookup_live(&name, "launch it with launch_vm")?;
    let st = session::monitor(&name, &rec, |q| {
        q.execute(cmd, None)?;
        Ok(q.execute("query-status", None)?)
    })?;
    Ok(ToolOutput::json(json!({
        "name": name, "status": st.get("status").and_then(Value::as_str).unwrap_or("unknown")
    })))
}

// ---- attach / forget ----

const ATTACH_DESCRIPTION: &str = "Register a QEMU started elsewhere so the other tools can drive \
    it. qmp_socket must be a unix socket that answers QMP; qga_socket (optional) is its \
    guest-agent socket; pid (optional) lets stop_vm signal it. Its liveness is judged by \
    connecting to the socket.";

/// `attach_vm`.
pub const ATTACH: ToolDef = ToolDef {
    name: "attach_vm",
    title: "Adopt a running QEMU",
    description: ATTACH_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": {"type": "string", "minLength": 1, "maxLength": 48},
                "qmp_socket": {"type": "string", "minLength": 1},
                "qga_socket": {"type": "string"},
                "pid": {"type": "integer", "minimum": 1}
            }),
            &["name", "qmp_socket"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "status": {"type": "string"},
                "qmp_socket": {"type": "string"},
                "qga_socket": {"type": ["string", "null"]},
                "pid": {"type": ["integer", "null"]},
                "qemu_version": {"type": "string"}
            },
            "required": ["name", "status", "qmp_socket"]
        })
    },
    annotations: presets::ADDITIVE,
    handler: attach_vm,
    ui: crate::mcp::tool::Ui::NONE,
};

fn socket_arg(args: &Args, key: &str) -> Result<Option<PathBuf>, ToolError> {
    if args.opt_str(key)?.is_none() {
        return Ok(None);
    }
    let p = path_arg(args, key, Access::Read)?;
    let p = std::fs::canonicalize(&p)
        .map_err(|e| ToolError::new(format!("{key} {}: {e}", p.display())))?;
    if !sock::is_socket(&p) {
        return Err(ToolError::new(format!(
            "{key} {} is not a unix socket",
            p.display()
        )));
    }
    Ok(Some(p))
}

/// The record of a QEMU adopted with attach_vm.
#[derive(Serialize)]
struct AttachedRecord<'a> {
    name: &'a str,
    source: &'static str,
    pid: Option<i32>,
    qmp_socket: String,
    qga_socket: Option<String>,
    qemu_version: &'a str,
    created_at: String,
}

fn attach_vm(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let qmp_path =
        socket_arg(args, "qmp_socket")?.ok_or_else(|| ToolError::new("missing qmp_socket"))?;
    let qga = socket_arg(args, "qga_socket")?;
    let pid = args.opt_i64("pid")?.map(|p| p as i32);
    if let Some(p) = pid {
        if !process::alive(p) {
            return Err(ToolError::new(format!("process {p} is not running")));
        }
    }
    let (status, version) = qmp::with_session(&qmp_path, |q| -> Result<_, QmpError> {
        let st = q.execute("query-status", None)?;
        Ok((
            st.get("status")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_string(),
            q.version.clone(),
        ))
    })
    .map_err(|e| match e {
        QmpError::NoGreeting => ToolError::new(format!(
            "{} accepts connections but sends no QMP greeting: another client holds that monitor. \
             Free it and retry",
            qmp_path.display()
        )),
        other => ToolError::new(format!(
            "{} does not answer QMP: {other}",
            qmp_path.display()
        )),
    })?;
    let rec = to_record(&AttachedRecord {
        name: &name,
        source: "attached",
        pid,
        qmp_socket: qmp_path.display().to_string(),
        qga_socket: qga.as_ref().map(|p| p.display().to_string()),
        qemu_version: &version,
        created_at: crate::clock::iso8601(crate::clock::now_secs()),
    });
    let name_c = name.clone();
    vm::registry().update(move |vms| {
        if let Some(old) = vms.get(&name_c) {
            if measure(old).alive() {
                return Err(ToolError::new(format!(
                    "a live VM is already registered as {name_c:?}; choose another name"
                )));
            }
        }
        vms.insert(name_c, rec);
        Ok(())
    })?;
    Ok(ToolOutput::json(json!({
        "name": name, "status": status, "qmp_socket": qmp_path.display().to_string(),
        "qga_socket": qga.map(|p| p.display().to_string()), "pid": pid, "qemu_version": version,
    })))
}

const FORGET_DESCRIPTION: &str = "Drop a VM's registry record only; the QEMU process and its \
    files are left alone. Refuses a live VM that mcqemu spawned unless force=true (it would keep \
    running unmanaged). Attached VMs can always be forgotten.";

/// `forget_vm`.
pub const FORGET: ToolDef = ToolDef {
    name: "forget_vm",
    title: "Forget a VM",
    description: FORGET_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "force": {"type": "boolean", "default": false}
            }),
            &["name"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "forgotten": {"type": "boolean"},
                "was_running": {"type": "boolean"}
            },
            "required": ["name", "forgotten"]
        })
    },
    annotations: presets::DESTRUCTIVE,
    handler: forget_vm,
    ui: crate::mcp::tool::Ui::NONE,
};

fn forget_vm(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let was_running = records::forget(&name, args.bool_or("force", false)?)?;
    ctx.log.log(
        "notice",
        &format!("forget_vm {name} (was running: {was_running})"),
    );
    Ok(ToolOutput::json(
        json!({"name": name, "forgotten": true, "was_running": was_running}),
    ))
}
