//! The live view's rows: the test guest's screen followed in headless Chromium through the page
//! `mcqemu view` serves (`tests/browser/view_bench.mjs`, playwright-core from
//! target/browser-tests, which `cargo test --test it -- view_browser::` installs). A change is written
//! into the VGA text buffer through /dev/mem (the text cursor is switched off first, so the
//! screen holds still between changes); a row is from the start of the guest_exec that makes
//! the change to the page's `load` of the new frame (an upper bound: the change happens inside
//! that call).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;

use crate::common::{Server, BIN};
use crate::report::{Stats, Table};
use crate::vm::{VmBench, VM_CALL_TIMEOUT};
use crate::{structured, Res, ToolCalls};

const ROUNDS: usize = 20;

pub fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn sh(server: &mut Server, name: &str, script: &str) -> Res<()> {
    let r = server.tool_within(
        "guest_exec",
        json!({"name": name, "command": "sh", "args": ["-c", script]}),
        VM_CALL_TIMEOUT,
    )?;
    structured(&r).map(|_| ())
}

/// A line of text at row `row` of the VGA text buffer.
fn write_row(row: u32, text: &str) -> String {
    let cells: String = text.chars().map(|c| format!("{c}\\017")).collect();
    format!(
        "printf '{cells}' | dd of=/dev/mem bs=1 seek={} conv=notrunc 2>/dev/null",
        0xb8000 + row * 160
    )
}

/// The live-view rows on the booted test guest `name`; SKIPPED without Chromium or the
/// browser-test packages.
pub fn view_rows(vb: &VmBench, table: &mut Table, server: &mut Server, name: &str) -> Res<()> {
    if let Some(why) = Viewer::missing() {
        table.skip_row("live view", why);
        return Ok(());
    }
    // The text cursor off (CRTC register 0x0A, bit 5): the screen holds still between changes.
    sh(
        server,
        name,
        "printf '\\012' | dd of=/dev/port bs=1 seek=980 2>/dev/null; \
         printf '\\040' | dd of=/dev/port bs=1 seek=981 2>/dev/null",
    )?;
    let viewer = Viewer::open(vb.state(), vb.runtime(), name)?;
    let result = viewer
        .ready()
        .and_then(|()| measure(table, server, name, &viewer.rx));
    viewer.close();
    result
}

/// `mcqemu view NAME` and headless Chromium on its page (`view_bench.mjs`), whose draws arrive
/// on `rx` as `draw EPOCH_MS` lines (`ready` after the first).
pub struct Viewer {
    view: Child,
    browser: Child,
    pub rx: mpsc::Receiver<String>,
}

impl Viewer {
    /// Why the live view cannot be benched here, if it cannot.
    pub fn missing() -> Option<&'static str> {
        let node = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/browser-tests/node");
        (!Path::new("/usr/bin/chromium").exists()
            || !node.join("node_modules/playwright-core").exists())
        .then_some(
            "needs /usr/bin/chromium and target/browser-tests (cargo test --test it -- view_browser::)",
        )
    }

    /// The view of VM `name` on the server folders `state` and `runtime`, open in Chromium.
    pub fn open(state: &Path, runtime: &Path, name: &str) -> Res<Viewer> {
        let node = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/browser-tests/node");
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/view_bench.mjs"),
            node.join("view_bench.mjs"),
        )
        .map_err(|e| format!("copy view_bench.mjs: {e}"))?;
        let mut view = Command::new(BIN)
            .args(["view", name])
            .env("MCQEMU_STATE_DIR", state)
            .env("MCQEMU_RUNTIME_DIR", runtime)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("mcqemu view: {e}"))?;
        let mut url = String::new();
        BufReader::new(view.stdout.take().ok_or("no stdout")?)
            .read_line(&mut url)
            .map_err(|e| format!("the view's URL: {e}"))?;
        let mut browser = Command::new("node")
            .arg(node.join("view_bench.mjs"))
            .arg(url.trim())
            .current_dir(&node)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("node: {e}"))?;
        let (tx, rx) = mpsc::channel::<String>();
        let out = browser.stdout.take().ok_or("no stdout")?;
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Viewer { view, browser, rx })
    }

    /// Waits for the first frame, then lets the frames of the page's start pass.
    pub fn ready(&self) -> Res<()> {
        loop {
            match self.rx.recv_timeout(Duration::from_secs(90)) {
                Ok(l) if l == "ready" => break,
                Ok(_) => {}
                Err(_) => return Err("the view never drew its first frame".into()),
            }
        }
        draws_in(&self.rx, Duration::from_secs(2));
        Ok(())
    }

    /// Closes the browser (stdin) and stops the view.
    pub fn close(mut self) {
        drop(self.browser.stdin.take());
        let _ = self.browser.wait();
        let _ = self.view.kill();
        let _ = self.view.wait();
    }
}

