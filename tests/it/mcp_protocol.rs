//! The MCP protocol end to end: handshakes, the stateless style, pagination, cancellation,
//! progress, logging, shutdown, and bad input that must never stop the server.

use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{json, Value};

const INIT_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

// ---- lifecycle and versions ----

#[test]
fn initialize_echoes_every_supported_version() {
    for version in INIT_VERSIONS {
        let mut s = Server::start();
        let r = s.initialize(version);
        assert_eq!(r["protocolVersion"], *version, "{r}");
        assert_eq!(r["serverInfo"]["name"], "mcqemu");
        assert_eq!(r["serverInfo"]["version"], env!("CARGO_PKG_VERSION"));
        assert!(r["capabilities"]["tools"].is_object(), "{r}");
        assert!(r["capabilities"]["logging"].is_object(), "{r}");
        assert_eq!(
            r["capabilities"]["resources"],
            json!({"listChanged": true, "subscribe": true}),
            "{r}"
        );
        assert!(r["instructions"].as_str().is_some_and(|i| !i.is_empty()));
        let tools = s.result("tools/list", json!({}));
        assert!(!tools["tools"].as_array().unwrap().is_empty());
        s.assert_alive();
    }
}

#[test]
fn initialize_with_unknown_version_answers_newest() {
    let mut s = Server::start();
    let r = s.initialize("1999-01-01");
    assert_eq!(r["protocolVersion"], NEWEST);
    let mut s = Server::start();
    let r = s.initialize("2099-12-31");
    assert_eq!(r["protocolVersion"], NEWEST);
}

#[test]
fn initialize_without_protocol_version_is_invalid_params() {
    let mut s = Server::start();
    let e = s.error("initialize", json!({"capabilities": {}}));
    assert_eq!(e["code"], -32602, "{e}");
    s.assert_alive();
}

/// The 2026-07-28 envelope every modern request carries.
fn envelope() -> Value {
    json!({ META_VERSION: STATELESS, META_CAPS: {} })
}

/// Asserts what 2026-07-28 asks of every result, and of cacheable ones.
fn assert_modern_result(r: &Value, cacheable: bool) {
    assert_eq!(r["resultType"], "complete", "{r}");
    assert_eq!(r["_meta"][META_SERVER_INFO]["name"], "mcqemu", "{r}");
    assert_eq!(
        r["_meta"][META_SERVER_INFO]["version"],
        env!("CARGO_PKG_VERSION"),
        "{r}"
    );
    if cacheable {
        assert_eq!(r["cacheScope"], "public", "{r}");
        assert!(r["ttlMs"].as_u64().is_some_and(|t| t > 0), "{r}");
    } else {
        assert!(
            r.get("ttlMs").is_none() && r.get("cacheScope").is_none(),
            "{r}"
        );
    }
}

#[test]
fn server_discover_lists_all_versions() {
    let mut s = Server::start();
    let r = s.result("server/discover", json!({"_meta": envelope()}));
    let versions: Vec<&str> = r["supportedVersions"]
        .as_array()
        .expect("supportedVersions")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for v in INIT_VERSIONS.iter().chain([&STATELESS]) {
        assert!(versions.contains(v), "{v} missing from {versions:?}");
    }
    assert_modern_result(&r, true);
    assert!(
        r.get("serverInfo").is_none(),
        "serverInfo belongs in _meta: {r}"
    );
    assert!(r["capabilities"]["tools"].is_object());
    assert!(r["instructions"].as_str().is_some_and(|i| !i.is_empty()));
}

#[test]
fn stateless_request_works_without_initialize() {
    let mut s = Server::start();
    let meta = envelope();
    let r = s.result("tools/list", json!({"_meta": meta}));
    assert!(r["tools"].as_array().is_some_and(|t| !t.is_empty()), "{r}");
    assert_modern_result(&r, true);
    // Tool calls in the stateless style too: a tool error still carries resultType.
    let r = s.result(
        "tools/call",
        json!({"_meta": meta, "name": "image_info",
               "arguments": {"path": s.tmp.file("missing.qcow2")}}),
    );
    assert_eq!(r["isError"], true, "{r}");
    assert_modern_result(&r, false);
    let r = s.result(
        "tools/call",
        json!({"_meta": meta, "name": "list_vms", "arguments": {}}),
    );
    assert_eq!(r["isError"], false, "{r}");
    assert_modern_result(&r, false);
    // ping and logging/setLevel were removed in 2026-07-28.
    for method in ["ping", "logging/setLevel"] {
        let resp = s.request(method, json!({"_meta": meta, "level": "debug"}));
        assert_eq!(error_code(&resp), -32601, "{method}: {resp}");
    }
    s.assert_alive();
}

#[test]
fn stateless_version_mismatch_is_32022_with_data() {
    let mut s = Server::start();
    for requested in ["2030-01-01", "2025-11-25"] {
        let resp = s.request(
            "tools/list",
            json!({"_meta": { META_VERSION: requested, META_CAPS: {} }}),
        );
        assert_eq!(error_code(&resp), -32022, "{resp}");
        let data = &resp["error"]["data"];
        assert_eq!(data["requested"], requested, "{resp}");
        let supported = data["supported"].as_array().expect("data.supported");
        assert!(supported.contains(&json!(STATELESS)), "{resp}");
        assert!(supported.contains(&json!(NEWEST)), "{resp}");
    }
    s.assert_alive();
}

