//! Dispatch: one reader thread turns lines into requests; instant requests are answered inline,
//! each `tools/call` and `resources/read` runs on a worker thread (bounded count) with its own
//! cancel flag (and, for tools, progress reporter). A watch thread notices when the resource
//! list changes and tells whoever listens.

use std::collections::HashMap;
use std::io::BufRead;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::client_roots::{ClientRoots, RootsHook, ROOTS_WAIT};
use super::era::{no_version, Era};
use super::listing::Listing;
use super::protocol::*;
use super::resources::{self, Provider, Watch};
use super::schema::check_arguments;
use super::subscriptions::{self, Subscriptions};
use super::tool::{error_result, Args, Logger, Progress, ToolCtx, ToolDef, ToolError};
use super::transport::{Line, LineReader, Output, MAX_LINE_BYTES};
use super::workers::{Job, Workers};

mod listening;

/// How long in-flight calls may run on after stdin closes before they are cancelled.
const EOF_GRACE: Duration = Duration::from_secs(2);
/// How long cancelled calls get to wind down before the server exits anyway.
const CANCEL_GRACE: Duration = Duration::from_secs(3);

/// Tools per `tools/list` page unless `MCQEMU_TOOLS_PAGE_SIZE` says otherwise.
const DEFAULT_PAGE_SIZE: usize = 50;

/// How often the watch thread looks for resource list changes (each tool call also looks when
/// it ends, before its answer).
const WATCH_INTERVAL: Duration = Duration::from_millis(500);

/// The server state shared by the reader, the workers and the signal thread.
pub struct Server {
    out: Arc<Output>,
    tools: &'static [ToolDef],
    /// tools/list pages, from definitions serialized once.
    listing: Listing,
    inflight: Mutex<HashMap<String, Arc<AtomicBool>>>,
    workers: Arc<Workers>,
    log_level: Arc<AtomicUsize>,
    /// Set once a handshake-era client sent `initialize`.
    initialized: AtomicBool,
    /// Set once it sent `notifications/initialized`: list-changed notifications may go out.
    ready: AtomicBool,
    /// The client's roots, asked for when it declares them.
    roots: ClientRoots,
    /// What the server offers as resources (None: no resources capability at all).
    resources: Option<Arc<dyn Provider>>,
    /// Notices changes of the resource list, once someone may want to hear of them.
    watch: Watch,
    /// The open `subscriptions/listen` streams (2026-07-28).
    subs: Subscriptions,
}

impl Server {
    /// A server writing to `out` and serving `tools`.
    pub fn new(out: Arc<Output>, tools: &'static [ToolDef]) -> Arc<Self> {
        Self::with_roots_hook(out, tools, None)
    }

    /// A server that also asks a client declaring the `roots` capability for its roots and
    /// hands them to `hook`.
    pub fn with_roots_hook(
        out: Arc<Output>,
        tools: &'static [ToolDef],
        hook: Option<RootsHook>,
    ) -> Arc<Self> {
        Self::with_resources(out, tools, hook, None)
    }

    /// A server with a roots hook (see [`Server::with_roots_hook`]) that also offers
    /// `resources` (the `resources` capability, `resources/*`, list-changed notifications).
    pub fn with_resources(
        out: Arc<Output>,
        tools: &'static [ToolDef],
        hook: Option<RootsHook>,
        resources: Option<Arc<dyn Provider>>,
    ) -> Arc<Self> {
        let page_size = std::env::var("MCQEMU_TOOLS_PAGE_SIZE")
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .filter(|n| *n > 0)
            .unwrap_or(DEFAULT_PAGE_SIZE);
        Arc::new(Server {
            out,
            tools,
            listing: Listing::new(page_size),
            inflight: Mutex::new(HashMap::new()),
            workers: Arc::new(Workers::default()),
            log_level: Arc::new(AtomicUsize::new(log_level_rank("info").unwrap_or(1))),
            initialized: AtomicBool::new(false),
            ready: AtomicBool::new(false),
            roots: ClientRoots::new(hook),
            resources,
            watch: Watch::default(),
            subs: Subscriptions::default(),
        })
    }

