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
//!
//! The VM rows (see [`vm_rows`]) drive real QEMUs (TCG) through the server: a diskless BIOS VM
//! and the test guest of `tests/guest/build_guest.py` (built into `target/test-guest`, the
//! tests' cache). They run fewer repetitions: `MCQEMU_BENCH_VM_N` (default min(N, 20)) for rows
//! that start, stop or exec something, min(that, 10) for the 8 MiB file read, and
//! `MCQEMU_BENCH_BOOTS` (default min(N, 10)) guest boots for the sandbox_vm readiness rows. A
//! section whose prerequisite (qemu-system-x86_64, python3 and the guest build) is missing
//! prints a SKIPPED row instead; a section that fails prints an ERROR row, the others still
//! run, and the bench exits non-zero. Every VM is stopped at the end (stop_vm force=true /
//! sandbox_destroy, then SIGKILL by the PIDs in the temp folder's `*.pid` files as a last
//! resort), and every wait on QEMU or the guest is bounded.

use std::cell::RefCell;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mcqemu::mcp::protocol::INIT_VERSIONS;
use mcqemu::qemu::qga::Qga;
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
const VM_INFO_TARGET: Duration = Duration::from_millis(3);
const LIST_VMS_TARGET: Duration = Duration::from_millis(10);
const LAUNCH_OVERHEAD_TARGET: Duration = Duration::from_millis(10);
const STOP_TARGET: Duration = Duration::from_millis(100);
const EXEC_TARGET: Duration = Duration::from_millis(50);
const FILE_READ_TARGET_MBPS: f64 = 20.0;
const READY_OVERSHOOT_TARGET: Duration = Duration::from_millis(100);
const SCREENSHOT_TARGET: Duration = Duration::from_millis(10);
const TYPE_TEXT_TARGET: Duration = Duration::from_millis(100);
const CLICK_TARGET: Duration = Duration::from_millis(30);

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

    // 5. The VM tools, against real QEMUs.
    vm_rows(n, &mut table, &tmp, &env, &image);

    table.footer();
    if table.errors > 0 {
        return Err(format!(
            "{} VM section(s) failed; see the ERROR lines above",
            table.errors
        ));
    }
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

/// The printed table; counts targets met and missed, rows skipped and sections that failed.
struct Table {
    met: usize,
    missed: usize,
    skipped: usize,
    errors: usize,
}

const NAME_W: usize = 40;