/// The next `draw` at or after `since` (epoch ms), within `limit`.
pub fn next_draw(rx: &mpsc::Receiver<String>, since: u64, limit: Duration) -> Res<u64> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = rx
            .recv_timeout(left)
            .map_err(|_| "the view drew no frame in time".to_string())?;
        if let Some(ms) = line
            .strip_prefix("draw ")
            .and_then(|m| m.parse::<u64>().ok())
        {
            if ms >= since {
                return Ok(ms);
            }
        }
    }
}

pub fn draws_in(rx: &mpsc::Receiver<String>, window: Duration) -> usize {
    let deadline = std::time::Instant::now() + window;
    let mut n = 0;
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(l) if l.starts_with("draw ") => n += 1,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    n
}

fn measure(
    table: &mut Table,
    server: &mut Server,
    name: &str,
    rx: &mpsc::Receiver<String>,
) -> Res<()> {
    let mut samples = Vec::new();
    for round in 0..ROUNDS {
        let start = epoch_ms();
        sh(
            server,
            name,
            &write_row(14, &format!("VIEW-BENCH-{round:04}")),
        )?;
        let drawn = next_draw(rx, start, Duration::from_secs(10))?;
        samples.push(Duration::from_millis(drawn - start));
        draws_in(rx, Duration::from_millis(300));
    }
    let mut sorted = samples.clone();
    sorted.sort();
    let p95 = sorted[(sorted.len() * 95 / 100).min(sorted.len() - 1)];
    table.time_row(
        "live view: screen change to the frame drawn (mcqemu view, Chromium)",
        ROUNDS,
        &Stats::of(samples),
        Some(Duration::from_millis(300)),
    );
    table.note(&format!("  p95 {} ms (goal 600)", p95.as_millis()));
    // A screen that keeps changing (a line rewritten every 50 ms for 5 s), then one that holds
    // still for 5 s.
    let script = format!(
        "i=0; while [ $i -lt 100 ]; do if [ $((i % 2)) = 0 ]; then {}; else {}; fi; \
         sleep 0.05; i=$((i+1)); done",
        write_row(16, "MOVING-EVEN"),
        write_row(16, "MOVING-ODD!")
    );
    let r = server.tool_within(
        "guest_exec",
        json!({"name": name, "command": "sh", "args": ["-c", script], "background": true}),
        VM_CALL_TIMEOUT,
    )?;
    structured(&r)?;
    let moving = draws_in(rx, Duration::from_secs(5));
    // The loop's 100 rounds take 8-12 s under TCG: let it end before the still window.
    draws_in(rx, Duration::from_secs(10));
    let still = draws_in(rx, Duration::from_secs(5));
    table.note(&format!(
        "  live view: {:.1} frames/s drawn while the screen changes (goal >= 5); {still} \
         frames in 5 s of a still screen (goal 0)",
        moving as f64 / 5.0
    ));
    Ok(())
}
