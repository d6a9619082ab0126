//! Latency and memory bench for the MCP stdio server, driven over real pipes against the
//! optimized binary.
//!
//! Run with `cargo bench --bench mcp_latency`. `MCQEMU_BENCH_N` overrides the number of
//! repetitions (default 50). Everything the server writes goes into a fresh temp folder
//! (`MCQEMU_STATE_DIR`, `MCQEMU_RUNTIME_DIR`) that is removed at the end.
//!
//! The bench drives the server with the tests' harness (`tests/it/common`: [`Server`], [`TempDir`],
//! the test guest, [`VmKiller`]), through its `try_` helpers, which return a readable error
//! instead of panicking. Its own files: this one (the server rows), `mcp_latency/report.rs`
//! (statistics and the printed table), `mcp_latency/vm.rs` (the diskless VM rows and the VM
//! cleanup), `mcp_latency/guest.rs` (the test-guest and sandbox_vm rows) and
//! `mcp_latency/screen_wait.rs` (the vm_screen_wait row, on the same guest).
//!
//! Adding a row: build what it needs (a warm [`Server`], a file in [`TempDir`]), then call
//! `bench.time("name", Some(target), || { ...; Ok(()) })`, or `bench.measure(...)` when the
//! closure must time only part of its work. Rows are printed as they finish.
//!
//! Every read from the server has a deadline (a reader thread feeds a channel, and the harness
//! waits with `recv_timeout`), so a hung server fails its row with a message instead of
//! hanging the bench. A row that fails prints an ERROR line and the bench goes on with the next
//! row (or, among the VM rows, the next section), then exits non-zero.
//!
//! The VM rows (see [`vm::vm_rows`]) drive real QEMUs (TCG) through the server: a diskless BIOS
//! VM and the test guest of `tests/guest/build_guest.py` (built into `target/test-guest`, the
//! tests' cache). They run fewer repetitions: `MCQEMU_BENCH_VM_N` (default min(N, 20)) for rows
//! that start, stop or exec something, min(that, 10) for the 8 MiB file read, and
//! `MCQEMU_BENCH_BOOTS` (default min(N, 10)) guest boots for the sandbox_vm readiness rows. A
//! section whose prerequisite (qemu-system-x86_64, python3 and the guest build) is missing
//! prints a SKIPPED row instead; a section that fails prints an ERROR row and the others still
//! run. Every VM is stopped at the end (stop_vm force=true / sandbox_destroy, then SIGKILL by
//! the PIDs in the temp folder's `*.pid` files as a last resort), and every wait on QEMU or the
//! guest is bounded.
//!
//! The templates section (`mcp_latency/templates.rs`) makes a template of the test guest once
//! and times sandbox_vm clones of it (one after another, and four at once), a clone's Pss,
//! forks, suspends and resumes of a clone (`mcp_latency/forks.rs`), and cold sandbox_vm boots
//! of the same guest beside them; its own knobs are listed there.
//! `MCQEMU_BENCH_SECTIONS` (e.g. `templates`, or `vm,templates`) runs only the listed slow
//! sections; the server rows always run. `MCQEMU_SERVER_BIN` names the binary to measure (the
//! static musl build, as users run it: `target/x86_64-unknown-linux-musl/release/mcqemu`).
//!
//! The templates section runs twice, on the system's QEMU and on QEMU 10.0 (`common::qemu10`),
//! and compares the two. The stock section (`mcp_latency/stock.rs`, name `stock`) times
//! image_prepare of the stock-shaped Debian image, cold boots of the prepared image and clones
//! of a template of it. The arm64 section (`mcp_latency/arm64.rs`, name `arm64`) times the
//! aarch64 test guest under TCG: cold sandbox_vm boots, guest_exec, vm_screenshot and clones
//! of a template of it. The egress section (`mcp_latency/egress.rs`, name `egress`) compares
//! requests through a sandbox's egress proxy with direct ones. The desktop section
//! (`mcp_latency/desktop.rs`, name `desktop`) boots the desktop test image and times boot to
//! desktop, key to screen change and the pointer tools. The copies section
//! (`mcp_latency/copies.rs`, name `copies`) times guest_copy_in/out over the data channel,
//! 64 MiB and 1 GiB each way and a 1,000-file tree, beside the agent's own rates. The agent
//! section (`mcp_latency/agent.rs`, name `agent`) compares mcqemu-agent with qemu-ga on the
//! same test guest: guest_exec with and without a token and live output, the first live
//! line's latency, clones' ready times, the agent's memory. The oci section
//! (`mcp_latency/oci.rs`, name `oci`) pulls and builds a container image against skopeo,
//! umoci and mke2fs by hand, boots it cold, clones a template of it, and reads the server's
//! memory after a 1 GiB layer.

