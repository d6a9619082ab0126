//! `template_list` and `template_delete`: the templates on disk, with their clones alive.

use std::path::Path;

use serde_json::json;

use super::object;
use crate::mcp::tool::{Annotations, Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::ops::templates::{clones_of, dir_of, load, meta_of, remove_dir, templates_dir};
use crate::state::registry::valid_name;

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
    annotations: Annotations {
        read_only: true,
        destructive: false,
        idempotent: true,
        open_world: false,
    },
    handler: list,
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
                    "size_on_disk": folder_bytes(&dir), "clones": clones_of(&n),
                })),
                // Half-made (interrupted) or damaged: shown, never offered as usable.
                Err(e) if meta_of(&dir).exists() => out.push(json!({
                    "name": n, "usable": false, "problem": e.0,
                    "size_on_disk": folder_bytes(&dir), "clones": clones_of(&n),
                })),
                Err(_) => {}
            }
        }
    }
    Ok(ToolOutput::json(json!({ "templates": out })))
}

const DELETE_DESCRIPTION: &str = "Delete a template and every file it has. Refused while any \
    clone of it is alive (sandbox_destroy them first).";

/// `template_delete`.
pub const DELETE: ToolDef = ToolDef {
    name: "template_delete",
    title: "Delete a sandbox template",
    description: DELETE_DESCRIPTION,
    input_schema: || {
        object(
            json!({"name": {"type": "string", "minLength": 1}}),
            &["name"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "deleted": {"type": "boolean"},
                           "errors": {"type": "array", "items": {"type": "string"}}},
            "required": ["name", "deleted"]
        })
    },
    annotations: Annotations {
        read_only: false,
        destructive: true,
        idempotent: false,
        open_world: false,
    },
    handler: delete,
};

fn delete(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = args.str("name")?.to_string();
    if !valid_name(&name) {
        return Err(ToolError::new(format!("invalid template name {name:?}")));
    }
    let dir = dir_of(&name);
    if !dir.is_dir() {
        return Err(ToolError::new(format!(
            "no template named {name:?}; template_list shows the templates"
        )));
    }
    let clones = clones_of(&name);
    if !clones.is_empty() {
        return Err(ToolError::new(format!(
            "template {name:?} still has live clones {clones:?}; sandbox_destroy them first"
        )));
    }
    let errors = remove_dir(&dir);
    Ok(ToolOutput::json(json!({
        "name": name, "deleted": errors.is_empty(), "errors": errors
    })))
}
