//! MCP dispatch: arbitrary input lines go to `Server::handle_bytes` with three stub tools
//! (`echo` checks and returns its arguments, `fail` returns a tool error, `boom` panics).
//! Nothing may panic out of the server, every output line is one JSON message, and the
//! answers add up: each request (an object with "jsonrpc":"2.0", a string or number id and a
//! string method) gets exactly one answer carrying its id (fewer only when a
//! `notifications/cancelled` for that id came after it), each malformed message gets the
//! one error JSON-RPC asks for (with its id when it has a usable one, else with a null id),
//! and notifications and client responses get nothing. Requests whose id is used by no other
//! line are checked further: results only for methods the request's era knows, the
//! handshake-era gate before `initialize`, the 2026-07-28 result stamp, and tool results
//! that agree with a reference check of the `echo` schema and echo the arguments unchanged.
#![no_main]

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libfuzzer_sys::{fuzz_target, Corpus};
use mcqemu::mcp::server::Server;
use mcqemu::mcp::tool::{Annotations, Args, ToolCtx, ToolDef, ToolError, ToolOutput};
use mcqemu::mcp::transport::{Line, LineReader, Output, MAX_LINE_BYTES};
use serde_json::{json, Map, Value};

/// Inputs above this are refused (libFuzzer's -max_len keeps them smaller anyway).
const MAX_INPUT: usize = 64 * 1024;
/// Tools per `tools/list` page: small, so three tools take two pages and cursors matter.
const PAGE_SIZE: &str = "2";
/// The 2026-07-28 envelope keys, spelled out here rather than taken from the library.
const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// The panic payload of the `boom` tool: the server must catch it; the panic hook lets it pass.
struct Deliberate;

fn output_schema() -> Value {
    json!({"type": "object"})
}

const ANNOTATIONS: Annotations = Annotations {
    read_only: true,
    destructive: false,
    idempotent: true,
    open_world: false,
};

fn echo_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "text": {"type": "string", "maxLength": 64},
            "count": {"type": "integer", "minimum": 0, "maximum": 10},
            "mode": {"type": "string", "enum": ["plain", "upper"]},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
            "note": {"type": ["string", "null"]}
        },
        "required": ["text"],
        "additionalProperties": false
    })
}

/// Argument `key` of the kind `ok` accepts (absent passes when `required` is false): a
/// schema/handler disagreement shows as a tool error, which the reference check flags.
fn read(args: &Args, key: &str, required: bool, ok: fn(&Value) -> bool) -> Result<(), ToolError> {
    match args.get(key) {
        None if !required => Ok(()),
        Some(v) if ok(v) => Ok(()),
        _ => Err(ToolError::new(format!("parameter '{key}' is not what the schema says"))),
    }
}

/// Reads every argument (see [`read`]), reports `count` progress steps while watching the
/// cancel flag, and returns the arguments as received.
fn echo(ctx: &ToolCtx, args: &Args) -> Result<ToolOutput, ToolError> {
    read(args, "text", true, Value::is_string)?;
    read(args, "count", false, Value::is_i64)?;
    read(args, "mode", false, Value::is_string)?;
    read(args, "tags", false, |v| {
        v.as_array().is_some_and(|a| a.iter().all(Value::is_string))
    })?;
    read(args, "note", false, Value::is_string)?;
    let steps = args.get("count").and_then(Value::as_i64).unwrap_or(0);
    for step in 0..steps {
        ctx.check_cancel()?;
        ctx.progress(step as f64, Some(steps as f64), "echoing");
        std::thread::yield_now();
    }
    ctx.progress_now(steps as f64, Some(steps as f64), "echoed");
    Ok(ToolOutput::json(
        json!({ "args": Value::Object(args.0.clone()) }),
    ))
}

fn fail_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"kind": {"type": "string", "enum": ["plain", "long"]}},
        "required": ["kind"],
        "additionalProperties": false
    })
}

/// Always a tool error; `long` makes one with quotes, controls and non-ASCII to escape.
fn fail(_ctx: &ToolCtx, args: &Args) -> Result<ToolOutput, ToolError> {
    read(args, "kind", true, Value::is_string)?;
    match args.get("kind").and_then(Value::as_str).unwrap_or("") {
        "long" => Err(ToolError::new(
            "\"quoted\"\n\t\u{0}\u{1f}\u{7f} é 😀 \u{2028}\\ ".repeat(200),
        )),
        _ => Err(ToolError::new("stub failure")),
    }
}

