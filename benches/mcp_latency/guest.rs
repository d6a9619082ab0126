//! The test-guest sections of the VM rows: the agent, file, screen, keyboard and mouse rows
//! on one booted guest, and sandbox_vm readiness against reference boots.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mcqemu::qemu::qga::Qga;
use mcqemu::qemu::qmp::Qmp;
use mcqemu::qemu::{scale, screen};
use serde_json::{json, Value};

use crate::common::Guest;

#[path = "../../tests/it/screenshots/desktop.rs"]
#[allow(dead_code)]
mod desktop;
use crate::report::{Stats, Table};
use crate::vm::{VmBench, BOOT_TIMEOUT, SANDBOX_CALL_TIMEOUT, SANDBOX_WAIT_S, VM_CALL_TIMEOUT};
use crate::{
    ms, structured, Res, ToolCalls, CLICK_TARGET, EXEC_TARGET, FILE_READ_TARGET_MBPS,
    READY_OVERSHOOT_TARGET, SCREENSHOT_TARGET, TYPE_TEXT_TARGET,
};

/// What the test guest's init prints on the serial console right after starting qemu-ga.
const READY_MARKER: &[u8] = b"mcqemu-test-guest: ready";
/// The guest_file_read row's file size (the tool's maximum).
const BIG_FILE: usize = 8 * 1024 * 1024;

