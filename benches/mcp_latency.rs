//! Latency and memory bench for the MCP stdio server, driven over real pipes against the
//! optimized binary.
//!
//! Run with `cargo bench --bench mcp_latency`. `MCQEMU_BENCH_N` overrides the number of
//! repetitions (default 50). Everything the server writes goes into a fresh temp folder
//! (`MCQEMU_STATE_DIR`, `MCQEMU_RUNTIME_DIR`) that is removed at the end.
//!
//! Adding a row: build what it needs (a warm [`Server`], a file in [`TempDir`]), then call
//! `bench.time("name", Some(target), || { ...; Ok(()) })`, or `bench.measure(...)` when the
//! closure must time only part of its work. Rows are printed as they finish.
//!
//! Every read from the server has a deadline (a reader thread feeds a channel, and the bench
//! waits with `recv_timeout`), so a hung server aborts the bench with a message instead of
//! hanging it.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mcqemu::mcp::protocol::INIT_VERSIONS;
use serde_json::{json, Value};

/// The server binary, built by cargo in the bench profile (optimized).
const SERVER_BIN: &str = env!("CARGO_BIN_EXE_mcqemu");
/// Longest wait for any one reply from the server.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for the server to exit after its stdin closes.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for a direct qemu-img run.
const QEMU_IMG_TIMEOUT: Duration = Duration::from_secs(10);
/// Most stderr bytes kept from a server, for error messages.
const STDERR_KEEP: usize = 16 * 1024;

/// Targets.
const START_TARGET: Duration = Duration::from_millis(10);
const RSS_TARGET_KB: u64 = 8 * 1024;
const LIST_TARGET: Duration = Duration::from_millis(2);
const IMAGE_INFO_OVERHEAD_TARGET: Duration = Duration::from_millis(2);

type Res<T> = Result<T, String>;

fn main() {
    // cargo passes `--bench` (and any filter); this bench takes no arguments.
    match run() {
        Ok(()) => {}
        Err(e) => {
            eprintln!("\nmcp_latency: aborted: {e}");
            std::process::exit(1);
        }
    }
}