impl Table {
    fn new() -> Table {
        Table {
            met: 0,
            missed: 0,
            skipped: 0,
            errors: 0,
        }
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

    /// A difference of medians without a target.
    fn diff_info_row(&mut self, name: &str, a: Duration, b: Duration) {
        let (sign, d) = if a >= b { ("+", a - b) } else { ("-", b - a) };
        let cols = [format!("{sign}{}", fmt_dur(d)), "-".into(), "-".into()];
        self.print(name, "", cols, "", "");
    }

    fn rss_row(&mut self, name: &str, kb: u64) {
        let verdict = self.verdict(Some(kb <= RSS_TARGET_KB));
        let cols = [fmt_kb(kb), "-".into(), "-".into()];
        let target = format!("<= {} MB", RSS_TARGET_KB / 1024);
        self.print(name, "1", cols, &target, verdict);
    }

    /// A row measured elsewhere whose result is a rate: `bytes` moved in each sample's time.
    /// Columns: the rate at the median, p90 and min time (MB = 10^6 bytes).
    fn rate_row(&mut self, name: &str, n: usize, bytes: usize, s: &Stats, target_mbps: f64) {
        let rate = |d: Duration| bytes as f64 / d.as_secs_f64().max(1e-9) / 1e6;
        let verdict = self.verdict(Some(rate(s.median) >= target_mbps));
        let cols = [s.median, s.p90, s.min].map(|d| format!("{:.1} MB/s", rate(d)));
        let target = format!(">= {target_mbps} MB/s");
        self.print(name, &n.to_string(), cols, &target, verdict);
    }

    /// A peak-RSS row without a target.
    fn rss_info_row(&mut self, name: &str, kb: u64) {
        let cols = [fmt_kb(kb), "-".into(), "-".into()];
        self.print(name, "1", cols, "", "");
    }

    fn skip_row(&mut self, name: &str, why: &str) {
        self.skipped += 1;
        let cols = ["-".into(), "-".into(), "-".into()];
        self.print(name, "", cols, "", &format!("SKIPPED: {why}"));
    }

    fn error_row(&mut self, name: &str, err: &str) {
        self.errors += 1;
        println!("{name}: ERROR: {err}");
    }

    fn section(&self, title: &str) {
        println!();
        println!("{title}");
    }

    /// An indented line of detail under the row above it.
    fn note(&self, text: &str) {
        println!("    {text}");
    }

    fn footer(&self) {
        println!();
        println!(
            "targets: {} met, {} missed (time targets compare the median; RSS is VmHWM in \
             /proc/PID/status, KiB)",
            self.met, self.missed
        );
        if self.skipped > 0 || self.errors > 0 {
            println!(
                "rows skipped: {}; sections failed: {}",
                self.skipped, self.errors
            );
        }
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
        self.request_within(method, params, REPLY_TIMEOUT)
    }

    /// Like `request`, waiting up to `timeout` for the reply (for calls that boot a guest).
    fn request_within(&mut self, method: &str, params: Value, timeout: Duration) -> Res<Value> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))?;
        let reply = self.reply(id, method, timeout)?;
        if let Some(err) = reply.get("error") {
            return Err(format!("{method} failed: {err}"));
        }
        reply
            .get("result")
            .cloned()
            .ok_or_else(|| format!("{method}: reply without result: {reply}"))
    }

    /// Waits (bounded) for the reply with `id`, skipping notifications and log messages.
    fn reply(&mut self, id: u64, method: &str, timeout: Duration) -> Res<Value> {
        let deadline = Instant::now() + timeout;
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
                        timeout.as_secs(),
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
        self.call_tool_within(name, arguments, REPLY_TIMEOUT)
    }

    /// Like `call_tool`, waiting up to `timeout` for the result.
    fn call_tool_within(&mut self, name: &str, arguments: Value, timeout: Duration) -> Res<Value> {
        let r = self.request_within(
            "tools/call",
            json!({ "name": name, "arguments": arguments }),
            timeout,
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
    // Each pipe drains on its own thread, so a chatty stderr (the guest builder's) cannot
    // block the program while stdout is being read.
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let both = out.recv_timeout(timeout).and_then(|o| {
        err.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .map(|e| (o, e))
    });
    let (stdout, stderr) = match both {
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

/// Reads a pipe to its end on a thread; the bytes arrive on the returned channel.
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        let _ = tx.send(buf);
    });
    rx
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

// ---------------------------------------------------------------------------------------------
// VM rows: real QEMUs (TCG) driven through the server

/// The system emulator the VM rows launch (the server runs `qemu-system-{arch}` too).
const QEMU_BIN: &str = "qemu-system-x86_64";
/// Longest wait for a tool call that starts or stops a QEMU or moves megabytes through a guest.
const VM_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// sandbox_vm's own wait for the agent (wait_agent_s).
const SANDBOX_WAIT_S: u64 = 60;
/// Longest wait for a sandbox_vm call: its agent wait plus launching.
const SANDBOX_CALL_TIMEOUT: Duration = Duration::from_secs(SANDBOX_WAIT_S + 60);
/// Longest a test guest may take from launch until its agent answers.
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest wait for the test-guest builder (about 25 s when nothing is cached), lock included.
const GUEST_BUILD_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest wait for a bare QEMU's daemonizing parent to exit.
const BARE_START_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for a pidfile, or for a SIGKILLed QEMU to be gone.
const PID_WAIT: Duration = Duration::from_secs(5);
/// Longest wait for a freshly booted diskless BIOS VM to go idle.
const IDLE_WAIT: Duration = Duration::from_secs(30);
/// What the test guest's init prints on the serial console right after starting qemu-ga.
const READY_MARKER: &[u8] = b"mcqemu-test-guest: ready";
/// The guest_file_read row's file size (the tool's maximum).
const BIG_FILE: usize = 8 * 1024 * 1024;
/// Dead records in the registry for the list_vms row.
const GHOSTS: usize = 100;

/// What the VM rows share.
struct VmBench<'a> {
    env: &'a ServerEnv,
    tmp: &'a Path,
    reaper: &'a Reaper,
    /// Rows of a few QMP round trips: the bench's own repetitions.
    quick: Bench,
    /// Rows that start or stop a QEMU, or wait for the guest.
    slow: Bench,
    /// The 8 MiB guest_file_read row.
    bulk: Bench,
    /// Guest boots for the sandbox_vm rows (each paired with a reference boot).
    boots: usize,
}

