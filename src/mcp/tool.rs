//! The tool framework: a tool is declared once (name, schemas, annotations, handler), and
//! handlers get a context with a cancel flag, a progress reporter and a logger.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::protocol::{log_level_rank, notification};
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
}

impl ToolDef {
    /// The definition as `tools/list` shows it.
    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "title": self.title,
            "description": self.description,
            "inputSchema": (self.input_schema)(),
            "outputSchema": (self.output_schema)(),
            "annotations": {
                "title": self.title,
                "readOnlyHint": self.annotations.read_only,
                "destructiveHint": self.annotations.destructive,
                "idempotentHint": self.annotations.idempotent,
                "openWorldHint": self.annotations.open_world,
            }
        })
    }
}

/// A tool failure: becomes a result with `isError: true`. The message says what happened and
/// what the agent can do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError(pub String);

impl ToolError {
    /// Builds an error from any message.
    pub fn new(msg: impl Into<String>) -> Self {
        ToolError(msg.into())
    }
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for ToolError {
    fn from(s: String) -> Self {
        ToolError(s)
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

/// The MCP `CallToolResult` for a tool error.
pub fn error_result(err: &ToolError) -> Value {
    json!({ "content": [{"type": "text", "text": err.0}], "isError": true })
}

/// Sends `notifications/progress` for a request that asked for it, at most every 100 ms
/// (and always for the last value), with a strictly increasing progress value.
pub struct Progress {
    token: Value,
    out: Arc<Output>,
    state: std::sync::Mutex<(f64, Option<Instant>)>,
}

impl Progress {
    /// A reporter for the given progress token.
    pub fn new(token: Value, out: Arc<Output>) -> Self {
        Progress {
            token,
            out,
            state: std::sync::Mutex::new((f64::MIN, None)),
        }
    }

    fn send(&self, progress: f64, total: Option<f64>, message: &str, force: bool) {
        let mut st = match self.state.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        if progress <= st.0 {
            return;
        }
        if !force {
            if let Some(last) = st.1 {
                if last.elapsed() < Duration::from_millis(100) {
                    return;
                }
            }
        }
        *st = (progress, Some(Instant::now()));
        let mut params = json!({ "progressToken": self.token, "progress": progress });
        if let Some(t) = total {
            params["total"] = json!(t);
        }
        if !message.is_empty() {
            params["message"] = json!(message);
        }
        self.out
            .send(&notification("notifications/progress", params));
    }
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

    /// Reports progress (rate-limited); a no-op when the client sent no progress token.
    pub fn progress(&self, done: f64, total: Option<f64>, message: &str) {
        if let Some(p) = &self.progress {
            p.send(done, total, message, false);
        }
    }

    /// Reports progress now, bypassing the rate limit (for a final value).
    pub fn progress_now(&self, done: f64, total: Option<f64>, message: &str) {
        if let Some(p) = &self.progress {
            p.send(done, total, message, true);
        }
    }

    /// Reports the next phase of a long call now: one more than the last progress value, so a
    /// phase after a wait that reported seconds is never dropped as not increasing.
    pub fn progress_phase(&self, message: &str) {
        if let Some(p) = &self.progress {
            let next = match p.state.lock() {
                Ok(st) => st.0,
                Err(poisoned) => poisoned.into_inner().0,
            }
            .max(0.0)
                + 1.0;
            p.send(next, None, message, true);
        }
    }
}

/// Typed access to checked arguments. Schema checking has already run, so a wrong type here
/// means the schema and the handler disagree: reported as a tool error, never a panic.
pub struct Args(pub Map<String, Value>);

impl Args {
    /// Raw value, treating JSON null as absent.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    /// A required string.
    pub fn str(&self, name: &str) -> Result<&str, ToolError> {
        self.opt_str(name)?
            .ok_or_else(|| ToolError::new(format!("missing required parameter '{name}'")))
    }

    /// An optional string.
    pub fn opt_str(&self, name: &str) -> Result<Option<&str>, ToolError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ToolError::new(format!(
                "parameter '{name}' must be a string"
            ))),
        }
    }

    /// A string with a default.
    pub fn str_or<'a>(&'a self, name: &str, default: &'a str) -> Result<&'a str, ToolError> {
        Ok(self.opt_str(name)?.unwrap_or(default))
    }

    /// A boolean with a default.
    pub fn bool_or(&self, name: &str, default: bool) -> Result<bool, ToolError> {
        match self.get(name) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(ToolError::new(format!(
                "parameter '{name}' must be a boolean"
            ))),
        }
    }

    /// An optional integer.
    pub fn opt_i64(&self, name: &str) -> Result<Option<i64>, ToolError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| ToolError::new(format!("parameter '{name}' must be an integer"))),
        }
    }

    /// An integer with a default.
    pub fn i64_or(&self, name: &str, default: i64) -> Result<i64, ToolError> {
        Ok(self.opt_i64(name)?.unwrap_or(default))
    }

    /// An optional number (integer or float).
    pub fn opt_f64(&self, name: &str) -> Result<Option<f64>, ToolError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| ToolError::new(format!("parameter '{name}' must be a number"))),
        }
    }

    /// An optional list of strings.
    pub fn opt_str_list(&self, name: &str) -> Result<Option<Vec<String>>, ToolError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|i| {
                    i.as_str().map(str::to_string).ok_or_else(|| {
                        ToolError::new(format!("parameter '{name}' must be a list of strings"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(ToolError::new(format!("parameter '{name}' must be a list"))),
        }
    }

    /// A list of strings, empty when absent.
    pub fn str_list(&self, name: &str) -> Result<Vec<String>, ToolError> {
        Ok(self.opt_str_list(name)?.unwrap_or_default())
    }
}
