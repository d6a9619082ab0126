//! `sandbox_vm` and `sandbox_destroy`: their definitions and arguments; the sandboxes
//! themselves are [`crate::ops::sandbox`].

use serde_json::json;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::sandbox;
use crate::tools::params::{self, sandbox_request};
use crate::tools::{object, presets, vm_name_arg};

const SANDBOX_DESCRIPTION: &str = "Create a qcow2 overlay on base_image (the base is never \
    modified), launch a VM on it, and wait up to wait_agent_s seconds for qemu-guest-agent to \
    answer, with progress. Then use guest_exec / guest_file_* and finally sandbox_destroy. \
    Guest-initiated network traffic is blocked unless allow_network=true, or limited to the \
    names in allow_network rules (an HTTP/HTTPS proxy, see allow_network); port forwards still \
    work; default forwards one auto host port to guest port 22. The agent can answer before the \
    guest has finished booting. A cloud-init module that fails (a resizefs, a write_files entry) \
    does not remove the sandbox: it is a warning quoting cloud-init's line, and cloud_init says \
    status and failed_modules. kernel/initrd/append boot a kernel directly (the base image then \
    serves as a data disk). It ends by itself unless told otherwise: suspended after 900 idle \
    seconds (the next tool naming it resumes it), stopped after a day (ttl_s, idle_s, on_idle, \
    on_ttl; vm_lifetime changes them later).";

/// `sandbox_vm`.
pub const SANDBOX: ToolDef = ToolDef {
    name: "sandbox_vm",
    title: "Start a disposable sandbox VM",
    description: SANDBOX_DESCRIPTION,
    input_schema: || object(params::sandbox_props(), &[]),
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "status": {"type": "string"},
                "pid": {"type": ["integer", "null"]},
                "accel": {"type": "string"},
                "agent_ready": {"type": "boolean"},
                "agent_wait_ms": {"type": "integer"},
                "overlay": {"type": "string"},
                "base_image": {"type": "string"},
                "port_forwards": {"type": "array", "items": {"type": "object"}},
                "warnings": {"type": "array", "items": {"type": "string"}},
                "cloud_init": {"type": "object"},
                "template": {"type": "string"},
                "pooled": {"type": "boolean"},
                "ready_ms": {"type": "integer"},
                "steps_ms": {"type": "object"},
                "image_process": {"type": "object", "description": "With run: the image's \
                    program in the background (handle, pid)."}
            },
            "required": ["name", "status", "agent_ready", "overlay", "base_image"]
        })
    },
    annotations: presets::ADDITIVE,
    handler: sandbox_vm,
    ui: presets::OPENS_VIEW,
};

fn sandbox_vm(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let made = sandbox::create(ctx, &sandbox_request(args)?)?;
    crate::tools::to_output(&made)
}

const DESTROY_DESCRIPTION: &str = "Stop a sandbox VM (verified, with SIGKILL if needed), delete \
    its overlay and its own state folder, and drop its record. Only for VMs made by sandbox_vm; \
    the base image is never touched. Refuses to delete an overlay that any process still holds \
    open. destroyed says what really happened; errors lists every cleanup problem.";

/// `sandbox_destroy`.
pub const DESTROY: ToolDef = ToolDef {
    name: "sandbox_destroy",
    title: "Destroy a sandbox",
    description: DESTROY_DESCRIPTION,
    input_schema: presets::name_only,
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "destroyed": {"type": "boolean"},
                "stopped": {"type": "string"},
                "deleted": {"type": "array", "items": {"type": "string"}},
                "errors": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["name", "destroyed", "deleted", "errors"]
        })
    },
    annotations: presets::DESTRUCTIVE,
    handler: destroy,
    ui: crate::mcp::tool::Ui::NONE,
};

fn destroy(ctx: &ToolCtx, args: &Args) -> ToolResult {
    crate::tools::to_output(&crate::ops::sandbox::destroy::destroy(
        ctx,
        &vm_name_arg(args)?,
    )?)
}
