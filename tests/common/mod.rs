//! The end-to-end harness: runs the built `mcqemu` binary and speaks MCP to it over pipes, one
//! JSON message per line. Every wait is bounded, so a hung server fails a test instead of
//! hanging it. Shared by every file in `tests/`; not every test file uses every helper.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_mcqemu");

/// How long a test waits for one response before failing.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

/// The newest version `initialize` answers with.
pub const NEWEST: &str = "2025-11-25";

/// The stateless revision's version string.
pub const STATELESS: &str = "2026-07-28";

/// The `_meta` key carrying the protocol version in the stateless revision.
pub const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";

/// The `_meta` key carrying client capabilities (required on every 2026-07-28 request).
pub const META_CAPS: &str = "io.modelcontextprotocol/clientCapabilities";

/// The `_meta` key identifying the server on every 2026-07-28 result.
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

// ---------------------------------------------------------------------------------------------
// Temporary folders

/// A fresh folder under the system temp dir, removed (with everything in it) on drop.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates a new, empty, uniquely named folder.
    pub fn new(label: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "mcqemu-test-{label}-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir { path }
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A path inside the folder.
    pub fn join(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }

    /// A path inside the folder as a string (for tool arguments).
    pub fn file(&self, rel: &str) -> String {
        self.join(rel)
            .to_str()
            .expect("utf-8 temp path")
            .to_string()
    }

    /// Creates (if needed) and returns a subfolder.
    pub fn subdir(&self, rel: &str) -> PathBuf {
        let p = self.join(rel);
        std::fs::create_dir_all(&p).expect("create subdir");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The names in a folder, sorted (hidden files included).
pub fn list_dir(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

// ---------------------------------------------------------------------------------------------
// The MCP server under test

/// What the stdout reader thread hands over.
enum Incoming {
    /// One line that parsed as JSON.
    Msg(Value),
    /// One line that did not (the server must never write such a line).
    Garbage(String),
}

/// A running `mcqemu` serving MCP on pipes, with its own state and runtime folders.
pub struct Server {
    child: Child,
    stdin: Arc<Mutex<Option<ChildStdin>>>,
    rx: Receiver<Incoming>,
    /// Messages read while waiting for something else, not yet handed out.
    backlog: VecDeque<Value>,
    stderr: Arc<Mutex<Vec<u8>>>,
    next_id: i64,
    /// The folder holding `state/` and `runtime/`; tests put their files here too.
    pub tmp: TempDir,
}

impl Server {
    /// Starts `mcqemu` (serve mode) with a fresh state and runtime folder.
    pub fn start() -> Server {
        Server::start_with_env(&[])
    }

    /// Starts `mcqemu` with extra environment variables.
    pub fn start_with_env(env: &[(&str, &str)]) -> Server {
        let tmp = TempDir::new("srv");
        let state = tmp.subdir("state");
        let runtime = tmp.subdir("runtime");
        let mut cmd = Command::new(BIN);
        cmd.env("MCQEMU_STATE_DIR", &state)
            .env("MCQEMU_RUNTIME_DIR", &runtime)
            .env_remove("MCQEMU_TOOLS_PAGE_SIZE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn mcqemu");
        let stdout = child.stdout.take().expect("stdout");
        let stderr_pipe = child.stderr.take().expect("stderr");
        let stdin = child.stdin.take().expect("stdin");

        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let mut line = Vec::new();
                match r.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                let text = String::from_utf8_lossy(&line).into_owned();
                let msg = match serde_json::from_str::<Value>(text.trim_end()) {
                    Ok(v) => Incoming::Msg(v),
                    Err(_) => Incoming::Garbage(text),
                };
                if tx.send(msg).is_err() {
                    return;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut r = stderr_pipe;
            let mut buf = [0u8; 8192];
            loop {
                match r.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        let mut s = sink.lock().unwrap();
                        // Keep the tail only; a chatty server must not eat the test's memory.
                        if s.len() > 1 << 20 {
                            s.drain(..1 << 19);
                        }
                        s.extend_from_slice(&buf[..n]);
                    }
                }
            }
        });
        Server {
            child,
            stdin: Arc::new(Mutex::new(Some(stdin))),
            rx,
            backlog: VecDeque::new(),
            stderr,
            next_id: 1,
            tmp,
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the server wrote to stderr so far (for failure messages).
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// A fresh integer request id.
    pub fn fresh_id(&mut self) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Writes raw bytes to the server's stdin (no newline added).
    pub fn send_raw(&self, bytes: &[u8]) {
        let mut guard = self.stdin.lock().unwrap();
        let stdin = guard.as_mut().expect("stdin already closed");
        stdin.write_all(bytes).expect("write to server stdin");
        stdin.flush().expect("flush server stdin");
    }

    /// Writes raw bytes from another thread, in chunks, so a huge write cannot deadlock
    /// against the test reading responses. Join the handle before sending anything else.
    pub fn send_raw_in_background<F>(&self, produce: F) -> JoinHandle<()>
    where
        F: FnOnce(&mut dyn FnMut(&[u8])) + Send + 'static,
    {
        let stdin = Arc::clone(&self.stdin);
        std::thread::spawn(move || {
            let mut guard = stdin.lock().unwrap();
            let pipe = guard.as_mut().expect("stdin already closed");
            let mut write = |chunk: &[u8]| pipe.write_all(chunk).expect("write to server stdin");
            produce(&mut write);
            pipe.flush().expect("flush server stdin");
        })
    }

    /// Sends one JSON message as one line.
    pub fn send(&self, msg: &Value) {
        let mut line = serde_json::to_vec(msg).unwrap();
        line.push(b'\n');
        self.send_raw(&line);
    }

    /// Sends a notification (no id, no reply expected).
    pub fn notify(&self, method: &str, params: Value) {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// Sends a request with the given id without waiting for its response.
    pub fn send_request(&self, id: &Value, method: &str, params: Value) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
    }

    /// Sends a request with a fresh id and returns the whole response message (result or error).
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        self.request_full(method, params).0
    }

    /// Like [`Server::request`], also returning every other message seen while waiting.
    pub fn request_full(&mut self, method: &str, params: Value) -> (Value, Vec<Value>) {
        let id = json!(self.fresh_id());
        self.send_request(&id, method, params);
        self.read_until_id(&id, RESPONSE_TIMEOUT)
    }

    /// Sends a request and returns its `result`, failing the test on an error response.
    pub fn result(&mut self, method: &str, params: Value) -> Value {
        let resp = self.request(method, params);
        match resp.get("result") {
            Some(r) => r.clone(),
            None => panic!("{method} failed: {resp}"),
        }
    }

    /// Sends a request and returns its `error` object, failing the test on a success.
    pub fn error(&mut self, method: &str, params: Value) -> Value {
        let resp = self.request(method, params);
        match resp.get("error") {
            Some(e) => e.clone(),
            None => panic!("{method} should have failed: {resp}"),
        }
    }

    /// The next message from the server, or None when nothing arrives within `timeout`.
    pub fn recv(&mut self, timeout: Duration) -> Option<Value> {
        if let Some(v) = self.backlog.pop_front() {
            return Some(v);
        }
        match self.rx.recv_timeout(timeout) {
            Ok(Incoming::Msg(v)) => Some(v),
            Ok(Incoming::Garbage(line)) => {
                panic!("server wrote a line that is not JSON: {line:?}")
            }
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => None,
        }
    }

    /// Reads until the response with `id` arrives; returns it and every other message seen
    /// meanwhile (notifications, and responses to other ids), in arrival order. Fails the test
    /// if it does not arrive within `timeout`.
    pub fn read_until_id(&mut self, id: &Value, timeout: Duration) -> (Value, Vec<Value>) {
        let deadline = Instant::now() + timeout;
        let mut others = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let msg = match self.recv(left) {
                Some(m) => m,
                None => panic!(
                    "no response with id {id} within {timeout:?}; other messages: {others:?}; server stderr:\n{}",
                    self.stderr_text()
                ),
            };
            let is_response = msg.get("method").is_none();
            if is_response && msg.get("id") == Some(id) {
                return (msg, others);
            }
            others.push(msg);
        }
    }

    /// Everything the server sends within `window` (after what was already buffered).
    pub fn collect_for(&mut self, window: Duration) -> Vec<Value> {
        let deadline = Instant::now() + window;
        let mut out: Vec<Value> = self.backlog.drain(..).collect();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return out;
            }
            match self.rx.recv_timeout(left) {
                Ok(Incoming::Msg(v)) => out.push(v),
                Ok(Incoming::Garbage(line)) => panic!("server wrote a non-JSON line: {line:?}"),
                Err(RecvTimeoutError::Timeout) => return out,
                Err(RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(left);
                    return out;
                }
            }
        }
    }

    /// Puts messages back so the next read sees them first.
    pub fn unread(&mut self, msgs: Vec<Value>) {
        for m in msgs.into_iter().rev() {
            self.backlog.push_front(m);
        }
    }

    /// Sends a ping and checks it is answered with an empty result; returns every other
    /// message seen before the answer.
    pub fn assert_alive(&mut self) -> Vec<Value> {
        let (resp, others) = self.request_full("ping", json!({}));
        assert_eq!(resp["result"], json!({}), "ping answered wrongly: {resp}");
        assert_eq!(resp["jsonrpc"], "2.0");
        others
    }

    /// Runs the `initialize` handshake for `version` and sends `notifications/initialized`.
    /// Returns the initialize result.
    pub fn initialize(&mut self, version: &str) -> Value {
        let result = self.result(
            "initialize",
            json!({
                "protocolVersion": version,
                "capabilities": {},
                "clientInfo": {"name": "mcqemu-tests", "version": "0"}
            }),
        );
        self.notify("notifications/initialized", json!({}));
        result
    }

    /// Starts a server and initializes it with the newest version.
    pub fn ready() -> Server {
        let mut s = Server::start();
        s.initialize(NEWEST);
        s
    }

    /// Calls a tool and returns its `CallToolResult`; fails the test on a JSON-RPC error.
    pub fn call_tool(&mut self, name: &str, args: Value) -> Value {
        let resp = self.call_tool_response(name, args);
        match resp.get("result") {
            Some(r) => r.clone(),
            None => panic!("tools/call {name} gave a protocol error: {resp}"),
        }
    }

    /// Calls a tool and returns the whole response message (result or error).
    pub fn call_tool_response(&mut self, name: &str, args: Value) -> Value {
        self.request("tools/call", json!({"name": name, "arguments": args}))
    }

    /// Calls a tool that must succeed; returns its `structuredContent`.
    pub fn call_ok(&mut self, name: &str, args: Value) -> Value {
        let r = self.call_tool(name, args.clone());
        tool_ok(&r, &format!("{name} {args}"))
    }

    /// Calls a tool that must fail with `isError`; returns its error text.
    pub fn call_err(&mut self, name: &str, args: Value) -> String {
        let r = self.call_tool(name, args.clone());
        tool_err(&r, &format!("{name} {args}"))
    }

    /// Closes the server's stdin (EOF).
    pub fn close_stdin(&self) {
        self.stdin.lock().unwrap().take();
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stdin.lock().map(|mut s| s.take()).ok();
        if self.wait_exit(Duration::from_millis(500)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Checks a `CallToolResult` is a success whose text block mirrors `structuredContent`;
/// returns the structured content.
pub fn tool_ok(result: &Value, what: &str) -> Value {
    assert_eq!(
        result["isError"],
        json!(false),
        "{what} failed: {}",
        result["content"]
    );
    let structured = result
        .get("structuredContent")
        .unwrap_or_else(|| panic!("{what}: no structuredContent in {result}"))
        .clone();
    let text = result["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: no text block in {result}"));
    let parsed: Value = serde_json::from_str(text).expect("text block is JSON");
    assert_eq!(
        parsed, structured,
        "{what}: text block differs from structuredContent"
    );
    structured
}

/// Checks a `CallToolResult` is a tool error; returns its text.
pub fn tool_err(result: &Value, what: &str) -> String {
    assert_eq!(
        result["isError"],
        json!(true),
        "{what} should have failed: {result}"
    );
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: error without text: {result}"))
        .to_string()
}

// ---------------------------------------------------------------------------------------------
// The CLI

/// What a CLI run produced.
#[derive(Debug)]
pub struct CliOutput {
    /// Exit code (None when killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs `mcqemu ARGS` with state and runtime folders inside `tmp`, feeding `stdin` (None:
/// /dev/null), bounded by `timeout`.
pub fn run_cli_with(
    tmp: &TempDir,
    args: &[&str],
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> CliOutput {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env("MCQEMU_STATE_DIR", tmp.join("state"))
        .env("MCQEMU_RUNTIME_DIR", tmp.join("runtime"))
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn mcqemu");
    let writer = stdin.map(|bytes| {
        let bytes = bytes.to_vec();
        let mut pipe = child.stdin.take().expect("stdin");
        std::thread::spawn(move || {
            let _ = pipe.write_all(&bytes);
        })
    });
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut s);
            }
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("mcqemu {args:?} did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    if let Some(w) = writer {
        let _ = w.join();
    }
    CliOutput {
        code: status.code(),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// Runs `mcqemu ARGS` (no stdin) with a 60 s bound.
pub fn run_cli(tmp: &TempDir, args: &[&str]) -> CliOutput {
    run_cli_with(tmp, args, None, Duration::from_secs(60))
}

// ---------------------------------------------------------------------------------------------
// External tools

/// Runs a program to completion (bounded) and returns (success, stdout, stderr).
pub fn run_tool(program: &str, args: &[&str]) -> (bool, String, String) {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{program} {args:?} did not finish in time");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    (
        status.success(),
        t_out.join().unwrap(),
        t_err.join().unwrap(),
    )
}

/// `qemu-img info --output=json` of a file, run directly (not through mcqemu).
pub fn qemu_img_info(path: &Path) -> Value {
    let p = path.to_str().unwrap();
    let (ok, out, err) = run_tool("qemu-img", &["info", "-U", "--output=json", p]);
    assert!(ok, "qemu-img info {p} failed: {err}");
    serde_json::from_str(&out).expect("qemu-img JSON")
}

// ---------------------------------------------------------------------------------------------
// A tiny HTTP/1.1 server on 127.0.0.1

/// How a path is served.
#[derive(Clone)]
pub enum Route {
    /// 200 with this body, written `chunk` bytes at a time with `delay` between chunks.
    Body {
        /// The body.
        data: Arc<Vec<u8>>,
        /// Bytes per write.
        chunk: usize,
        /// Pause after each write.
        delay: Duration,
    },
    /// A bodyless reply with this status.
    Status(u16),
    /// 200 announcing `claimed` bytes in Content-Length, sending only `data`, then closing.
    Truncated {
        /// Announced length.
        claimed: usize,
        /// What is really sent.
        data: Arc<Vec<u8>>,
    },
    /// 200 with `Transfer-Encoding: chunked`, sending `data` in chunks; with `complete` false
    /// the connection closes without the final zero-length chunk.
    Chunked {
        /// The body.
        data: Arc<Vec<u8>>,
        /// Whether to send the terminating chunk.
        complete: bool,
    },
    /// A redirect with this status to this location.
    Redirect(u16, String),
    /// 200 announcing `claimed` bytes, sending `data`, then going silent (connection open) for
    /// `hold` or until the server is dropped.
    Stall {
        /// Announced length.
        claimed: usize,
        /// What is sent before the silence.
        data: Arc<Vec<u8>>,
        /// How long to stay silent.
        hold: Duration,
    },
}

impl Route {
    /// The whole body at once.
    pub fn body(data: Vec<u8>) -> Route {
        Route::Body {
            data: Arc::new(data),
            chunk: 64 * 1024,
            delay: Duration::ZERO,
        }
    }

    /// The body in `chunk`-byte pieces with `delay` after each.
    pub fn trickle(data: Vec<u8>, chunk: usize, delay: Duration) -> Route {
        Route::Body {
            data: Arc::new(data),
            chunk,
            delay,
        }
    }
}

/// An HTTP server on an ephemeral loopback port serving fixed routes; unknown paths get 404.
/// Stops accepting on drop; connection threads end when their body is sent, the peer goes
/// away, or the server is dropped.
pub struct HttpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    hits: Arc<Mutex<Vec<String>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl HttpServer {
    /// Starts serving `routes` (path → route).
    pub fn start(routes: Vec<(&str, Route)>) -> HttpServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let addr = listener.local_addr().unwrap();
        let routes: Arc<Vec<(String, Route)>> = Arc::new(
            routes
                .into_iter()
                .map(|(p, r)| (p.to_string(), r))
                .collect(),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let hits = Arc::new(Mutex::new(Vec::new()));
        let (stop2, hits2) = (Arc::clone(&stop), Arc::clone(&hits));
        let acceptor = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (routes, stop, hits) =
                    (Arc::clone(&routes), Arc::clone(&stop2), Arc::clone(&hits2));
                std::thread::spawn(move || serve_conn(conn, &routes, &stop, &hits));
            }
        });
        HttpServer {
            addr,
            stop,
            hits,
            acceptor: Some(acceptor),
        }
    }

    /// `http://127.0.0.1:PORT/PATH`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{}", self.addr, path.trim_start_matches('/'))
    }

    /// The request paths seen so far.
    pub fn hits(&self) -> Vec<String> {
        self.hits.lock().unwrap().clone()
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
    }
}