fn env_count(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

/// All VM rows. A section that cannot run prints SKIPPED rows; one that fails prints an ERROR
/// line (counted, so the bench exits non-zero) and the next section still runs. Every VM is
/// stopped before this returns.
fn vm_rows(n: usize, table: &mut Table, tmp: &TempDir, env: &ServerEnv, base_image: &Path) {
    let vm_n = env_count("MCQEMU_BENCH_VM_N", n.min(20));
    let reaper = Reaper::new(tmp.path());
    let vb = VmBench {
        env,
        tmp: tmp.path(),
        reaper: &reaper,
        quick: Bench { n, warmup: 3 },
        slow: Bench { n: vm_n, warmup: 1 },
        bulk: Bench {
            n: vm_n.min(10),
            warmup: 1,
        },
        boots: env_count("MCQEMU_BENCH_BOOTS", n.min(10)),
    };
    table.section("VM tools: real QEMU (TCG), driven over MCP");

    let diskless = "diskless VM: vm_info, list_vms, stop_vm, launch_vm";
    let guest_rows_name = "test guest: guest_exec, guest_file_read, screen, keys, mouse";
    let sandbox_name = "test guest: sandbox_vm readiness";
    let qemu = match run_bounded(QEMU_BIN, &[OsStr::new("--version")], QEMU_IMG_TIMEOUT) {
        Ok(out) => String::from_utf8_lossy(&out)
            .lines()
            .next()
            .unwrap_or("")
            .to_string(),
        Err(e) => {
            let why = format!("{QEMU_BIN} is not usable ({e})");
            for row in [diskless, guest_rows_name, sandbox_name] {
                table.skip_row(row, &why);
            }
            return;
        }
    };
    table.note(&format!("{qemu}; accel tcg (1 vCPU per VM)"));
    table.note(&format!(
        "repetitions: {n} for QMP-sized rows, {} for rows that start/stop/exec, {} for the \
         8 MiB read, {} guest boots (x2) for sandbox_vm",
        vb.slow.n, vb.bulk.n, vb.boots
    ));

    if let Err(e) = diskless_rows(&vb, table) {
        table.error_row(diskless, &e);
    }
    vb.cleanup(table);

    match build_guest() {
        Err(e) => {
            let why = format!("the test guest could not be built: {e}");
            table.skip_row(guest_rows_name, &why);
            table.skip_row(sandbox_name, &why);
        }
        Ok(guest) => {
            if let Err(e) = guest_rows(&vb, table, &guest) {
                table.error_row(guest_rows_name, &e);
            }
            vb.cleanup(table);
            if let Err(e) = sandbox_rows(&vb, table, &guest, base_image) {
                table.error_row(sandbox_name, &e);
            }
        }
    }
    vb.cleanup(table);
}

impl VmBench<'_> {
    /// A fresh, initialized server on the bench's state and runtime folders.
    fn server(&self) -> Res<Server> {
        let mut s = Server::spawn(self.env)?;
        s.initialize()?;
        Ok(s)
    }

    /// launch_vm; returns its structured result and remembers the PID for the last-resort kill.
    fn launch(&self, server: &mut Server, args: Value) -> Res<Value> {
        let r = server.call_tool_within("launch_vm", args, VM_CALL_TIMEOUT)?;
        let s = structured(&r)?.clone();
        if let Some(pid) = s["pid"].as_i64() {
            self.reaper.track(pid as i32);
        }
        Ok(s)
    }

    /// stop_vm force=true, which must report the VM stopped.
    fn stop(&self, server: &mut Server, name: &str) -> Res<()> {
        let r = server.call_tool_within(
            "stop_vm",
            json!({"name": name, "force": true}),
            VM_CALL_TIMEOUT,
        )?;
        let s = structured(&r)?;
        if s["status"] != json!("stopped") {
            return Err(format!("stop_vm {name} did not stop it: {s}"));
        }
        Ok(())
    }

    fn serial_log(&self, name: &str) -> PathBuf {
        self.env.state.join("vms").join(name).join("serial.log")
    }

    /// Stops every VM the registry still shows alive (sandbox_destroy for sandboxes, stop_vm
    /// force=true otherwise), then SIGKILLs whatever QEMU of this bench is left.
    fn cleanup(&self, table: &Table) {
        let mut problems = Vec::new();
        let mut stopped = Vec::new();
        match self.server() {
            Err(e) => problems.push(e),
            Ok(mut server) => {
                let listed = server
                    .call_tool("list_vms", json!({}))
                    .and_then(|r| Ok(structured(&r)?["vms"].clone()));
                match listed {
                    Err(e) => problems.push(e),
                    Ok(vms) => {
                        for v in vms.as_array().into_iter().flatten() {
                            let name = v["name"].as_str().unwrap_or("").to_string();
                            if v["status"] == json!("stopped") || name.is_empty() {
                                continue;
                            }
                            let done = if v["sandbox"].is_object() {
                                server.call_tool_within(
                                    "sandbox_destroy",
                                    json!({"name": name}),
                                    VM_CALL_TIMEOUT,
                                )
                            } else {
                                server.call_tool_within(
                                    "stop_vm",
                                    json!({"name": name, "force": true}),
                                    VM_CALL_TIMEOUT,
                                )
                            };
                            match done {
                                Ok(_) => stopped.push(name),
                                Err(e) => problems.push(e),
                            }
                        }
                    }
                }
                if let Err(e) = server.close() {
                    problems.push(e);
                }
            }
        }
        if !stopped.is_empty() {
            table.note(&format!("cleanup stopped left-over VMs: {stopped:?}"));
        }
        for p in problems {
            table.note(&format!("cleanup problem: {p}"));
        }
        let killed = self.reaper.sweep();
        if !killed.is_empty() {
            table.note(&format!("cleanup SIGKILLed left-over QEMU PIDs {killed:?}"));
        }
    }
}

/// A tool result's `structuredContent`.
fn structured(r: &Value) -> Res<&Value> {
    r.get("structuredContent")
        .ok_or_else(|| format!("tool result without structuredContent: {r}"))
}

/// launch_vm arguments of the diskless BIOS VM.
fn bios_args(name: &str) -> Value {
    json!({"name": name, "memory_mb": 64, "cpus": 1, "accel": "tcg"})
}