fn boom_schema() -> Value {
    json!({"type": "object", "properties": {}, "additionalProperties": false})
}

fn boom(_ctx: &ToolCtx, _args: &Args) -> Result<ToolOutput, ToolError> {
    std::panic::panic_any(Deliberate)
}

static TOOLS: [ToolDef; 3] = [
    ToolDef {
        name: "echo",
        title: "Echo",
        description: "Returns its arguments.",
        input_schema: echo_schema,
        output_schema,
        annotations: ANNOTATIONS,
        handler: echo,
        ui: mcqemu::mcp::tool::Ui::NONE,
    },
    ToolDef {
        name: "fail",
        title: "Fail",
        description: "Always fails.",
        input_schema: fail_schema,
        output_schema,
        annotations: ANNOTATIONS,
        handler: fail,
        ui: mcqemu::mcp::tool::Ui::NONE,
    },
    ToolDef {
        name: "boom",
        title: "Boom",
        description: "Panics.",
        input_schema: boom_schema,
        output_schema,
        annotations: ANNOTATIONS,
        handler: boom,
        ui: mcqemu::mcp::tool::Ui::NONE,
    },
];

/// The reference check of `echo_schema`, written out by hand.
fn echo_args_valid(args: &Map<String, Value>) -> bool {
    let int_in = |v: &Value, lo: f64, hi: f64| {
        (v.is_i64() || v.is_u64()) && v.as_f64().is_some_and(|n| (lo..=hi).contains(&n))
    };
    args.contains_key("text")
        && args.iter().all(|(k, v)| match k.as_str() {
            "text" => v.as_str().is_some_and(|s| s.chars().count() <= 64),
            "count" => int_in(v, 0.0, 10.0),
            "mode" => v == "plain" || v == "upper",
            "tags" => v
                .as_array()
                .is_some_and(|a| a.len() <= 3 && a.iter().all(Value::is_string)),
            "note" => v.is_string() || v.is_null(),
            _ => false,
        })
}

/// The server's output, captured.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What JSON-RPC says one input line should get back.
enum Class {
    /// Nothing: a blank line, a notification, or a client's response.
    Silent,
    /// A valid notification (nothing back); `cancels` names the request id it cancels.
    Notification { cancels: Option<String> },
    /// A request: one answer with this id (unless cancelled while in flight).
    Request {
        key: String,
        method: String,
        params: Option<Value>,
    },
    /// Malformed, but with a usable id: one error answer with this id.
    BadWithId(String),
    /// Malformed without a usable id: one error answer with a null id.
    BadNullId,
}

/// The id as a map key (its JSON text), for string and number ids only.
fn id_key(id: &Value) -> Option<String> {
    match id {
        Value::String(_) | Value::Number(_) => serde_json::to_string(id).ok(),
        _ => None,
    }
}

fn classify(line: &[u8]) -> Class {
    let Ok(text) = std::str::from_utf8(line) else {
        return Class::BadNullId;
    };
    if text.trim_matches([' ', '\t', '\r', '\n']).is_empty() {
        return Class::Silent;
    }
    let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(text) else {
        return Class::BadNullId; // not JSON, or a batch, or a scalar
    };
    let version_ok = obj.get("jsonrpc").and_then(Value::as_str) == Some("2.0");
    let is_response = obj.contains_key("result") || obj.contains_key("error");
    let key = match obj.get("id") {
        None => None,
        Some(id) => match id_key(id) {
            Some(k) => Some(k),
            None => return Class::BadNullId, // null, boolean, array or object ids
        },
    };
    let method = obj.get("method");
    match (key, method) {
        (Some(key), _) if !version_ok => Class::BadWithId(key),
        (None, _) if !version_ok => Class::BadNullId,
        (Some(key), Some(Value::String(m))) => Class::Request {
            key,
            method: m.clone(),
            params: obj.get("params").cloned(),
        },
        (None, Some(Value::String(m))) => Class::Notification {
            cancels: (m == "notifications/cancelled")
                .then(|| obj.get("params")?.get("requestId").and_then(id_key))
                .flatten(),
        },
        (_, None) if is_response => Class::Silent,
        (Some(key), _) => Class::BadWithId(key),
        (None, _) => Class::BadNullId,
    }
}