fn serve_conn(
    mut conn: TcpStream,
    routes: &[(String, Route)],
    stop: &AtomicBool,
    hits: &Mutex<Vec<String>>,
) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(5)));
    // Read the request head (we ignore any body: the client only sends GETs).
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > 64 * 1024 {
            return;
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let target = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("/")
        .to_string();
    hits.lock().unwrap().push(target.clone());
    let route = routes
        .iter()
        .find(|(p, _)| *p == target || format!("/{}", p.trim_start_matches('/')) == target)
        .map(|(_, r)| r.clone())
        .unwrap_or(Route::Status(404));
    match route {
        Route::Status(code) => {
            let reason = match code {
                404 => "Not Found",
                500 => "Internal Server Error",
                403 => "Forbidden",
                _ => "Status",
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {code} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
        }
        Route::Truncated { claimed, data } => {
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {claimed}\r\nConnection: close\r\n\r\n"
            );
            let _ = conn.write_all(&data);
            let _ = conn.flush();
            let _ = conn.shutdown(std::net::Shutdown::Both);
        }
        Route::Chunked { data, complete } => {
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            );
            for piece in data.chunks(16 * 1024) {
                let _ = write!(conn, "{:x}\r\n", piece.len());
                let _ = conn.write_all(piece);
                let _ = conn.write_all(b"\r\n");
            }
            if complete {
                let _ = conn.write_all(b"0\r\n\r\n");
            }
            let _ = conn.flush();
            let _ = conn.shutdown(std::net::Shutdown::Both);
        }
        Route::Stall {
            claimed,
            data,
            hold,
        } => {
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {claimed}\r\nConnection: close\r\n\r\n"
            );
            let _ = conn.write_all(&data);
            let _ = conn.flush();
            let until = Instant::now() + hold;
            while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Route::Redirect(code, location) => {
            let _ = write!(
                conn,
                "HTTP/1.1 {code} Moved\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
        }
        Route::Body { data, chunk, delay } => {
            if write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                data.len()
            )
            .is_err()
            {
                return;
            }
            for piece in data.chunks(chunk.max(1)) {
                if stop.load(Ordering::SeqCst) || conn.write_all(piece).is_err() {
                    return;
                }
                if !delay.is_zero() {
                    std::thread::sleep(delay);
                }
            }
            let _ = conn.flush();
        }
    }
}

