//! `template_list`, `template_pool` and `template_delete`: the templates on disk, with their
//! clones alive and their warm pools ([`crate::ops::sandbox::pool`]).

use std::path::Path;

use serde_json::json;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::ops::sandbox::pool;
use crate::ops::sandbox::templates::{clones_of, dir_of, load, meta_of, remove_dir, templates_dir};
use crate::tools::{object, presets, template_name_arg};

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

fn folder_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.blocks() * 512)
                .sum()
        })
        .unwrap_or(0)
}

/// The live clones of a template that callers hold (its pool's are counted apart).
fn own_clones(template: &str) -> Vec<String> {
    let pooled = pool::pooled(template);
    clones_of(template)
        .into_iter()
        .filter(|c| !pooled.contains(c))
        .collect()
}

fn list(_ctx: &ToolCtx, _args: &Args) -> ToolResult {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(templates_dir()) {
        let mut names: Vec<String> = entries
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for n in names {
            let dir = dir_of(&n);
            match load(&n) {
                Ok(t) => out.push(json!({
                    "name": t.name, "usable": true, "base_image": t.base_image,
                    "memory_mb": t.memory_mb, "cpus": t.cpus, "created_at": t.created_at,
                    "size_on_disk": folder_bytes(&dir), "clones": own_clones(&n),
                    "pool": pool::size(&n), "pool_ready": pool::ready(&n),
                })),
                // Half-made (interrupted) or damaged: shown, never offered as usable.
                Err(e) if meta_of(&dir).exists() => out.push(json!({
                    "name": n, "usable": false, "problem": e.msg,
                    "size_on_disk": folder_bytes(&dir), "clones": own_clones(&n),
                })),
                Err(_) => {}
            }
        }
    }
    Ok(ToolOutput::json(json!({ "templates": out })))
}

const DELETE_DESCRIPTION: &str = "Delete a template and every file it has; its warm pool is \
    ended first. Refused while any clone of it that a caller holds is alive (sandbox_destroy \
    them first).";

const POOL_DESCRIPTION: &str = "Keep `size` clones of a template started, clock set and agent \
    answering (0 ends the pool): sandbox_vm {template} without cloud_init, port_forwards or \
    allow_network then hands one out, renamed as asked, in milliseconds, and the pool refills \
    in the background. Pooled clones count in the VM and memory quotas, are not listed by \
    list_vms (template_list shows pool and pool_ready), keep running when the server exits and \
    are adopted by the next one. template_create takes pool too.";

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
                         "description": "Clones to keep ready; 0 ends the pool."}
            }),
            &["name", "size"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "pool": {"type": "integer"},
                           "pool_ready": {"type": "integer"}},
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
    pool::set_size(ctx, &name, size)?;
    Ok(ToolOutput::json(json!({
        "name": name, "pool": pool::size(&name), "pool_ready": pool::ready(&name)
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
    let dir = dir_of(&name);
    if !dir.is_dir() {
        return Err(ToolError::new(format!(
            "no template named {name:?}; template_list shows the templates"
        )));
    }
    // Its pool ends first: pooled clones are the server's, not anyone's work.
    if pool::size(&name) > 0 || !pool::pooled(&name).is_empty() {
        let file = dir.join("pool");
        let _ = std::fs::remove_file(&file);
        for c in pool::pooled(&name) {
            crate::ops::sandbox::destroy::destroy_quietly(ctx, &c);
        }
    }
    let clones = clones_of(&name);
    if !clones.is_empty() {
        return Err(ToolError::new(format!(
            "template {name:?} still has clones (or forks of them, running or suspended) that \
             stand on its disk: {clones:?}; sandbox_destroy them first"
        )));
    }
    let errors = remove_dir(&dir);
    Ok(ToolOutput::json(json!({
        "name": name, "deleted": errors.is_empty(), "errors": errors
    })))
}