#[test]
fn malformed_envelope_is_invalid_params() {
    let mut s = Server::start();
    // A version that is not a string, or a missing clientCapabilities, is malformed: -32602.
    for meta in [
        json!({ META_VERSION: 7, META_CAPS: {} }),
        json!({ META_VERSION: STATELESS }),
        json!({ META_VERSION: STATELESS, META_CAPS: {}, "io.modelcontextprotocol/logLevel": "loud" }),
    ] {
        let resp = s.request("tools/list", json!({"_meta": meta}));
        assert_eq!(error_code(&resp), -32602, "{meta}: {resp}");
    }
    s.assert_alive();
}

#[test]
fn requests_without_a_version_before_initialize_are_refused() {
    let mut s = Server::start();
    for method in [
        "tools/list",
        "tools/call",
        "server/discover",
        "logging/setLevel",
    ] {
        let resp = s.request(method, json!({"name": "list_vms", "level": "info"}));
        assert_eq!(error_code(&resp), -32602, "{method}: {resp}");
        let msg = resp["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains("initialize") && msg.contains(META_VERSION),
            "{msg}"
        );
    }
    // ping is allowed before initialize in the handshake era; unknown methods stay -32601.
    assert_eq!(s.result("ping", json!({})), json!({}));
    let resp = s.request("prompts/list", json!({}));
    assert_eq!(error_code(&resp), -32601, "{resp}");
    // initialize opens the handshake era even when a client stamps the envelope on it.
    let r = s.result(
        "initialize",
        json!({"protocolVersion": NEWEST, "capabilities": {}, "_meta": envelope(),
               "clientInfo": {"name": "t", "version": "0"}}),
    );
    assert_eq!(r["protocolVersion"], NEWEST);
    assert!(r.get("resultType").is_none(), "{r}");
    let r = s.result("tools/list", json!({}));
    assert!(
        r.get("resultType").is_none() && r.get("ttlMs").is_none(),
        "{r}"
    );
}

#[test]
fn modern_log_notifications_only_for_requests_that_opt_in() {
    let mut s = Server::start();
    let state = s.tmp.join("state");
    let record = json!({"version": 1, "vms": {
        "ghost1": {"qmp_socket": "/nonexistent/q1.sock", "pid": null},
        "ghost2": {"qmp_socket": "/nonexistent/q2.sock", "pid": null}}});
    std::fs::write(state.join("vms.json"), record.to_string()).expect("write registry");
    let forget = |s: &mut Server, name: &str, meta: Value| {
        let (resp, others) = s.request_full(
            "tools/call",
            json!({"_meta": meta, "name": "forget_vm", "arguments": {"name": name}}),
        );
        assert_eq!(resp["result"]["isError"], false, "{resp}");
        others
            .into_iter()
            .filter(|m| m["method"] == "notifications/message")
            .count()
    };
    // forget_vm logs at "notice": nothing without a level, a message with one.
    assert_eq!(forget(&mut s, "ghost1", envelope()), 0);
    let mut opted = envelope();
    opted["io.modelcontextprotocol/logLevel"] = json!("info");
    assert_eq!(forget(&mut s, "ghost2", opted), 1);
    s.assert_alive();
}

#[test]
fn ping_answers_empty_result() {
    let mut s = Server::ready();
    let resp = s.request("ping", json!({}));
    assert_eq!(
        resp,
        json!({"jsonrpc": "2.0", "id": resp["id"], "result": {}})
    );
    // params may also be absent
    s.send(&json!({"jsonrpc": "2.0", "id": "p", "method": "ping"}));
    let (resp, _) = s.read_until_id(&json!("p"), RESPONSE_TIMEOUT);
    assert_eq!(resp["result"], json!({}));
}

#[test]
fn unknown_method_is_32601_at_once() {
    let mut s = Server::ready();
    let resp = s.request("prompts/list", json!({}));
    assert_eq!(error_code(&resp), -32601, "{resp}");
    let resp = s.request("no/such/method", json!({}));
    assert_eq!(error_code(&resp), -32601, "{resp}");
    s.assert_alive();
}

// ---- the harness's output-schema check ----

