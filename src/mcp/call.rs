//! One tool call, the same for every front end (the stdio server, `mcqemu call`, the live
//! view's HTTP page): find the tool, check the arguments against its schema, run its handler
//! (a panic becomes an error result, never a lost answer), and name the tool in a failure.

use serde_json::{Map, Value};

use super::schema::check_arguments;
use super::tool::{Args, ToolCtx, ToolDef, ToolError, ToolOutput};
use super::tool_error::ErrorKind;

/// The tool named `name` among `tools`.
pub fn find<'a>(tools: &'a [ToolDef], name: &str) -> Result<&'a ToolDef, ToolError> {
    tools.iter().find(|t| t.name == name).ok_or_else(|| {
        ToolError::of(
            ErrorKind::NotFound,
            format!("unknown tool {name:?}; tools/list (or `mcqemu tools`) shows the tools"),
        )
    })
}

/// The arguments checked against `tool`'s input schema (types, bounds, required, nothing
/// else), for the handler to parse.
pub fn check(tool: &ToolDef, args: Map<String, Value>) -> Result<Args, ToolError> {
    let schema = (tool.input_schema)();
    check_arguments(&schema, &args).map_err(|msg| {
        ToolError::of(ErrorKind::InvalidArgument, format!("{}: {msg}", tool.name))
    })?;
    Ok(Args::new(args))
}

/// What the front end has run around every tool call, whatever the transport: the tools
/// layer's bookkeeping of a call (a VM's activity, why a VM ends). `before` may refuse the
/// call; `after` runs whenever `before` let the call run (a handler that panicked too), told
/// whether it succeeded.
#[derive(Clone, Copy)]
pub struct Hooks {
    /// Runs before the handler, with the tool's name and checked arguments.
    pub before: fn(&str, &Args, &ToolCtx) -> Result<(), ToolError>,
    /// Runs after it, told whether it succeeded.
    pub after: fn(&str, &Args, bool),
}

static HOOKS: std::sync::OnceLock<Hooks> = std::sync::OnceLock::new();

/// Sets the hooks every later call runs (once; the front end's start).
pub fn set_hooks(h: Hooks) {
    let _ = HOOKS.set(h);
}

/// Runs `tool`'s handler on checked arguments; a failure (or a panic) is the tool's error,
/// its message starting with the tool's name.
pub fn run(tool: &ToolDef, ctx: &ToolCtx, args: Args) -> Result<ToolOutput, ToolError> {
    let hooks = HOOKS.get();
    use std::panic::{catch_unwind, AssertUnwindSafe as Unwinding};
    let pre = catch_unwind(Unwinding(|| match hooks {
        Some(h) => (h.before)(tool.name, &args, ctx),
        None => Ok(()),
    }));
    let run = match pre {
        Ok(Ok(())) => {
            let out = catch_unwind(Unwinding(|| (tool.handler)(ctx, &args)));
            if let Some(h) = hooks {
                let ok = matches!(out, Ok(Ok(_)));
                let _ = catch_unwind(Unwinding(|| (h.after)(tool.name, &args, ok)));
            }
            out
        }
        Ok(Err(e)) => Ok(Err(e)),
        Err(panic) => Err(panic),
    };
    ctx.finish();
    match run {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => Err(e.context(tool.name)),
        Err(_) => Err(ToolError::of(
            ErrorKind::HostFailed,
            format!(
                "{}: internal error (the tool panicked); this is a bug in mcqemu, please report it",
                tool.name
            ),
        )),
    }
}

/// All three: the tool `name` of `tools`, its arguments checked, its handler run.
pub fn call(
    tools: &[ToolDef],
    name: &str,
    ctx: &ToolCtx,
    args: Map<String, Value>,
) -> Result<ToolOutput, ToolError> {
    let tool = find(tools, name)?;
    let args = check(tool, args)?;
    run(tool, ctx, args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::tool::{Annotations, Ui};
    use serde_json::json;

    fn panics(_: &ToolCtx, _: &Args) -> Result<ToolOutput, ToolError> {
        panic!("a bug")
    }

    fn busy(_: &ToolCtx, _: &Args) -> Result<ToolOutput, ToolError> {
        Err(ToolError::of(ErrorKind::Busy, "held"))
    }

    fn tool(name: &'static str, handler: crate::mcp::tool::Handler) -> ToolDef {
        ToolDef {
            name,
            title: "t",
            description: "d",
            input_schema: || json!({"type": "object", "properties": {}, "additionalProperties": false}),
            output_schema: || json!({"type": "object"}),
            annotations: Annotations {
                read_only: true,
                destructive: false,
                idempotent: true,
                open_world: false,
            },
            handler,
            ui: Ui::NONE,
        }
    }

    #[test]
    fn every_failure_has_a_kind_and_names_the_tool() {
        let tools = [tool("p", panics), tool("b", busy)];
        let ctx = ToolCtx::detached();
        let e = call(&tools, "nope", &ctx, Map::new()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
        let mut bad = Map::new();
        bad.insert("x".into(), json!(1));
        let e = call(&tools, "b", &ctx, bad).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.msg.starts_with("b: "), "{}", e.msg);
        let e = call(&tools, "b", &ctx, Map::new()).unwrap_err();
        assert_eq!((e.kind, e.msg.as_str()), (ErrorKind::Busy, "b: held"));
        let e = call(&tools, "p", &ctx, Map::new()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::HostFailed);
        assert!(e.msg.contains("panicked"), "{}", e.msg);
    }
}
