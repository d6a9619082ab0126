//! The desktop section (name `desktop`): the desktop test image (`common::desktop`: Xorg,
//! openbox and a full-screen Tk program logging its input) under TCG, 1 vCPU, 1024 MiB:
//!
//! 1. the image's build time (from its manifest: a cached image costs nothing);
//! 2. one cold sandbox_vm: to the agent, and to the program's `ready` record (boot to
//!    desktop);
//! 3. key to screen change: vm_type_text of one character into the text field, then full
//!    vm_screenshots until the image differs (the field's cursor does not blink, nothing else
//!    moves), timed from the type call's start to the changed screenshot's return;
//! 4. vm_screenshot at 1280x800, vm_drag (12 steps) and vm_scroll round trips; vm_screenshot
//!    at 1920x1080 (scaled to 1568) after `desktop-mode 1920x1080`;
//! 5. before that, the live view at 1024x768 in Chromium (`mcqemu view`): a typed character to
//!    the changed frame drawn, and a click on the scaled image to the program's press.
//!
//! Knob: `MCQEMU_BENCH_DESKTOP_N` (default 10) samples per row. SKIPPED when QEMU is missing
//! or the image cannot be built; the sandbox is destroyed at the end and any QEMU left is
//! SIGKILLed.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::clones::{cold_sandbox, destroy, load_average};
use crate::common::browser::{node_dir, try_run_node};
use crate::common::desktop::{
    desktop_roots, guest_clock_offset_ms, try_test_desktop_image, DesktopImage, Events,
};
use crate::common::{try_run, Server, TempDir, VmKiller, BIN};
use crate::report::{Bench, Stats, Table};
use crate::view::{draws_in, epoch_ms, next_draw, Viewer};
use crate::{env_count, newest, structured, Dirs, Res, ToolCalls, QEMU_IMG_TIMEOUT};

const VM: &str = "bench-desktop";
const BOOT_CALL: Duration = Duration::from_secs(600);
const CALL: Duration = Duration::from_secs(60);
/// Longest wait for the program's ready record, and for a screen change.
const READY_WAIT: Duration = Duration::from_secs(300);
const CHANGE_WAIT: Duration = Duration::from_secs(20);

/// The desktop section.
pub fn desktop_rows(table: &mut Table, dirs: &Dirs) {
    table.section("desktop: Xorg + openbox + a Tk program, 1 vCPU, 1024 MiB, TCG");
    let name = "desktop section";
    if let Err(e) = try_run(
        "qemu-system-x86_64",
        &[OsStr::new("--version")],
        QEMU_IMG_TIMEOUT,
    ) {
        table.skip_row(name, &format!("qemu-system-x86_64 is not usable ({e})"));
        return;
    }
    let t_build = Instant::now();
    let image = match try_test_desktop_image() {
        Ok(i) => i,
        Err(e) => {
            table.skip_row(name, &format!("the desktop image could not be built: {e}"));
            return;
        }
    };
    build_note(table, &image, t_build.elapsed());
    let killer = VmKiller::new(dirs.tmp.path());
    let Some(mut server) = table.or_error(name, roots_server(dirs)) else {
        return;
    };
    table.note(&format!("load average {} at the start", load_average()));
    let outcome = rows(table, &mut server, &killer, &image, dirs);
    table.or_error(name, outcome);
    if let Err(e) = destroy(&mut server, VM) {
        table.note(&format!("cleanup: {e}"));
    }
    killer.kill_all();
    let _ = server.try_close();
}

fn build_note(table: &Table, image: &DesktopImage, here: Duration) {
    let built = std::fs::read_to_string(&image.manifest)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .map(|m| m["build_seconds"].clone())
        .unwrap_or(Value::Null);
    table.note(&format!(
        "image: built in {built} s (mmdebstrap, mke2fs -d, qemu-img); {} ms to find it now",
        here.as_millis()
    ));
}

