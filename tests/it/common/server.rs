//! The MCP server under test: a running `mcqemu` spoken to over its stdin and stdout, one JSON
//! message per line, with every read bounded. The tool-call helpers are in `tools.rs`.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::files::TempDir;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_mcqemu");

/// The binary a server is started from: `MCQEMU_SERVER_BIN` when set (the bench's figures for
/// the static musl build users drop onto hosts), else [`BIN`].
pub fn server_bin() -> String {
    std::env::var("MCQEMU_SERVER_BIN")
        .ok()
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| BIN.to_string())
}

/// How long a test waits for one response before failing.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long [`Server::try_close`] waits for the server to exit once its stdin is closed.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

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

/// What the stdout reader thread hands over.
enum Incoming {
    /// One line that parsed as JSON.
    Msg(Value),
    /// One line that did not (the server must never write such a line).
    Garbage(String),
    /// A tool's result that breaks its declared output schema (the official SDK client
    /// refuses such a result): what is wrong.
    Invalid(String),
}

/// The tool each `tools/call` request in flight names, by its id (as JSON text): the reader
/// checks the response against that tool's output schema.
type Calls = Arc<Mutex<HashMap<String, String>>>;

/// A running `mcqemu` serving MCP on pipes, with its own state and runtime folders.
pub struct Server {
    child: Child,
    stdin: Arc<Mutex<Option<ChildStdin>>>,
    rx: Receiver<Incoming>,
    /// Messages read while waiting for something else, not yet handed out.
    backlog: VecDeque<Value>,
    stderr: Arc<Mutex<Vec<u8>>>,
    calls: Calls,
    next_id: i64,
    /// The server's own folder, for the test's files; it also holds the server's `state/` and
    /// `runtime/` unless the server was started on other folders ([`Server::start_in`]).
    pub tmp: TempDir,
}

/// Notes the `tools/call` requests among the JSON lines of `bytes` (other bytes pass
/// unnoted: a test may send anything).
fn note_calls(calls: &Calls, bytes: &[u8]) {
    for line in bytes.split(|b| *b == b'\n') {
        let Ok(msg) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        for m in msg.as_array().cloned().unwrap_or_else(|| vec![msg]) {
            if let (Some(id), Some(tool), Some("tools/call")) = (
                m.get("id"),
                m["params"]["name"].as_str(),
                m["method"].as_str(),
            ) {
                let mut c = calls.lock().unwrap_or_else(|p| p.into_inner());
                c.insert(id.to_string(), tool.to_string());
            }
        }
    }
}

/// A message as read: a tool's response is checked against the tool's output schema.
fn checked(calls: &Calls, msg: Value) -> Incoming {
    if msg.get("method").is_some() {
        return Incoming::Msg(msg);
    }
    let tool = msg.get("id").and_then(|id| {
        let mut c = calls.lock().unwrap_or_else(|p| p.into_inner());
        c.remove(&id.to_string())
    });
    match tool.map(|t| super::schema::check_call_response(&t, &msg)) {
        Some(Err(why)) => Incoming::Invalid(why),
        _ => Incoming::Msg(msg),
    }
}

/// The `initialize` parameters for `version`.
pub fn initialize_params(version: &str) -> Value {
    json!({
        "protocolVersion": version,
        "capabilities": {},
        "clientInfo": {"name": "mcqemu-tests", "version": "0"}
    })
}

impl Server {
    /// Starts `mcqemu` (serve mode) with a fresh state and runtime folder.
    pub fn start() -> Server {
        Server::start_with_env(&[])
    }

    /// Starts `mcqemu` with extra environment variables.
    pub fn start_with_env(env: &[(&str, &str)]) -> Server {
        Server::try_start_with_env(env).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Server::start_with_env`], with an error instead of a panic.
    pub fn try_start_with_env(env: &[(&str, &str)]) -> Result<Server, String> {
        let tmp = TempDir::try_new("srv")?;
        let state = tmp.try_subdir("state")?;
        let runtime = tmp.try_subdir("runtime")?;
        Server::try_start_with(tmp, &state, &runtime, env)
    }

    /// Starts `mcqemu` on the given state and runtime folders (several servers may share them).
    pub fn start_in(state: &Path, runtime: &Path) -> Server {
        Server::try_start_in(state, runtime).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Server::start_in`], with an error instead of a panic. The server's own `tmp` is made
    /// too (for the test's files), without `state/` and `runtime/` in it.
    pub fn try_start_in(state: &Path, runtime: &Path) -> Result<Server, String> {
        let tmp = TempDir::try_new("srv")?;
        Server::try_start_with(tmp, state, runtime, &[])
    }