mod agent;
mod arm64;
mod clones;
#[path = "../../tests/it/common/mod.rs"]
mod common;
mod copies;
mod desktop;
mod egress;
mod forks;
mod guest;
mod lifetimes;
mod mounts;
mod oci;
mod pools;
mod pull;
mod report;
mod screen_wait;
mod stock;
mod template_bench;
mod templates;
mod travel;
mod view;
mod vm;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{try_qemu_img_info, try_run, Server, TempDir, NEWEST, RESPONSE_TIMEOUT};
use mcqemu::mcp::protocol::INIT_VERSIONS;
use report::{Bench, Table};
use serde_json::{json, Value};

/// Longest wait for a direct qemu-img run.
const QEMU_IMG_TIMEOUT: Duration = Duration::from_secs(10);

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
            eprintln!("\nmcp_latency: {e}");
            std::process::exit(1);
        }
    }
}

fn run() -> Res<()> {
    let n = env_count("MCQEMU_BENCH_N", 50);
    let dirs = Dirs::new()?;
    let qemu_img = mcqemu::qemu::img::binary();
    let image = dirs.tmp.path().join("bench.qcow2");
    create_image(&qemu_img, &image).map_err(|e| format!("aborted: {e}"))?;

    println!();
    println!("mcqemu MCP latency bench");
    println!("  server:   {}", common::server_bin());
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
    let name = "start -> initialize reply";
    let started = bench.measure(&mut table, name, Some(START_TARGET), || {
        // The server's own scratch folder is made first, untimed.
        let own = TempDir::try_new("srv")?;
        let t0 = Instant::now();
        let mut server = Server::try_start_with(own, &dirs.state, &dirs.runtime, &[])?;
        server.try_result("initialize", common::initialize_params(newest()))?;
        let took = t0.elapsed();
        server.try_close()?;
        Ok(took)
    });
    table.or_error(name, started);

    // Peak RSS of a fresh server after initialize + tools/list + image_info.
    let name = "peak RSS: init + list + image_info";
    let kb = (|| {
        let mut server = dirs.server()?;
        server.try_result("tools/list", json!({}))?;
        server.tool("image_info", json!({ "path": image }))?;
        let kb = peak_rss_kb(&server)?;
        server.try_close()?;
        Ok(kb)
    })();
    if let Some(kb) = table.or_error(name, kb) {
        table.rss_row(name, kb);
    }

    // The round-trip rows, on one warm server.
    let warm = "warm server: tools/list, ping, image_info";
    if let Some(server) = table.or_error(warm, dirs.server()) {
        warm_rows(&bench, &mut table, server, &qemu_img, &image);
    }

    pull::pull_rows(n, &mut table, &dirs);

    // 5. The VM tools, against real QEMUs.
    if wanted("vm") {
        vm::vm_rows(n, &mut table, &dirs, &image);
    }

    // Container images: pull and build, cold boots, clones, memory.
    if wanted("oci") {
        oci::oci_rows(&mut table, &dirs);
    }

    // 6. Templates: clones against cold boots.
    if wanted("templates") {
        templates::template_rows(&mut table, &dirs, &image);
    }

    // 7. The stock-shaped cloud image: image_prepare, cold boots, a template's clones.
    if wanted("stock") {
        stock::stock_rows(&mut table, &dirs);
    }

    // 8. The aarch64 test guest under TCG: cold boots, exec, screenshot, a template's clones.
    if wanted("arm64") {
        arm64::arm64_rows(&mut table, &dirs, &image);
    }

    // 9. Egress: requests through a sandbox's egress proxy against direct ones.
    if wanted("egress") {
        egress::egress_rows(&mut table, &dirs, &image);
    }

    // 10. The desktop image: boot to desktop, key to screen change, pointer gestures.
    if wanted("desktop") {
        desktop::desktop_rows(&mut table, &dirs);
    }

    // 11. Copies over the data channel against the agent's own rates.
    if wanted("copies") {
        copies::copy_rows(&mut table, &dirs, &image);
    }

    // Host folders mounted into the guest against copies and the guest's own disk.
    if wanted("mounts") {
        mounts::mount_rows(&mut table, &dirs);
    }

    // Lifetimes: idle ends with no server, resume on use, list_vms metrics, the watcher.
    if wanted("lifetimes") {
        lifetimes::lifetime_rows(&mut table, &dirs);
    }

    // 12. mcqemu-agent beside qemu-ga on the same guest.
    if wanted("agent") {
        agent::agent_rows(&mut table, &dirs);
    }

    table.footer();
    if table.errors > 0 {
        return Err(format!(
            "{} row(s) or section(s) failed; see the ERROR lines above",
            table.errors
        ));
    }
    Ok(())
}

