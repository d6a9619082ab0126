//! The MCP tools, one module per group, each saying what its tools mean in terms of `qemu/`
//! and `state/`. [`ALL`] is the fixed order `tools/list` shows.

use crate::mcp::tool::{ToolDef, ToolError};

pub mod activity;
pub mod boundary;
pub mod groups;
pub mod guest;
pub mod image;
pub mod names;
pub mod params;
pub mod presets;
pub mod resources;
pub mod sandbox;
pub mod screen;
pub mod vm;

pub use crate::ops::vm::checks::checked_image;

/// Every tool, in the order `tools/list` shows them.
pub static ALL: &[ToolDef] = &[
    vm::launch::LAUNCH,
    vm::stop::STOP,
    vm::lifecycle::PAUSE,
    vm::lifecycle::RESUME,
    vm::lifecycle::ATTACH,
    vm::lifecycle::FORGET,
    vm::inspect::LIST,
    vm::inspect::INFO,
    vm::lifetime::LIFETIME,
    vm::forward::FORWARD,
    vm::mount::MOUNT,
    vm::snapshot::CREATE,
    vm::snapshot::RESTORE,
    vm::snapshot::DELETE,
    vm::snapshot::LIST,
    screen::screenshot::SCREENSHOT,
    screen::wait::SCREEN_WAIT,
    screen::view::VIEW,
    screen::view::TAKEOVER,
    screen::view::FRAME,
    screen::view::INPUT,
    screen::keyboard::SEND_KEYS,
    screen::keyboard::TYPE_TEXT,
    screen::drive::CLICK,
    screen::drive::MOUSE_MOVE,
    screen::pointer::DRAG,
    screen::pointer::SCROLL,
    vm::serial::READ,
    vm::serial::WRITE,
    vm::serial::WAIT,
    image::disk::CREATE,
    image::disk::INFO,
    image::disk::CONVERT,
    image::disk::RESIZE,
    image::snapshots::SNAPSHOT_LIST,
    image::snapshots::SNAPSHOT_CREATE,
    image::snapshots::SNAPSHOT_APPLY,
    image::snapshots::SNAPSHOT_DELETE,
    image::download::DOWNLOAD,
    image::pull::PULL,
    image::catalog::CATALOG,
    image::prepare::PREPARE,
    sandbox::vm::SANDBOX,
    sandbox::vm::DESTROY,
    sandbox::fork::FORK,
    sandbox::fork::SUSPEND,
    sandbox::fork::RESUME,
    sandbox::template::CREATE,
    sandbox::template_manage::LIST,
    sandbox::template_manage::POOL,
    sandbox::template_manage::DELETE,
    sandbox::travel::PUSH,
    sandbox::travel::PULL,
    sandbox::travel::SANDBOX_PUSH,
    guest::agent::PING,
    guest::agent::INFO,
    guest::agent::EXEC,
    guest::background::STATUS,
    guest::background::KILL,
    guest::agent::FILE_READ,
    guest::agent::FILE_WRITE,
    guest::copy::COPY_IN,
    guest::copy::COPY_OUT,
    guest::agent::LIST_DIR,
];

/// Checks a snapshot tag against `^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`.
pub fn check_tag(tag: &str) -> Result<(), ToolError> {
    let mut chars = tag.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if first_ok && rest_ok && tag.len() <= 64 {
        Ok(())
    } else {
        Err(ToolError::new(format!(
            "invalid snapshot tag {tag:?}: use 1-64 characters from A-Z a-z 0-9 _ . -, starting \
             with a letter or digit"
        )))
    }
}

/// A typed operation result as a tool's structured output (its fields in declaration order).
pub fn to_output<T: serde::Serialize>(v: &T) -> crate::mcp::tool::ToolResult {
    serde_json::to_value(v)
        .map(crate::mcp::tool::ToolOutput::json)
        .map_err(|e| ToolError::new(format!("cannot shape the result: {e}")))
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    /// Hosts whose function-calling schemas allow one type per field (an OpenAPI subset), and
    /// the Inspector's strict mode, take only these: optional means absent, never `null`.
    #[test]
    fn every_input_parameter_has_one_type_and_no_null_default() {
        for tool in super::ALL {
            let schema = (tool.input_schema)();
            let props = schema["properties"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            for (name, prop) in props {
                assert!(
                    prop.get("type").is_none_or(Value::is_string),
                    "{}.{name} has type {}",
                    tool.name,
                    prop["type"]
                );
                assert_ne!(
                    prop.get("default"),
                    Some(&Value::Null),
                    "{}.{name}",
                    tool.name
                );
            }
        }
    }
}