#[test]
fn the_harness_refuses_results_that_break_their_output_schema() {
    let problems = |schema: Value, v: Value| {
        let mut p = Vec::new();
        crate::common::schema::check(&schema, &v, "data", &mut p);
        p
    };
    let s = json!({"type": "object", "properties": {"file_size": {"type": "integer"}},
                   "required": ["content"]});
    assert!(problems(s.clone(), json!({"content": "", "file_size": 3})).is_empty());
    assert_eq!(
        problems(s.clone(), json!({"content": "", "file_size": null})).len(),
        1
    );
    assert_eq!(problems(s, json!({"file_size": 3})).len(), 1);
    let nullable = json!({"anyOf": [{"type": "integer"}, {"type": "null"}]});
    assert!(problems(nullable.clone(), json!(null)).is_empty());
    assert!(!problems(nullable, json!("x")).is_empty());
    // A keyword the checker does not know fails instead of passing unchecked.
    assert!(!problems(json!({"patternProperties": {}}), json!({})).is_empty());
    // A real call's result is checked by the reader: guest_file_read's schema refuses a null
    // file_size, so a response carrying one is an error of the read itself.
    let resp = json!({"jsonrpc": "2.0", "id": 1, "result": {"content": [], "structuredContent":
        {"name": "v", "path": "/e", "content": "", "encoding": "utf-8", "size": 0,
         "truncated": false, "offset": 0, "file_size": null}}});
    let why = crate::common::schema::check_call_response("guest_file_read", &resp).unwrap_err();
    assert!(why.contains("file_size"), "{why}");
    // A schema made from its result type is closed: a field the type does not declare fails.
    let ok = json!({"name": "v", "destroyed": true, "stopped": "quit", "deleted": [],
                    "errors": []});
    let resp = |sc: Value| {
        json!({"jsonrpc": "2.0", "id": 1, "result": {"content": [],
                                  "structuredContent": sc}})
    };
    crate::common::schema::check_call_response("sandbox_destroy", &resp(ok.clone())).unwrap();
    let mut extra = ok;
    extra["undeclared"] = json!(1);
    let why =
        crate::common::schema::check_call_response("sandbox_destroy", &resp(extra)).unwrap_err();
    assert!(why.contains("undeclared"), "{why}");
}

// ---- instructions ----

/// The longest the instructions may be: one screen.
const INSTRUCTIONS_MAX: usize = 1500;

/// Every tool-like name in `text`: snake_case words (at least one underscore), the shape of
/// every tool name.
fn tool_like_names(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
        .filter(|w| w.contains('_') && w.starts_with(|c: char| c.is_ascii_lowercase()))
        .map(|w| w.trim_end_matches('_').to_string())
        .collect()
}

#[test]
fn the_instructions_fit_one_screen_and_name_only_real_tools() {
    let mut s = Server::start();
    let init = s.initialize(NEWEST);
    let text = init["instructions"]
        .as_str()
        .expect("instructions")
        .to_string();
    let discover = s.result("server/discover", json!({"_meta": envelope()}));
    assert_eq!(discover["instructions"], text, "the same in both eras");
    assert!(
        text.chars().count() <= INSTRUCTIONS_MAX,
        "{} characters, more than one screen:\n{text}",
        text.chars().count()
    );
    let listed = tool_names(&s.result("tools/list", json!({})));
    let named = tool_like_names(&text);
    let unknown: Vec<&String> = named.iter().filter(|n| !listed.contains(n)).collect();
    assert!(
        unknown.is_empty(),
        "the instructions name tools that do not exist: {unknown:?}"
    );
    // What they must teach: the journeys by the tools that start and drive them (the
    // container-image sandbox with a mount first),
    // templates, the roots rule, progress, and the resources.
    for tool in [
        "image_pull",
        "image_prepare",
        "sandbox_vm",
        "guest_exec",
        "launch_vm",
        "vm_screenshot",
        "vm_click",
        "vm_type_text",
        "vm_send_keys",
        "vm_serial_wait",
        "vm_serial_read",
        "template_create",
    ] {
        assert!(
            named.iter().any(|n| n == tool),
            "{tool} is not named:\n{text}"
        );
    }
    for words in [
        "iso",
        "kernel",
        "initrd",
        "append",
        "\"template\"",
        "roots",
        "--root",
        "progress",
        "mcqemu://vm/{name}/serial",
        "mcqemu://vm/{name}/screen",
        "\"oci\"",
        "\"mounts\"",
    ] {
        assert!(text.contains(words), "{words:?} is not said:\n{text}");
    }
    eprintln!("instructions: {} characters\n{text}", text.chars().count());
}

// ---- tools/list ----

#[test]
fn tools_list_definitions_are_complete() {
    let mut s = Server::ready();
    let r = s.result("tools/list", json!({}));
    assert!(
        r.get("nextCursor").is_none(),
        "default page holds all tools: {r}"
    );
    let tools = r["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    for expected in [
        "image_create",
        "image_info",
        "image_convert",
        "image_resize",
        "image_snapshot_list",
        "image_snapshot_create",
        "image_snapshot_apply",
        "image_snapshot_delete",
        "image_download",
    ] {
        assert!(names.contains(&expected), "{expected} missing: {names:?}");
    }
    for t in tools {
        let name = &t["name"];
        assert!(t["title"].as_str().is_some_and(|x| !x.is_empty()), "{name}");
        assert!(
            t["description"].as_str().is_some_and(|x| !x.is_empty()),
            "{name}"
        );
        assert_eq!(t["inputSchema"]["type"], "object", "{name}");
        assert_eq!(t["inputSchema"]["additionalProperties"], false, "{name}");
        assert_eq!(t["outputSchema"]["type"], "object", "{name}");
        for hint in [
            "readOnlyHint",
            "destructiveHint",
            "idempotentHint",
            "openWorldHint",
        ] {
            assert!(t["annotations"][hint].is_boolean(), "{name} lacks {hint}");
        }
    }
}