fn roots_server(dirs: &Dirs) -> Res<Server> {
    let roots = desktop_roots();
    let mut s = Server::try_start_with(
        TempDir::try_new("srv")?,
        &dirs.state,
        &dirs.runtime,
        &[("MCQEMU_ROOTS", roots.as_str())],
    )?;
    s.try_initialize(newest())?;
    Ok(s)
}

fn rows(
    table: &mut Table,
    s: &mut Server,
    killer: &VmKiller,
    image: &DesktopImage,
    dirs: &Dirs,
) -> Res<()> {
    let n = env_count("MCQEMU_BENCH_DESKTOP_N", 10);
    let t0 = Instant::now();
    let (sb, _) = cold_sandbox(
        s,
        killer,
        json!({"name": VM, "base_image": image.disk, "kernel": image.kernel,
               "initrd": image.initrd, "append": image.append, "memory_mb": 1024, "cpus": 1,
               "wait_agent_s": 400}),
        BOOT_CALL,
    )?;
    let agent = t0.elapsed();
    let ready = wait_ready(s, &image.events, "\"screen\": [1280, 800]")?;
    let desktop = t0.elapsed();
    let one = |d: Duration| Stats::of(vec![d]);
    table.time_row("sandbox_vm to the agent", 1, &one(agent), None);
    table.time_row(
        "sandbox_vm to the desktop program ready",
        1,
        &one(desktop),
        None,
    );
    let _ = sb;
    let entry = &ready["widgets"]["entry"];
    let (ex, ey) = (
        entry[0].as_i64().unwrap_or(0) + 20,
        entry[1].as_i64().unwrap_or(0) + 20,
    );
    s.tool_within("vm_click", json!({"name": VM, "x": ex, "y": ey}), CALL)?;
    let bench = Bench { n, warmup: 1 };
    let keys = "abcdefghijklmnopqrstuvwxyz";
    let mut i = 0usize;
    let row = "key to screen change (type 1 char, full screenshots until changed)";
    let r = bench.measure(table, row, None, || {
        i += 1;
        let ch = &keys[i % 26..i % 26 + 1];
        key_to_change(s, ch)
    });
    table.or_error(row, r);
    let row = "vm_screenshot 1280x800 (inline PNG)";
    let r = bench.time(table, row, None, || {
        s.tool_within("vm_screenshot", json!({"name": VM}), CALL)
            .map(drop)
    });
    table.or_error(row, r);
    let canvas = &ready["widgets"]["canvas"];
    let (cx, cy) = (
        canvas[0].as_i64().unwrap_or(0),
        canvas[1].as_i64().unwrap_or(0),
    );
    let row = "vm_drag, 12 steps of 20 ms, ctrl held";
    let r = bench.time(table, row, None, || {
        let args = json!({"name": VM, "x": cx + 50, "y": cy + 50, "to_x": cx + 300,
                          "to_y": cy + 200, "hold": ["ctrl"]});
        s.tool_within("vm_drag", args, CALL).map(drop)
    });
    table.or_error(row, r);
    let list = &ready["widgets"]["list"];
    let (lx, ly) = (
        list[0].as_i64().unwrap_or(0) + 100,
        list[1].as_i64().unwrap_or(0) + 100,
    );
    let row = "vm_scroll, 3 notches";
    let r = bench.time(table, row, None, || {
        let args = json!({"name": VM, "x": lx, "y": ly, "clicks": 3});
        s.tool_within("vm_scroll", args, CALL).map(drop)
    });
    table.or_error(row, r);
    let row = "live view at 1024x768";
    let r = view_1024(table, s, image, dirs);
    table.or_error(row, r);
    big_screen(table, &bench, s, image)
}

