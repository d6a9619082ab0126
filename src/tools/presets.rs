//! What the tools declare over and over, named once: the annotation combinations that really
//! occur, and the `name` parameter of the tools that act on one VM or template.

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

crate::params! {
    /// The parameters of a tool that takes none.
    #[derive(serde::Deserialize)]
    pub struct NoArgs {}
}

/// The live view's resource (an MCP App: `tools::view` has its tools, `tools::resources`
/// serves it, `mcqemu view` serves the same page over local HTTP).
pub const VIEW_URI: &str = "ui://mcqemu/view";
/// Its MIME type (MCP Apps).
pub const VIEW_MIME: &str = "text/html;profile=mcp-app";
/// The page: script and style inline, nothing fetched from elsewhere (it works under the
/// default content security policy of MCP Apps hosts).
pub const VIEW_PAGE: &str = include_str!("view.html");

/// The `_meta.ui` of a tool after which a person wants to look: hosts that render MCP Apps
/// show the live view beside its result.
pub const OPENS_VIEW: crate::mcp::tool::Ui = crate::mcp::tool::Ui {
    resource: Some(VIEW_URI),
    app_only: false,
};

#[cfg(test)]
mod tests {
    use serde_json::{json, Map, Value};

    use crate::mcp::tool::{Args, ToolCtx};

    /// A name that is no VM's: it would leave the state folder if used in a path.
    const BAD: &str = "../escape";

    /// Plausible values for a tool's other required parameters, so only the name is wrong.
    fn arguments(schema: &Value) -> Map<String, Value> {
        let mut args = Map::new();
        for key in schema["required"].as_array().into_iter().flatten() {
            let key = key.as_str().unwrap_or_default();
            let value = match schema["properties"][key]["type"].as_str() {
                Some("integer") => json!(0),
                Some("array") => json!([]),
                _ => json!("a"),
            };
            args.insert(key.to_string(), value);
        }
        args.insert("name".into(), json!(BAD));
        args
    }

    /// Every tool that takes a name refuses an invalid one, with one message, before it looks
    /// anything up.
    #[test]
    fn every_tool_taking_a_name_refuses_an_invalid_one() {
        let ctx = ToolCtx::detached();
        let mut checked = 0;
        for tool in super::super::ALL {
            let schema = (tool.input_schema)();
            let required = schema["required"].as_array().cloned().unwrap_or_default();
            if !required.contains(&json!("name")) {
                continue;
            }
            let what = if tool.name.starts_with("template_") {
                "template"
            } else {
                "VM"
            };
            let err = match (tool.handler)(&ctx, &Args::new(arguments(&schema))) {
                Ok(_) => panic!("{} took the name {BAD:?}", tool.name),
                Err(e) => e.msg,
            };
            let want = format!(
                "invalid {what} name {BAD:?}: use 1-48 characters from A-Z a-z 0-9 _ . -, \
                 starting with a letter or digit"
            );
            assert_eq!(err, want, "{}", tool.name);
            checked += 1;
        }
        assert_eq!(checked, 48);
    }
}