    /// The capabilities this server declares: resources only when it has them.
    fn capabilities(&self) -> Value {
        capabilities(self.resources.is_some())
    }

    /// Reads requests until EOF, then lets in-flight calls finish (bounded) and returns.
    pub fn run<R: BufRead>(self: &Arc<Self>, input: R) {
        let mut reader = LineReader::new(input, MAX_LINE_BYTES);
        loop {
            match reader.next_line() {
                Line::Eof => break,
                Line::TooLong(n) => {
                    self.send(&error_response(
                        &Value::Null,
                        parse_error(format!(
                            "line of {n} bytes exceeds the {MAX_LINE_BYTES}-byte limit; send \
                             smaller messages"
                        )),
                    ));
                }
                Line::Data(bytes) => self.handle_bytes(&bytes),
            }
        }
        self.shutdown(EOF_GRACE);
    }

    /// Ends in-flight work: waits up to `grace` for calls to finish, then cancels them and
    /// waits a bounded time more.
    pub fn shutdown(&self, grace: Duration) {
        // Listen streams end gracefully, each with its result.
        self.subs.close_all(&self.out);
        if !self.wait_idle(grace) {
            self.cancel_all();
            self.wait_idle(CANCEL_GRACE);
        }
    }

    fn wait_idle(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while self.workers.busy() > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    fn cancel_all(&self) {
        if let Ok(map) = self.inflight.lock() {
            for flag in map.values() {
                flag.store(true, Ordering::SeqCst);
            }
        }
    }

    fn send(&self, msg: &Value) {
        self.out.send(msg);
    }

    /// The log sink for one call: the level `logging/setLevel` chose in the handshake era; in
    /// 2026-07-28 only the level the request itself opted in to (none: stderr only).
    fn logger(&self, era: Era) -> Logger {
        match era {
            Era::Handshake => Logger::new(Some(self.out.clone()), self.log_level.clone()),
            Era::Modern { log_rank } => Logger::new(
                Some(self.out.clone()),
                Arc::new(AtomicUsize::new(log_rank.unwrap_or(usize::MAX))),
            ),
        }
    }

    /// Handles one raw input line (already split and size-capped).
    pub fn handle_bytes(self: &Arc<Self>, bytes: &[u8]) {
        let text = match std::str::from_utf8(bytes) {
            Ok(t) => t,
            Err(e) => {
                return self.send(&error_response(
                    &Value::Null,
                    parse_error(format!("input is not valid UTF-8: {e}")),
                ))
            }
        };
        // JSON's own whitespace only: a line of other Unicode spaces is a parse error.
        if text.trim_matches([' ', '\t', '\r', '\n']).is_empty() {
            return;
        }
        let msg: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                return self.send(&error_response(
                    &Value::Null,
                    parse_error(format!("invalid JSON: {e}")),
                ))
            }
        };
        self.handle_message(msg);
    }

    fn handle_message(self: &Arc<Self>, msg: Value) {
        let obj = match msg {
            Value::Object(o) => o,
            Value::Array(_) => {
                return self.send(&error_response(
                    &Value::Null,
                    invalid_request(
                        "JSON-RPC batches are not supported by MCP; send one message per line",
                    ),
                ))
            }
            _ => {
                return self.send(&error_response(
                    &Value::Null,
                    invalid_request("a JSON-RPC message must be an object"),
                ))
            }
        };
        let id = obj.get("id").cloned();
        let id_ok = matches!(
            id,
            None | Some(Value::String(_)) | Some(Value::Number(_)) | Some(Value::Null)
        );
        let reply_id = if id_ok {
            id.clone().unwrap_or(Value::Null)
        } else {
            Value::Null
        };
        if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return self.send(&error_response(
                &reply_id,
                invalid_request("missing or wrong \"jsonrpc\": must be \"2.0\""),
            ));
        }
        if !id_ok || id == Some(Value::Null) {
            return self.send(&error_response(
                &Value::Null,
                invalid_request("\"id\" must be a string or a number (MCP forbids null ids)"),
            ));
        }
        let method = match obj.get("method") {
            Some(Value::String(m)) => m.clone(),
            Some(_) => {
                return self.send(&error_response(
                    &reply_id,
                    invalid_request("\"method\" must be a string"),
                ))
            }
            None => {
                if obj.contains_key("result") || obj.contains_key("error") {
                    // A client's response: only roots/list is ever asked, so nothing else waits.
                    self.roots.on_response(&obj);
                    return;
                }
                return self.send(&error_response(
                    &reply_id,
                    invalid_request("missing \"method\""),
                ));
            }
        };
        let params = match obj.get("params") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(p)) => p.clone(),
            Some(_) => {
                if id.is_none() {
                    return;
                }
                return self.send(&error_response(
                    &reply_id,
                    invalid_params("\"params\" must be an object"),
                ));
            }
        };
        match id {
            None => self.handle_notification(&method, &params),
            Some(id) => self.handle_request(id, &method, params),
        }
    }

    fn handle_notification(&self, method: &str, params: &Map<String, Value>) {
        if method == "notifications/cancelled" {
            if let Some(req) = params.get("requestId") {
                let key = req.to_string();
                // A listen stream the client ends: no answer follows.
                if self.subs.cancel(&key) {
                    return;
                }
                if let Ok(mut map) = self.inflight.lock() {
                    if let Some(flag) = map.get(&key) {
                        flag.store(true, Ordering::SeqCst);
                        crate::log::stderr("info", &format!("request {key} cancelled by client"));
                        // A call still waiting for a worker is dropped: it never runs.
                        if self.workers.cancel_queued(&key) {
                            map.remove(&key);
                        }
                    }
                }
            }
        }
        if method == "notifications/initialized" {
            self.ready.store(true, Ordering::SeqCst);
        }
        if method == "notifications/initialized" || method == "notifications/roots/list_changed" {
            self.roots.ask(&self.out);
        }
        // Every other notification needs nothing from us.
    }

    fn handle_request(self: &Arc<Self>, id: Value, method: &str, params: Map<String, Value>) {
        let era = match Era::of_request(method, &params) {
            Ok(era) => era,
            Err(e) => return self.send(&error_response(&id, e)),
        };
        let result = if era.is_modern() {
            match method {
                "server/discover" => Ok(json!({
                    "supportedVersions": all_versions(),
                    "capabilities": self.capabilities(),
                    "instructions": INSTRUCTIONS,
                })),
                "tools/list" => return self.list_tools(&id, &params, era),
                "tools/call" => return self.call_tool(id, params, era),
                "subscriptions/listen" => return self.listen(id, &params),
                "resources/list" | "resources/templates/list" | "resources/read"
                    if self.resources.is_some() =>
                {
                    return self.resource_request(id, method, params, era)
                }
                // ping and logging/setLevel are gone from 2026-07-28 (the log level travels
                // in each request's _meta), so they are unknown methods there.
                _ => Err(method_not_found(method)),
            }
        } else {
            let resource_method = matches!(
                method,
                "resources/list" | "resources/templates/list" | "resources/read"
            );
            let known = matches!(
                method,
                "initialize"
                    | "ping"
                    | "server/discover"
                    | "tools/list"
                    | "tools/call"
                    | "logging/setLevel"
            ) || (resource_method && self.resources.is_some());
            if !known {
                Err(method_not_found(method))
            } else if !matches!(method, "initialize" | "ping")
                && !self.initialized.load(Ordering::SeqCst)
            {
                Err(no_version(method))
            } else {
                match method {
                    "initialize" => self.initialize(&params),
                    "server/discover" => Ok(json!({
                        "supportedVersions": all_versions(),
                        "capabilities": self.capabilities(),
                        "serverInfo": server_info(),
                        "instructions": INSTRUCTIONS,
                    })),
                    _ if resource_method => return self.resource_request(id, method, params, era),
                    "tools/list" => return self.list_tools(&id, &params, era),
                    "logging/setLevel" => self.set_level(&params),
                    "tools/call" => return self.call_tool(id, params, era),
                    _ => Ok(json!({})),
                }
            }
        };
        match result {
            Ok(mut r) => {
                era.stamp(&mut r, method == "server/discover");
                self.send(&response(&id, r))
            }
            Err(e) => self.send(&error_response(&id, e)),
        }
    }

    fn initialize(
        self: &Arc<Self>,
        params: &Map<String, Value>,
    ) -> Result<Value, jsonrpc_core::Error> {
        let requested = params
            .get("protocolVersion")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid_params("initialize needs \"protocolVersion\" (a string)"))?;
        self.initialized.store(true, Ordering::SeqCst);
        self.roots.on_initialize(params);
        // The list as it is now, before the answer: any change after it is notified.
        self.start_watch();
        Ok(json!({
            "protocolVersion": negotiate(requested),
            "capabilities": self.capabilities(),
            "serverInfo": server_info(),
            "instructions": INSTRUCTIONS,
        }))
    }

    fn set_level(&self, params: &Map<String, Value>) -> Result<Value, jsonrpc_core::Error> {
        let level = params.get("level").and_then(Value::as_str).unwrap_or("");
        let rank = log_level_rank(level).ok_or_else(|| {
            invalid_params(format!(
                "unknown log level {level:?}; use one of {}",
                LOG_LEVELS.join(", ")
            ))
        })?;
        self.log_level.store(rank, Ordering::Relaxed);
        Ok(json!({}))
    }

    /// Answers tools/list from the pre-serialized definitions, building the line by hand
    /// (the definitions are ~40 KB of JSON that never change).
    fn list_tools(&self, id: &Value, params: &Map<String, Value>, era: Era) {
        match self.listing.page(self.tools, id, params.get("cursor"), era) {
            Ok(line) => {
                self.out.send_line(line.into_bytes());
            }
            Err(e) => self.send(&error_response(id, e)),
        }
    }

    fn call_tool(self: &Arc<Self>, id: Value, params: Map<String, Value>, era: Era) {
        let name = match params.get("name").and_then(Value::as_str) {
            Some(n) => n.to_string(),
            None => {
                return self.send(&error_response(
                    &id,
                    invalid_params("tools/call needs \"name\" (a string)"),
                ))
            }
        };
        let tool = match self.tools.iter().find(|t| t.name == name) {
            Some(t) => t,
            None => {
                return self.send(&error_response(
                    &id,
                    invalid_params(format!(
                        "unknown tool {name:?}; tools/list shows the available tools"
                    )),
                ))
            }
        };
        let args = match params.get("arguments") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(a)) => a.clone(),
            Some(_) => {
                return self.send(&error_response(
                    &id,
                    invalid_params("\"arguments\" must be an object"),
                ))
            }
        };
        let reply_id = id.clone();
        let finish = move |r: Value| {
            let mut r = r;
            era.stamp(&mut r, false);
            response(&reply_id, r)
        };
        if let Err(msg) = check_arguments(&(tool.input_schema)(), &args) {
            return self.send(&finish(error_result(&ToolError::new(format!(
                "{name}: {msg}"
            )))));
        }
        let key = id.to_string();
        let cancel = Arc::new(AtomicBool::new(false));
        {
            let mut map = match self.inflight.lock() {
                Ok(m) => m,
                Err(p) => p.into_inner(),
            };
            if map.contains_key(&key) {
                drop(map);
                return self.send(&error_response(
                    &id,
                    invalid_request(format!(
                        "request id {key} is already in flight; use a fresh id"
                    )),
                ));
            }
            map.insert(key.clone(), cancel.clone());
        }
        let progress = params
            .get("_meta")
            .and_then(|m| m.get("progressToken"))
            .filter(|t| t.is_string() || t.is_number())
            .map(|t| Progress::new(t.clone(), self.out.clone()));
        let ctx = ToolCtx::new(cancel.clone(), progress, self.logger(era));
        let server = Arc::clone(self);
        let handler = tool.handler;
        let job_key = key.clone();
        let tool_name = name.clone();
        let run = move || {
            if era == Era::Handshake {
                server.roots.wait_ready(ROOTS_WAIT);
            }
            // A panicking handler must still answer and release its slot; otherwise the
            // client waits forever and the server's shutdown waits for a call that is gone.
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                handler(&ctx, &Args(args))
            }));
            ctx.finish();
            let result = match run {
                Ok(Ok(out)) => out.to_result(),
                Ok(Err(e)) => error_result(&ToolError::new(format!("{name}: {}", e.0))),
                Err(_) => error_result(&ToolError::new(format!(
                    "{name}: internal error (the tool panicked); this is a bug in mcqemu, \
                     please report it"
                ))),
            };
            if let Ok(mut map) = server.inflight.lock() {
                map.remove(&job_key);
            }
            // A call that added or removed a VM says so before its answer.
            server.check_resources();
            if !cancel.load(Ordering::SeqCst) {
                server.send(&finish(result));
            }
        };
        let job = Job {
            key: key.clone(),
            name: tool_name.clone(),
            run: Box::new(run),
        };
        if let Err(e) = self.workers.submit(job) {
            if let Ok(mut map) = self.inflight.lock() {
                map.remove(&key);
            }
            let mut r = error_result(&ToolError::new(format!("{tool_name}: {e}")));
            era.stamp(&mut r, false);
            self.send(&response(&id, r));
        }
    }
}