/// launch_vm arguments of the test guest.
fn guest_args(g: &Guest, name: &str, memory_mb: u64) -> Value {
    json!({
        "name": name, "kernel": g.kernel, "initrd": g.initrd, "append": g.append,
        "memory_mb": memory_mb, "cpus": 1, "accel": "tcg"
    })
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

// ---- diskless BIOS VM: vm_info, list_vms, stop_vm, launch_vm against bare QEMU ----

fn diskless_rows(vb: &VmBench, table: &mut Table) -> Res<()> {
    let mut server = vb.server()?;
    let bios = "bench-bios";
    let launched = vb.launch(&mut server, bios_args(bios))?;
    // A diskless BIOS VM spends its first seconds in SeaBIOS and iPXE (DHCP, PXE); a busy TCG
    // vCPU slows QEMU's monitor, so the QMP-sized rows are measured once the VM is idle.
    let pid = launched["pid"].as_i64().ok_or("launch_vm gave no pid")? as i32;
    match wait_idle(pid, IDLE_WAIT) {
        Some(after) => table.note(&format!(
            "BIOS VM idle (SeaBIOS/iPXE done) {} s after launch; vm_info and list_vms run on \
             the idle VM",
            after.as_secs_f64().round()
        )),
        None => table.note(&format!(
            "BIOS VM still busy {} s after launch; measuring anyway",
            IDLE_WAIT.as_secs()
        )),
    }
    vb.quick.time(
        table,
        "vm_info (running diskless BIOS VM)",
        Some(VM_INFO_TARGET),
        || {
            let r = server.call_tool("vm_info", json!({ "name": bios }))?;
            let s = structured(&r)?;
            match s["status"].as_str() {
                Some("running") => Ok(()),
                _ => Err(format!("vm_info does not show {bios} running: {s}")),
            }
        },
    )?;
    server.close()?;

    // list_vms: 100 dead records written before the server starts, plus the live VM.
    set_ghosts(&vb.env.state, vb.tmp, true)?;
    let listed = (|| {
        let mut server = vb.server()?;
        vb.quick.time(
            table,
            "list_vms (100 dead records + 1 live VM)",
            Some(LIST_VMS_TARGET),
            || {
                let r = server.call_tool("list_vms", json!({}))?;
                let vms = structured(&r)?["vms"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let live = vms
                    .iter()
                    .filter(|v| v["status"] != json!("stopped"))
                    .count();
                if vms.len() != GHOSTS + 1 || live != 1 {
                    return Err(format!(
                        "list_vms showed {} VMs, {live} alive; expected {} and 1",
                        vms.len(),
                        GHOSTS + 1
                    ));
                }
                Ok(())
            },
        )?;
        server.close()
    })();
    set_ghosts(&vb.env.state, vb.tmp, false)?;
    listed?;

    let mut server = vb.server()?;
    vb.stop(&mut server, bios)?;

    // Forced stop of a running VM: launched (untimed), left running briefly, stopped (timed).
    let stop = "bench-stop";
    vb.slow.measure(
        table,
        "stop_vm force=true (running BIOS VM)",
        Some(STOP_TARGET),
        || {
            vb.launch(&mut server, bios_args(stop))?;
            std::thread::sleep(Duration::from_millis(200));
            let t0 = Instant::now();
            vb.stop(&mut server, stop)?;
            Ok(t0.elapsed())
        },
    )?;

    // launch_vm against QEMU's own start-up. Each repetition runs, back to back (so all see
    // the same background load): the bench's minimal QEMU command; launch_vm's exact QEMU
    // argv started directly, timed to the parent's exit and again to the end of the QMP
    // session launch_vm opens right after it (query-kvm, query-status); and launch_vm over
    // MCP. Daemons are killed and launched VMs force-stopped outside the timed parts.
    let name = "bench-launch";
    let s = vb.launch(&mut server, bios_args(name))?;
    let argv = s["pid"]
        .as_i64()
        .and_then(|p| cmdline(p as i32))
        .ok_or("could not read launch_vm's QEMU command line from /proc")?;
    vb.stop(&mut server, name)?;

    let bare_dir = vb.tmp.join("bare");
    std::fs::create_dir_all(&bare_dir).map_err(|e| format!("cannot create bare/: {e}"))?;
    let qmp = bare_dir.join("qmp.sock");
    let plain: Vec<String> = [
        "-display",
        "none",
        "-machine",
        "q35",
        "-accel",
        "tcg",
        "-m",
        "64",
        "-daemonize",
        "-pidfile",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        bare_dir.join("qemu.pid").display().to_string(),
        "-qmp".to_string(),
        format!("unix:{},server=on,wait=off", qmp.display()),
    ])
    .collect();

    let rt = vb.env.runtime.join(name).display().to_string();
    let sd = vb.env.state.join("vms").join(name).display().to_string();
    let same_dir = vb.tmp.join("bare-same");
    std::fs::create_dir_all(&same_dir).map_err(|e| format!("cannot create bare-same/: {e}"))?;
    let same_s = same_dir.display().to_string();
    let same: Vec<String> = argv
        .iter()
        .skip(1)
        .map(|a| a.replace(&rt, &same_s).replace(&sd, &same_s))
        .collect();
    if same.iter().any(|a| a.contains(&rt) || a.contains(&sd)) {
        return Err(format!(
            "could not move launch_vm's argv to {same_s}: {same:?}"
        ));
    }
    let same_qmp = same_dir.join("qmp.sock");

    let (mut plain_t, mut same_t, mut same_qmp_t, mut mcp_t) = (vec![], vec![], vec![], vec![]);
    for i in 0..vb.slow.warmup + vb.slow.n {
        let run = |e: String| format!("launch_vm vs bare qemu (run {}): {e}", i + 1);
        let (a, _) = bare_start(vb.reaper, &plain, &bare_dir, None).map_err(run)?;
        let (b, c) = bare_start(vb.reaper, &same, &same_dir, Some(&same_qmp)).map_err(run)?;
        let t0 = Instant::now();
        vb.launch(&mut server, bios_args(name)).map_err(run)?;
        let d = t0.elapsed();
        vb.stop(&mut server, name).map_err(run)?;
        if i >= vb.slow.warmup {
            plain_t.push(a);
            same_t.push(b);
            same_qmp_t.push(c.unwrap_or(b));
            mcp_t.push(d);
        }
    }
    let n = vb.slow.n;
    let row = |table: &mut Table, name: &str, v: Vec<Duration>| {
        let s = Stats::of(v);
        table.time_row(name, n, &s, None);
        s
    };
    let plain_s = row(table, "bare qemu -daemonize (minimal argv)", plain_t);
    let same_s = row(table, "bare qemu -daemonize (launch_vm's argv)", same_t);
    let same_qmp_s = row(table, "  ... + launch_vm's first QMP session", same_qmp_t);
    let mcp = row(table, "launch_vm (diskless BIOS, via MCP)", mcp_t);
    table.diff_row(
        "launch_vm - bare qemu (median diff)",
        mcp.median,
        plain_s.median,
        LAUNCH_OVERHEAD_TARGET,
    );
    table.diff_info_row(
        "launch_vm - same-argv qemu (median diff)",
        mcp.median,
        same_s.median,
    );
    table.diff_info_row(
        "launch_vm - same argv + QMP (median diff)",
        mcp.median,
        same_qmp_s.median,
    );
    server.close()
}

/// Waits (bounded) until QEMU `pid` uses at most 1 clock tick of CPU per half second;
/// returns how long that took, or None when it stayed busy.
fn wait_idle(pid: i32, limit: Duration) -> Option<Duration> {
    let cpu_ticks = || -> Option<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let f: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
        // utime and stime: fields 14 and 15 of stat, 12 and 13 after the command name.
        Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
    };
    let t0 = Instant::now();
    let mut last = cpu_ticks()?;
    while t0.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(500));
        let now = cpu_ticks()?;
        if now.saturating_sub(last) <= 1 {
            return Some(t0.elapsed());
        }
        last = now;
    }
    None
}