#[test]
fn tools_list_pagination_follows_cursors_to_the_end() {
    let mut full = Server::ready();
    let all = full.result("tools/list", json!({}));
    let all_tools = all["tools"].as_array().unwrap().clone();
    assert!(all_tools.len() > 3, "need more than one page");

    let mut paged = Server::start_with_env(&[("MCQEMU_TOOLS_PAGE_SIZE", "3")]);
    paged.initialize(NEWEST);
    let walk = |s: &mut Server| {
        let mut seen = Vec::new();
        let mut cursor: Option<Value> = None;
        for _ in 0..100 {
            let params = match &cursor {
                None => json!({}),
                Some(c) => json!({"cursor": c}),
            };
            let page = s.result("tools/list", params);
            let tools = page["tools"].as_array().unwrap();
            assert!(tools.len() <= 3, "page too big: {}", tools.len());
            assert!(!tools.is_empty(), "empty page");
            seen.extend(tools.iter().cloned());
            match page.get("nextCursor") {
                None => return seen,
                Some(c) => {
                    assert!(c.is_string(), "cursor must be a string: {c}");
                    cursor = Some(c.clone());
                }
            }
        }
        panic!("pagination never ended");
    };
    let first = walk(&mut paged);
    assert_eq!(
        first, all_tools,
        "paged union differs from the unpaged list"
    );
    let second = walk(&mut paged);
    assert_eq!(first, second, "order is not fixed");
    assert_eq!(
        tool_names(&json!({"tools": first})),
        tool_names(&all),
        "same names in the same order"
    );
}

#[test]
fn tools_list_bad_cursor_is_invalid_params() {
    let mut s = Server::start_with_env(&[("MCQEMU_TOOLS_PAGE_SIZE", "3")]);
    s.initialize(NEWEST);
    for bad in [
        json!("garbage"),
        json!("mcq-zz"),
        json!(3),
        json!({"a": 1}),
        json!(""),
    ] {
        let resp = s.request("tools/list", json!({"cursor": bad}));
        assert_eq!(error_code(&resp), -32602, "cursor {bad}: {resp}");
    }
    s.assert_alive();
}

// ---- logging ----

#[test]
fn logging_set_level() {
    let mut s = Server::ready();
    for level in ["debug", "info", "warning", "emergency"] {
        let r = s.result("logging/setLevel", json!({"level": level}));
        assert_eq!(r, json!({}));
    }
    let e = s.error("logging/setLevel", json!({"level": "loud"}));
    assert_eq!(e["code"], -32602, "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("debug"),
        "lists the valid levels: {e}"
    );
    let e = s.error("logging/setLevel", json!({}));
    assert_eq!(e["code"], -32602, "{e}");
    s.assert_alive();
}

// ---- progress and cancellation ----

#[test]
fn progress_notifications_during_download() {
    let body = pseudo_random(4 << 20, 7);
    let http = HttpServer::start(vec![(
        "big.img",
        // About 1.3 s: progress at 0.5 s and 1 s (a final update inside the gap is dropped).
        Route::trickle(body.clone(), 32 * 1024, Duration::from_millis(10)),
    )]);
    let mut s = Server::ready();
    let dest = s.tmp.file("big.img");
    let (resp, others) = s.request_full(
        "tools/call",
        json!({"name": "image_download",
               "arguments": {"url": http.url("big.img"), "path": dest},
               "_meta": {"progressToken": "dl-1"}}),
    );
    let out = tool_ok(&resp["result"], "image_download");
    assert_eq!(out["bytes"], body.len());
    let progress: Vec<&Value> = others
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .collect();
    assert!(
        progress.len() >= 2,
        "too few progress notifications: {others:?}"
    );
    let mut last = f64::MIN;
    for p in &progress {
        assert_eq!(p["params"]["progressToken"], "dl-1", "{p}");
        let v = p["params"]["progress"].as_f64().unwrap();
        assert!(v > last, "progress must increase: {progress:?}");
        last = v;
        if let Some(t) = p["params"]["total"].as_f64() {
            assert_eq!(t, body.len() as f64);
        }
    }
    assert!(
        last <= body.len() as f64,
        "progress past the whole body: {progress:?}"
    );
    // A numeric token works as well.
    let dest2 = s.tmp.file("big2.img");
    let (resp, others) = s.request_full(
        "tools/call",
        json!({"name": "image_download",
               "arguments": {"url": http.url("big.img"), "path": dest2},
               "_meta": {"progressToken": 42}}),
    );
    tool_ok(&resp["result"], "image_download");
    assert!(others
        .iter()
        .any(|m| m["method"] == "notifications/progress" && m["params"]["progressToken"] == 42));
    // Without a token, no progress at all.
    let dest3 = s.tmp.file("big3.img");
    let (resp, others) = s.request_full(
        "tools/call",
        json!({"name": "image_download", "arguments": {"url": http.url("big.img"), "path": dest3}}),
    );
    tool_ok(&resp["result"], "image_download");
    assert!(
        others
            .iter()
            .all(|m| m["method"] != "notifications/progress"),
        "progress without a token: {others:?}"
    );
}