/// Deterministic pseudo-random bytes (xorshift), so bodies do not compress to nothing.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

// ---------------------------------------------------------------------------------------------
// SHA-256 (FIPS 180-4), to check downloads without a crypto dependency

const K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
];

/// SHA-256 of `data` as lower-case hex.
pub fn sha256_hex(data: &[u8]) -> String {
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    let bit_len = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bit_len.to_be_bytes());
    for block in msg.chunks(64) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    h.iter().map(|x| format!("{x:08x}")).collect()
}

// =============================================================================================
// Real guests: the test guest, a per-binary limit on concurrent QEMUs, and a kill-on-drop guard
// (added for tests/guest_agent.rs; other test files may use it too)

/// The tiny Linux test guest built by `tests/guest/build_guest.py` (direct kernel boot).
#[derive(Clone, Debug)]
pub struct Guest {
    /// Uncompressed kernel (PVH-bootable vmlinux).
    pub kernel: String,
    /// The initramfs.
    pub initrd: String,
    /// The kernel command line to boot it with.
    pub append: String,
}

/// Builds the test guest once per test process into `<workspace>/target/test-guest` (cached
/// there by package versions across runs). A file lock keeps two test binaries from building
/// it at the same time; the builder also renames its finished folder into place atomically.
pub fn test_guest() -> Guest {
    static GUEST: std::sync::OnceLock<Guest> = std::sync::OnceLock::new();
    GUEST
        .get_or_init(|| {
            let root = Path::new(env!("CARGO_MANIFEST_DIR"));
            let out = root.join("target").join("test-guest");
            std::fs::create_dir_all(&out).expect("create target/test-guest");
            let lock = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(out.join(".build.lock"))
                .expect("open the guest build lock");
            {
                use std::os::unix::io::AsRawFd;
                // Blocks until another binary's build is done; released when `lock` closes.
                // SAFETY: flock on a file descriptor we own; no memory is involved.
                let rc = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
                assert_eq!(rc, 0, "flock {}", out.display());
            }
            let script = root.join("tests").join("guest").join("build_guest.py");
            let output = Command::new("python3")
                .arg(&script)
                .arg(&out)
                .stdin(Stdio::null())
                .output()
                .expect("run python3 tests/guest/build_guest.py");
            drop(lock);
            assert!(
                output.status.success(),
                "build_guest.py failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
            let v: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
                panic!(
                    "build_guest.py printed no JSON ({e}): {}",
                    String::from_utf8_lossy(&output.stdout)
                )
            });
            let s = |k: &str| {
                v[k].as_str()
                    .unwrap_or_else(|| panic!("build_guest.py output lacks {k}: {v}"))
                    .to_string()
            };
            Guest {
                kernel: s("kernel"),
                initrd: s("initrd"),
                append: s("append"),
            }
        })
        .clone()
}