/// Adds (or removes) the dead registry records of the list_vms row, while no server runs.
fn set_ghosts(state: &Path, tmp: &Path, add: bool) -> Res<()> {
    let file = state.join("vms.json");
    let mut top: Value = match std::fs::read(&file) {
        Ok(b) => serde_json::from_slice(&b)
            .map_err(|e| format!("{} is not JSON: {e}", file.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => json!({"version": 1, "vms": {}}),
        Err(e) => return Err(format!("cannot read {}: {e}", file.display())),
    };
    let vms = top
        .get_mut("vms")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| format!("{} has no vms object", file.display()))?;
    for i in 0..GHOSTS {
        let name = format!("ghost-{i:03}");
        if add {
            let sock = tmp.join(format!("nonexistent-{i}.sock"));
            vms.insert(
                name,
                json!({"qmp_socket": sock.display().to_string(), "pid": null, "source": "spawned", "arch": "x86_64"}),
            );
        } else {
            vms.remove(&name);
        }
    }
    let part = state.join("vms.json.bench-tmp");
    let bytes = serde_json::to_vec_pretty(&top).map_err(|e| e.to_string())?;
    std::fs::write(&part, bytes)
        .and_then(|_| std::fs::rename(&part, &file))
        .map_err(|e| format!("cannot write {}: {e}", file.display()))
}

/// The arguments of a live process, from /proc.
fn cmdline(pid: i32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
    )
}

/// Runs `qemu-system-x86_64 ARGS` (which daemonize with `-pidfile DIR/qemu.pid`) the way the
/// server does (stdin and stdout on /dev/null, stderr piped) and times it until the daemonizing
/// parent exits; with `qmp`, also until the QMP session launch_vm opens right after start-up
/// (greeting, capabilities, query-kvm, query-status) has finished. Then SIGKILLs the daemon
/// (untimed).
fn bare_start(
    reaper: &Reaper,
    args: &[String],
    dir: &Path,
    qmp: Option<&Path>,
) -> Res<(Duration, Option<Duration>)> {
    let pidfile = dir.join("qemu.pid");
    for f in [
        "qemu.pid",
        "qmp.sock",
        "qga.sock",
        "serial.sock",
        "serial.log",
    ] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    let t0 = Instant::now();
    let mut child = Command::new(QEMU_BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {QEMU_BIN}: {e}"))?;
    let parent = child.id() as i32;
    let stderr = drain(child.stderr.take());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let status = child.wait();
        let _ = tx.send((status, Instant::now()));
    });
    let (status, exited) = match rx.recv_timeout(BARE_START_TIMEOUT) {
        Ok((Ok(status), at)) => (status, at),
        Ok((Err(e), _)) => return Err(format!("waiting for {QEMU_BIN}: {e}")),
        Err(_) => {
            // SAFETY: kill(2) on our own child's PID; no memory is involved.
            unsafe { libc::kill(parent, libc::SIGKILL) };
            return Err(format!(
                "{QEMU_BIN} did not daemonize within {} s",
                BARE_START_TIMEOUT.as_secs()
            ));
        }
    };
    let took = exited - t0;
    if !status.success() {
        let err = stderr.recv_timeout(PID_WAIT).unwrap_or_default();
        return Err(format!(
            "{QEMU_BIN} failed to start ({status}): {}",
            String::from_utf8_lossy(&err).trim()
        ));
    }
    let pid = read_pidfile(&pidfile, PID_WAIT)
        .ok_or_else(|| format!("{QEMU_BIN} wrote no PID to {}", pidfile.display()));
    if let Ok(pid) = pid {
        reaper.track(pid);
    }
    let with_qmp = qmp.map(|sock| {
        mcqemu::qemu::qmp::with_session(sock, |q| {
            q.execute("query-kvm", None)?;
            q.execute("query-status", None)
        })
        .map(|_| t0.elapsed())
        .map_err(|e| format!("QMP on {}: {e}", sock.display()))
    });
    let pid = pid?;
    if !reaper.kill(pid) {
        return Err(format!(
            "daemonized QEMU {pid} was not ours or already gone"
        ));
    }
    Ok((took, with_qmp.transpose()?))
}

