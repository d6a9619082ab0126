//! `mcqemu view NAME [--open] [--port N]`: the live view's page on local HTTP, for clients that
//! render no MCP Apps (Claude Code). One URL carries a 256-bit secret in its path; a request
//! without it is refused (404), as is one whose Host is not this listener's (403: DNS
//! rebinding), and no CORS header is ever sent. The page is the MCP App's, with its bridge
//! swapped for `fetch` to `SECRET/call`, which runs only the view's tools, only for this VM.
//! Synchronous: std's TcpListener, a thread per connection, bounded connections and requests.

#![allow(clippy::print_stdout)] // the URL is this subcommand's output

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::mcp::call as mcp_call;
use crate::mcp::tool::{error_result, ToolCtx, ToolError};
use crate::tools;

/// Most connections served at once (frame long polls hold one each).
const MAX_CONNECTIONS: usize = 16;
/// Longest request head.
const MAX_HEAD: usize = 16 * 1024;
/// Longest request body (a batch of input events).
const MAX_BODY: usize = 1024 * 1024;
/// The tools the page may call.
const VIEW_TOOLS: &[&str] = &[
    "vm_view",
    "vm_view_frame",
    "vm_view_input",
    "vm_takeover",
    "vm_serial_read",
    "vm_serial_write",
];

/// What every connection shares.
struct Served {
    vm: String,
    secret: String,
    port: u16,
    busy: AtomicUsize,
    /// Holds taken through this server, released when it ends.
    holds: Mutex<Vec<String>>,
}

/// Runs the subcommand; returns the exit code.
pub fn main(args: &[String]) -> i32 {
    let mut name = None;
    let mut open = false;
    let mut port = 0u16;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--open" => open = true,
            "--port" => match it.next().and_then(|p| p.parse().ok()) {
                Some(p) => port = p,
                None => return fail("--port needs a number"),
            },
            other if name.is_none() && !other.starts_with('-') => name = Some(other.to_string()),
            other => return fail(&format!("unknown view option {other:?}")),
        }
    }
    let Some(vm) = name else {
        return fail("usage: mcqemu view NAME [--open] [--port N]");
    };
    if let Err(e) = crate::ops::vm::records::lookup(&vm) {
        return fail(&e.to_string());
    }
    let listener = match TcpListener::bind(("127.0.0.1", port)) {
        Ok(l) => l,
        Err(e) => return fail(&format!("cannot listen on 127.0.0.1:{port}: {e}")),
    };
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(port);
    let secret = match crate::ops::vm::hold::new_secret() {
        Ok(s) => s,
        Err(e) => return fail(&e.to_string()),
    };
    let url = format!("http://127.0.0.1:{port}/{secret}/");
    println!("{url}");
    let _ = std::io::stdout().flush();
    if open {
        let _ = std::process::Command::new("xdg-open")
            .arg(&url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
    }
    let served = Arc::new(Served {
        vm,
        secret,
        port,
        busy: AtomicUsize::new(0),
        holds: Mutex::new(Vec::new()),
    });
    release_on_exit(served.clone());
    for conn in listener.incoming().flatten() {
        if served.busy.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            served.busy.fetch_sub(1, Ordering::SeqCst);
            let mut c = conn;
            let _ = c.write_all(&reply(503, "text/plain", b"too many connections"));
            continue;
        }
        let s = served.clone();
        let spawned = std::thread::Builder::new()
            .name("view-conn".into())
            .spawn(move || {
                // Counted down on every way out, a panic included.
                let _busy = Busy(&s.busy);
                handle(&s, conn);
            });
        if spawned.is_err() {
            served.busy.fetch_sub(1, Ordering::SeqCst);
        }
    }
    0
}

/// One connection in the count of those served at once.
struct Busy<'a>(&'a AtomicUsize);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn fail(msg: &str) -> i32 {
    eprintln!("mcqemu view: {msg}");
    2
}