/// How many QEMU guests one test binary runs at once (CI has 2 cores and no KVM).
pub const QEMU_SLOTS: usize = 2;

/// A held slot for one QEMU guest; released on drop.
pub struct QemuSlot(());

fn qemu_slot_state() -> &'static (Mutex<usize>, std::sync::Condvar) {
    static STATE: std::sync::OnceLock<(Mutex<usize>, std::sync::Condvar)> =
        std::sync::OnceLock::new();
    STATE.get_or_init(|| (Mutex::new(0), std::sync::Condvar::new()))
}

/// Waits for one of the [`QEMU_SLOTS`] guest slots of this test binary. Hold it for the whole
/// life of one guest, and never ask for a second slot while holding one (that can deadlock):
/// a test needing two guests at once runs them one after the other instead.
pub fn qemu_slot() -> QemuSlot {
    let (m, cv) = qemu_slot_state();
    let mut used = m.lock().unwrap_or_else(|p| p.into_inner());
    while *used >= QEMU_SLOTS {
        used = cv.wait(used).unwrap_or_else(|p| p.into_inner());
    }
    *used += 1;
    QemuSlot(())
}

impl Drop for QemuSlot {
    fn drop(&mut self) {
        let (m, cv) = qemu_slot_state();
        let mut used = m.lock().unwrap_or_else(|p| p.into_inner());
        *used = used.saturating_sub(1);
        cv.notify_all();
    }
}