#[test]
fn cancelled_call_gets_no_reply() {
    // 8 MiB at 16 KiB per 50 ms would take ~25 s: certainly still in flight when cancelled.
    let body = pseudo_random(8 << 20, 3);
    let http = HttpServer::start(vec![(
        "slow.img",
        Route::trickle(body, 16 * 1024, Duration::from_millis(50)),
    )]);
    let mut s = Server::ready();
    let dl_dir = s.tmp.subdir("dl");
    let dest = dl_dir.join("slow.img");
    let id = json!("cancel-me");
    s.send_request(
        &id,
        "tools/call",
        json!({"name": "image_download",
               "arguments": {"url": http.url("slow.img"), "path": dest.to_str().unwrap()},
               "_meta": {"progressToken": "c1"}}),
    );
    // Wait until the download is really under way (first progress with bytes > 0).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = s
            .recv(deadline.saturating_duration_since(Instant::now()))
            .expect("no progress before the deadline");
        assert_ne!(
            m.get("id"),
            Some(&id),
            "call finished before it was cancelled: {m}"
        );
        if m["method"] == "notifications/progress" && m["params"]["progress"].as_f64() > Some(0.0) {
            break;
        }
    }
    s.notify(
        "notifications/cancelled",
        json!({"requestId": id, "reason": "test"}),
    );
    let others = s.assert_alive();
    assert!(
        others.iter().all(|m| m.get("id") != Some(&id)),
        "a reply to the cancelled request arrived: {others:?}"
    );
    let later = s.collect_for(Duration::from_secs(2));
    assert!(
        later.iter().all(|m| m.get("id") != Some(&id)),
        "a reply to the cancelled request arrived: {later:?}"
    );
    // The partial download is cleaned up: nothing at path, no temporary files.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !list_dir(&dl_dir).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        list_dir(&dl_dir).is_empty(),
        "left behind: {:?}",
        list_dir(&dl_dir)
    );
    // The id is free again and the server still serves calls.
    let r = s.call_tool("image_info", json!({"path": s.tmp.file("nope.qcow2")}));
    assert_eq!(r["isError"], true);
}

#[test]
fn cancelling_unknown_or_finished_requests_is_harmless() {
    let mut s = Server::ready();
    s.notify("notifications/cancelled", json!({"requestId": 12345}));
    s.notify("notifications/cancelled", json!({"requestId": "nope"}));
    s.notify("notifications/cancelled", json!({}));
    let others = s.assert_alive();
    assert!(others.is_empty(), "{others:?}");
}

// ---- shutdown ----

#[test]
fn eof_on_stdin_exits_zero_promptly() {
    let mut s = Server::ready();
    s.assert_alive();
    let t = Instant::now();
    s.close_stdin();
    let st = s
        .wait_exit(Duration::from_secs(5))
        .expect("server did not exit after EOF");
    assert_eq!(st.code(), Some(0), "{st:?}");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t.elapsed()
    );
}

#[test]
fn eof_without_any_input_exits_zero() {
    let mut s = Server::start();
    s.close_stdin();
    let st = s.wait_exit(Duration::from_secs(5)).expect("no exit");
    assert_eq!(st.code(), Some(0));
}

#[test]
fn sigterm_exits_zero() {
    let mut s = Server::ready();
    s.assert_alive();
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    let rc = unsafe { libc::kill(s.pid() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let st = s
        .wait_exit(Duration::from_secs(5))
        .expect("server did not exit after SIGTERM");
    assert_eq!(st.code(), Some(0), "{st:?}");
}

// ---- bad input: each answered correctly, the server still serving the next line ----

fn expect_parse_error(s: &mut Server, what: &str) {
    let m = s
        .recv(RESPONSE_TIMEOUT)
        .unwrap_or_else(|| panic!("{what}: no reply"));
    assert_eq!(m["jsonrpc"], "2.0", "{what}: {m}");
    assert_eq!(m["error"]["code"], -32700, "{what}: {m}");
    assert!(m["id"].is_null(), "{what}: id must be null: {m}");
    let others = s.assert_alive();
    assert!(others.is_empty(), "{what}: extra messages {others:?}");
}

#[test]
fn garbage_is_parse_error() {
    let mut s = Server::ready();
    s.send_raw(b"hello, this is not json\n");
    expect_parse_error(&mut s, "garbage");
    s.send_raw(b"{{{{]]]\n");
    expect_parse_error(&mut s, "brackets");
}

#[test]
fn truncated_json_is_parse_error() {
    let mut s = Server::ready();
    s.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"pi\n");
    expect_parse_error(&mut s, "truncated");
    s.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"\n");
    expect_parse_error(&mut s, "missing brace");
}

#[test]
fn invalid_utf8_is_parse_error() {
    let mut s = Server::ready();
    s.send_raw(
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":{\"x\":\"\xff\xfe\"}}\n",
    );
    expect_parse_error(&mut s, "invalid utf-8");
    s.send_raw(b"\xc3\x28\n");
    expect_parse_error(&mut s, "bad utf-8 sequence");
}

