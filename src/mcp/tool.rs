//! The tool framework: a tool is declared once (name, schemas, annotations, handler), and
//! handlers get a context with a cancel flag, a progress reporter and a logger.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};

pub use super::args::Args;
pub use super::progress::{Progress, HEARTBEAT, MIN_GAP};
use super::protocol::{log_level_rank, notification};
pub use super::tool_error::ToolError;
use super::transport::Output;

/// The four MCP tool annotations, always set explicitly.
#[derive(Clone, Copy, Debug)]
pub struct Annotations {
    /// The tool changes nothing.
    pub read_only: bool,
    /// The tool may destroy data or state.
    pub destructive: bool,
    /// Calling it twice with the same arguments has no further effect.
    pub idempotent: bool,
    /// It reaches beyond this host (network).
    pub open_world: bool,
}

/// What a handler is: arguments in, structured result or tool error out.
pub type Handler = fn(&ToolCtx, &Args) -> Result<ToolOutput, ToolError>;

/// One tool, declared once.
#[derive(Clone, Copy)]
pub struct ToolDef {
    /// The name agents call it by (kept from the Python mcqemu).
    pub name: &'static str,
    /// A human-readable title.
    pub title: &'static str,
    /// What it does and what to expect, for the agent reading it.
    pub description: &'static str,
    /// JSON Schema of the arguments (an object with additionalProperties: false).
    pub input_schema: fn() -> Value,
    /// JSON Schema of `structuredContent`.
    pub output_schema: fn() -> Value,
    /// Annotations, set truthfully.
    pub annotations: Annotations,
    /// The code that runs it.
    pub handler: Handler,
    /// Its place in MCP Apps (`_meta.ui`): the view it opens, and whether only a view may
    /// call it.
    pub ui: Ui,
}

/// A tool's `_meta.ui` (the MCP Apps extension, `io.modelcontextprotocol/ui`). Sent to every
/// client: a host that renders no apps ignores it.
#[derive(Clone, Copy, Debug)]
pub struct Ui {
    /// The `ui://` resource a host may render beside the tool's result.
    pub resource: Option<&'static str>,
    /// Only a view may call it (`visibility: ["app"]`): the model never sees it listed.
    pub app_only: bool,
}

impl Ui {
    /// No place in MCP Apps.
    pub const NONE: Ui = Ui {
        resource: None,
        app_only: false,
    };

    /// The `_meta` object, when there is anything to say.
    fn meta(&self) -> Option<Value> {
        if self.resource.is_none() && !self.app_only {
            return None;
        }
        let mut ui = json!({});
        if let Some(r) = self.resource {
            ui["resourceUri"] = json!(r);
        }
        if self.app_only {
            ui["visibility"] = json!(["app"]);
        }
        Some(json!({"ui": ui}))
    }
}

impl ToolDef {
    /// The definition as `tools/list` shows it.
    pub fn to_json(&self) -> Value {
        let mut out = json!({
            "name": self.name,
            "title": self.title,
            "description": self.description,
            "inputSchema": (self.input_schema)(),
            "outputSchema": super::schema::portable((self.output_schema)()),
            "annotations": {
                "title": self.title,
                "readOnlyHint": self.annotations.read_only,
                "destructiveHint": self.annotations.destructive,
                "idempotentHint": self.annotations.idempotent,
                "openWorldHint": self.annotations.open_world,
            }
        });
        if let Some(meta) = self.ui.meta() {
            out["_meta"] = meta;
        }
        out
    }
}

/// Shorthand for handler results.
pub type ToolResult = Result<ToolOutput, ToolError>;

/// A successful result: the structured JSON, plus any images (MCP image content).
#[derive(Debug, Default)]
pub struct ToolOutput {
    /// `structuredContent`, also sent as a text block.
    pub structured: Value,
    /// Extra content blocks, e.g. `{"type":"image",...}`.
    pub extra: Vec<Value>,
}

impl ToolOutput {
    /// A result with structured content only.
    pub fn json(structured: Value) -> Self {
        ToolOutput {
            structured,
            extra: Vec::new(),
        }
    }

    /// The MCP `CallToolResult` for this output.
    pub fn to_result(&self) -> Value {
        let text = serde_json::to_string(&self.structured).unwrap_or_default();
        let mut content = vec![json!({"type": "text", "text": text})];
        content.extend(self.extra.iter().cloned());
        json!({ "content": content, "structuredContent": self.structured, "isError": false })
    }
}