fn run() -> Res<()> {
    let n = std::env::var("MCQEMU_BENCH_N")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(50);
    let tmp = TempDir::new()?;
    let env = ServerEnv::new(&tmp)?;
    let qemu_img = mcqemu::qemu::img::binary();
    let image = tmp.path().join("bench.qcow2");
    create_image(&qemu_img, &image)?;

    println!();
    println!("mcqemu MCP latency bench");
    println!("  server:   {SERVER_BIN}");
    println!("  qemu-img: {}", first_line_of(&qemu_img, &["--version"]));
    println!(
        "  host:     {} CPU(s); other load on the machine shows up in these numbers",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("  runs:     {n} per row (after a few unmeasured warm-up runs)");
    println!();

    let mut table = Table::new();
    table.header();
    let bench = Bench { n, warmup: 3 };

    // 1. Process start -> initialize reply, a fresh server each time.
    bench.measure(
        &mut table,
        "start -> initialize reply",
        Some(START_TARGET),
        || {
            let t0 = Instant::now();
            let mut server = Server::spawn(&env)?;
            server.request("initialize", init_params())?;
            let took = t0.elapsed();
            server.close()?;
            Ok(took)
        },
    )?;

    // Peak RSS of a fresh server after initialize + tools/list + image_info.
    {
        let mut server = Server::spawn(&env)?;
        server.initialize()?;
        server.request("tools/list", json!({}))?;
        server.call_tool("image_info", json!({ "path": image }))?;
        let kb = server.peak_rss_kb()?;
        server.close()?;
        table.rss_row("peak RSS: init + list + image_info", kb);
    }

    // Warm server for the round-trip rows.
    let mut server = Server::spawn(&env)?;
    server.initialize()?;

    // 2. tools/list.
    bench.time(
        &mut table,
        "tools/list round trip",
        Some(LIST_TARGET),
        || {
            let r = server.request("tools/list", json!({}))?;
            match r.get("tools").and_then(Value::as_array) {
                Some(t) if !t.is_empty() => Ok(()),
                _ => Err(format!("tools/list returned no tools: {r}")),
            }
        },
    )?;

    // 4. ping.
    bench.time(&mut table, "ping round trip", None, || {
        server.request("ping", json!({})).map(|_| ())
    })?;

    // 3. image_info over MCP against qemu-img info run directly.
    let direct = bench.time(&mut table, "qemu-img info (direct child)", None, || {
        qemu_img_info(&qemu_img, &image).map(|_| ())
    })?;
    let mcp = bench.time(&mut table, "image_info tools/call round trip", None, || {
        let r = server.call_tool("image_info", json!({ "path": image }))?;
        match r
            .pointer("/structuredContent/format")
            .and_then(Value::as_str)
        {
            Some("qcow2") => Ok(()),
            _ => Err(format!("image_info gave an unexpected result: {r}")),
        }
    })?;
    table.diff_row(
        "image_info overhead (median - median)",
        mcp.median,
        direct.median,
        IMAGE_INFO_OVERHEAD_TARGET,
    );

    let kb = server.peak_rss_kb()?;
    server.close()?;
    table.rss_row("peak RSS: warm server after all rows", kb);

    table.footer();
    Ok(())
}

fn init_params() -> Value {
    json!({
        "protocolVersion": INIT_VERSIONS.last().copied().unwrap_or("2025-06-18"),
        "capabilities": {},
        "clientInfo": { "name": "mcp_latency-bench", "version": "0" }
    })
}

// ---------------------------------------------------------------------------------------------
// Timing and reporting

/// Summary of one row's samples.
#[derive(Clone, Copy, Debug)]
struct Stats {
    median: Duration,
    p90: Duration,
    min: Duration,
}

impl Stats {
    fn of(mut samples: Vec<Duration>) -> Stats {
        samples.sort();
        let n = samples.len();
        let median = if n % 2 == 1 {
            samples[n / 2]
        } else {
            (samples[n / 2 - 1] + samples[n / 2]) / 2
        };
        // Nearest-rank 90th percentile.
        let p90 = samples[(n * 9).div_ceil(10).max(1) - 1];
        Stats {
            median,
            p90,
            min: samples[0],
        }
    }
}

/// Runs a closure `warmup` times unmeasured, then `n` times measured, and prints a row.
struct Bench {
    n: usize,
    warmup: usize,
}

impl Bench {
    /// Times each whole call of `f`.
    fn time<F: FnMut() -> Res<()>>(
        &self,
        table: &mut Table,
        name: &str,
        target: Option<Duration>,
        mut f: F,
    ) -> Res<Stats> {
        self.measure(table, name, target, || {
            let t0 = Instant::now();
            f()?;
            Ok(t0.elapsed())
        })
    }

    /// Like `time`, but `f` returns the duration it measured (so setup and teardown inside
    /// it stay out of the number).
    fn measure<F: FnMut() -> Res<Duration>>(
        &self,
        table: &mut Table,
        name: &str,
        target: Option<Duration>,
        mut f: F,
    ) -> Res<Stats> {
        for _ in 0..self.warmup {
            f().map_err(|e| format!("{name} (warm-up): {e}"))?;
        }
        let mut samples = Vec::with_capacity(self.n);
        for i in 0..self.n {
            samples.push(f().map_err(|e| format!("{name} (run {}): {e}", i + 1))?);
        }
        let stats = Stats::of(samples);
        table.time_row(name, self.n, &stats, target);
        Ok(stats)
    }
}

/// The printed table; counts targets met and missed.
struct Table {
    met: usize,
    missed: usize,
}

const NAME_W: usize = 40;

impl Table {
    fn new() -> Table {
        Table { met: 0, missed: 0 }
    }

    fn header(&self) {
        let cols = ["median".into(), "p90".into(), "min".into()];
        self.print("metric", "n", cols, "target", "result");
        println!("{}", "-".repeat(NAME_W + 4 + 3 * 11 + 3 + 13 + 6));
    }

    fn verdict(&mut self, ok: Option<bool>) -> &'static str {
        match ok {
            None => "",
            Some(true) => {
                self.met += 1;
                "ok"
            }
            Some(false) => {
                self.missed += 1;
                "MISSED"
            }
        }
    }

    fn print(&self, name: &str, n: &str, cols: [String; 3], target: &str, verdict: &str) {
        let line = format!(
            "{name:<NAME_W$} {n:>4} {:>10} {:>10} {:>10}   {target:<12} {verdict}",
            cols[0], cols[1], cols[2]
        );
        println!("{}", line.trim_end());
    }

    fn time_row(&mut self, name: &str, n: usize, s: &Stats, target: Option<Duration>) {
        let verdict = self.verdict(target.map(|t| s.median <= t));
        let target = target.map_or(String::new(), |t| format!("<= {}", fmt_target(t)));
        let cols = [fmt_dur(s.median), fmt_dur(s.p90), fmt_dur(s.min)];
        self.print(name, &n.to_string(), cols, &target, verdict);
    }

    fn diff_row(&mut self, name: &str, a: Duration, b: Duration, target: Duration) {
        let (sign, d) = if a >= b { ("+", a - b) } else { ("-", b - a) };
        let verdict = self.verdict(Some(a <= b + target));
        let cols = [format!("{sign}{}", fmt_dur(d)), "-".into(), "-".into()];
        self.print(
            name,
            "",
            cols,
            &format!("<= {}", fmt_target(target)),
            verdict,
        );
    }

    fn rss_row(&mut self, name: &str, kb: u64) {
        let verdict = self.verdict(Some(kb <= RSS_TARGET_KB));
        let cols = [fmt_kb(kb), "-".into(), "-".into()];
        let target = format!("<= {} MB", RSS_TARGET_KB / 1024);
        self.print(name, "1", cols, &target, verdict);
    }

    fn footer(&self) {
        println!();
        println!(
            "targets: {} met, {} missed (time targets compare the median; RSS is VmHWM in \
             /proc/PID/status, KiB)",
            self.met, self.missed
        );
    }
}