/// A short, fresh folder directly under /tmp for `MCQEMU_RUNTIME_DIR` (unix socket paths must
/// stay within 107 bytes whatever TMPDIR is); removed on drop.
pub fn short_runtime_dir(label: &str) -> TempDir {
    static N: AtomicU64 = AtomicU64::new(0);
    let path = PathBuf::from(format!(
        "/tmp/mcq-{label}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).expect("create short runtime dir");
    TempDir { path }
}

/// True when `pid` is a live QEMU system emulator (checked before signalling it).
fn is_qemu_process(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            let argv0 = c.split(|b| *b == 0).next().unwrap_or(&[]);
            String::from_utf8_lossy(argv0).contains("qemu-system")
        })
        .unwrap_or(false)
}

/// Kills the QEMUs of a test on drop (even when the test panics): every PID it was told
/// about, and every `qemu.pid` under the runtime folder it watches. Only processes that are
/// still QEMU system emulators are signalled (SIGKILL), then reaped by waiting for them to go.
pub struct VmKiller {
    runtime: PathBuf,
    pids: Mutex<Vec<i32>>,
}

impl VmKiller {
    /// Watches the VMs whose sockets and pidfiles live under `runtime` (MCQEMU_RUNTIME_DIR).
    pub fn new(runtime: &Path) -> VmKiller {
        VmKiller {
            runtime: runtime.to_path_buf(),
            pids: Mutex::new(Vec::new()),
        }
    }

