//! `vm_lifetime`: read or change a VM's lifetime (the operation is
//! [`crate::ops::vm::lifetime::change`]).

use serde::Deserialize;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::vm::lifetime::{self, Change, MAX_S};
use crate::schema::Param;
use crate::tools::names::VmName;
use crate::tools::presets;

const DESCRIPTION: &str =
    "Read or change when a VM ends by itself. With only name: deadline, idle \
    clock, what keeps it busy. ttl_s sets a deadline from now (0: none), extend_s moves it later, \
    idle_s sets the idle limit, clear drops both. A change restarts the idle clock. Sandboxes \
    default to a day, then stop, and suspend after 900 idle seconds; launched VMs have none. A \
    held VM never ends.";

/// `vm_lifetime`.
pub const LIFETIME: ToolDef = ToolDef {
    name: "vm_lifetime",
    title: "Read or change a VM's lifetime",
    description: DESCRIPTION,
    input_schema: LifetimeArgs::param,
    output_schema: <lifetime::Changed as crate::schema::Schema>::schema,
    annotations: presets::IDEMPOTENT,
    handler: vm_lifetime,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct LifetimeArgs {
        name: VmName,
        /// Deadline from now; 0: none.
        ttl_s: Option<u64> = {"minimum": 0, "maximum": MAX_S},
        /// Move the deadline this many seconds later.
        extend_s: Option<u64> = {"minimum": 1, "maximum": MAX_S},
        /// 0: no limit.
        idle_s: Option<u64> = {"minimum": 0, "maximum": MAX_S},
        on_idle: Option<String> = {"enum": lifetime::ACTIONS},
        on_ttl: Option<String> = {"enum": lifetime::ACTIONS},
        /// Drop the lifetime.
        clear: bool = {"default": false},
    }
}

fn vm_lifetime(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: LifetimeArgs = args.parse()?;
    let c = Change {
        ttl_s: a.ttl_s,
        extend_s: a.extend_s,
        idle_s: a.idle_s,
        on_idle: a.on_idle,
        on_ttl: a.on_ttl,
        clear: a.clear,
    };
    crate::tools::to_output(&lifetime::apply(&a.name.0, &c)?)
}