/// launch_vm arguments of the test guest.
fn guest_args(g: &Guest, name: &str, memory_mb: u64) -> Value {
    json!({
        "name": name, "kernel": g.kernel, "initrd": g.initrd, "append": g.append,
        "memory_mb": memory_mb, "cpus": 1, "accel": "tcg"
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

/// guest_exec, guest_file_read, vm_screenshot, vm_type_text, vm_click and vm_mouse_move on one
/// booted test guest.
pub fn guest_rows(vb: &VmBench, table: &mut Table, g: &Guest) -> Res<()> {
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
    let qmp = PathBuf::from(
        s["qmp_socket"]
            .as_str()
            .ok_or("launch_vm gave no qmp_socket")?,
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
            let r = server.tool_within(
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

    token_rows(table, &mut server, name)?;
    background_rows(vb, table, &mut server, name)?;

    let r = server.tool_within(
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
            let r = server.tool_within(
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

    let first = server.tool("vm_screenshot", json!({ "name": name }))?;
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
            let r = server.tool("vm_screenshot", json!({ "name": name }))?;
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

    crate::screen_wait::screen_wait_row(vb, table, &mut server, name)?;
    crate::view::view_rows(vb, table, &mut server, name)?;

    vb.slow.time(
        table,
        "vm_type_text 10 chars (delay_ms 30)",
        Some(TYPE_TEXT_TARGET),
        || {
            let r = server.tool("vm_type_text", json!({"name": name, "text": "abcdefghij"}))?;
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
                .tool("vm_click", json!({"name": name, "x": x, "y": y}))
                .map(|_| ())
        },
    )?;

    // Reported: five PS/2 moves, two groups with a paced pause after each, two paced
    // flushes, then the press and release; the guest reads the queue between them.
    vb.quick.time(
        table,
        "vm_mouse_move (600,-250) in steps of 120, then a click",
        None,
        || {
            server
                .tool(
                    "vm_mouse_move",
                    json!({"name": name, "dx": 600, "dy": -250, "step": 120, "click": "left"}),
                )
                .map(|_| ())
        },
    )?;

    let vm_dir = vb
        .serial_log(name)
        .parent()
        .map(Path::to_path_buf)
        .ok_or("no VM folder")?;
    screen_parts(vb, table, &qmp, &vm_dir, "720x400 text console")?;
    desktop_rows(vb, table, &mut server, name, &qmp, &vm_dir)?;

    vb.stop(&mut server, name)?;
    let kb = crate::peak_rss_kb(&server)?;
    table.rss_info_row("peak RSS: server after the guest rows", kb);
    server.try_close()
}

/// Calls per side of the progress-token rows.
const TOKEN_N: usize = 9;

/// Fast calls with and without a progress token, alternating, in one run: the medians with a
/// token must stay within 1.3x + 5 ms of those without (Claude Code sends one on every call).
fn token_rows(table: &mut Table, server: &mut crate::common::Server, name: &str) -> Res<()> {
    let calls = [
        (
            "guest_exec /bin/true",
            "guest_exec",
            json!({"name": name, "command": "/bin/true"}),
        ),
        (
            "guest_file_read /proc/version",
            "guest_file_read",
            json!({"name": name, "path": "/proc/version"}),
        ),
        ("vm_info", "vm_info", json!({"name": name})),
        ("vm_screenshot", "vm_screenshot", json!({"name": name})),
    ];
    for (label, tool, args) in calls {
        let (mut with, mut without) = (Vec::new(), Vec::new());
        let mut notes = 0;
        for _ in 0..TOKEN_N {
            let (r, t, progress) =
                server.try_call_with_token(tool, args.clone(), VM_CALL_TIMEOUT)?;
            if r["isError"] == json!(true) {
                return Err(format!("{tool} failed: {r}"));
            }
            notes += progress.len();
            with.push(t);
            let t0 = Instant::now();
            server.tool_within(tool, args.clone(), VM_CALL_TIMEOUT)?;
            without.push(t0.elapsed());
        }
        let (w, wo) = (Stats::of(with), Stats::of(without));
        table.time_row(&format!("{label}, progress token"), TOKEN_N, &w, None);
        table.time_row(&format!("{label}, no token"), TOKEN_N, &wo, None);
        let allowed = wo.median.mul_f64(0.3) + Duration::from_millis(5);
        table.diff_row(
            &format!("  -> a token's cost ({notes} notifications)"),
            w.median,
            wo.median,
            allowed,
        );
    }
    Ok(())
}

/// Background processes: the start round trip (guest_exec {background}) and the status round
/// trip (guest_exec_status by offsets, no wait), each started process killed after.
fn background_rows(
    vb: &VmBench,
    table: &mut Table,
    server: &mut crate::common::Server,
    name: &str,
) -> Res<()> {
    let mut handles = Vec::new();
    vb.slow
        .time(table, "guest_exec background start", None, || {
            let r = server.tool_within(
                "guest_exec",
                json!({"name": name, "command": "sleep", "args": ["600"], "background": true}),
                VM_CALL_TIMEOUT,
            )?;
            let h = structured(&r)?["handle"].as_str().map(str::to_string);
            handles.push(h.ok_or_else(|| format!("no handle: {r}"))?);
            Ok(())
        })?;
    let first = handles
        .first()
        .cloned()
        .ok_or("no background process started")?;
    vb.slow
        .time(table, "guest_exec_status (offsets, no wait)", None, || {
            let r = server.tool_within(
                "guest_exec_status",
                json!({"name": name, "handle": first, "stdout_offset": 0, "stderr_offset": 0}),
                VM_CALL_TIMEOUT,
            )?;
            match structured(&r)?["running"].as_bool() {
                Some(true) => Ok(()),
                _ => Err(format!("the background sleep is not running: {r}")),
            }
        })?;
    for h in handles {
        server.tool_within(
            "guest_exec_kill",
            json!({"name": name, "handle": h, "signal": "KILL"}),
            VM_CALL_TIMEOUT,
        )?;
    }
    Ok(())
}

// ---- screenshots: the parts, and a 1920x1080 desktop ----

/// Target for vm_screenshot of a 1920x1080 screen (capture, scale to 1568x882, encode).
const SCREENSHOT_1080_TARGET: Duration = Duration::from_millis(30);

/// The parts of a screenshot, timed through the library on the bench's own monitor connection
/// (the server holds none between calls): the capture (screendump into a memory file, read
/// here), then, when the screen is larger than the default bound, the scaling and a
/// single-threaded encoding apart, and both as vm_screenshot runs them (in segments, one
/// thread per core).
fn screen_parts(vb: &VmBench, table: &mut Table, qmp: &Path, dir: &Path, what: &str) -> Res<()> {
    let mut q = Qmp::connect(qmp, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    let mut frame = None;
    vb.quick.measure(
        table,
        &format!("  capture (screendump, PPM into a memory file), {what}"),
        None,
        || {
            let t0 = Instant::now();
            let f = screen::capture(&mut q, dir).map_err(|e| e.to_string())?;
            let took = t0.elapsed();
            frame = Some(f);
            Ok(took)
        },
    )?;
    drop(q);
    let frame = frame.ok_or("no frame")?;
    let bounds = screen::Bounds {
        max_edge: Some(screen::DEFAULT_MAX_EDGE),
        max_bytes: Some(screen::DEFAULT_MAX_BYTES),
        ..screen::Bounds::default()
    };
    let s = screen::fit_scale(frame.width, frame.height, &bounds);
    let (w, h) = screen::scaled_size(frame.width, frame.height, s);
    let mut size = 0;
    if (w, h) != (frame.width, frame.height) {
        let mut small = Vec::new();
        vb.quick.time(
            table,
            &format!(
                "  scale {}x{} -> {w}x{h} (area average)",
                frame.width, frame.height
            ),
            None,
            || {
                small = scale::downscale(frame.pixels(), frame.width, frame.height, w, h);
                Ok(())
            },
        )?;
        vb.quick
            .time(table, &format!("  encode PNG {w}x{h}"), None, || {
                size = screen::encode(&small, w, h)
                    .map_err(|e| e.to_string())?
                    .len();
                Ok(())
            })?;
    }
    vb.quick.time(
        table,
        &format!("  scale + encode in segments on all cores, {w}x{h} PNG"),
        None,
        || {
            size = screen::scale_encode(&frame, w, h)
                .map_err(|e| e.to_string())?
                .data
                .len();
            Ok(())
        },
    )?;
    table.note(&format!(
        "{what}: {}x{} screen, {w}x{h} PNG of {size} bytes",
        frame.width, frame.height
    ));
    Ok(())
}

/// vm_screenshot of a 1920x1080 desktop: the guest sets the mode on QEMU's standard VGA and
/// shows the tests' desktop picture (`tests/it/screenshots/desktop.rs`), then the tool call is
/// timed (scaled to 1568x882 by default) and its parts apart.
fn desktop_rows(
    vb: &VmBench,
    table: &mut Table,
    server: &mut crate::common::Server,
    name: &str,
    qmp: &Path,
    dir: &Path,
) -> Res<()> {
    let picture = desktop::picture();
    desktop::show(name, &picture, |tool, args| {
        let r = server.tool_within(tool, args, VM_CALL_TIMEOUT)?;
        Ok(structured(&r)?.clone())
    })?;
    let first = server.tool("vm_screenshot", json!({ "name": name }))?;
    let s = structured(&first)?.clone();
    if (s["screen_width"].as_u64(), s["width"].as_u64()) != (Some(1920), Some(1568)) {
        return Err(format!(
            "the desktop screenshot is not 1920 scaled to 1568: {s}"
        ));
    }
    vb.quick.time(
        table,
        "vm_screenshot inline PNG, 1920x1080 desktop -> 1568x882",
        Some(SCREENSHOT_1080_TARGET),
        || {
            let r = server.tool("vm_screenshot", json!({ "name": name }))?;
            match structured(&r)?["width"].as_u64() {
                Some(1568) => Ok(()),
                _ => Err(format!("vm_screenshot did not scale to 1568: {r}")),
            }
        },
    )?;
    table.note(&format!(
        "the desktop's PNG: {} bytes at scale {} (default bounds: longer edge 1568, 750000 bytes)",
        s["bytes"], s["scale"]
    ));
    screen_parts(vb, table, qmp, dir, "1920x1080 desktop")
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
pub fn sandbox_rows(vb: &VmBench, table: &mut Table, g: &Guest, base_image: &Path) -> Res<()> {
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
            .tool_within(
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
        vb.killer.track(&s);
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
            .tool_within("sandbox_destroy", json!({ "name": name }), VM_CALL_TIMEOUT)
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
    server.try_close()
}