/// The MCP `CallToolResult` for a tool error: the message as text, its kind's code in
/// `_meta` (where a program reads it; no structuredContent, which the tool's outputSchema
/// describes for successes only).
pub fn error_result(err: &ToolError) -> Value {
    json!({
        "content": [{"type": "text", "text": err.msg}],
        "isError": true,
        "_meta": { super::tool_error::ERROR_META: { "kind": err.kind.code() } },
    })
}

/// Where log messages go: always stderr, and to the client as `notifications/message` when
/// the level is at or above what `logging/setLevel` asked for.
#[derive(Clone)]
pub struct Logger {
    out: Option<Arc<Output>>,
    min_level: Arc<std::sync::atomic::AtomicUsize>,
}

impl Logger {
    /// A logger that also notifies the client through `out` (None: stderr only).
    pub fn new(out: Option<Arc<Output>>, min_level: Arc<std::sync::atomic::AtomicUsize>) -> Self {
        Logger { out, min_level }
    }

    /// A logger for the CLI: stderr only.
    pub fn stderr_only() -> Self {
        Logger::new(
            None,
            Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX)),
        )
    }

    /// Logs one message at `level` (an MCP level name).
    pub fn log(&self, level: &str, msg: &str) {
        crate::log::stderr(level, msg);
        let rank = log_level_rank(level).unwrap_or(0);
        if let Some(out) = &self.out {
            if rank >= self.min_level.load(Ordering::Relaxed) {
                out.send(&notification(
                    "notifications/message",
                    json!({"level": level, "logger": "mcqemu", "data": msg}),
                ));
            }
        }
    }
}

/// What a handler gets besides its arguments.
pub struct ToolCtx {
    cancel: Arc<AtomicBool>,
    progress: Option<Progress>,
    /// Log sink for this call.
    pub log: Logger,
}

impl ToolCtx {
    /// A context with the given cancel flag, optional progress reporter and logger.
    pub fn new(cancel: Arc<AtomicBool>, progress: Option<Progress>, log: Logger) -> Self {
        ToolCtx {
            cancel,
            progress,
            log,
        }
    }

    /// A context for one-shot use (CLI): never cancelled, progress to nowhere.
    pub fn detached() -> Self {
        ToolCtx::new(
            Arc::new(AtomicBool::new(false)),
            None,
            Logger::stderr_only(),
        )
    }

    /// True when the client asked for progress (a progress token): worth reading a running
    /// program's output for.
    pub fn has_progress(&self) -> bool {
        self.progress.is_some()
    }

    /// True once the client cancelled this request (or the server is shutting down).
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    /// Fails with a clear error when the request was cancelled; call between slices of a long wait.
    pub fn check_cancel(&self) -> Result<(), ToolError> {
        if self.cancelled() {
            Err(ToolError::new("cancelled by the client"))
        } else {
            Ok(())
        }
    }

    /// Reports progress (at most twice a second; the latest update always goes out); a no-op
    /// when the client sent no progress token.
    pub fn progress(&self, done: f64, total: Option<f64>, message: &str) {
        if let Some(p) = &self.progress {
            p.send(done, total, message);
        }
    }

    /// Reports output the caller asked to follow as it comes (a program's live lines): the
    /// first notification goes out at once, not after the call's first half second.
    pub fn progress_output(&self, done: f64, total: Option<f64>, message: &str) {
        if let Some(p) = &self.progress {
            p.send_output(done, total, message);
        }
    }

    /// Reports a value that must arrive (a final one, a phase): as [`ToolCtx::progress`],
    /// whose latest update is never dropped.
    pub fn progress_now(&self, done: f64, total: Option<f64>, message: &str) {
        self.progress(done, total, message);
    }

    /// Reports the next phase of a long call: one more than the last progress value, so a
    /// phase after a wait that reported seconds is never dropped as not increasing.
    pub fn progress_phase(&self, message: &str) {
        if let Some(p) = &self.progress {
            p.send(p.last().floor().max(0.0) + 1.0, None, message);
        }
    }

    /// Ends the call's progress (its heartbeat stops, a pending update goes out): the server
    /// calls it before sending the response.
    pub fn finish(&self) {
        if let Some(p) = &self.progress {
            p.finish();
        }
    }
}