    /// Starts `mcqemu` on `state` and `runtime`, with extra environment variables (which may
    /// override those two), as the owner of `tmp` (made beforehand: the bench keeps making
    /// folders out of its start-up row).
    pub fn try_start_with(
        tmp: TempDir,
        state: &Path,
        runtime: &Path,
        env: &[(&str, &str)],
    ) -> Result<Server, String> {
        let mut cmd = Command::new(server_bin());
        cmd.env("MCQEMU_STATE_DIR", state)
            .env("MCQEMU_RUNTIME_DIR", runtime)
            .env("MCQEMU_ROOTS", test_roots())
            .envs(super::kernel::kernel_env())
            .env_remove("MCQEMU_TOOLS_PAGE_SIZE");
        for (k, v) in env {
            cmd.env(k, v);
        }
        Server::try_spawn(tmp, cmd)
    }

    /// Starts the server `cmd` describes (its program, arguments and environment as given:
    /// a test of a binary copied elsewhere, run with `env -i`), owning `tmp`.
    pub fn try_spawn(tmp: TempDir, mut cmd: Command) -> Result<Server, String> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", server_bin()))?;
        let (Some(stdout), Some(stderr_pipe), Some(stdin)) =
            (child.stdout.take(), child.stderr.take(), child.stdin.take())
        else {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the server's pipes are missing".into());
        };

