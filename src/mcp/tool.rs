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
            "outputSchema": super::schema::portable((self.output_schema)()),
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

/// Sends `notifications/progress` for a request that asked for it: at most twice a second
/// (an update inside that gap waits, and the latest one goes out when it ends while the call
/// still runs), and at least every [`HEARTBEAT`] while the call runs, repeating what it last
/// said it waits for: hosts kill calls that stay silent, and no wait has to remember to
/// speak. A call that ends within its first half second says nothing, and no response ever
/// waits for a gap: Claude Code puts a token on every call. Progress values strictly
/// increase. The heartbeat thread ends with the call ([`Progress::finish`]), before its
/// response, so no notification follows the result.
pub struct Progress {
    inner: Arc<ProgressInner>,
    ticker: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

struct ProgressInner {
    token: Value,
    out: Arc<Output>,
    started: Instant,
    done: AtomicBool,
    /// Wakes the heartbeat thread at once when the call ends (its response must not wait).
    bell: (std::sync::Mutex<()>, std::sync::Condvar),
    state: std::sync::Mutex<ProgressState>,
}

#[derive(Default)]
struct ProgressState {
    /// The last value sent.
    value: Option<f64>,
    /// When the last notification went out.
    sent_at: Option<Instant>,
    /// What the call last said (repeated by the heartbeat).
    message: String,
    total: Option<f64>,
    /// An update that came inside the rate gap: (value, total, message).
    pending: Option<(f64, Option<f64>, String)>,
}

/// Least time between two progress notifications of one call.
pub const MIN_GAP: Duration = Duration::from_millis(500);
/// Longest silence while a call runs.
pub const HEARTBEAT: Duration = Duration::from_secs(5);

impl ProgressInner {
    /// Sends one notification; `said` is the call's own message (kept for the heartbeat to
    /// repeat), `shown` what this notification says (the heartbeat adds the time).
    fn emit(
        &self,
        st: &mut ProgressState,
        value: f64,
        total: Option<f64>,
        said: &str,
        shown: &str,
    ) {
        st.value = Some(value);
        st.sent_at = Some(Instant::now());
        st.total = total;
        if !said.is_empty() {
            st.message = said.to_string();
        }
        let mut params = json!({ "progressToken": self.token, "progress": value });
        if let Some(t) = total {
            params["total"] = json!(t);
        }
        let text = if shown.is_empty() { &st.message } else { shown };
        if !text.is_empty() {
            params["message"] = json!(text);
        }
        self.out
            .send(&notification("notifications/progress", params));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ProgressState> {
        match self.state.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        }
    }

    /// One tick: a pending update whose gap has passed, or a heartbeat after a silence.
    fn tick(&self) {
        let mut st = self.lock();
        let since = st.sent_at.unwrap_or(self.started).elapsed();
        if since < MIN_GAP {
            return;
        }
        if let Some((v, t, m)) = st.pending.take() {
            self.emit(&mut st, v, t, &m, "");
        } else if since >= HEARTBEAT {
            // Strictly above the last value, and well below the next whole step a wait reports.
            let v = st.value.map_or(0.0, |v| v + 1e-3);
            let what = if st.message.is_empty() {
                "working"
            } else {
                st.message.as_str()
            };
            let shown = format!(
                "{what} (still running after {} s)",
                self.started.elapsed().as_secs()
            );
            let total = st.total;
            self.emit(&mut st, v, total, "", &shown);
        }
    }
}

impl Progress {
    /// A reporter for the given progress token, with its heartbeat running.
    pub fn new(token: Value, out: Arc<Output>) -> Self {
        let inner = Arc::new(ProgressInner {
            token,
            out,
            started: Instant::now(),
            done: AtomicBool::new(false),
            bell: (std::sync::Mutex::new(()), std::sync::Condvar::new()),
            state: std::sync::Mutex::new(ProgressState::default()),
        });
        let beat = Arc::clone(&inner);
        let ticker = std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || {
                while !beat.done.load(Ordering::SeqCst) {
                    {
                        let guard = beat.bell.0.lock().unwrap_or_else(|p| p.into_inner());
                        if !beat.done.load(Ordering::SeqCst) {
                            let _ = beat.bell.1.wait_timeout(guard, Duration::from_millis(100));
                        }
                    }
                    if !beat.done.load(Ordering::SeqCst) {
                        beat.tick();
                    }
                }
            })
            .ok();
        Progress {
            inner,
            ticker: std::sync::Mutex::new(ticker),
        }
    }

    fn send(&self, progress: f64, total: Option<f64>, message: &str) {
        let inner = &self.inner;
        let mut st = inner.lock();
        let floor = st
            .pending
            .as_ref()
            .map(|p| p.0)
            .or(st.value)
            .unwrap_or(f64::MIN);
        if progress <= floor {
            return;
        }
        // The gap runs from the call's start too: a call done within half a second says
        // nothing, and a long one speaks first after half a second.
        let recent = st.sent_at.unwrap_or(inner.started).elapsed() < MIN_GAP;
        if recent || inner.done.load(Ordering::SeqCst) {
            if !inner.done.load(Ordering::SeqCst) {
                st.pending = Some((progress, total, message.to_string()));
            }
            return;
        }
        st.pending = None;
        inner.emit(&mut st, progress, total, message, "");
    }