#[test]
fn hundred_megabyte_line_is_parse_error() {
    let mut s = Server::ready();
    let writer = s.send_raw_in_background(|write| {
        write(b"{\"jsonrpc\":\"2.0\",\"id\":\"huge\",\"method\":\"ping\",\"params\":{\"x\":\"");
        let chunk = vec![b'a'; 1 << 20];
        for _ in 0..100 {
            write(&chunk);
        }
        write(b"\"}}\n");
    });
    let m = s
        .recv(Duration::from_secs(60))
        .expect("no reply to the huge line");
    writer.join().expect("writer thread");
    assert_eq!(m["error"]["code"], -32700, "{m}");
    assert!(m["id"].is_null(), "{m}");
    let others = s.assert_alive();
    assert!(others.is_empty(), "{others:?}");
}

#[test]
fn batch_is_invalid_request() {
    let mut s = Server::ready();
    s.send_raw(b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}]\n");
    let m = s.recv(RESPONSE_TIMEOUT).expect("no reply to a batch");
    assert_eq!(m["error"]["code"], -32600, "{m}");
    assert!(m["id"].is_null(), "{m}");
    assert!(s.assert_alive().is_empty());
    s.send_raw(b"[]\n");
    let m = s
        .recv(RESPONSE_TIMEOUT)
        .expect("no reply to an empty batch");
    assert_eq!(m["error"]["code"], -32600, "{m}");
    assert!(s.assert_alive().is_empty());
}

#[test]
fn non_object_messages_are_invalid_request() {
    let mut s = Server::ready();
    for line in ["42", "\"ping\"", "null", "true"] {
        s.send_raw(format!("{line}\n").as_bytes());
        let m = s.recv(RESPONSE_TIMEOUT).expect("no reply");
        assert_eq!(m["error"]["code"], -32600, "{line}: {m}");
        assert!(m["id"].is_null());
        assert!(s.assert_alive().is_empty());
    }
}

#[test]
fn request_without_jsonrpc_is_invalid_request() {
    let mut s = Server::ready();
    s.send(&json!({"id": 5, "method": "ping"}));
    let (resp, _) = s.read_until_id(&json!(5), RESPONSE_TIMEOUT);
    assert_eq!(error_code(&resp), -32600, "{resp}");
    s.send(&json!({"jsonrpc": "1.0", "id": 6, "method": "ping"}));
    let (resp, _) = s.read_until_id(&json!(6), RESPONSE_TIMEOUT);
    assert_eq!(error_code(&resp), -32600, "{resp}");
    assert!(s.assert_alive().is_empty());
}