/// On SIGINT, SIGTERM or SIGHUP: hands back every hold taken through this server, then exits.
fn release_on_exit(served: Arc<Served>) {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else {
        return;
    };
    let _ = std::thread::Builder::new()
        .name("view-signals".into())
        .spawn(move || {
            if signals.forever().next().is_some() {
                let holds = served.holds.lock().map(|h| h.clone()).unwrap_or_default();
                for h in holds {
                    let _ = crate::ops::vm::hold::release(&served.vm, &h);
                }
                std::process::exit(0);
            }
        });
}

/// A parsed request.
struct Request {
    method: String,
    path: String,
    host: String,
    body: Vec<u8>,
}

fn handle(s: &Served, conn: TcpStream) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(30)));
    let mut out = match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    };
    let answer = match read_request(conn) {
        Ok(req) => route(s, &req),
        Err(code) => reply(code, "text/plain", b"bad request"),
    };
    let _ = out.write_all(&answer);
}

fn read_request(conn: TcpStream) -> Result<Request, u16> {
    let mut r = BufReader::new(conn).take(MAX_HEAD as u64 + MAX_BODY as u64);
    let mut head = Vec::new();
    loop {
        let mut line = Vec::new();
        let n = r.read_until(b'\n', &mut line).map_err(|_| 400u16)?;
        if n == 0 {
            return Err(400);
        }
        head.extend_from_slice(&line);
        if head.len() > MAX_HEAD {
            return Err(431);
        }
        if line == b"\r\n" || line == b"\n" {
            break;
        }
    }
    let text = String::from_utf8(head).map_err(|_| 400u16)?;
    let mut lines = text.lines();
    let mut first = lines.next().unwrap_or_default().split(' ');
    let (method, path) = (
        first.next().unwrap_or_default(),
        first.next().unwrap_or_default(),
    );
    let mut host = String::new();
    let mut length = 0usize;
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let v = v.trim();
        if k.eq_ignore_ascii_case("host") {
            host = v.to_string();
        } else if k.eq_ignore_ascii_case("content-length") {
            length = v.parse().map_err(|_| 400u16)?;
        }
    }
    if length > MAX_BODY {
        return Err(413);
    }
    let mut body = vec![0u8; length];
    r.read_exact(&mut body).map_err(|_| 400u16)?;
    Ok(Request {
        method: method.to_string(),
        path: path.to_string(),
        host,
        body,
    })
}

fn route(s: &Served, req: &Request) -> Vec<u8> {
    let hosts = [
        format!("127.0.0.1:{}", s.port),
        format!("localhost:{}", s.port),
    ];
    if !hosts.iter().any(|h| h.eq_ignore_ascii_case(&req.host)) {
        return reply(403, "text/plain", b"wrong Host");
    }
    let Some(rest) = req.path.strip_prefix('/') else {
        return reply(404, "text/plain", b"not found");
    };
    // By `get`: a path is any bytes a local client sends, and a split inside a character
    // would panic.
    let n = s.secret.len();
    let (Some(given), Some(tail)) = (rest.get(..n), rest.get(n..)) else {
        return reply(404, "text/plain", b"not found");
    };
    if !crate::ops::vm::hold::same(given, &s.secret) {
        return reply(404, "text/plain", b"not found");
    }
    match (req.method.as_str(), tail) {
        ("GET", "/") => {
            let config = json!({"name": s.vm, "base": format!("/{}/", s.secret)});
            let page =
                tools::presets::VIEW_PAGE.replacen("/*MCQEMU_CONFIG*/null", &config.to_string(), 1);
            reply(200, "text/html; charset=utf-8", page.as_bytes())
        }
        ("POST", "/call") => {
            let result = call(s, &req.body);
            reply(200, "application/json", result.to_string().as_bytes())
        }
        _ => reply(404, "text/plain", b"not found"),
    }
}