    /// The last value reported (pending included).
    fn last(&self) -> f64 {
        let st = self.inner.lock();
        st.pending.as_ref().map(|p| p.0).or(st.value).unwrap_or(0.0)
    }

    /// Ends the heartbeat and sends a pending update: call before the call's response.
    pub fn finish(&self) {
        if self.inner.done.swap(true, Ordering::SeqCst) {
            return;
        }
        {
            let _guard = self.inner.bell.0.lock().unwrap_or_else(|p| p.into_inner());
            self.inner.bell.1.notify_all();
        }
        let handle = match self.ticker.lock() {
            Ok(mut t) => t.take(),
            Err(p) => p.into_inner().take(),
        };
        if let Some(h) = handle {
            let _ = h.join();
        }
        let mut st = self.inner.lock();
        if let Some((v, t, m)) = st.pending.take() {
            // The response never waits for the gap: an update whose gap has passed goes out
            // now, one still inside it (or inside a call's first half second) is dropped, since
            // the response that follows says more than it would.
            let at = st.sent_at.unwrap_or(self.inner.started);
            if at.elapsed() >= MIN_GAP {
                self.inner.emit(&mut st, v, t, &m, "");
            }
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
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

#[cfg(test)]
mod progress_tests {
    use super::*;
    use std::io::Write;

    /// A sink the test reads back: every line with the time it was written.
    #[derive(Clone, Default)]
    struct Lines(Arc<std::sync::Mutex<Vec<(Instant, Value)>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            for line in buf.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                if let Ok(v) = serde_json::from_slice(line) {
                    self.0.lock().unwrap().push((Instant::now(), v));
                }
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_silent_call_gets_a_heartbeat_and_a_chatty_one_at_most_two_a_second() {
        let lines = Lines::default();
        let out = Arc::new(Output::new(Box::new(lines.clone())));
        let start = Instant::now();
        let p = Progress::new(json!("t"), out);
        // 2 s of updates every 10 ms, then silence past the heartbeat.
        for i in 0..200 {
            p.send(i as f64, None, "copying");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(HEARTBEAT + Duration::from_millis(700));
        p.send(1000.0, Some(1000.0), "done");
        // Past any gap: the ticker sends it while the call still runs.
        std::thread::sleep(MIN_GAP + Duration::from_millis(200));
        p.finish();
        let seen = lines.0.lock().unwrap().clone();
        let times: Vec<Duration> = seen.iter().map(|(t, _)| *t - start).collect();
        assert!(seen.len() >= 5 && seen.len() <= 8, "{seen:?}");
        for w in times.windows(2) {
            assert!(w[1] - w[0] >= Duration::from_millis(480), "{times:?}");
            assert!(
                w[1] - w[0] <= HEARTBEAT + Duration::from_millis(300),
                "{times:?}"
            );
        }
        let beat = seen
            .iter()
            .find(|(_, v)| {
                v["params"]["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("copying (still running after"))
            })
            .unwrap_or_else(|| panic!("no heartbeat: {seen:?}"));
        assert!(beat.1["params"]["progress"].as_f64().unwrap() > 199.0 - 1.0);
        let last = &seen.last().unwrap().1["params"];
        assert_eq!(last["progress"], json!(1000.0));
        assert_eq!(last["message"], json!("done"));
        let values: Vec<f64> = seen
            .iter()
            .map(|(_, v)| v["params"]["progress"].as_f64().unwrap())
            .collect();
        assert!(values.windows(2).all(|w| w[1] > w[0]), "{values:?}");
    }

    /// A reporter writing into a sink the test reads back.
    fn recorded() -> (Lines, Progress) {
        let lines = Lines::default();
        let out = Arc::new(Output::new(Box::new(lines.clone())));
        (lines, Progress::new(json!("t"), out))
    }

    #[test]
    fn a_quick_call_says_nothing_and_no_response_waits_for_the_gap() {
        let (lines, p) = recorded();
        p.send(0.01, Some(30.0), "running");
        let t0 = Instant::now();
        p.finish();
        assert!(
            t0.elapsed() < Duration::from_millis(50),
            "{:?}",
            t0.elapsed()
        );
        assert!(
            lines.0.lock().unwrap().is_empty(),
            "a quick call sent progress"
        );

        // A long call whose last update comes inside the gap: dropped, not waited for.
        let (lines, p) = recorded();
        std::thread::sleep(MIN_GAP + Duration::from_millis(50));
        p.send(1.0, None, "first");
        p.send(2.0, None, "second");
        let t0 = Instant::now();
        p.finish();
        assert!(
            t0.elapsed() < Duration::from_millis(50),
            "{:?}",
            t0.elapsed()
        );
        let seen = lines.0.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].1["params"]["message"], json!("first"));
    }
}