    /// Remembers the `pid` of a launch_vm / sandbox_vm result.
    pub fn track(&self, launched: &Value) {
        if let Some(p) = launched["pid"].as_i64() {
            self.pids.lock().unwrap().push(p as i32);
        }
    }

    /// Kills every tracked QEMU now.
    pub fn kill_all(&self) {
        let mut pids = self.pids.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Ok(dirs) = std::fs::read_dir(&self.runtime) {
            for d in dirs.flatten() {
                if let Ok(s) = std::fs::read_to_string(d.path().join("qemu.pid")) {
                    if let Ok(p) = s.trim().parse::<i32>() {
                        pids.push(p);
                    }
                }
            }
        }
        pids.sort_unstable();
        pids.dedup();
        for &pid in &pids {
            if pid > 1 && is_qemu_process(pid) {
                // SAFETY: plain kill(2) on a PID just checked to be a QEMU process.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while pids.iter().any(|&p| is_qemu_process(p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for VmKiller {
    fn drop(&mut self) {
        self.kill_all();
    }
}

impl Server {
    /// Calls a tool with a custom bound on the wait for its response (for slow tools such as
    /// sandbox_vm or snapshots under TCG); returns the `CallToolResult`.
    pub fn call_tool_within(&mut self, name: &str, args: Value, timeout: Duration) -> Value {
        let id = json!(self.fresh_id());
        self.send_request(&id, "tools/call", json!({"name": name, "arguments": args}));
        let (resp, _) = self.read_until_id(&id, timeout);
        match resp.get("result") {
            Some(r) => r.clone(),
            None => panic!("tools/call {name} gave a protocol error: {resp}"),
        }
    }

    /// [`Server::call_ok`] with a custom bound.
    pub fn call_ok_within(&mut self, name: &str, args: Value, timeout: Duration) -> Value {
        let r = self.call_tool_within(name, args.clone(), timeout);
        tool_ok(&r, &format!("{name} {args}"))
    }

    /// [`Server::call_err`] with a custom bound.
    pub fn call_err_within(&mut self, name: &str, args: Value, timeout: Duration) -> String {
        let r = self.call_tool_within(name, args.clone(), timeout);
        tool_err(&r, &format!("{name} {args}"))
    }
}

// =============================================================================================
// Lifecycle and QMP-fault helpers (added for tests/lifecycle.rs and tests/qmp_faults.rs)

/// Waits until `n` guest slots are free and takes them all at once (never one by one, so two
/// tests each wanting two cannot deadlock). For a test that needs `n` QEMUs running together;
/// `n` must not exceed [`QEMU_SLOTS`].
pub fn qemu_slots(n: usize) -> Vec<QemuSlot> {
    assert!(n <= QEMU_SLOTS, "asked for {n} of {QEMU_SLOTS} QEMU slots");
    let (m, cv) = qemu_slot_state();
    let mut used = m.lock().unwrap_or_else(|p| p.into_inner());
    while *used + n > QEMU_SLOTS {
        // Bounded so that a wakeup lost to another waiter only delays, never hangs.
        used = cv
            .wait_timeout(used, Duration::from_millis(200))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
    *used += n;
    (0..n).map(|_| QemuSlot(())).collect()
}

impl Server {
    /// Starts `mcqemu` on the given state and runtime folders (several servers may share them).
    pub fn start_in(state: &Path, runtime: &Path) -> Server {
        let state = state.to_str().expect("utf-8 state dir").to_string();
        let runtime = runtime.to_str().expect("utf-8 runtime dir").to_string();
        Server::start_with_env(&[
            ("MCQEMU_STATE_DIR", state.as_str()),
            ("MCQEMU_RUNTIME_DIR", runtime.as_str()),
        ])
    }

    /// [`Server::start_in`] plus the `initialize` handshake.
    pub fn ready_in(state: &Path, runtime: &Path) -> Server {
        let mut s = Server::start_in(state, runtime);
        s.initialize(NEWEST);
        s
    }
}

/// The state letter of /proc/PID/stat (R, S, D, Z, ...), or None when the PID is gone.
pub fn pid_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.trim_start().chars().next()
}

/// True when `pid` exists and is not a zombie. A zombie thread-group leader whose other
/// threads are still exiting (they still hold its sockets open) counts as alive.
pub fn pid_alive(pid: i32) -> bool {
    let live = |c: char| c != 'Z' && c != 'X';
    match pid_state(pid) {
        None => false,
        Some('Z') => std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|t| {
                std::fs::read_to_string(t.path().join("stat"))
                    .ok()
                    .and_then(|st| {
                        let after = &st[st.rfind(')')? + 1..];
                        after.trim_start().chars().next()
                    })
                    .is_some_and(live)
            }),
        Some(c) => live(c),
    }
}

/// Waits (bounded) until `pid` is gone or a zombie; true when it is.
pub fn wait_pid_dead(pid: i32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while pid_alive(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Live QEMU system emulators whose command line mentions `dir` (e.g. a test's runtime folder).
pub fn qemu_pids_mentioning(dir: &Path) -> Vec<i32> {
    let needle = dir.to_string_lossy().into_owned();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if !is_qemu_process(pid) || !pid_alive(pid) {
            continue;
        }
        let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&raw).contains(&needle) {
            out.push(pid);
        }
    }
    out
}

/// Reads a pidfile written by `qemu -daemonize -pidfile`, waiting (bounded) for it.
pub fn read_pidfile(path: &Path, limit: Duration) -> i32 {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(p) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            return p;
        }
        assert!(
            Instant::now() < deadline,
            "pidfile {} did not appear",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

// =============================================================================================
// Overlapping tool calls (added for tests/see_and_drive.rs): start a call, make others while
// it runs, then collect its response. The server runs each tools/call on its own worker.

impl Server {
    /// Sends a `tools/call` without waiting; returns its id for [`Server::finish_call`].
    pub fn start_call(&mut self, name: &str, args: Value) -> Value {
        let id = json!(self.fresh_id());
        self.send_request(&id, "tools/call", json!({"name": name, "arguments": args}));
        id
    }

    /// Waits (bounded) for the response to a call made with [`Server::start_call`] and returns
    /// its `CallToolResult`. Responses to other ids seen meanwhile are kept for later reads
    /// (notifications are dropped), so overlapping calls never lose each other's answers.
    pub fn finish_call(&mut self, id: &Value, timeout: Duration) -> Value {
        let (resp, others) = self.read_until_id(id, timeout);
        let responses: Vec<Value> = others
            .into_iter()
            .filter(|m| m.get("method").is_none())
            .collect();
        self.unread(responses);
        match resp.get("result") {
            Some(r) => r.clone(),
            None => panic!("tools/call {id} gave a protocol error: {resp}"),
        }
    }

    /// A tool call that keeps other calls' responses (see [`Server::finish_call`]).
    pub fn call_keeping(&mut self, name: &str, args: Value, timeout: Duration) -> Value {
        let id = self.start_call(name, args);
        self.finish_call(&id, timeout)
    }
}
