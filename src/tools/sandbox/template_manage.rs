//! `template_list`, `template_pool` and `template_delete`: the templates on disk, with their
//! clones alive and their warm pools ([`crate::ops::sandbox::pool`]).

use serde::Deserialize;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::sandbox::pool;
use crate::ops::sandbox::template_manage as manage;
use crate::ops::vm::lifetime::MAX_S;
use crate::schema::Param;
use crate::tools::names::{TemplateName, TemplateOnly};
use crate::tools::{presets, to_output};

const LIST_DESCRIPTION: &str = "List the templates: name, base image, memory, size on disk, \
    when saved, and the clones alive now.";

/// `template_list`.
pub const LIST: ToolDef = ToolDef {
    name: "template_list",
    title: "List sandbox templates",
    description: LIST_DESCRIPTION,
    input_schema: presets::NoArgs::param,
    output_schema: <manage::Templates as crate::schema::Schema>::schema,
    annotations: presets::READ_ONLY,
    handler: list,
    ui: crate::mcp::tool::Ui::NONE,
};

fn list(_ctx: &ToolCtx, _args: &Args) -> ToolResult {
    to_output(&manage::list())
}

const DELETE_DESCRIPTION: &str = "Delete a template and its files (its pool first); refused while \
    a clone of it is alive.";

const POOL_DESCRIPTION: &str = "Keep size clones of a template started and ready (0 ends the \
    pool): sandbox_vm {template} without cloud_init, port_forwards or allow_network then gets one \
    in milliseconds. Pooled clones count in the quotas and survive the server.";

/// `template_pool`.
pub const POOL: ToolDef = ToolDef {
    name: "template_pool",
    title: "Keep a warm pool of clones",
    description: POOL_DESCRIPTION,
    input_schema: PoolArgs::param,
    output_schema: <pool::PoolState as crate::schema::Schema>::schema,
    annotations: presets::IDEMPOTENT,
    handler: set_pool,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct PoolArgs {
        name: TemplateName,
        /// Clones to keep ready; 0 ends the pool.
        size: u64 = {"minimum": 0, "maximum": pool::MAX_POOL},
        /// Once no server keeps the pool; 0: until a server ends it. Default 600.
        idle_s: Option<u64> = {"minimum": 0, "maximum": MAX_S},
    }
}

fn set_pool(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: PoolArgs = args.parse()?;
    to_output(&pool::set(ctx, &a.name.0, a.size, a.idle_s)?)
}

/// `template_delete`.
pub const DELETE: ToolDef = ToolDef {
    name: "template_delete",
    title: "Delete a sandbox template",
    description: DELETE_DESCRIPTION,
    input_schema: TemplateOnly::param,
    output_schema: <crate::ops::sandbox::template_manage::Deleted as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE,
    handler: delete,
    ui: crate::mcp::tool::Ui::NONE,
};

fn delete(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = args.parse::<TemplateOnly>()?.name();
    to_output(&manage::delete(ctx, &name)?)
}