/// Runs one of the view's tools for this server's VM (through the one call path,
/// `mcp::call`, limited to the view's tools); the result is a `CallToolResult`.
fn call(s: &Served, body: &[u8]) -> Value {
    let fail = |m: String| error_result(&ToolError::new(m));
    let Ok(req) = serde_json::from_slice::<Value>(body) else {
        return fail("the body is not JSON".into());
    };
    let name = req["name"].as_str().unwrap_or_default();
    if !VIEW_TOOLS.contains(&name) {
        return fail(format!("{name:?} is not a tool of the view"));
    }
    let args: Map<String, Value> = match &req["arguments"] {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    if args.get("name").and_then(Value::as_str) != Some(s.vm.as_str()) {
        return fail(format!("this view serves VM {:?} only", s.vm));
    }
    match mcp_call::call(tools::ALL, name, &ToolCtx::detached(), args) {
        Ok(out) => {
            if name == "vm_takeover" {
                if let (Some(h), Ok(mut holds)) = (out.structured["hold"].as_str(), s.holds.lock())
                {
                    holds.push(h.to_string());
                }
            }
            out.to_result()
        }
        Err(e) => error_result(&e),
    }
}

fn reply(code: u16, ctype: &str, body: &[u8]) -> Vec<u8> {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nReferrer-Policy: no-referrer\r\nX-Frame-Options: DENY\r\n\
         X-Content-Type-Options: nosniff\r\nContent-Security-Policy: default-src 'none'; \
         script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; connect-src \
         'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'\r\n\
         Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served() -> Served {
        Served {
            vm: "vm1".into(),
            secret: "s".repeat(64),
            port: 4242,
            busy: AtomicUsize::new(0),
            holds: Mutex::new(Vec::new()),
        }
    }

    fn status(b: &[u8]) -> u16 {
        String::from_utf8_lossy(b)[9..12].parse().unwrap()
    }

    fn req(method: &str, path: &str, host: &str) -> Request {
        Request {
            method: method.into(),
            path: path.into(),
            host: host.into(),
            body: Vec::new(),
        }
    }

    #[test]
    fn only_the_secret_path_on_our_own_host_is_served() {
        let s = served();
        let good = format!("/{}/", "s".repeat(64));
        assert_eq!(
            status(&route(&s, &req("GET", &good, "127.0.0.1:4242"))),
            200
        );
        assert_eq!(
            status(&route(&s, &req("GET", &good, "localhost:4242"))),
            200
        );
        assert_eq!(
            status(&route(&s, &req("GET", &good, "evil.example:4242"))),
            403
        );
        assert_eq!(status(&route(&s, &req("GET", &good, "127.0.0.1:80"))), 403);
        assert_eq!(status(&route(&s, &req("GET", "/", "127.0.0.1:4242"))), 404);
        let wrong = format!("/{}/", "t".repeat(64));
        assert_eq!(
            status(&route(&s, &req("GET", &wrong, "127.0.0.1:4242"))),
            404
        );
        let page = route(&s, &req("GET", &good, "127.0.0.1:4242"));
        let text = String::from_utf8_lossy(&page);
        assert!(text.contains(r#"const CONFIG = {"name":"vm1","base":"/ss"#));
        assert!(!text.contains("Access-Control"));
    }

    #[test]
    fn the_page_calls_only_the_view_tools_for_its_own_vm() {
        let s = served();
        let r = call(
            &s,
            br#"{"name": "launch_vm", "arguments": {"name": "vm1"}}"#,
        );
        assert_eq!(r["isError"], json!(true));
        let r = call(
            &s,
            br#"{"name": "vm_view", "arguments": {"name": "other"}}"#,
        );
        assert!(
            r["content"][0]["text"]
                .as_str()
                .unwrap()
                .contains("vm1 only")
                || r["content"][0]["text"]
                    .as_str()
                    .unwrap()
                    .contains("\"vm1\" only")
        );
    }
}