/// True when the request carries a 2026-07-28 version envelope key (so it is served in that
/// era, or refused for a malformed envelope).
fn has_version_meta(params: &Option<Value>) -> bool {
    params
        .as_ref()
        .and_then(|p| p.get("_meta"))
        .and_then(Value::as_object)
        .is_some_and(|m| m.contains_key(META_VERSION))
}

/// One request, with the connection state when it came (initialized or not).
struct Req {
    method: String,
    params: Option<Value>,
    initialized: bool,
}

/// Checks the one answer of a request no other line shares an id with.
fn check_unique(req: &Req, answer: &Value, line: &str) {
    let modern = req.method != "initialize" && has_version_meta(&req.params);
    let gated = matches!(
        req.method.as_str(),
        "tools/list" | "tools/call" | "server/discover" | "logging/setLevel"
    );
    if !modern && gated && !req.initialized {
        assert_eq!(
            answer["error"]["code"], -32602,
            "a handshake-era {} before initialize must be refused: {line}",
            req.method
        );
    }
    let Some(result) = answer.get("result") else {
        return;
    };
    let known: &[&str] = if modern {
        &["server/discover", "tools/list", "tools/call"]
    } else {
        &[
            "initialize",
            "ping",
            "server/discover",
            "tools/list",
            "tools/call",
            "logging/setLevel",
        ]
    };
    assert!(
        known.contains(&req.method.as_str()),
        "a result for {:?}, unknown in its era: {line}",
        req.method
    );
    if modern {
        assert_eq!(result["resultType"], "complete", "modern result: {line}");
        assert_eq!(
            result["_meta"][META_SERVER_INFO]["name"], "mcqemu",
            "modern result without the server stamp: {line}"
        );
    } else {
        assert!(
            result.get("resultType").is_none(),
            "handshake-era result with a 2026-07-28 stamp: {line}"
        );
    }
    match req.method.as_str() {
        "tools/call" => check_call(req, result, line),
        "tools/list" => {
            let tools = result["tools"].as_array();
            assert!(
                tools.is_some_and(|t| !t.is_empty() && t.len() <= 2),
                "tools/list page: {line}"
            );
        }
        _ => {}
    }
}

/// A `tools/call` result against what the stub tool must have done.
fn check_call(req: &Req, result: &Value, line: &str) {
    let params = req.params.as_ref();
    let name = params.and_then(|p| p["name"].as_str()).unwrap_or_default();
    let args = match params.and_then(|p| p.get("arguments")) {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(a)) => a.clone(),
        Some(_) => panic!("non-object arguments got a result: {line}"),
    };
    let is_error = result["isError"]
        .as_bool()
        .unwrap_or_else(|| panic!("isError missing: {line}"));
    let text = result["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text block: {line}"));
    if is_error {
        assert!(
            text.starts_with(&format!("{name}: ")),
            "a tool error that does not name its tool: {line}"
        );
    }
    match name {
        // Valid arguments fail only when the queue is full or no thread could be started.
        "echo" if is_error => assert!(
            !echo_args_valid(&args)
                || text.contains("more are waiting")
                || text.contains("could not start a worker thread"),
            "echo refused arguments its schema allows: {line}"
        ),
        "echo" => {
            assert!(
                echo_args_valid(&args),
                "echo ran with arguments its schema forbids: {line}"
            );
            let structured = &result["structuredContent"];
            assert_eq!(
                structured["args"],
                Value::Object(args),
                "arguments changed: {line}"
            );
            let from_text: Value = serde_json::from_str(text).unwrap_or_default();
            assert_eq!(&from_text, structured, "text block differs: {line}");
        }
        "fail" | "boom" => assert!(is_error, "{name} cannot succeed: {line}"),
        _ => panic!("a result for unknown tool {name:?}: {line}"),
    }
}

/// Checks one server notification (no id).
fn check_notification(msg: &Value, line: &str) {
    assert_eq!(
        msg["method"], "notifications/progress",
        "unexpected notification: {line}"
    );
    let p = &msg["params"];
    assert!(
        p["progressToken"].is_string() || p["progressToken"].is_number(),
        "progress token: {line}"
    );
    assert!(p["progress"].is_number(), "progress value: {line}");
}

fn init() {
    // libFuzzer's hook aborts on every panic, caught or not: let the stub's deliberate one by.
    let abort = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !info.payload().is::<Deliberate>() {
            abort(info);
        }
    }));
    std::env::set_var("MCQEMU_TOOLS_PAGE_SIZE", PAGE_SIZE);
}