/// tools/list, ping and image_info against qemu-img run directly, on one warm server; each row
/// that fails prints an ERROR line and the next one still runs.
fn warm_rows(bench: &Bench, table: &mut Table, mut server: Server, qemu_img: &str, image: &Path) {
    // 2. tools/list.
    let name = "tools/list round trip";
    let listed = bench.time(table, name, Some(LIST_TARGET), || {
        let r = server.try_result("tools/list", json!({}))?;
        match r.get("tools").and_then(Value::as_array) {
            Some(t) if !t.is_empty() => Ok(()),
            _ => Err(format!("tools/list returned no tools: {r}")),
        }
    });
    table.or_error(name, listed);

    // 4. ping.
    let name = "ping round trip";
    let pinged = bench.time(table, name, None, || {
        server.try_result("ping", json!({})).map(|_| ())
    });
    table.or_error(name, pinged);

    // 3. image_info over MCP against qemu-img info run directly.
    let name = "qemu-img info (direct child)";
    let direct = bench.time(table, name, None, || {
        try_qemu_img_info(qemu_img, image).map(|_| ())
    });
    let direct = table.or_error(name, direct);
    let name = "image_info tools/call round trip";
    let mcp = bench.time(table, name, None, || {
        let r = server.tool("image_info", json!({ "path": image }))?;
        match r
            .pointer("/structuredContent/format")
            .and_then(Value::as_str)
        {
            Some("qcow2") => Ok(()),
            _ => Err(format!("image_info gave an unexpected result: {r}")),
        }
    });
    if let (Some(direct), Some(mcp)) = (direct, table.or_error(name, mcp)) {
        table.diff_row(
            "image_info overhead (median - median)",
            mcp.median,
            direct.median,
            IMAGE_INFO_OVERHEAD_TARGET,
        );
    }

    let name = "peak RSS: warm server after all rows";
    let kb = peak_rss_kb(&server).and_then(|kb| server.try_close().map(|_| kb));
    if let Some(kb) = table.or_error(name, kb) {
        table.rss_row(name, kb);
    }
}

/// The protocol version the bench initializes with: the newest the server offers.
fn newest() -> &'static str {
    INIT_VERSIONS.last().copied().unwrap_or(NEWEST)
}

/// The bench's temp folder: `state/` and `runtime/` shared by every server it starts, and the
/// bench's own files beside them.
struct Dirs {
    tmp: TempDir,
    state: PathBuf,
    runtime: PathBuf,
}

impl Dirs {
    fn new() -> Res<Dirs> {
        let tmp = TempDir::try_new("bench")?;
        let state = tmp.try_subdir("state")?;
        let runtime = tmp.try_subdir("runtime")?;
        Ok(Dirs {
            tmp,
            state,
            runtime,
        })
    }

    /// A fresh, initialized server on the bench's folders.
    fn server(&self) -> Res<Server> {
        let mut s = Server::try_start_in(&self.state, &self.runtime)?;
        s.try_initialize(newest())?;
        Ok(s)
    }
}

/// `tools/call` as the bench makes it: a tool error (`isError: true`) is an `Err` too, and the
/// result is not checked any further (timed rows measure the round trip, not the checks).
trait ToolCalls {
    /// A call bounded by the harness's usual response timeout.
    fn tool(&mut self, name: &str, args: Value) -> Res<Value> {
        self.tool_within(name, args, RESPONSE_TIMEOUT)
    }

    /// A call bounded by `timeout` (for calls that start, stop or boot something).
    fn tool_within(&mut self, name: &str, args: Value, timeout: Duration) -> Res<Value>;
}

impl ToolCalls for Server {
    fn tool_within(&mut self, name: &str, args: Value, timeout: Duration) -> Res<Value> {
        let r = self.try_call_tool_within(name, args, timeout)?;
        if r.get("isError").and_then(Value::as_bool) == Some(true) {
            return Err(format!("tool {name} failed: {r}"));
        }
        Ok(r)
    }
}

/// A tool result's `structuredContent`.
fn structured(r: &Value) -> Res<&Value> {
    r.get("structuredContent")
        .ok_or_else(|| format!("tool result without structuredContent: {r}"))
}

/// Peak resident set size of the server so far (VmHWM), in KiB.
fn peak_rss_kb(server: &Server) -> Res<u64> {
    let file = format!("/proc/{}/status", server.pid());
    let status = std::fs::read_to_string(&file).map_err(|e| format!("cannot read {file}: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| format!("no VmHWM line in {file}"))
}

/// Whether a slow section runs: all do unless `MCQEMU_BENCH_SECTIONS` lists some (comma
/// separated: `vm`, `templates`).
fn wanted(section: &str) -> bool {
    match std::env::var("MCQEMU_BENCH_SECTIONS") {
        Ok(list) if !list.trim().is_empty() => list.split(',').any(|s| s.trim() == section),
        _ => true,
    }
}

/// A positive count from the environment, or `default`.
fn env_count(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

/// Milliseconds with one decimal.
fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

fn create_image(qemu_img: &str, path: &Path) -> Res<()> {
    let os = OsStr::new;
    try_run(
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

/// The first line `program args` prints, or the error in parentheses.
fn first_line_of(program: &str, args: &[&str]) -> String {
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    match try_run(program, &args, QEMU_IMG_TIMEOUT) {
        Ok(out) => String::from_utf8_lossy(&out)
            .lines()
            .next()
            .unwrap_or("")
            .to_string(),
        Err(e) => format!("({e})"),
    }
}
