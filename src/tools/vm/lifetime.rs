//! `vm_lifetime`: read or change a VM's lifetime (the operation is
//! [`crate::ops::vm::lifetime::change`]).

use serde_json::json;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::vm::lifetime::{self, Change};
use crate::tools::{object, presets, vm_name_arg};

const DESCRIPTION: &str = "Read or change when a VM ends by itself. With only name: its \
    lifetime now (deadline, idle clock, what keeps it busy). ttl_s sets a new deadline from now \
    (0: none), extend_s moves it later, idle_s sets the idle limit (0: none), on_idle/on_ttl \
    what each does (stop; sandboxes also suspend or destroy), clear=true drops the lifetime \
    (the VM then lives until asked to end). Any change restarts the idle clock. Sandboxes get \
    a lifetime by default (a day, then stop; suspend after 900 idle seconds); launched VMs \
    none. Activity: a tool call that names the VM and works on it, an open live view or a \
    person's hold (a held VM is never ended), data through its port forwards or egress proxy, \
    a background process still running. A sandbox suspended when idle resumes by itself when \
    the next such tool names it (costs about a clone's ready time).";

/// `vm_lifetime`.
pub const LIFETIME: ToolDef = ToolDef {
    name: "vm_lifetime",
    title: "Read or change a VM's lifetime",
    description: DESCRIPTION,
    input_schema: || {
        let max = lifetime::MAX_S;
        let actions = ["stop", "suspend", "destroy"];
        object(
            json!({
                "name": presets::name_schema(),
                "ttl_s": {"type": "integer", "minimum": 0, "maximum": max,
                          "description": "A new deadline this many seconds from now; 0: none."},
                "extend_s": {"type": "integer", "minimum": 1, "maximum": max,
                             "description": "Move the deadline this many seconds later."},
                "idle_s": {"type": "integer", "minimum": 0, "maximum": max,
                           "description": "Seconds without activity allowed; 0: no limit."},
                "on_idle": {"type": "string", "enum": actions},
                "on_ttl": {"type": "string", "enum": actions},
                "clear": {"type": "boolean", "default": false,
                          "description": "Drop the lifetime altogether."}
            }),
            &["name"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "lifetime": crate::tools::params::lifetime_out()
            },
            "required": ["name", "lifetime"]
        })
    },
    annotations: presets::IDEMPOTENT,
    handler: vm_lifetime,
    ui: crate::mcp::tool::Ui::NONE,
};

fn vm_lifetime(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let u = |k: &str| -> Result<Option<u64>, crate::mcp::tool::ToolError> {
        Ok(args.opt_i64(k)?.map(|v| v.max(0) as u64))
    };
    let c = Change {
        ttl_s: u("ttl_s")?,
        extend_s: u("extend_s")?,
        idle_s: u("idle_s")?,
        on_idle: args.opt_str("on_idle")?.map(str::to_string),
        on_ttl: args.opt_str("on_ttl")?.map(str::to_string),
        clear: args.bool_or("clear", false)?,
    };
    let shown = lifetime::change(&name, &c)?;
    crate::tools::to_output(&json!({"name": name, "lifetime": shown}))
}