/// Serves MCP on stdin/stdout until EOF or SIGTERM/SIGINT, offering `tools` and, when given,
/// `resources`. Returns the process exit code.
pub fn serve_stdio(
    tools: &'static [ToolDef],
    resources: Option<Arc<dyn Provider>>,
    roots_hook: Option<RootsHook>,
) -> i32 {
    let out = Arc::new(Output::new(Box::new(std::io::stdout())));
    let server = Server::with_resources(out, tools, roots_hook, resources);
    install_signal_handler(Arc::clone(&server));
    crate::log::stderr(
        "info",
        &format!("mcqemu {} serving MCP on stdio", env!("CARGO_PKG_VERSION")),
    );
    let stdin = std::io::stdin();
    server.run(stdin.lock());
    0
}

fn install_signal_handler(server: Arc<Server>) {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = match signal_hook::iterator::Signals::new([SIGTERM, SIGINT]) {
        Ok(s) => s,
        Err(e) => {
            crate::log::stderr("warn", &format!("cannot install signal handlers: {e}"));
            return;
        }
    };
    let _ = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                crate::log::stderr("info", &format!("signal {sig}: shutting down"));
                server.subs.close_all(&server.out);
                server.cancel_all();
                server.wait_idle(CANCEL_GRACE);
                std::process::exit(0);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink the tests can read back.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::ErrorKind::Other)?
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    const fn stub(name: &'static str) -> ToolDef {
        ToolDef {
            name,
            title: name,
            description: "a stub",
            input_schema: || json!({"type": "object"}),
            output_schema: || json!({"type": "object"}),
            annotations: super::super::tool::Annotations {
                read_only: true,
                destructive: false,
                idempotent: true,
                open_world: false,
            },
            handler: |_, _| Ok(super::super::tool::ToolOutput::json(json!({}))),
        }
    }

    static FIRST: [ToolDef; 1] = [stub("first")];
    static SECOND: [ToolDef; 1] = [stub("second")];

    fn listed(tools: &'static [ToolDef]) -> Vec<String> {
        let sink = Sink::default();
        let server = Server::new(Arc::new(Output::new(Box::new(sink.clone()))), tools);
        for line in [
            concat!(
                r#"{"jsonrpc":"2.0","id":1,"method":"initialize","#,
                r#""params":{"protocolVersion":"2025-11-25"}}"#
            ),
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        ] {
            server.handle_bytes(line.as_bytes());
        }
        let out = sink.0.lock().map(|b| b.clone()).unwrap_or_default();
        let last = String::from_utf8_lossy(&out)
            .lines()
            .last()
            .unwrap_or("")
            .to_string();
        let reply: Value = serde_json::from_str(&last).unwrap_or_default();
        reply["result"]["tools"]
            .as_array()
            .map(|t| {
                t.iter()
                    .filter_map(|t| t["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn each_server_lists_its_own_tools() {
        assert_eq!(listed(&FIRST), ["first"]);
        assert_eq!(listed(&SECOND), ["second"]);
    }
}
