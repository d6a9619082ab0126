//! The live view over MCP, against the built binary and a real VM (the test guest), without a
//! browser: the MCP Apps declarations (the `ui://mcqemu/view` resource, `_meta.ui` on the
//! tools, the extension in the capabilities), a person's hold (vm_takeover: the agent's input
//! tools refuse, in a second server too; a release needs the secret), the view's own frames
//! and input (typed text reaching the guest's console exactly), and `mcqemu view` (the secret
//! URL, wrong secrets and Hosts refused, the view's tools only).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::view::{boot_test_sandbox, finish_tty_reader, spawn_view, start_tty_reader};
use crate::common::*;
use serde_json::{json, Value};

const STEP: Duration = Duration::from_secs(60);

/// The MCP Apps declarations: resource, tool `_meta`, capability.
fn declarations(s: &mut Server) {
    let tools = s.request("tools/list", json!({}))["result"]["tools"].clone();
    let tool = |n: &str| {
        tools
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == n)
            .unwrap_or_else(|| panic!("no tool {n}"))
            .clone()
    };
    for n in [
        "vm_screenshot",
        "vm_screen_wait",
        "launch_vm",
        "sandbox_vm",
        "sandbox_fork",
        "vm_view",
    ] {
        assert_eq!(
            tool(n)["_meta"]["ui"]["resourceUri"],
            json!("ui://mcqemu/view"),
            "{n}"
        );
    }
    for n in ["vm_view_frame", "vm_view_input"] {
        assert_eq!(tool(n)["_meta"]["ui"]["visibility"], json!(["app"]), "{n}");
    }
    assert_eq!(
        tool("vm_view_frame")["annotations"]["readOnlyHint"],
        json!(true)
    );
    assert!(tool("guest_exec").get("_meta").is_none());
    let listed = s.request("resources/list", json!({}))["result"]["resources"].clone();
    assert!(
        listed.as_array().unwrap().iter().any(|r| r["uri"] == "ui://mcqemu/view"
            && r["mimeType"] == "text/html;profile=mcp-app"),
        "{listed}"
    );
    let read = s.request("resources/read", json!({"uri": "ui://mcqemu/view"}));
    let c = &read["result"]["contents"][0];
    assert_eq!(c["mimeType"], json!("text/html;profile=mcp-app"), "{read}");
    let page = c["text"].as_str().unwrap();
    assert!(page.contains("ui/initialize") && page.len() < 512 * 1024);
    // Self-contained: nothing fetched from elsewhere.
    for needle in ["src=\"http", "href=\"http", "<script src", "<link "] {
        assert!(!page.contains(needle), "the page loads {needle}");
    }
}

fn refused(s: &mut Server, tool: &str, args: Value) -> String {
    let e = s.call_err(tool, args);
    assert!(e.contains("a person has taken over"), "{tool}: {e}");
    e
}

