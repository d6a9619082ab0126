//! `template_list`, `template_pool` and `template_delete`: the templates on disk, with their
//! clones alive and their warm pools ([`crate::ops::sandbox::pool`]).

use serde_json::json;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolOutput, ToolResult};
use crate::ops::sandbox::pool;
use crate::ops::sandbox::template_manage as manage;
use crate::tools::{object, presets, template_name_arg, to_output};

const LIST_DESCRIPTION: &str = "List the templates: name, base image, memory, size on disk, \
    when saved, and the clones alive now.";

/// `template_list`.
pub const LIST: ToolDef = ToolDef {
    name: "template_list",
    title: "List sandbox templates",
    description: LIST_DESCRIPTION,
    input_schema: || json!({"type": "object", "properties": {}, "additionalProperties": false}),
    output_schema: || {
        json!({
            "type": "object",
            "properties": {"templates": {"type": "array", "items": {"type": "object"}}},
            "required": ["templates"]
        })
    },
    annotations: presets::READ_ONLY,
    handler: list,
    ui: crate::mcp::tool::Ui::NONE,
};

fn list(_ctx: &ToolCtx, _args: &Args) -> ToolResult {
    Ok(ToolOutput::json(json!({ "templates": manage::list() })))
}

const DELETE_DESCRIPTION: &str = "Delete a template and every file it has; its warm pool is \
    ended first. Refused while any clone of it that a caller holds is alive (sandbox_destroy \
    them first).";

const POOL_DESCRIPTION: &str = "Keep `size` clones of a template started, clock set and agent \
    answering (0 ends the pool): sandbox_vm {template} without cloud_init, port_forwards or \
    allow_network then hands one out, renamed as asked, in milliseconds, and the pool refills \
    in the background. Pooled clones count in the VM and memory quotas, are not listed by \
    list_vms (template_list shows pool and pool_ready), keep running when the server exits and \
    are adopted by the next one, or destroyed idle_s seconds after no server keeps the pool \
    (default 600). template_create takes pool too.";

/// `template_pool`.
pub const POOL: ToolDef = ToolDef {
    name: "template_pool",
    title: "Keep a warm pool of clones",
    description: POOL_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "name": presets::name_schema(),
                "size": {"type": "integer", "minimum": 0, "maximum": pool::MAX_POOL,
                         "description": "Clones to keep ready; 0 ends the pool."},
                "idle_s": {"type": "integer", "minimum": 0,
                           "maximum": crate::ops::vm::lifetime::MAX_S,
                           "description": "How long pooled clones live on once no server keeps \
                               the pool (the watcher destroys them then); 0: until a server \
                               ends it. Default 600."}
            }),
            &["name", "size"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "pool": {"type": "integer"},
                           "pool_ready": {"type": "integer"}, "idle_s": {"type": "integer"}},
            "required": ["name", "pool", "pool_ready"]
        })
    },
    annotations: presets::IDEMPOTENT,
    handler: set_pool,
    ui: crate::mcp::tool::Ui::NONE,
};

fn set_pool(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = template_name_arg(args)?;
    let size = args.i64_or("size", 0)?.max(0) as u64;
    if let Some(idle) = args.opt_i64("idle_s")? {
        pool::set_idle_s(&name, idle.max(0) as u64)?;
    }
    pool::set_size(ctx, &name, size)?;
    Ok(ToolOutput::json(json!({
        "name": name, "pool": pool::size(&name), "pool_ready": pool::ready(&name),
        "idle_s": pool::idle_s(&name)
    })))
}

/// `template_delete`.
pub const DELETE: ToolDef = ToolDef {
    name: "template_delete",
    title: "Delete a sandbox template",
    description: DELETE_DESCRIPTION,
    input_schema: presets::name_only,
    output_schema: || {
        json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "deleted": {"type": "boolean"},
                           "errors": {"type": "array", "items": {"type": "string"}}},
            "required": ["name", "deleted"]
        })
    },
    annotations: presets::DESTRUCTIVE,
    handler: delete,
    ui: crate::mcp::tool::Ui::NONE,
};

fn delete(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = template_name_arg(args)?;
    to_output(&manage::delete(ctx, &name)?)
}