/// The live view at 1024x768, drawn scaled in Chromium from `mcqemu view`: from the start of
/// a vm_type_text of one character into the field to the page's drawing of the changed frame;
/// then a person's clicks on the scaled image (`view_desktop.mjs`) to the program's record of
/// each press, its clock turned into the host's.
fn view_1024(table: &mut Table, s: &mut Server, image: &DesktopImage, dirs: &Dirs) -> Res<()> {
    if let Some(why) = Viewer::missing() {
        table.skip_row("live view at 1024x768", why);
        return Ok(());
    }
    let args = json!({"name": VM, "command": "desktop-mode", "args": ["1024x768"], "timeout": 60});
    if structured(&s.tool_within("guest_exec", args, CALL)?)?["exitcode"] != json!(0) {
        return Err("desktop-mode 1024x768 failed".into());
    }
    let ready = wait_ready(s, &image.events, "\"screen\": [1024, 768]")?;
    let n = env_count("MCQEMU_BENCH_DESKTOP_N", 10);
    let viewer = Viewer::open(&dirs.state, &dirs.runtime, VM)?;
    let drawn = viewer.ready().and_then(|()| change_to_drawn(s, &viewer, n));
    viewer.close();
    let samples = drawn?;
    table.time_row(
        "live view 1024x768: type 1 char to the frame drawn (mcqemu view, Chromium)",
        samples.len(),
        &Stats::of(samples.clone()),
        Some(Duration::from_millis(300)),
    );
    table.note(&format!("  p95 {} ms (goal 600)", p95(samples).as_millis()));
    let clicks = click_to_program(s, image, dirs, &ready, n)?;
    table.time_row(
        "live view 1024x768: click on the scaled image to the program's press",
        clicks.len(),
        &Stats::of(clicks),
        Some(Duration::from_millis(150)),
    );
    Ok(())
}