#[test]
fn a_person_takes_over_types_and_hands_back() {
    let mut lab = Lab::new("view");
    declarations(lab.srv());
    let name = "lv";
    boot_test_sandbox(&mut lab, name);
    let s = lab.srv();

    // The view's first frame, then a long poll that comes back unchanged when nothing moves.
    let f = s.call_tool_within(
        "vm_view_frame",
        json!({"name": name, "max_width": 400}),
        STEP,
    );
    let sc = tool_ok(&f, "vm_view_frame");
    assert_eq!(sc["changed"], json!(true), "{sc}");
    assert!(sc["width"].as_u64().unwrap() <= 400, "{sc}");
    assert!(f["content"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["type"] == "image"));

    // Only the cursor blinks (the test guest's kernel draws nothing on the VGA screen:
    // SeaBIOS's last lines stay): after the view has seen it blink (at most three frames), no
    // frame goes out in 5 s. The desktop test checks that a real change still goes out.
    let (learning, window, _) =
        crate::common::view::frames_while_still(s, name, Duration::from_secs(3));
    eprintln!(
        "vm_view_frame on a blinking console: {learning} frames while learning, {window} in 5 s"
    );
    assert!(
        (2..=3).contains(&learning),
        "the cursor did not blink as expected, or the blink was not learned: {learning} frames"
    );
    assert_eq!(window, 0, "frames sent for a blinking cursor");

    let t = tool_ok(
        &s.call_tool_within("vm_takeover", json!({"name": name}), STEP),
        "vm_takeover",
    );
    let secret = t["hold"].as_str().unwrap().to_string();
    assert_eq!(secret.len(), 64, "{t}");
    let info = s.call_ok("vm_info", json!({"name": name}));
    assert!(info["held"]["since_iso"].is_string(), "{info}");
    assert!(
        !info.to_string().contains(&secret),
        "vm_info shows the secret"
    );
    let listed = s.call_ok("list_vms", json!({}));
    assert!(listed.to_string().contains("since_iso"), "{listed}");

    let e = refused(s, "vm_type_text", json!({"name": name, "text": "x"}));
    assert!(
        e.contains("vm_screenshot") && e.contains("vm_screen_wait"),
        "{e}"
    );
    refused(s, "vm_click", json!({"name": name, "x": 1, "y": 1}));
    refused(s, "vm_send_keys", json!({"name": name, "keys": ["ret"]}));
    refused(s, "vm_serial_write", json!({"name": name, "text": "x"}));
    // The agent's other tools still work.
    s.call_ok("guest_exec", json!({"name": name, "command": "true"}));
    // A second server on the same registry sees the hold.
    let mut other = lab.spawn_server();
    refused(
        &mut other,
        "vm_mouse_move",
        json!({"name": name, "dx": 1, "dy": 1}),
    );
    drop(other);
    let s = lab.srv();

    // The agent cannot end the person's hold.
    let e = s.call_err("vm_takeover", json!({"name": name, "release": true}));
    assert!(e.contains("secret"), "{e}");
    let e = s.call_err(
        "vm_takeover",
        json!({"name": name, "release": true, "hold": "0".repeat(64)}),
    );
    assert!(e.contains("not the secret"), "{e}");
    let e = s.call_err(
        "vm_view_input",
        json!({"name": name, "events": [{"type": "text", "text": "x"}]}),
    );
    assert!(e.contains("secret"), "{e}");

    // The view's input passes the hold: typed text and a chord reach the guest exactly.
    let reader = start_tty_reader(s, name, "view1");
    let typed = "Hello, view! ~`|\\ \"quoted\" 0123";
    // (call_keeping: the reader's answer may come first and must not be dropped.)
    let r = tool_ok(
        &s.call_keeping(
            "vm_view_input",
            json!({"name": name, "hold": secret, "events": [
                {"type": "keys", "keys": ["ctrl-a"]},
                {"type": "text", "text": typed}, {"type": "keys", "keys": ["ret"]}
            ]}),
            STEP,
        ),
        "vm_view_input",
    );
    assert_eq!(r["chords"], json!(2), "{r}");
    // The chord arrives as its control character (^A is no special key to a tty's line).
    assert_eq!(finish_tty_reader(s, &reader), format!("\u{1}{typed}"));

    // Hand back: the agent's input works again.
    let r = s.call_ok(
        "vm_takeover",
        json!({"name": name, "release": true, "hold": secret}),
    );
    assert_eq!(r["released"], json!(true), "{r}");
    let reader = start_tty_reader(s, name, "view2");
    tool_ok(
        &s.call_keeping(
            "vm_type_text",
            json!({"name": name, "text": "agent again", "enter": true}),
            STEP,
        ),
        "vm_type_text",
    );
    assert_eq!(finish_tty_reader(s, &reader), "agent again");
    assert!(s.call_ok("vm_info", json!({"name": name}))["held"].is_null());

    view_server(&lab, name);
}

/// One HTTP request; the status and body.
fn http(port: u16, method: &str, path: &str, host: &str, body: &str) -> (u16, String) {
    let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        c,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).expect("the answer");
    let status = out[9..12].parse().unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn view_server(lab: &Lab, name: &str) {
    let (mut child, url) = spawn_view(lab, name);
    let rest = url
        .strip_prefix("http://127.0.0.1:")
        .expect("a loopback URL");
    let (port, path) = rest.split_once('/').unwrap();
    let port: u16 = port.parse().unwrap();
    let secret = path.trim_end_matches('/');
    assert_eq!(secret.len(), 64, "{url}");
    let host = format!("127.0.0.1:{port}");
    let base = format!("/{secret}/");

    let (st, page) = http(port, "GET", &base, &host, "");
    assert_eq!(st, 200);
    assert!(
        page.contains(&format!("\"name\":\"{name}\"")),
        "no config in the page"
    );
    assert_eq!(http(port, "GET", "/", &host, "").0, 404);
    assert_eq!(
        http(port, "GET", &format!("/{}/", "0".repeat(64)), &host, "").0,
        404
    );
    assert_eq!(
        http(port, "GET", &base, &format!("evil.example:{port}"), "").0,
        403
    );

    let t = Instant::now();
    let call = |tool: &str, args: Value| {
        let body = json!({"name": tool, "arguments": args}).to_string();
        let (st, out) = http(port, "POST", &format!("{base}call"), &host, &body);
        assert_eq!(st, 200);
        serde_json::from_str::<Value>(&out).expect("a CallToolResult")
    };
    let f = call("vm_view_frame", json!({"name": name, "max_width": 320}));
    assert_eq!(f["isError"], json!(false), "{f}");
    assert!(f["content"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["type"] == "image"));
    eprintln!("mcqemu view: first frame in {:?}", t.elapsed());
    let other = call("launch_vm", json!({"name": name}));
    assert_eq!(other["isError"], json!(true));
    let wrong_vm = call("vm_view_frame", json!({"name": "elsewhere"}));
    assert_eq!(wrong_vm["isError"], json!(true));
    // A hold taken through the view is released when the view server ends.
    let held = call("vm_takeover", json!({"name": name}));
    assert_eq!(held["structuredContent"]["held"], json!(true), "{held}");
    // SAFETY: SIGTERM to the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    let reg: Value = serde_json::from_slice(&std::fs::read(lab.registry()).unwrap()).unwrap();
    assert!(
        reg["vms"][name].get("hold").is_none(),
        "the view's hold outlived it"
    );
}