fn fmt_dur(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.1} us")
    } else {
        format!("{:.3} ms", us / 1000.0)
    }
}

/// A target: whole milliseconds without decimals.
fn fmt_target(d: Duration) -> String {
    if d.as_micros().is_multiple_of(1000) {
        format!("{} ms", d.as_millis())
    } else {
        fmt_dur(d)
    }
}

fn fmt_kb(kb: u64) -> String {
    if kb < 1024 {
        format!("{kb} KB")
    } else {
        format!("{:.2} MB", kb as f64 / 1024.0)
    }
}

// ---------------------------------------------------------------------------------------------
// Temp folder and server environment

/// A fresh folder under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Res<TempDir> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path =
            std::env::temp_dir().join(format!("mcqemu-bench-{}-{nanos:08x}", std::process::id()));
        std::fs::create_dir(&path)
            .map_err(|e| format!("cannot create temp folder {}: {e}", path.display()))?;
        Ok(TempDir(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where spawned servers keep their state: inside the temp folder, nowhere else.
struct ServerEnv {
    state: PathBuf,
    runtime: PathBuf,
}

impl ServerEnv {
    fn new(tmp: &TempDir) -> Res<ServerEnv> {
        let state = tmp.path().join("state");
        let runtime = tmp.path().join("runtime");
        for d in [&state, &runtime] {
            std::fs::create_dir(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
        }
        Ok(ServerEnv { state, runtime })
    }
}

// ---------------------------------------------------------------------------------------------
// The server under test

/// One `mcqemu serve` process, spoken to over its stdin/stdout.
struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Arc<Mutex<Vec<u8>>>,
    next_id: u64,
}

impl Server {
    fn spawn(env: &ServerEnv) -> Res<Server> {
        let mut child = Command::new(SERVER_BIN)
            .arg("serve")
            .env("MCQEMU_STATE_DIR", &env.state)
            .env("MCQEMU_RUNTIME_DIR", &env.runtime)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {SERVER_BIN}: {e}"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or("no stdout pipe")?;
        let stderr_pipe = child.stderr.take().ok_or("no stderr pipe")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let mut line = String::new();
                match r.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if tx.send(line).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut r = stderr_pipe;
            let mut buf = [0u8; 4096];
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if let Ok(mut kept) = sink.lock() {
                    let room = STDERR_KEEP.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
            }
        });
        Ok(Server {
            child,
            stdin,
            lines,
            stderr,
            next_id: 1,
        })
    }

    fn stderr_text(&self) -> String {
        let kept = self.stderr.lock().map(|k| k.clone()).unwrap_or_default();
        let text = String::from_utf8_lossy(&kept).trim().to_string();
        if text.is_empty() {
            "(server stderr empty)".into()
        } else {
            format!("server stderr:\n{text}")
        }
    }

    fn send(&mut self, msg: &Value) -> Res<()> {
        let mut line = msg.to_string();
        line.push('\n');
        let stdin = self.stdin.as_mut().ok_or("server stdin already closed")?;
        stdin
            .write_all(line.as_bytes())
            .and_then(|_| stdin.flush())
            .map_err(|e| format!("writing to the server failed: {e}; {}", self.stderr_text()))
    }

    /// Sends a request and returns its `result`; a JSON-RPC error is an `Err`.
    fn request(&mut self, method: &str, params: Value) -> Res<Value> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))?;
        let reply = self.reply(id, method)?;
        if let Some(err) = reply.get("error") {
            return Err(format!("{method} failed: {err}"));
        }
        reply
            .get("result")
            .cloned()
            .ok_or_else(|| format!("{method}: reply without result: {reply}"))
    }

    /// Waits (bounded) for the reply with `id`, skipping notifications and log messages.
    fn reply(&mut self, id: u64, method: &str) -> Res<Value> {
        let deadline = Instant::now() + REPLY_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let v: Value = serde_json::from_str(&line)
                        .map_err(|e| format!("server wrote a non-JSON line ({e}): {line:?}"))?;
                    if v.get("id").and_then(Value::as_u64) == Some(id) {
                        return Ok(v);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "server hung: no reply to {method} (id {id}) within {} s; {}",
                        REPLY_TIMEOUT.as_secs(),
                        self.stderr_text()
                    ))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(format!(
                        "server closed stdout while {method} (id {id}) was pending; {}",
                        self.stderr_text()
                    ))
                }
            }
        }
    }

    /// The MCP handshake: initialize, then the initialized notification.
    fn initialize(&mut self) -> Res<Value> {
        let r = self.request("initialize", init_params())?;
        self.send(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }))?;
        Ok(r)
    }

    /// A `tools/call`; a tool error (`isError: true`) is an `Err`.
    fn call_tool(&mut self, name: &str, arguments: Value) -> Res<Value> {
        let r = self.request(
            "tools/call",
            json!({ "name": name, "arguments": arguments }),
        )?;
        if r.get("isError").and_then(Value::as_bool) == Some(true) {
            return Err(format!("tool {name} failed: {r}"));
        }
        Ok(r)
    }

    /// Peak resident set size so far (VmHWM), in KiB.
    fn peak_rss_kb(&self) -> Res<u64> {
        let file = format!("/proc/{}/status", self.child.id());
        let status =
            std::fs::read_to_string(&file).map_err(|e| format!("cannot read {file}: {e}"))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or_else(|| format!("no VmHWM line in {file}"))
    }

    /// Closes stdin and waits (bounded) for a clean exit.
    fn close(&mut self) -> Res<()> {
        drop(self.stdin.take());
        let deadline = Instant::now() + EXIT_TIMEOUT;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => {
                    return Err(format!(
                        "server exited with {status} after stdin closed; {}",
                        self.stderr_text()
                    ))
                }
                Ok(None) if Instant::now() >= deadline => {
                    return Err(format!(
                        "server did not exit within {} s of stdin closing; {}",
                        EXIT_TIMEOUT.as_secs(),
                        self.stderr_text()
                    ))
                }
                Ok(None) => std::thread::sleep(Duration::from_micros(200)),
                Err(e) => return Err(format!("waiting for the server failed: {e}")),
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A no-op after a clean close; otherwise make sure no server outlives the bench.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// qemu-img, run directly

/// Runs `program args` with a deadline; returns stdout on success.
fn run_bounded(program: &str, args: &[&std::ffi::OsStr], timeout: Duration) -> Res<Vec<u8>> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let (tx, rx) = mpsc::channel();
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    std::thread::spawn(move || {
        let mut o = Vec::new();
        let mut e = Vec::new();
        // stderr output of these commands is tiny, so reading stdout first cannot deadlock.
        if let Some(s) = out.as_mut() {
            let _ = s.read_to_end(&mut o);
        }
        if let Some(s) = err.as_mut() {
            let _ = s.read_to_end(&mut e);
        }
        let _ = tx.send((o, e));
    });
    let (stdout, stderr) = match rx.recv_timeout(timeout) {
        Ok(pair) => pair,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{program} did not finish within {} s",
                timeout.as_secs()
            ));
        }
    };
    let status = child
        .wait()
        .map_err(|e| format!("waiting for {program}: {e}"))?;
    if !status.success() {
        return Err(format!(
            "{program} failed ({status}): {}",
            String::from_utf8_lossy(&stderr).trim()
        ));
    }
    Ok(stdout)
}

fn create_image(qemu_img: &str, path: &Path) -> Res<()> {
    let os = std::ffi::OsStr::new;
    run_bounded(
        qemu_img,
        &[
            os("create"),
            os("-q"),
            os("-f"),
            os("qcow2"),
            path.as_os_str(),
            os("64M"),
        ],
        QEMU_IMG_TIMEOUT,
    )
    .map(|_| ())
}

/// What the image_info tool runs, done directly: `qemu-img info --output=json -U FILE`.
fn qemu_img_info(qemu_img: &str, path: &Path) -> Res<Value> {
    let os = std::ffi::OsStr::new;
    let out = run_bounded(
        qemu_img,
        &[os("info"), os("--output=json"), os("-U"), path.as_os_str()],
        QEMU_IMG_TIMEOUT,
    )?;
    serde_json::from_slice(&out).map_err(|e| format!("qemu-img info gave non-JSON output: {e}"))
}

fn first_line_of(program: &str, args: &[&str]) -> String {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    match run_bounded(program, &args, QEMU_IMG_TIMEOUT) {
        Ok(out) => String::from_utf8_lossy(&out)
            .lines()
            .next()
            .unwrap_or("")
            .to_string(),
        Err(e) => format!("({e})"),
    }
}