        let (tx, rx) = mpsc::channel();
        let calls: Calls = Arc::default();
        let pending = Arc::clone(&calls);
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
                    Ok(v) => checked(&pending, v),
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
                        let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
                        // Keep the tail only; a chatty server must not eat the test's memory.
                        if s.len() > 1 << 20 {
                            s.drain(..1 << 19);
                        }
                        s.extend_from_slice(&buf[..n]);
                    }
                }
            }
        });
        Ok(Server {
            child,
            stdin: Arc::new(Mutex::new(Some(stdin))),
            rx,
            backlog: VecDeque::new(),
            stderr,
            calls,
            next_id: 1,
            tmp,
        })
    }

    /// Starts a server and initializes it with the newest version.
    pub fn ready() -> Server {
        let mut s = Server::start();
        s.initialize(NEWEST);
        s
    }

    /// [`Server::start_in`] plus the `initialize` handshake.
    pub fn ready_in(state: &Path, runtime: &Path) -> Server {
        Server::try_ready_in(state, runtime).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Server::ready_in`], with an error instead of a panic.
    pub fn try_ready_in(state: &Path, runtime: &Path) -> Result<Server, String> {
        let mut s = Server::try_start_in(state, runtime)?;
        s.try_initialize(NEWEST)?;
        Ok(s)
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the server wrote to stderr so far (for failure messages).
    pub fn stderr_text(&self) -> String {
        let kept = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&kept).into_owned()
    }

    /// A fresh integer request id.
    pub fn fresh_id(&mut self) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Writes raw bytes to the server's stdin (no newline added).
    pub fn send_raw(&self, bytes: &[u8]) {
        self.try_send_raw(bytes).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Server::send_raw`], with an error instead of a panic.
    pub fn try_send_raw(&self, bytes: &[u8]) -> Result<(), String> {
        note_calls(&self.calls, bytes);
        let mut guard = self.stdin.lock().unwrap_or_else(|p| p.into_inner());
        let stdin = guard
            .as_mut()
            .ok_or("the server's stdin is already closed")?;
        stdin
            .write_all(bytes)
            .and_then(|_| stdin.flush())
            .map_err(|e| {
                format!(
                    "writing to the server failed: {e}; server stderr:\n{}",
                    self.stderr_text()
                )
            })
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
        self.try_send(msg).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Server::send`], with an error instead of a panic.
    pub fn try_send(&self, msg: &Value) -> Result<(), String> {
        let mut line = serde_json::to_vec(msg).map_err(|e| format!("unserializable: {e}"))?;
        line.push(b'\n');
        self.try_send_raw(&line)
    }

    /// Sends a notification (no id, no reply expected).
    pub fn notify(&self, method: &str, params: Value) {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// Sends a request with the given id without waiting for its response.
    pub fn send_request(&self, id: &Value, method: &str, params: Value) {
        self.try_send_request(id, method, params)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Server::send_request`], with an error instead of a panic.
    pub fn try_send_request(&self, id: &Value, method: &str, params: Value) -> Result<(), String> {
        self.try_send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
    }

    /// Sends a request with a fresh id and returns the whole response message (result or error).
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        self.request_full(method, params).0
    }

    /// [`Server::request`], with an error instead of a panic (a JSON-RPC error response is
    /// still an `Ok`: it is the whole response that is returned).
    pub fn try_request(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.try_request_within(method, params, RESPONSE_TIMEOUT)
            .map(|(resp, _)| resp)
    }

    /// Like [`Server::request`], also returning every other message seen while waiting.
    pub fn request_full(&mut self, method: &str, params: Value) -> (Value, Vec<Value>) {
        self.try_request_within(method, params, RESPONSE_TIMEOUT)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Sends a request with a fresh id and waits up to `timeout` for its response; returns it
    /// and every other message seen meanwhile.
    pub fn try_request_within(
        &mut self,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<(Value, Vec<Value>), String> {
        let id = json!(self.fresh_id());
        self.try_send_request(&id, method, params)?;
        self.try_read_until_id(&id, timeout)
            .map_err(|e| format!("{method}: {e}"))
    }

    /// Sends a request and returns its `result`, failing the test on an error response.
    pub fn result(&mut self, method: &str, params: Value) -> Value {
        let resp = self.request(method, params);
        match resp.get("result") {
            Some(r) => r.clone(),
            None => panic!("{method} failed: {resp}"),
        }
    }

    /// [`Server::result`], with an error instead of a panic (an error response is an `Err`).
    pub fn try_result(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let resp = self.try_request(method, params)?;
        match resp.get("result") {
            Some(r) => Ok(r.clone()),
            None => Err(format!("{method} failed: {resp}")),
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
    /// A tool result that breaks its output schema fails the test here.
    pub fn recv(&mut self, timeout: Duration) -> Option<Value> {
        self.try_recv(timeout).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Server::recv`], with an error instead of a panic when the server writes a line that
    /// is not JSON.
    pub fn try_recv(&mut self, timeout: Duration) -> Result<Option<Value>, String> {
        if let Some(v) = self.backlog.pop_front() {
            return Ok(Some(v));
        }
        match self.rx.recv_timeout(timeout) {
            Ok(Incoming::Msg(v)) => Ok(Some(v)),
            Ok(Incoming::Garbage(line)) => {
                Err(format!("server wrote a line that is not JSON: {line:?}"))
            }
            Ok(Incoming::Invalid(why)) => Err(why),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Ok(None),
        }
    }

    /// Reads until the response with `id` arrives; returns it and every other message seen
    /// meanwhile (notifications, and responses to other ids), in arrival order. Fails the test
    /// if it does not arrive within `timeout`.
    pub fn read_until_id(&mut self, id: &Value, timeout: Duration) -> (Value, Vec<Value>) {
        self.try_read_until_id(id, timeout)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Server::read_until_id`], with an error instead of a panic.
    pub fn try_read_until_id(
        &mut self,
        id: &Value,
        timeout: Duration,
    ) -> Result<(Value, Vec<Value>), String> {
        let deadline = Instant::now() + timeout;
        let mut others = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let msg = match self.try_recv(left)? {
                Some(m) => m,
                None => {
                    return Err(format!(
                        "no response with id {id} within {timeout:?}; other messages: {others:?}; server stderr:\n{}",
                        self.stderr_text()
                    ))
                }
            };
            let is_response = msg.get("method").is_none();
            if is_response && msg.get("id") == Some(id) {
                return Ok((msg, others));
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
                Ok(Incoming::Invalid(why)) => panic!("{why}"),
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
        self.try_initialize(version)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Server::initialize`], with an error instead of a panic.
    pub fn try_initialize(&mut self, version: &str) -> Result<Value, String> {
        let result = self.try_result("initialize", initialize_params(version))?;
        self.try_send(
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized", "params": {}}),
        )?;
        Ok(result)
    }

    /// Closes the server's stdin (EOF).
    pub fn close_stdin(&self) {
        self.stdin.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        // Short polls first: a server told to go usually exits within a millisecond or two.
        let mut pause = Duration::from_micros(200);
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }

    /// Closes stdin and waits (up to [`EXIT_TIMEOUT`]) for a clean exit; an `Err` when the
    /// server does not exit in time or exits unsuccessfully.
    pub fn try_close(&mut self) -> Result<(), String> {
        self.close_stdin();
        match self.wait_exit(EXIT_TIMEOUT) {
            Some(st) if st.success() => Ok(()),
            Some(st) => Err(format!(
                "the server exited with {st} after its stdin closed; server stderr:\n{}",
                self.stderr_text()
            )),
            None => Err(format!(
                "the server did not exit within {EXIT_TIMEOUT:?} of its stdin closing; server \
                 stderr:\n{}",
                self.stderr_text()
            )),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.close_stdin();
        if self.wait_exit(Duration::from_millis(500)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The roots a test server gets unless a test sets `MCQEMU_ROOTS` itself: the temporary folder
/// (where every test keeps its files) and the test-guest and installer-ISO caches under
/// `target/`.
pub fn test_roots() -> String {
    let guest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("test-guest");
    let _ = std::fs::create_dir_all(&guest);
    let installer = super::installer::installer_dir();
    let _ = std::fs::create_dir_all(&installer);
    format!(
        "{}:{}:{}",
        std::env::temp_dir().display(),
        guest.display(),
        installer.display()
    )
}