fn read_pidfile(path: &Path, wait: Duration) -> Option<i32> {
    let deadline = Instant::now() + wait;
    loop {
        let pid = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .filter(|p| *p > 0);
        if pid.is_some() || Instant::now() >= deadline {
            return pid;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

// ---- the test guest: agent, screen, keyboard and mouse rows ----

/// The test guest's direct-kernel-boot files.
struct Guest {
    kernel: String,
    initrd: String,
    append: String,
}

/// Builds (or finds cached) the test guest in `<manifest dir>/target/test-guest`, under the
/// same lock file the tests take, so a test run building it at the same time is waited for.
fn build_guest() -> Res<Guest> {
    use std::os::unix::io::AsRawFd;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = root.join("target").join("test-guest");
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(out.join(".build.lock"))
        .map_err(|e| format!("cannot open the guest build lock: {e}"))?;
    let deadline = Instant::now() + GUEST_BUILD_TIMEOUT;
    loop {
        // SAFETY: flock on a file descriptor we own; no memory is involved.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            break;
        }
        if Instant::now() >= deadline {
            return Err("another build of the test guest held its lock too long".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let script = root.join("tests").join("guest").join("build_guest.py");
    let left = deadline.saturating_duration_since(Instant::now());
    let built = run_bounded(
        "python3",
        &[script.as_os_str(), out.as_os_str()],
        left.max(Duration::from_secs(1)),
    );
    drop(lock);
    let v: Value = serde_json::from_slice(&built?)
        .map_err(|e| format!("build_guest.py printed no JSON: {e}"))?;
    let field = |k: &str| {
        v[k].as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("build_guest.py output lacks {k}: {v}"))
    };
    Ok(Guest {
        kernel: field("kernel")?,
        initrd: field("initrd")?,
        append: field("append")?,
    })
}

/// Waits (bounded) until the guest agent on `sock` answers a sync, holding each probe open
/// for up to 10 s: a probe sent before qemu-ga starts waits in the socket and is answered as
/// soon as the agent opens its port. Returns when the answer arrived.
fn first_answer(sock: &Path, limit: Duration) -> Res<Instant> {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "the guest agent on {} did not answer within {} s",
                sock.display(),
                limit.as_secs()
            ));
        }
        match Qga::connect(sock, left.min(Duration::from_secs(10))) {
            Ok(_) => return Ok(Instant::now()),
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// Watches a serial log (polling the file every millisecond, never touching the VM) for the
/// test guest's ready line, and notes when it appeared.
struct SerialWatch {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Option<Instant>>>,
}

impl SerialWatch {
    fn start(path: PathBuf, limit: Duration) -> SerialWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = std::thread::spawn(move || {
            let deadline = Instant::now() + limit;
            let mut seen: Vec<u8> = Vec::new();
            while !flag.load(Ordering::Relaxed) && Instant::now() < deadline {
                if let Ok(mut f) = std::fs::File::open(&path) {
                    let from = seen.len();
                    if f.seek(SeekFrom::Start(from as u64)).is_ok() {
                        let _ = f.read_to_end(&mut seen);
                    }
                    let start = from.saturating_sub(READY_MARKER.len());
                    if seen[start..]
                        .windows(READY_MARKER.len())
                        .any(|w| w == READY_MARKER)
                    {
                        return Some(Instant::now());
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            None
        });
        SerialWatch {
            stop,
            handle: Some(handle),
        }
    }

    /// When the ready line appeared (waiting a moment for the watcher to notice it).
    fn finish(mut self) -> Option<Instant> {
        let handle = self.handle.take()?;
        let until = Instant::now() + Duration::from_millis(500);
        while !handle.is_finished() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.stop.store(true, Ordering::Relaxed);
        handle.join().ok().flatten()
    }
}

impl Drop for SerialWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn guest_rows(vb: &VmBench, table: &mut Table, g: &Guest) -> Res<()> {
    let mut server = vb.server()?;
    let name = "bench-guest";
    // 256 MiB: the agent holds the 8 MiB file and its base64 copy in memory.
    let log = vb.serial_log(name);
    let _ = std::fs::remove_file(&log);
    let watch = SerialWatch::start(log, BOOT_TIMEOUT);
    let t0 = Instant::now();
    let s = vb.launch(&mut server, guest_args(g, name, 256))?;
    let launched = t0.elapsed();
    let qga = PathBuf::from(
        s["qga_socket"]
            .as_str()
            .ok_or("launch_vm gave no qga_socket")?,
    );
    let answered = first_answer(&qga, BOOT_TIMEOUT)?;
    let serial = watch.finish();
    table.note(&format!(
        "test guest (256 MiB) booted: launch_vm returned after {} ms, agent answered {} ms \
         after launch began ({} ms after the serial ready line)",
        ms(launched),
        ms(answered - t0),
        serial.map_or("?".into(), |t| ms(answered.saturating_duration_since(t)))
    ));

    vb.slow
        .time(table, "guest_exec /bin/true", Some(EXEC_TARGET), || {
            let r = server.call_tool_within(
                "guest_exec",
                json!({"name": name, "command": "/bin/true"}),
                VM_CALL_TIMEOUT,
            )?;
            let s = structured(&r)?;
            match s["exitcode"].as_i64() {
                Some(0) => Ok(()),
                _ => Err(format!("/bin/true did not exit 0: {s}")),
            }
        })?;

    let r = server.call_tool_within(
        "guest_exec",
        json!({"name": name, "command": "sh", "timeout": 60,
               "args": ["-c", format!("head -c {BIG_FILE} /dev/urandom > /tmp/big")]}),
        VM_CALL_TIMEOUT,
    )?;
    if structured(&r)?["exitcode"] != json!(0) {
        return Err(format!("creating /tmp/big in the guest failed: {r}"));
    }
    let read = vb
        .bulk
        .time(table, "guest_file_read 8 MiB, base64", None, || {
            let r = server.call_tool_within(
            "guest_file_read",
            json!({"name": name, "path": "/tmp/big", "max_bytes": BIG_FILE, "encoding": "base64"}),
            VM_CALL_TIMEOUT,
        )?;
            let s = structured(&r)?;
            let b64_len = BIG_FILE.div_ceil(3) * 4;
            if s["size"] != json!(BIG_FILE)
                || s["truncated"] != json!(false)
                || s["content"].as_str().map(str::len) != Some(b64_len)
            {
                return Err(format!(
                    "guest_file_read gave size {} truncated {} and {:?} content bytes",
                    s["size"],
                    s["truncated"],
                    s["content"].as_str().map(str::len)
                ));
            }
            Ok(())
        })?;
    table.rate_row(
        "  -> guest_file_read throughput",
        vb.bulk.n,
        BIG_FILE,
        &read,
        FILE_READ_TARGET_MBPS,
    );

    let first = server.call_tool("vm_screenshot", json!({ "name": name }))?;
    let s = structured(&first)?;
    let (w, h) = match (s["width"].as_u64(), s["height"].as_u64()) {
        (Some(w), Some(h)) if w > 0 && h > 0 => (w, h),
        _ => return Err(format!("vm_screenshot gave no size: {s}")),
    };
    let png_bytes = s["bytes"].as_u64().unwrap_or(0);
    vb.quick.time(
        table,
        &format!("vm_screenshot inline PNG, {w}x{h}"),
        Some(SCREENSHOT_TARGET),
        || {
            let r = server.call_tool("vm_screenshot", json!({ "name": name }))?;
            let has_image = r["content"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == json!("image") && c["data"].as_str().is_some());
            if has_image {
                Ok(())
            } else {
                Err(format!("vm_screenshot returned no inline image: {r}"))
            }
        },
    )?;
    table.note(&format!(
        "the target is for 1024x768; the test guest's text console is {w}x{h} \
         ({png_bytes} PNG bytes)"
    ));

    vb.slow.time(
        table,
        "vm_type_text 10 chars (delay_ms 30)",
        Some(TYPE_TEXT_TARGET),
        || {
            let r =
                server.call_tool("vm_type_text", json!({"name": name, "text": "abcdefghij"}))?;
            match structured(&r)?["characters"].as_u64() {
                Some(10) => Ok(()),
                _ => Err(format!("vm_type_text did not type 10 characters: {r}")),
            }
        },
    )?;

    let (x, y) = (w / 2, h / 2);
    vb.quick.time(
        table,
        &format!("vm_click ({x},{y}) on {w}x{h}"),
        Some(CLICK_TARGET),
        || {
            server
                .call_tool("vm_click", json!({"name": name, "x": x, "y": y}))
                .map(|_| ())
        },
    )?;

    vb.stop(&mut server, name)?;
    let kb = server.peak_rss_kb()?;
    table.rss_info_row("peak RSS: server after the guest rows", kb);
    server.close()
}

// ---- sandbox_vm readiness ----

/// sandbox_vm readiness. The server polls the agent itself, and the agent socket serves one
/// client at a time, so the bench cannot watch the agent while sandbox_vm runs. Instead each
/// repetition pairs two boots of the same guest:
/// - a reference boot (launch_vm), where the bench holds a probe open on the agent socket and
///   measures "serial ready line -> agent first answers" (qemu-ga's own start-up);
/// - a sandbox_vm boot, where the bench watches only the serial log file and measures
///   "serial ready line -> sandbox_vm returned".
///
/// The difference of the medians estimates how late sandbox_vm notices the agent.
fn sandbox_rows(vb: &VmBench, table: &mut Table, g: &Guest, base_image: &Path) -> Res<()> {
    let mut server = vb.server()?;
    let mut total = Vec::new();
    let mut waited = Vec::new();
    let mut launch_part = Vec::new();
    let mut serial_to_reply = Vec::new();
    let mut ref_serial_to_answer = Vec::new();
    let mut ref_launch_to_answer = Vec::new();
    for run in 1..=vb.boots {
        let fail = |e: String| format!("boot {run}: {e}");
        // Reference boot.
        let name = "bench-ref";
        let log = vb.serial_log(name);
        let _ = std::fs::remove_file(&log);
        let watch = SerialWatch::start(log, BOOT_TIMEOUT);
        let t0 = Instant::now();
        let s = vb
            .launch(&mut server, guest_args(g, name, 128))
            .map_err(fail)?;
        let qga = PathBuf::from(s["qga_socket"].as_str().ok_or("no qga_socket")?);
        let answered = first_answer(&qga, BOOT_TIMEOUT).map_err(fail)?;
        let serial = watch
            .finish()
            .ok_or_else(|| fail("no ready line in the reference boot's serial log".into()))?;
        ref_serial_to_answer.push(answered.saturating_duration_since(serial));
        ref_launch_to_answer.push(answered - t0);
        vb.stop(&mut server, name).map_err(fail)?;

        // sandbox_vm boot.
        let name = "bench-sb";
        let watch = SerialWatch::start(vb.serial_log(name), SANDBOX_CALL_TIMEOUT);
        let t0 = Instant::now();
        let r = server
            .call_tool_within(
                "sandbox_vm",
                json!({
                    "base_image": base_image, "name": name, "memory_mb": 128, "cpus": 1,
                    "port_forwards": [], "wait_agent_s": SANDBOX_WAIT_S,
                    "kernel": g.kernel, "initrd": g.initrd, "append": g.append
                }),
                SANDBOX_CALL_TIMEOUT,
            )
            .map_err(fail)?;
        let done = Instant::now();
        let s = structured(&r)?.clone();
        if let Some(pid) = s["pid"].as_i64() {
            vb.reaper.track(pid as i32);
        }
        let serial = watch.finish();
        if s["agent_ready"] != json!(true) {
            return Err(fail(format!("sandbox_vm: agent not ready: {s}")));
        }
        let serial =
            serial.ok_or_else(|| fail("no ready line in the sandbox's serial log".into()))?;
        let wait = Duration::from_millis(s["agent_wait_ms"].as_u64().unwrap_or(0));
        total.push(done - t0);
        waited.push(wait);
        launch_part.push((done - t0).saturating_sub(wait));
        serial_to_reply.push(done.saturating_duration_since(serial));
        let r = server
            .call_tool_within("sandbox_destroy", json!({ "name": name }), VM_CALL_TIMEOUT)
            .map_err(fail)?;
        if structured(&r)?["destroyed"] != json!(true) {
            return Err(fail(format!("sandbox_destroy did not destroy it: {r}")));
        }
    }
    let n = vb.boots;
    let row = |table: &mut Table, name: &str, v: &[Duration]| {
        let s = Stats::of(v.to_vec());
        table.time_row(name, n, &s, None);
        s
    };
    row(table, "sandbox_vm total (MCP round trip)", &total);
    row(table, "  agent_wait_ms (server-reported)", &waited);
    row(
        table,
        "  total - agent_wait_ms (overlay+launch)",
        &launch_part,
    );
    let s2r = row(
        table,
        "  serial ready line -> sandbox_vm reply",
        &serial_to_reply,
    );
    row(
        table,
        "ref: launch_vm -> agent first answer",
        &ref_launch_to_answer,
    );
    let s2a = row(
        table,
        "ref: serial ready line -> agent answers",
        &ref_serial_to_answer,
    );
    table.diff_row(
        "sandbox_vm ready - agent up (median diff)",
        s2r.median,
        s2a.median,
        READY_OVERSHOOT_TARGET,
    );
    let list = |v: &[Duration]| v.iter().map(|d| ms(*d)).collect::<Vec<_>>().join(", ");
    table.note(&format!(
        "per boot, ms: serial->reply [{}]; ref serial->answer [{}]; agent_wait [{}]",
        list(&serial_to_reply),
        list(&ref_serial_to_answer),
        list(&waited)
    ));
    let est: Vec<String> = serial_to_reply
        .iter()
        .map(|d| {
            let x = d.as_secs_f64() - s2a.median.as_secs_f64();
            format!("{:+.0}", x * 1000.0)
        })
        .collect();
    table.note(&format!(
        "overshoot estimate per sandbox boot (serial->reply minus the reference median), \
         ms: [{}]",
        est.join(", ")
    ));
    server.close()
}

// ---- last-resort cleanup ----

/// SIGKILLs the QEMUs this bench started: the PIDs it was told about and those in every
/// `*.pid` file under the bench's temp folder. Only live QEMU system emulators whose command
/// line names the temp folder are signalled, so no other QEMU on the machine is touched.
/// Runs on drop too (an error or a panic on the way out).
struct Reaper {
    dir: PathBuf,
    pids: RefCell<Vec<i32>>,
}

impl Reaper {
    fn new(dir: &Path) -> Reaper {
        Reaper {
            dir: dir.to_path_buf(),
            pids: RefCell::new(Vec::new()),
        }
    }

    fn track(&self, pid: i32) {
        self.pids.borrow_mut().push(pid);
    }

    fn ours(&self, pid: i32) -> bool {
        let Some(args) = cmdline(pid) else {
            return false;
        };
        let dir = self.dir.display().to_string();
        args.first().is_some_and(|a| a.contains("qemu-system"))
            && args.iter().any(|a| a.contains(&dir))
    }

    /// SIGKILLs `pid` when it is a live QEMU of ours and waits (bounded) until it is gone.
    /// True when it was signalled.
    fn kill(&self, pid: i32) -> bool {
        if pid <= 0 || !process_alive(pid) || !self.ours(pid) {
            return false;
        }
        // SAFETY: kill(2) with a positive PID checked above; no memory is involved.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let deadline = Instant::now() + PID_WAIT;
        while process_alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }

    /// Kills every QEMU of ours still alive; returns their PIDs.
    fn sweep(&self) -> Vec<i32> {
        let mut pids = self.pids.borrow().clone();
        pid_files(&self.dir, 4, &mut pids);
        pids.sort_unstable();
        pids.dedup();
        pids.into_iter().filter(|p| self.kill(*p)).collect()
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.sweep();
    }
}

/// PIDs in the `*.pid` files under `dir`, `depth` levels down.
fn pid_files(dir: &Path, depth: usize, out: &mut Vec<i32>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() && depth > 0 {
            pid_files(&p, depth - 1, out);
        } else if ft.is_file() && p.extension().is_some_and(|x| x == "pid") {
            if let Some(pid) = std::fs::read_to_string(&p)
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
            {
                out.push(pid);
            }
        }
    }
}

/// Alive: the PID exists and is neither a zombie nor dead.
fn process_alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].trim_start().chars().next());
    !matches!(state, None | Some('Z' | 'X' | 'x'))
}