fuzz_target!(init: init(), |data: &[u8]| -> Corpus {
    if data.len() > MAX_INPUT {
        return Corpus::Reject;
    }
    let sink = Sink::default();
    let server = Server::new(Arc::new(Output::new(Box::new(sink.clone()))), &TOOLS);

    // Expected answers per id key: (requests + malformed-with-id lines, cancels after the
    // first tools/call with that id); and how many null-id errors.
    let mut expect: HashMap<String, (usize, usize)> = HashMap::new();
    let mut calls_seen: HashSet<String> = HashSet::new();
    let mut requests_by_key: HashMap<String, Vec<Req>> = HashMap::new();
    let mut null_expected = 0usize;
    let mut initialized = false;

    let mut reader = LineReader::new(data, MAX_LINE_BYTES);
    loop {
        let bytes = match reader.next_line() {
            Line::Eof => break,
            Line::TooLong(n) => panic!("a {n}-byte line from a {}-byte input", data.len()),
            Line::Data(b) => b,
        };
        match classify(&bytes) {
            Class::Silent => {}
            Class::Notification { cancels } => {
                if let Some(k) = cancels {
                    if calls_seen.contains(&k) {
                        expect.entry(k).or_default().1 += 1;
                    }
                }
            }
            Class::Request {
                key,
                method,
                params,
            } => {
                expect.entry(key.clone()).or_default().0 += 1;
                if method == "tools/call" {
                    calls_seen.insert(key.clone());
                }
                let starts = method == "initialize"
                    && params
                        .as_ref()
                        .is_some_and(|p| p.get("protocolVersion").is_some_and(Value::is_string));
                requests_by_key.entry(key).or_default().push(Req {
                    method,
                    params,
                    initialized,
                });
                initialized |= starts;
            }
            Class::BadWithId(key) => {
                expect.entry(key).or_default().0 += 1;
            }
            Class::BadNullId => null_expected += 1,
        }
        server.handle_bytes(&bytes);
    }

    // Every worker thread holds a clone of the server until its answer is out.
    let deadline = Instant::now() + Duration::from_secs(10);
    while Arc::strong_count(&server) > 1 {
        assert!(Instant::now() < deadline, "a tool call never finished");
        std::thread::yield_now();
    }
    drop(server);

    let out = std::mem::take(&mut *sink.0.lock().unwrap_or_else(|p| p.into_inner()));
    assert!(
        out.is_empty() || out.ends_with(b"\n"),
        "output does not end in a newline"
    );
    let mut answers: HashMap<String, Vec<Value>> = HashMap::new();
    let mut null_answers = 0usize;
    for raw in out.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let line = String::from_utf8_lossy(raw);
        let msg: Value = serde_json::from_slice(raw)
            .unwrap_or_else(|e| panic!("output line is not JSON ({e}): {line}"));
        assert!(msg.is_object(), "output is not an object: {line}");
        assert_eq!(msg["jsonrpc"], "2.0", "output without jsonrpc 2.0: {line}");
        let Some(id) = msg.get("id") else {
            check_notification(&msg, &line);
            continue;
        };
        match (msg.get("result"), msg.get("error")) {
            (Some(_), None) => {}
            (None, Some(e)) => {
                assert!(e["code"].is_i64(), "error code: {line}");
                assert!(e["message"].is_string(), "error message: {line}");
            }
            _ => panic!("an answer needs exactly one of result and error: {line}"),
        }
        if id.is_null() {
            null_answers += 1;
        } else {
            let key = id_key(id).unwrap_or_else(|| panic!("answer id of a bad type: {line}"));
            answers.entry(key).or_default().push(msg);
        }
    }

    assert_eq!(
        null_answers, null_expected,
        "null-id errors: {null_answers} sent, {null_expected} malformed lines without an id"
    );
    for key in answers.keys() {
        assert!(
            expect.contains_key(key),
            "an answer for id {key}, which no input line had"
        );
    }
    for (key, (want, cancels)) in &expect {
        let got = answers.get(key).map_or(0, Vec::len);
        assert!(
            got <= *want && got + cancels >= *want,
            "id {key}: {got} answers for {want} messages ({cancels} cancellations after a call)"
        );
        if *want == 1 && *cancels == 0 {
            if let (Some([req]), Some([answer])) = (
                requests_by_key.get(key).map(Vec::as_slice),
                answers.get(key).map(Vec::as_slice),
            ) {
                check_unique(req, answer, &answer.to_string());
            }
        }
    }
    Corpus::Keep
});