fn p95(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get((v.len() * 95 / 100).min(v.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

fn change_to_drawn(s: &mut Server, viewer: &Viewer, n: usize) -> Res<Vec<Duration>> {
    let keys = "abcdefghijklmnopqrstuvwxyz";
    let mut samples = Vec::new();
    for i in 0..n {
        let start = epoch_ms();
        let ch = &keys[i % 26..i % 26 + 1];
        s.tool_within("vm_type_text", json!({"name": VM, "text": ch}), CALL)?;
        let drawn = next_draw(&viewer.rx, start, CHANGE_WAIT)?;
        samples.push(Duration::from_millis(drawn.saturating_sub(start)));
        draws_in(&viewer.rx, Duration::from_millis(300));
    }
    Ok(samples)
}

/// `n` clicks on the canvas through the view; each press's delay as the program recorded it.
fn click_to_program(
    s: &mut Server,
    image: &DesktopImage,
    dirs: &Dirs,
    ready: &Value,
    n: usize,
) -> Res<Vec<Duration>> {
    let canvas = &ready["widgets"]["canvas"];
    let (cx, cy) = (
        canvas[0].as_i64().unwrap_or(0),
        canvas[1].as_i64().unwrap_or(0),
    );
    let points: Vec<(i64, i64)> = (0..n as i64)
        .map(|i| (cx + 20 + i * 37 % 500, cy + 20 + i * 53 % 300))
        .collect();
    let offset = guest_clock_offset_ms(s, VM)?;
    let mut ev = Events::new(VM, &image.events);
    ev.poll(s);
    let mark = ev.mark();
    let view = Command::new(BIN)
        .args(["view", VM])
        .env("MCQEMU_STATE_DIR", &dirs.state)
        .env("MCQEMU_RUNTIME_DIR", &dirs.runtime)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("mcqemu view: {e}"))?;
    let seen = run_clicks(view, &points);
    let seen = seen?;
    let presses: Vec<Value> = ev
        .since(s, mark)
        .into_iter()
        .filter(|v| v["event"] == "press" && v["button"] == 1)
        .collect();
    let made = seen["clicks"].as_array().cloned().unwrap_or_default();
    if presses.len() != made.len() {
        return Err(format!(
            "{} clicks made in the view, {} presses recorded",
            made.len(),
            presses.len()
        ));
    }
    Ok(made
        .iter()
        .zip(&presses)
        .map(|(c, p)| {
            let ms =
                p["t"].as_f64().unwrap_or(0.0) * 1000.0 - offset - c["t"].as_f64().unwrap_or(0.0);
            Duration::from_secs_f64(ms.max(0.0) / 1000.0)
        })
        .collect())
}

/// Reads the view's URL, runs `view_desktop.mjs` on it and stops the view.
fn run_clicks(mut view: Child, points: &[(i64, i64)]) -> Res<Value> {
    let mut url = String::new();
    let read = view
        .stdout
        .take()
        .ok_or_else(|| "no stdout".to_string())
        .and_then(|o| {
            BufReader::new(o)
                .read_line(&mut url)
                .map_err(|e| format!("the view's URL: {e}"))
        });
    let spec = json!({"screen": [1024, 768], "clicks": points, "gap_ms": 400, "text": "q"});
    let node = node_dir();
    let out = read.and_then(|_| {
        try_run_node(
            &node,
            "view_desktop.mjs",
            &[url.trim(), &spec.to_string()],
            &[],
        )
    });
    let _ = view.kill();
    let _ = view.wait();
    out
}

/// `desktop-mode 1920x1080`, the program's new ready record, then screenshots of it.
fn big_screen(table: &mut Table, bench: &Bench, s: &mut Server, image: &DesktopImage) -> Res<()> {
    let args = json!({"name": VM, "command": "desktop-mode", "args": ["1920x1080"], "timeout": 60});
    let r = s.tool_within("guest_exec", args, CALL)?;
    if structured(&r)?["exitcode"] != json!(0) {
        return Err(format!("desktop-mode 1920x1080 failed: {r}"));
    }
    wait_ready(s, &image.events, "\"screen\": [1920, 1080]")?;
    let row = "vm_screenshot 1920x1080 -> 1568x882 (inline PNG)";
    let r = bench.time(table, row, None, || {
        s.tool_within("vm_screenshot", json!({"name": VM}), CALL)
            .map(drop)
    });
    table.or_error(row, r);
    Ok(())
}

/// Types `ch` and polls full screenshots until one differs from the one before the key.
fn key_to_change(s: &mut Server, ch: &str) -> Res<Duration> {
    let before = shot(s)?;
    let t0 = Instant::now();
    s.tool_within("vm_type_text", json!({"name": VM, "text": ch}), CALL)?;
    loop {
        if shot(s)? != before {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > CHANGE_WAIT {
            return Err(format!(
                "the screen did not change within {CHANGE_WAIT:?} of typing {ch:?}"
            ));
        }
    }
}

/// The inline PNG of a vm_screenshot (base64 as sent: equal images encode alike).
fn shot(s: &mut Server) -> Res<String> {
    let r = s.tool_within("vm_screenshot", json!({"name": VM}), CALL)?;
    r["content"]
        .as_array()
        .and_then(|c| c.iter().find(|b| b["type"] == "image"))
        .and_then(|b| b["data"].as_str())
        .map(str::to_string)
        .ok_or_else(|| format!("vm_screenshot returned no image: {r}"))
}

/// Polls the program's event log for its last `ready` record containing `marker`.
fn wait_ready(s: &mut Server, events: &str, marker: &str) -> Res<Value> {
    let t0 = Instant::now();
    loop {
        let r = s.try_call_tool_within(
            "guest_file_read",
            json!({"name": VM, "path": events, "max_bytes": 8 << 20}),
            CALL,
        )?;
        let text = r["structuredContent"]["content"]
            .as_str()
            .unwrap_or_default();
        let found = text
            .lines()
            .rev()
            .find(|l| l.contains("\"event\": \"ready\"") && l.contains(marker));
        if let Some(line) = found {
            return serde_json::from_str(line)
                .map_err(|e| format!("bad ready record {line:?}: {e}"));
        }
        if t0.elapsed() > READY_WAIT {
            return Err(format!(
                "no ready record with {marker} within {READY_WAIT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
