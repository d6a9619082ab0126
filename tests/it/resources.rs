//! Resources over the raw protocol: each VM's serial console log and screen at
//! `mcqemu://vm/{name}/serial` and `mcqemu://vm/{name}/screen`, in both eras; the list
//! following the VMs (handshake era: `notifications/resources/list_changed`; 2026-07-28:
//! `subscriptions/listen` streams, acknowledged, tagged with their id, cancelled by the client,
//! closed with a result at shutdown); a VM that is gone is a clear error; a wedged monitor
//! cannot hold up a screen read. Also `initialize` with the 2026-07-28 envelope and no
//! `protocolVersion`: -32601, as for the other methods that revision removed.
//!
//! One test guest (the tiny Linux, `cpus: 1`) for the whole file.

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::b64::b64_decode;
use crate::common::*;
use serde_json::{json, Value};

const LAUNCH: Duration = Duration::from_secs(120);
const STEP: Duration = Duration::from_secs(60);
/// A screen read answers within this, whatever the VM does (the server's budget is 4 s).
const READ_LIMIT: Duration = Duration::from_secs(6);
/// A list change made by another server is noticed within this (the watch looks twice a second).
const NOTICE_LIMIT: Duration = Duration::from_secs(5);
const META_SUB: &str = "io.modelcontextprotocol/subscriptionId";

fn envelope() -> Value {
    json!({ META_VERSION: STATELESS, META_CAPS: {} })
}

/// `params` with the 2026-07-28 envelope added.
fn modern(mut params: Value) -> Value {
    params["_meta"] = envelope();
    params
}

fn serial_uri(name: &str) -> String {
    format!("mcqemu://vm/{name}/serial")
}

fn screen_uri(name: &str) -> String {
    format!("mcqemu://vm/{name}/screen")
}

fn metrics_uri(name: &str) -> String {
    format!("mcqemu://vm/{name}/metrics")
}

