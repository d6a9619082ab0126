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
//!    at 1920x1080 (scaled to 1568) after `desktop-mode 1920x1080`.
//!
//! Knob: `MCQEMU_BENCH_DESKTOP_N` (default 10) samples per row. SKIPPED when QEMU is missing
//! or the image cannot be built; the sandbox is destroyed at the end and any QEMU left is
//! SIGKILLed.

use std::ffi::OsStr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::clones::{cold_sandbox, destroy, load_average};
use crate::common::desktop::{desktop_roots, try_test_desktop_image, DesktopImage};
use crate::common::{try_run, Server, TempDir, VmKiller};
use crate::report::{Bench, Stats, Table};
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
    let outcome = rows(table, &mut server, &killer, &image);
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

fn rows(table: &mut Table, s: &mut Server, killer: &VmKiller, image: &DesktopImage) -> Res<()> {
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
    big_screen(table, &bench, s, image)
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