#[test]
fn malformed_requests_are_rejected() {
    let mut s = Server::ready();
    // id of a type JSON-RPC forbids: answered with id null.
    s.send(&json!({"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}));
    let m = s.recv(RESPONSE_TIMEOUT).expect("reply");
    assert_eq!(m["error"]["code"], -32600, "{m}");
    assert!(m["id"].is_null());
    // a null id: JSON-RPC allows it, MCP does not.
    s.send(&json!({"jsonrpc": "2.0", "id": null, "method": "ping"}));
    let m = s.recv(RESPONSE_TIMEOUT).expect("reply");
    assert_eq!(m["error"]["code"], -32600, "{m}");
    // method not a string
    s.send(&json!({"jsonrpc": "2.0", "id": 7, "method": 12}));
    let (resp, _) = s.read_until_id(&json!(7), RESPONSE_TIMEOUT);
    assert_eq!(error_code(&resp), -32600, "{resp}");
    // neither method nor result
    s.send(&json!({"jsonrpc": "2.0", "id": 8}));
    let (resp, _) = s.read_until_id(&json!(8), RESPONSE_TIMEOUT);
    assert_eq!(error_code(&resp), -32600, "{resp}");
    // params not an object
    s.send(&json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": [1]}));
    let (resp, _) = s.read_until_id(&json!(9), RESPONSE_TIMEOUT);
    assert_eq!(error_code(&resp), -32602, "{resp}");
    // tools/call without a name, or with non-object arguments
    let resp = s.request("tools/call", json!({"arguments": {}}));
    assert_eq!(error_code(&resp), -32602, "{resp}");
    let resp = s.request(
        "tools/call",
        json!({"name": "image_info", "arguments": [1]}),
    );
    assert_eq!(error_code(&resp), -32602, "{resp}");
    assert!(s.assert_alive().is_empty());
}

#[test]
fn wrong_parameter_type_is_tool_error_naming_it() {
    let mut s = Server::ready();
    let err = s.call_err(
        "image_create",
        json!({"path": s.tmp.file("x.qcow2"), "size": 5}),
    );
    assert!(err.contains("'size'"), "{err}");
    let err = s.call_err(
        "image_info",
        json!({"path": s.tmp.file("x"), "backing_chain": "yes"}),
    );
    assert!(err.contains("'backing_chain'"), "{err}");
    let err = s.call_err(
        "image_create",
        json!({"path": s.tmp.file("x"), "size": "1M", "format": "zip"}),
    );
    assert!(err.contains("'format'"), "{err}");
    let err = s.call_err("image_create", json!({"size": "1M"}));
    assert!(
        err.contains("'path'"),
        "missing required parameter named: {err}"
    );
    assert!(!s.tmp.join("x.qcow2").exists() && !s.tmp.join("x").exists());
    s.assert_alive();
}

#[test]
fn unknown_tool_is_invalid_params() {
    let mut s = Server::ready();
    let resp = s.call_tool_response("launch_rocket", json!({}));
    assert_eq!(error_code(&resp), -32602, "{resp}");
    assert!(resp["error"]["message"]
        .as_str()
        .unwrap()
        .contains("launch_rocket"));
    s.assert_alive();
}

#[test]
fn unknown_parameter_is_tool_error_listing_valid_ones() {
    let mut s = Server::ready();
    let err = s.call_err(
        "image_create",
        json!({"path": s.tmp.file("x.qcow2"), "size": "1M", "fromat": "raw"}),
    );
    assert!(err.contains("'fromat'"), "{err}");
    for valid in ["path", "size", "format", "backing_file", "overwrite"] {
        assert!(err.contains(valid), "{valid} not listed: {err}");
    }
    assert!(!s.tmp.join("x.qcow2").exists(), "nothing may be created");
    s.assert_alive();
}

#[test]
fn unknown_notification_gets_no_reply() {
    let mut s = Server::ready();
    s.notify("notifications/whatever", json!({"x": 1}));
    s.notify("no/such/notification", json!({}));
    s.send(&json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}));
    // A notification whose params are malformed still gets no reply.
    s.send(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": 5}));
    let others = s.assert_alive();
    assert!(others.is_empty(), "notifications were answered: {others:?}");
}

#[test]
fn request_ids_of_every_type_are_echoed_exactly() {
    let mut s = Server::ready();
    for id in [
        json!("abc"),
        json!(""),
        json!("id with spaces and ünïcode"),
        json!(0),
        json!(42),
        json!(-7),
        json!(1.5),
        json!(-0.25),
        json!(9007199254740993u64),
    ] {
        s.send_request(&id, "ping", json!({}));
        let (resp, others) = s.read_until_id(&id, RESPONSE_TIMEOUT);
        assert!(others.is_empty(), "{id}: {others:?}");
        assert_eq!(resp["result"], json!({}), "{id}: {resp}");
        // Exact: same JSON type and value (an integer stays an integer, a float a float).
        assert_eq!(resp["id"], id);
        assert_eq!(resp["id"].is_f64(), id.is_f64(), "{id} vs {}", resp["id"]);
        assert_eq!(resp["id"].to_string(), id.to_string());
    }
    // Errors echo the id too.
    let id = json!(-3.75);
    s.send_request(&id, "no/such", json!({}));
    let (resp, _) = s.read_until_id(&id, RESPONSE_TIMEOUT);
    assert_eq!(resp["error"]["code"], -32601);
    assert_eq!(resp["id"].to_string(), "-3.75");
    // And tool results.
    let id = json!("tool-call-ü");
    s.send_request(
        &id,
        "tools/call",
        json!({"name": "image_info", "arguments": {"path": s.tmp.file("none")}}),
    );
    let (resp, _) = s.read_until_id(&id, RESPONSE_TIMEOUT);
    assert_eq!(resp["result"]["isError"], true);
}

#[test]
fn client_responses_are_ignored() {
    let mut s = Server::ready();
    s.send(&json!({"jsonrpc": "2.0", "id": 99, "result": {}}));
    s.send(&json!({"jsonrpc": "2.0", "id": "x", "error": {"code": -1, "message": "no"}}));
    let others = s.assert_alive();
    assert!(
        others.is_empty(),
        "a client response was answered: {others:?}"
    );
    let later = s.collect_for(Duration::from_millis(300));
    assert!(later.is_empty(), "{later:?}");
}

#[test]
fn blank_lines_and_crlf_are_tolerated() {
    let mut s = Server::ready();
    s.send_raw(b"\n   \n\r\n");
    s.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":\"crlf\",\"method\":\"ping\"}\r\n");
    let (resp, others) = s.read_until_id(&json!("crlf"), RESPONSE_TIMEOUT);
    assert_eq!(resp["result"], json!({}));
    assert!(others.is_empty(), "{others:?}");
}

#[test]
fn many_bad_lines_in_a_row_then_a_good_one() {
    let mut s = Server::ready();
    let mut burst = Vec::new();
    for i in 0..50 {
        burst.extend_from_slice(format!("not json {i}\n").as_bytes());
    }
    s.send_raw(&burst);
    let others = s.assert_alive();
    assert_eq!(others.len(), 50, "one parse error per bad line");
    assert!(others.iter().all(|m| m["error"]["code"] == -32700));
}

// ---- calls in flight ----

/// Starts an image_download that trickles for ~25 s and waits until bytes are flowing.
fn start_slow_download(s: &mut Server, http: &HttpServer, id: &Value, dest: &str) {
    s.send_request(
        id,
        "tools/call",
        json!({"name": "image_download",
               "arguments": {"url": http.url("slow.img"), "path": dest},
               "_meta": {"progressToken": format!("p-{id}")}}),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = s
            .recv(deadline.saturating_duration_since(Instant::now()))
            .expect("the download did not start");
        assert_ne!(m.get("id"), Some(id), "the download ended early: {m}");
        if m["method"] == "notifications/progress" && m["params"]["progress"].as_f64() > Some(0.0) {
            return;
        }
    }
}

fn slow_http() -> HttpServer {
    HttpServer::start(vec![(
        "slow.img",
        Route::trickle(
            pseudo_random(8 << 20, 5),
            16 * 1024,
            Duration::from_millis(50),
        ),
    )])
}

#[test]
fn a_long_call_blocks_neither_other_calls_nor_requests() {
    let http = slow_http();
    let mut s = Server::ready();
    let id = json!("long");
    let dest = s.tmp.file("slow.img");
    start_slow_download(&mut s, &http, &id, &dest);
    let t = Instant::now();
    s.assert_alive();
    s.result("tools/list", json!({}));
    let out = s.call_ok(
        "image_create",
        json!({"path": s.tmp.file("meanwhile.qcow2"), "size": "1M"}),
    );
    assert_eq!(out["format"], "qcow2");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "blocked for {:?}",
        t.elapsed()
    );
    // A second request reusing the in-flight id is refused, and the first keeps running.
    s.send_request(
        &id,
        "tools/call",
        json!({"name": "image_info", "arguments": {"path": s.tmp.file("meanwhile.qcow2")}}),
    );
    let (resp, _) = s.read_until_id(&id, RESPONSE_TIMEOUT);
    assert_eq!(resp["error"]["code"], -32600, "{resp}");
    s.notify("notifications/cancelled", json!({"requestId": id}));
    s.assert_alive();
}

#[test]
fn eof_with_a_call_in_flight_still_exits_zero_in_bounded_time() {
    let http = slow_http();
    let mut s = Server::ready();
    let dir = s.tmp.subdir("dl");
    let dest = dir.join("slow.img");
    start_slow_download(&mut s, &http, &json!(1000), dest.to_str().unwrap());
    let t = Instant::now();
    s.close_stdin();
    let st = s
        .wait_exit(Duration::from_secs(10))
        .expect("no exit after EOF");
    assert_eq!(st.code(), Some(0), "{st:?}");
    assert!(
        t.elapsed() < Duration::from_secs(7),
        "took {:?}",
        t.elapsed()
    );
    assert!(
        list_dir(&dir).is_empty(),
        "left behind: {:?}",
        list_dir(&dir)
    );
}

#[test]
fn sigterm_with_a_call_in_flight_exits_zero_and_cleans_up() {
    let http = slow_http();
    let mut s = Server::ready();
    let dir = s.tmp.subdir("dl");
    let dest = dir.join("slow.img");
    start_slow_download(&mut s, &http, &json!(2000), dest.to_str().unwrap());
    let t = Instant::now();
    // SAFETY: kill(2) on our own child's pid.
    let rc = unsafe { libc::kill(s.pid() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let st = s
        .wait_exit(Duration::from_secs(10))
        .expect("no exit after SIGTERM");
    assert_eq!(st.code(), Some(0), "{st:?}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    assert!(
        list_dir(&dir).is_empty(),
        "left behind: {:?}",
        list_dir(&dir)
    );
}

/// Regression: a download whose server goes silent mid-body blocked in a socket read for up
/// to ureq's 60 s read timeout, so a cancel was not seen and the temporary `.part` file stayed
/// (for good when the server exited meanwhile).
#[test]
fn cancel_is_honoured_while_the_http_server_is_silent() {
    let http = HttpServer::start(vec![(
        "stall.img",
        Route::Stall {
            claimed: 1 << 20,
            data: std::sync::Arc::new(pseudo_random(64 * 1024, 1)),
            hold: Duration::from_secs(30),
        },
    )]);
    let mut s = Server::ready();
    let dir = s.tmp.subdir("dl");
    let id = json!("stalled");
    s.send_request(
        &id,
        "tools/call",
        json!({"name": "image_download",
               "arguments": {"url": http.url("stall.img"),
                             "path": dir.join("stall.img").to_str().unwrap()}}),
    );
    // Wait for the temporary file to appear (bytes are flowing), then cancel.
    let deadline = Instant::now() + Duration::from_secs(10);
    while list_dir(&dir).is_empty() {
        assert!(Instant::now() < deadline, "download never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    s.notify("notifications/cancelled", json!({"requestId": id}));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !list_dir(&dir).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let others = s.assert_alive();
    assert!(
        others.iter().all(|m| m.get("id") != Some(&id)),
        "{others:?}"
    );
    assert!(
        list_dir(&dir).is_empty(),
        "still there 5 s after cancel: {:?}",
        list_dir(&dir)
    );
}

/// Every tool error carries its kind in `_meta` (a stable code a program can act on): an
/// unknown VM is not_found, a path outside the roots refused, arguments the schema or the
/// tool refuses invalid_argument.
#[test]
fn tool_errors_say_their_kind() {
    let mut s = Server::ready();
    s.call_err_kind("vm_info", json!({"name": "no-such-vm"}), "not_found");
    s.call_err_kind("image_info", json!({"path": "/etc/passwd"}), "refused");
    s.call_err_kind("list_vms", json!({"bogus": 1}), "invalid_argument");
    s.call_err_kind(
        "vm_snapshot_create",
        json!({"name": "x", "tag": "../bad"}),
        "invalid_argument",
    );
}