/// The VMs' resources listed (the live view, `ui://mcqemu/view`, is always there, last).
fn uris(list: &Value) -> Vec<String> {
    let all: Vec<String> = list["resources"]
        .as_array()
        .unwrap_or_else(|| panic!("no resources array: {list}"))
        .iter()
        .map(|r| r["uri"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        all.last().map(String::as_str),
        Some("ui://mcqemu/view"),
        "{list}"
    );
    all[..all.len() - 1].to_vec()
}

/// Checks a `resources/read` result of a screen: one PNG blob that decodes; its size.
fn check_screen(r: &Value, uri: &str) -> (u32, u32) {
    let contents = r["contents"].as_array().expect("contents");
    assert_eq!(contents.len(), 1, "{r}");
    let c = &contents[0];
    assert_eq!(c["uri"], uri, "{c}");
    assert_eq!(c["mimeType"], "image/png", "{c}");
    assert!(c.get("text").is_none(), "a blob, not text: {c}");
    let png = b64_decode(c["blob"].as_str().expect("blob"));
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    let mut reader = png::Decoder::new(std::io::Cursor::new(&png[..]))
        .read_info()
        .expect("the PNG header decodes");
    let mut buf = vec![0; reader.output_buffer_size().expect("buffer size")];
    let info = reader.next_frame(&mut buf).expect("the PNG decodes");
    assert!(info.width > 0 && info.height > 0);
    (info.width, info.height)
}

/// The serial log's text from a `resources/read` result.
fn serial_text(r: &Value, uri: &str) -> String {
    let c = &r["contents"][0];
    assert_eq!(c["uri"], uri, "{r}");
    assert_eq!(c["mimeType"], "text/plain", "{r}");
    c["text"].as_str().expect("text").to_string()
}

/// Reads until `want` messages matching `is` arrived (bounded); returns them, and puts the
/// others back.
fn wait_for(
    s: &mut Server,
    want: usize,
    within: Duration,
    is: impl Fn(&Value) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + within;
    let (mut hits, mut others) = (Vec::new(), Vec::new());
    while hits.len() < want {
        let left = deadline.saturating_duration_since(Instant::now());
        match s.recv(left) {
            Some(m) if is(&m) => hits.push(m),
            Some(m) => others.push(m),
            None => panic!(
                "{} of {want} awaited messages within {within:?}; got {hits:?}; others {others:?}",
                hits.len()
            ),
        }
    }
    s.unread(others);
    hits
}

fn is_handshake_change(m: &Value) -> bool {
    m["method"] == "notifications/resources/list_changed" && m["params"].get("_meta").is_none()
}

fn is_stream_change(m: &Value, id: &str) -> bool {
    m["method"] == "notifications/resources/list_changed" && m["params"]["_meta"][META_SUB] == id
}

// ---------------------------------------------------------------------------------------------
// No VM needed

#[test]
fn initialize_with_the_2026_envelope_and_no_protocol_version_is_32601() {
    let mut s = Server::start();
    let e = s.error(
        "initialize",
        json!({"_meta": envelope(), "capabilities": {},
               "clientInfo": {"name": "t", "version": "0"}}),
    );
    assert_eq!(e["code"], -32601, "{e}");
    let msg = e["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("initialize")
            && msg.contains("server/discover")
            && msg.contains("protocolVersion"),
        "{msg}"
    );
    let supported = e["data"]["supported"].as_array().expect("data.supported");
    assert!(
        supported.contains(&json!(STATELESS)) && supported.contains(&json!(NEWEST)),
        "{e}"
    );
    // Nothing was opened by it: the connection still serves either era.
    let r = s.result("server/discover", json!({"_meta": envelope()}));
    assert_eq!(r["resultType"], "complete", "{r}");
    let r = s.initialize(NEWEST);
    assert_eq!(r["protocolVersion"], NEWEST, "{r}");
    // Without the envelope, a missing protocolVersion stays a bad initialize (-32602).
    let mut s = Server::start();
    let e = s.error("initialize", json!({"capabilities": {}}));
    assert_eq!(e["code"], -32602, "{e}");
}

#[test]
fn capabilities_templates_and_missing_resources_in_both_eras() {
    let mut s = Server::start();
    let init = s.initialize(NEWEST);
    assert_eq!(
        init["capabilities"]["resources"],
        json!({"listChanged": true, "subscribe": true}),
        "{init}"
    );

    // Handshake era: no cache hints; -32002 for a resource that does not exist.
    let t = s.result("resources/templates/list", json!({}));
    let templates: Vec<&str> = t["resourceTemplates"]
        .as_array()
        .expect("resourceTemplates")
        .iter()
        .map(|t| t["uriTemplate"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        templates,
        [
            "mcqemu://vm/{name}/serial",
            "mcqemu://vm/{name}/screen",
            "mcqemu://vm/{name}/metrics"
        ],
        "{t}"
    );
    for t in t["resourceTemplates"].as_array().unwrap() {
        assert!(t["name"].is_string() && t["mimeType"].is_string(), "{t}");
    }
    assert!(
        t.get("ttlMs").is_none() && t.get("resultType").is_none(),
        "{t}"
    );
    let list = s.result("resources/list", json!({}));
    assert!(uris(&list).is_empty(), "{list}");
    let resp = s.request("resources/read", json!({"uri": serial_uri("ghost")}));
    assert_eq!(error_code(&resp), -32002, "{resp}");
    assert_eq!(resp["error"]["data"]["uri"], serial_uri("ghost"));
    let msg = resp["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("\"ghost\"") && msg.contains("launch_vm"),
        "{msg}"
    );
    for uri in [
        "file:///etc/passwd",
        "mcqemu://vm/../screen",
        "mcqemu://vm/x/disk",
    ] {
        let resp = s.request("resources/read", json!({"uri": uri}));
        assert_eq!(error_code(&resp), -32002, "{uri}: {resp}");
        let msg = resp["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("mcqemu://vm/{name}/serial"), "{msg}");
    }
    // Malformed requests are -32602.
    let resp = s.request("resources/read", json!({}));
    assert_eq!(error_code(&resp), -32602, "{resp}");
    let resp = s.request("resources/list", json!({"cursor": "c1"}));
    assert_eq!(error_code(&resp), -32602, "{resp}");
    // A resource that cannot be followed (no such VM) is refused with a reason.
    let resp = s.request("resources/subscribe", json!({"uri": serial_uri("ghost")}));
    assert_eq!(error_code(&resp), -32602, "{resp}");
    assert!(
        resp["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("cannot be subscribed")),
        "{resp}"
    );
    // Not in this era, or in none.
    for method in ["subscriptions/listen", "prompts/list"] {
        let resp = s.request(
            method,
            json!({"uri": serial_uri("ghost"), "notifications": {}}),
        );
        assert_eq!(error_code(&resp), -32601, "{method}: {resp}");
    }

    // 2026-07-28: discover declares the capability; cache hints; -32602 for a missing one.
    let d = s.result("server/discover", json!({"_meta": envelope()}));
    assert_eq!(
        d["capabilities"]["resources"],
        json!({"listChanged": true, "subscribe": true}),
        "{d}"
    );
    let t = s.result("resources/templates/list", modern(json!({})));
    assert_eq!(t["resultType"], "complete");
    assert_eq!(t["cacheScope"], "public", "{t}");
    assert!(t["ttlMs"].as_u64().is_some_and(|ms| ms > 0), "{t}");
    let list = s.result("resources/list", modern(json!({})));
    assert!(uris(&list).is_empty(), "{list}");
    assert_eq!(
        (list["ttlMs"].as_u64(), list["cacheScope"].as_str()),
        (Some(0), Some("private"))
    );
    assert_eq!(list["_meta"][META_SERVER_INFO]["name"], "mcqemu");
    let resp = s.request(
        "resources/read",
        modern(json!({"uri": screen_uri("ghost")})),
    );
    assert_eq!(error_code(&resp), -32602, "{resp}");
    assert_eq!(resp["error"]["data"]["uri"], screen_uri("ghost"));
    for method in ["resources/subscribe", "resources/unsubscribe"] {
        let resp = s.request(method, modern(json!({"uri": screen_uri("ghost")})));
        assert_eq!(error_code(&resp), -32601, "{method}: {resp}");
    }
    // A listen request needs its filter.
    let resp = s.request("subscriptions/listen", modern(json!({})));
    assert_eq!(error_code(&resp), -32602, "{resp}");
    s.assert_alive();
}

/// A monitor socket that accepts connections and never says a word (no QMP greeting).
struct SilentMonitor {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl SilentMonitor {
    fn start(path: PathBuf) -> SilentMonitor {
        let listener = UnixListener::bind(&path).expect("bind the silent monitor");
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let halt = Arc::clone(&stop);
        let acceptor = std::thread::spawn(move || {
            let mut held: Vec<UnixStream> = Vec::new();
            while !halt.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => held.push(conn),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        SilentMonitor {
            path,
            stop,
            acceptor: Some(acceptor),
        }
    }
}

impl Drop for SilentMonitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
    }
}

fn write_attached(state: &Path, name: &str, sock: &Path, pid: i32) {
    let reg = json!({"version": 1, "vms": {name: {
        "name": name, "source": "attached", "pid": pid,
        "qmp_socket": sock.to_str().unwrap(), "arch": "x86_64"}}});
    std::fs::write(state.join("vms.json"), reg.to_string()).expect("write vms.json");
}

#[test]
fn a_silent_monitor_cannot_hold_up_a_screen_read() {
    let dir = short_runtime_dir("res-silent");
    let state = dir.subdir("s");
    let runtime = dir.subdir("r");
    let monitor = SilentMonitor::start(runtime.join("hung.sock"));
    let sleeper = StandIn::start();
    write_attached(&state, "hung", &monitor.path, sleeper.pid());
    let mut s = Server::ready_in(&state, &runtime);

    // An attached VM has no serial log: only its screen is listed, and its serial is not found.
    let list = s.result("resources/list", json!({}));
    assert_eq!(
        uris(&list),
        [screen_uri("hung"), metrics_uri("hung")],
        "{list}"
    );
    let resp = s.request("resources/read", json!({"uri": serial_uri("hung")}));
    assert_eq!(error_code(&resp), -32002, "{resp}");
    let msg = resp["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("attach_vm") && msg.contains(&screen_uri("hung")),
        "{msg}"
    );

    // The screen read ends in time with a clear error, and other requests are not held up.
    let id = json!("shot");
    let t = Instant::now();
    s.send_request(&id, "resources/read", json!({"uri": screen_uri("hung")}));
    s.assert_alive();
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "a ping waited for the read"
    );
    let (resp, _) = s.read_until_id(&id, READ_LIMIT);
    let took = t.elapsed();
    assert!(took <= READ_LIMIT, "the screen read took {took:?}");
    assert_eq!(error_code(&resp), -32603, "{resp}");
    assert_eq!(resp["error"]["data"]["uri"], screen_uri("hung"));
    let msg = resp["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("\"hung\"") && msg.contains("stop_vm"), "{msg}");
    s.assert_alive();
}

// ---------------------------------------------------------------------------------------------
// A running test guest

#[test]
fn a_vm_s_console_and_screen_and_a_list_that_follows_the_vms() {
    let g = test_guest();
    let lab = Lab::without_server("res", 1);
    let mut a = lab.spawn_server();

    // Two listen streams on the same connection: one asks for resource list changes (and tool
    // list changes, which the server never has), one for nothing the server offers.
    a.send_request(
        &json!("listen-1"),
        "subscriptions/listen",
        modern(
            json!({"notifications": {"resourcesListChanged": true, "toolsListChanged": true,
                                        "resourceSubscriptions": [serial_uri("box")]}}),
        ),
    );
    a.send_request(
        &json!(77),
        "subscriptions/listen",
        modern(json!({"notifications": {"promptsListChanged": true}})),
    );
    let acks = wait_for(&mut a, 2, STEP, |m| {
        m["method"] == "notifications/subscriptions/acknowledged"
    });
    let ack = |id: Value| {
        acks.iter()
            .find(|m| m["params"]["_meta"][META_SUB] == id)
            .unwrap_or_else(|| panic!("no acknowledgment for {id}: {acks:?}"))
            .clone()
    };
    assert_eq!(
        ack(json!("listen-1"))["params"]["notifications"],
        json!({"resourcesListChanged": true})
    );
    assert_eq!(ack(json!(77))["params"]["notifications"], json!({}));
    // A second stream under an id still open is refused.
    a.send_request(
        &json!("listen-1"),
        "subscriptions/listen",
        modern(json!({"notifications": {"resourcesListChanged": true}})),
    );
    let (resp, _) = a.read_until_id(&json!("listen-1"), STEP);
    assert_eq!(error_code(&resp), -32600, "{resp}");

    // A launch: both kinds of list_changed arrive, before the launch's own answer.
    let name = "box";
    let args = json!({"name": name, "kernel": g.kernel, "initrd": g.initrd, "append": g.append,
                      "memory_mb": 128, "cpus": 1, "no_net": true});
    let (resp, before) = a
        .try_request_within(
            "tools/call",
            json!({"name": "launch_vm", "arguments": args}),
            LAUNCH,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    lab.track(&resp["result"]);
    let launched = tool_ok(&resp["result"], "launch_vm");
    let log = launched["serial_log"]
        .as_str()
        .expect("serial_log")
        .to_string();
    assert_eq!(
        before.iter().filter(|m| is_handshake_change(m)).count(),
        1,
        "{before:?}"
    );
    assert_eq!(
        before
            .iter()
            .filter(|m| is_stream_change(m, "listen-1"))
            .count(),
        1,
        "{before:?}"
    );
    assert!(
        before.iter().all(|m| m["params"]["_meta"][META_SUB] != 77),
        "the stream that did not ask got a notification: {before:?}"
    );

    let list = a.result("resources/list", json!({}));
    assert_eq!(
        uris(&list),
        [serial_uri(name), screen_uri(name), metrics_uri(name)],
        "{list}"
    );
    let first = &list["resources"][0];
    assert_eq!(first["mimeType"], "text/plain", "{first}");
    assert!(
        first["name"].is_string() && first["title"].is_string(),
        "{first}"
    );
    assert_eq!(list["resources"][1]["mimeType"], "image/png");

    // The serial log: the guest's boot as it happens.
    let deadline = Instant::now() + STEP;
    let text = loop {
        let r = a.result("resources/read", json!({"uri": serial_uri(name)}));
        let text = serial_text(&r, &serial_uri(name));
        if text.contains("mcqemu-test-guest: ready") {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the guest never said it was ready: {text:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    // The log is far below 256 KiB: the read was all of it, and the log only grows.
    let on_disk =
        String::from_utf8_lossy(&std::fs::read(&log).expect("the serial log")).into_owned();
    assert!(
        on_disk.starts_with(&text),
        "read {text:?}, the log holds {on_disk:?}"
    );
    let r = a.result("resources/read", modern(json!({"uri": serial_uri(name)})));
    assert!(serial_text(&r, &serial_uri(name)).contains("mcqemu-test-guest: ready"));
    assert_eq!(
        (r["ttlMs"].as_u64(), r["resultType"].as_str()),
        (Some(0), Some("complete"))
    );

    // The screen, in both eras; no capture file is left behind.
    let t = Instant::now();
    let r = a.result("resources/read", json!({"uri": screen_uri(name)}));
    let (w, h) = check_screen(&r, &screen_uri(name));
    eprintln!("screen {w}x{h} read in {:?}", t.elapsed());
    let r = a.result("resources/read", modern(json!({"uri": screen_uri(name)})));
    check_screen(&r, &screen_uri(name));
    assert_eq!(r["cacheScope"], "private", "{r}");
    let left: Vec<String> = list_dir(&lab.vm_dir(name))
        .into_iter()
        .filter(|n| n.starts_with(".screenshot-"))
        .collect();
    assert!(left.is_empty(), "capture files left: {left:?}");

    // The metrics: read as JSON, and followed in both eras (the screen cannot be).
    let r = a.result("resources/read", json!({"uri": metrics_uri(name)}));
    let m: Value = serde_json::from_str(r["contents"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(m["status"], json!("running"), "{m}");
    assert!(
        m["metrics"]["rss_bytes"].as_u64().unwrap() > 16 << 20,
        "{m}"
    );
    assert_eq!(
        a.result("resources/subscribe", json!({"uri": metrics_uri(name)})),
        json!({})
    );
    let resp = a.request("resources/subscribe", json!({"uri": screen_uri(name)}));
    assert_eq!(error_code(&resp), -32602, "{resp}");
    a.send_request(
        &json!("follow"),
        "subscriptions/listen",
        modern(json!({"notifications": {
            "resourceSubscriptions": [metrics_uri(name), screen_uri(name)]}})),
    );
    let updates = wait_for(&mut a, 3, STEP, |m| {
        m["method"] == "notifications/resources/updated"
            || (m["method"] == "notifications/subscriptions/acknowledged"
                && m["params"]["_meta"][META_SUB] == json!("follow"))
    });
    let ack = updates
        .iter()
        .find(|m| m["method"] == "notifications/subscriptions/acknowledged")
        .unwrap_or_else(|| panic!("{updates:?}"));
    assert_eq!(
        ack["params"]["notifications"],
        json!({"resourceSubscriptions": [metrics_uri(name)]})
    );
    let updated: Vec<&Value> = updates
        .iter()
        .filter(|m| m["method"] == "notifications/resources/updated")
        .collect();
    assert!(
        updated
            .iter()
            .all(|m| m["params"]["uri"] == json!(metrics_uri(name))),
        "{updated:?}"
    );
    a.notify(
        "notifications/cancelled",
        modern(json!({"requestId": "follow"})),
    );
    assert_eq!(
        a.result("resources/unsubscribe", json!({"uri": metrics_uri(name)})),
        json!({})
    );

    // Another server on the same registry stops the VM (the list stays) and forgets it: this
    // server's watch notices without any request of its own.
    let mut b = lab.spawn_server();
    b.call_ok_within("stop_vm", json!({"name": name, "force": true}), STEP);
    let r = a.request("resources/read", json!({"uri": screen_uri(name)}));
    assert_eq!(error_code(&r), -32603, "a stopped VM's screen: {r}");
    let msg = r["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("launch_vm"), "{msg}");
    let stray: Vec<Value> = a
        .collect_for(Duration::from_millis(1500))
        .into_iter()
        .filter(|m| m["method"] == "notifications/resources/list_changed")
        .collect();
    assert!(stray.is_empty(), "a stop changes no list: {stray:?}");
    b.call_ok("forget_vm", json!({"name": name}));
    let t = Instant::now();
    wait_for(&mut a, 2, NOTICE_LIMIT, |m| {
        is_handshake_change(m) || is_stream_change(m, "listen-1")
    });
    eprintln!("a forget by another server noticed in {:?}", t.elapsed());

    // Gone: empty list, and reads that say so in each era's words.
    assert_eq!(
        uris(&a.result("resources/list", json!({}))),
        Vec::<String>::new()
    );
    for uri in [serial_uri(name), screen_uri(name)] {
        let resp = a.request("resources/read", json!({"uri": uri}));
        assert_eq!(error_code(&resp), -32002, "{resp}");
        let msg = resp["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("\"box\"") && msg.contains("list_vms"), "{msg}");
        let resp = a.request("resources/read", modern(json!({"uri": uri})));
        assert_eq!(error_code(&resp), -32602, "{resp}");
        assert_eq!(resp["error"]["data"]["uri"], json!(uri));
    }

    // The client ends listen-1 (no answer); at EOF the server closes 77 with its result.
    a.notify("notifications/cancelled", json!({"requestId": "listen-1"}));
    a.assert_alive();
    a.close_stdin();
    let last = a.collect_for(Duration::from_secs(3));
    let answers: Vec<&Value> = last.iter().filter(|m| m.get("method").is_none()).collect();
    assert_eq!(answers.len(), 1, "{last:?}");
    assert_eq!(answers[0]["id"], 77, "{last:?}");
    assert_eq!(answers[0]["result"]["resultType"], "complete");
    assert_eq!(answers[0]["result"]["_meta"][META_SUB], 77);
    assert_eq!(
        answers[0]["result"]["_meta"][META_SERVER_INFO]["name"],
        "mcqemu"
    );
}
