//! What the tools declare over and over, named once: the annotation combinations that really
//! occur, and the `name` parameter of the tools that act on one VM or template.

use serde_json::{json, Value};

use crate::mcp::tool::Annotations;

/// Changes nothing; asking twice tells the same (list, info, read).
pub const READ_ONLY: Annotations = Annotations {
    read_only: true,
    destructive: false,
    idempotent: true,
    open_world: false,
};

/// Changes nothing, but waits for what comes next: a second call sees later output.
pub const READ_ONLY_WAIT: Annotations = Annotations {
    read_only: true,
    destructive: false,
    idempotent: false,
    open_world: false,
};

/// Adds something (a VM, a snapshot, a forward) and destroys nothing; twice adds twice.
pub const ADDITIVE: Annotations = Annotations {
    read_only: false,
    destructive: false,
    idempotent: false,
    open_world: false,
};

/// Sets a state (paused, running, a pool size) and destroys nothing; twice is once.
pub const IDEMPOTENT: Annotations = Annotations {
    read_only: false,
    destructive: false,
    idempotent: true,
    open_world: false,
};

/// May overwrite or remove data or state (input sent, files written, things deleted).
pub const DESTRUCTIVE: Annotations = Annotations {
    read_only: false,
    destructive: true,
    idempotent: false,
    open_world: false,
};

/// May overwrite or remove data or state, but twice is once (stop, restore, copy).
pub const DESTRUCTIVE_IDEMPOTENT: Annotations = Annotations {
    read_only: false,
    destructive: true,
    idempotent: true,
    open_world: false,
};

/// Fetches from the network and may overwrite files (download, pull, prepare).
pub const DESTRUCTIVE_OPEN_WORLD: Annotations = Annotations {
    read_only: false,
    destructive: true,
    idempotent: false,
    open_world: true,
};

/// The schema of the `name` parameter naming an existing VM or template.
pub fn name_schema() -> Value {
    json!({"type": "string", "minLength": 1})
}

/// The input schema of a tool whose one parameter is `name`.
pub fn name_only() -> Value {
    super::object(json!({"name": name_schema()}), &["name"])
}
