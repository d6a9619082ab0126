//! `template_create`: boot a guest, run its setup through the agent, and save it into the
//! template store (the operation is [`crate::ops::sandbox::template_create`]'s). `template_list`
//! and `template_delete` are in [`crate::tools::sandbox::template_manage`].

use serde_json::{json, Value};

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::sandbox::template_create::{self, SetupStep, TemplateRequest};
use crate::tools::params::{self, launch_args};
use crate::tools::{object, presets, template_name_arg};

fn setup_schema() -> Value {
    json!({
        "type": "array", "default": [],
        "items": {"type": "object", "properties": {
            "command": {"type": "string", "minLength": 1},
            "args": {"type": "array", "items": {"type": "string"}, "default": []},
            "timeout": {"type": "number", "minimum": 1, "maximum": 3600, "default": 300}
        }, "required": ["command"], "additionalProperties": false},
        "description": "Commands run in the guest through the agent before it is saved, in \
            order; the first failure stops template_create with its output."
    })
}

const CREATE_DESCRIPTION: &str = "Make a template for instant sandboxes: boot a guest (from \
    base_image, or kernel/initrd), wait for its agent, run each setup command, then save the \
    running guest (RAM in a file, device state, its disk frozen as the clones' backing file) \
    and stop it for good. sandbox_vm with template then starts a clone in well under a second. \
    Takes the sandbox_vm parameters (cloud_init included). Progress per phase.";

/// `template_create`.
pub const CREATE: ToolDef = ToolDef {
    name: "template_create",
    title: "Create a sandbox template",
    description: CREATE_DESCRIPTION,
    input_schema: || {
        let mut props = params::sandbox_props();
        if let Some(p) = props.as_object_mut() {
            p.remove("name");
            p.remove("template");
            p.remove("port_forwards");
            p.remove("run");
            p.remove("expose");
            // A template's builder has no lifetime; its clones get theirs from sandbox_vm.
            for k in ["ttl_s", "idle_s", "on_idle", "on_ttl"] {
                p.remove(k);
            }
            p.insert(
                "name".into(),
                json!({"type": "string", "minLength": 1, "maxLength": 48,
                       "description": "Template name: ^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$."}),
            );
            p.insert("setup".into(), setup_schema());
            p.insert(
                "pool".into(),
                json!({"type": "integer", "minimum": 0, "maximum": crate::ops::sandbox::pool::MAX_POOL,
                       "description": "Clones to keep started for instant sandbox_vm \
                           (template_pool changes it later); 0: none."}),
            );
            if let Some(b) = p.get_mut("base_image") {
                b["description"] = json!(
                    "Base disk image; left untouched. Absent: an empty 1 GiB disk (with kernel)."
                );
            }
            if let Some(m) = p.get_mut("memory_mb") {
                m["default"] = json!(512);
            }
        }
        object(props, &["name"])
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"}, "path": {"type": "string"},
                "memory_mb": {"type": "integer"}, "state_bytes": {"type": "integer"},
                "save_ms": {"type": "integer"}, "setup": {"type": "array"},
                "duration_ms": {"type": "integer"},
                "warnings": {"type": "array", "items": {"type": "string"}},
                "cloud_init": {"type": "object"}
            },
            "required": ["name", "path", "memory_mb", "save_ms"]
        })
    },
    annotations: presets::ADDITIVE,
    handler: create,
    ui: crate::mcp::tool::Ui::NONE,
};

fn create(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let setup = args
        .0
        .get("setup")
        .and_then(Value::as_array)
        .map(|steps| {
            steps
                .iter()
                .map(|step| SetupStep {
                    command: step["command"].as_str().unwrap_or_default().to_string(),
                    args: step["args"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(Value::as_str)
                                .map(str::to_string)
                                .collect()
                        })
                        .unwrap_or_default(),
                    timeout: step["timeout"].as_f64().unwrap_or(300.0),
                })
                .collect()
        })
        .unwrap_or_default();
    let req = TemplateRequest {
        name: template_name_arg(args)?,
        launch: launch_args(args)?,
        allow_network: args.bool_or("allow_network", false)?,
        base_image: args.opt_str("base_image")?.map(str::to_string),
        oci: args.opt_str("oci")?.map(str::to_string),
        disk_size: args.opt_str("disk_size")?.map(str::to_string),
        wait_agent_s: args.number("wait_agent_s")?,
        wait_cloud_init: args.bool_or("wait_cloud_init", false)?,
        wait_cloud_init_s: args.number("wait_cloud_init_s")?,
        setup,
        pool: args.i64_or("pool", 0)?.max(0) as u64,
    };
    crate::tools::to_output(&template_create::create(ctx, &req)?)
}
