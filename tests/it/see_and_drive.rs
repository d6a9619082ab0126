//! See and drive, end to end against real QEMUs (TCG): screenshots, keyboard, mouse and the
//! serial console.
//!
//! Two guests for the whole file, each holding a slot of the shared per-binary semaphore:
//! a diskless BIOS VM (screenshots, the bounded serial read of a huge log) and one sandbox of
//! the tiny Linux test guest (serial shell, typing, keys, tablet and PS/2 mouse, screenshot),
//! driven as one journey so CI (2 cores, no KVM) boots it only once. Every QEMU is SIGKILLed
//! on drop, even when a step panics.
//!
//! Input is checked where the guest receives it: a guest_exec reads /dev/tty1 or records
//! /dev/input/event* while the test drives the VM through overlapping tool calls. Readers say
//! they are listening on the serial console, and are told to stop through the serial shell:
//! agent calls would queue behind the reader's own guest_exec.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::b64::b64_decode;
use crate::common::evdev::*;
use crate::common::*;
use serde_json::{json, Value};

mod guest_io;
mod keyboard;

use guest_io::*;
use keyboard::*;

pub(crate) const STEP: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Fixtures: each test runs in a [`Lab`] (one server on short folders, one QEMU slot, and a
// guard that kills every QEMU of the test when dropped)

/// Fails when a temporary capture file is left in the VM's state folder.
fn assert_no_capture_left(lab: &Lab, name: &str, when: &str) {
    let dir = lab.vm_dir(name);
    let left: Vec<String> = list_dir(&dir)
        .into_iter()
        .filter(|n| n.starts_with(".screenshot-"))
        .collect();
    assert!(
        left.is_empty(),
        "{when}: capture files left in {}: {left:?}",
        dir.display()
    );
}

// ---------------------------------------------------------------------------------------------
// Small decoders, independent of the code under test

/// How many distinct pixel values an image has (capped at 3: "more than one" is all we need).
fn distinct_pixels(bpp: usize, pixels: &[u8]) -> usize {
    let mut seen: Vec<&[u8]> = Vec::new();
    for p in pixels.chunks(bpp) {
        if !seen.contains(&p) {
            seen.push(p);
            if seen.len() >= 3 {
                break;
            }
        }
    }
    seen.len()
}

/// Checks a vm_screenshot result carrying inline PNG content; returns (width, height, distinct
/// pixel values).
fn check_inline_screenshot(result: &Value, what: &str) -> (u32, u32, usize) {
    let sc = tool_ok(result, what);
    let images: Vec<&Value> = result["content"]
        .as_array()
        .expect("content array")
        .iter()
        .filter(|c| c["type"] == "image")
        .collect();
    assert_eq!(
        images.len(),
        1,
        "{what}: one image block expected: {result}"
    );
    let img = images[0];
    assert_eq!(img["mimeType"], "image/png", "{what}");
    let bytes = b64_decode(img["data"].as_str().expect("image data"));
    assert_eq!(
        sc["bytes"].as_u64(),
        Some(bytes.len() as u64),
        "{what}: bytes"
    );
    assert_eq!(sc["format"], "png");
    assert!(sc["path"].is_null(), "{what}: inline capture has no path");
    let (w, h, bpp, px) = decode_png(&bytes);
    assert_eq!(sc["width"].as_u64(), Some(u64::from(w)), "{what}: width");
    assert_eq!(sc["height"].as_u64(), Some(u64::from(h)), "{what}: height");
    (w, h, distinct_pixels(bpp, &px))
}

fn has_image(result: &Value) -> bool {
    result["content"]
        .as_array()
        .is_some_and(|c| c.iter().any(|b| b["type"] == "image"))
}

// ---------------------------------------------------------------------------------------------
// The diskless BIOS VM: screenshots (inline, to a file, paused, failing) and the serial log

#[test]
fn bios_vm_screenshots_and_bounded_serial_read() {
    let mut lab = Lab::new("bios");
    let name = "bios";
    let launched = lab.srv().call_ok_within(
        "launch_vm",
        json!({"name": name, "memory_mb": 64, "cpus": 1, "no_net": true}),
        STEP,
    );
    lab.killer.track(&launched);
    let serial_log = launched["serial_log"]
        .as_str()
        .expect("launch reports serial_log")
        .to_string();

    // Inline: image content whose PNG decodes to exactly the reported size.
    let t = Instant::now();
    let r = lab
        .srv()
        .call_tool_within("vm_screenshot", json!({"name": name}), STEP);
    let inline_ms = t.elapsed().as_millis();
    let (w, h, _) = check_inline_screenshot(&r, "vm_screenshot inline");
    assert!(w >= 320 && h >= 200, "BIOS screen {w}x{h}");
    assert_no_capture_left(&lab, name, "after an inline screenshot");

    // To a file: written there, no image content.
    let out = TempDir::new("shot");
    let dest = out.file("screen.png");
    let t = Instant::now();
    let r = lab.srv().call_tool_within(
        "vm_screenshot",
        json!({"name": name, "path": dest.as_str()}),
        STEP,
    );
    let file_ms = t.elapsed().as_millis();
    let sc = tool_ok(&r, "vm_screenshot path");
    assert!(!has_image(&r), "no image content with path: {r}");
    assert_eq!(sc["path"].as_str(), Some(dest.as_str()));
    let saved = std::fs::read(&dest).expect("screenshot file written");
    assert_eq!(sc["bytes"].as_u64(), Some(saved.len() as u64));
    // The BIOS may switch video modes between captures: compare with this capture's size.
    let (fw, fh, _, _) = decode_png(&saved);
    assert_eq!(
        (Some(u64::from(fw)), Some(u64::from(fh))),
        (sc["width"].as_u64(), sc["height"].as_u64()),
        "saved PNG size"
    );
    assert_eq!(
        list_dir(out.path()),
        vec!["screen.png".to_string()],
        "only the PNG in the destination folder"
    );
    assert_no_capture_left(&lab, name, "after a screenshot to a file");

    // Paused: still works, still no leftovers.
    lab.srv().call_ok("pause_vm", json!({"name": name}));
    let r = lab
        .srv()
        .call_tool_within("vm_screenshot", json!({"name": name}), STEP);
    check_inline_screenshot(&r, "vm_screenshot while paused");
    assert_no_capture_left(&lab, name, "after a screenshot of the paused VM");
    lab.srv().call_ok("resume_vm", json!({"name": name}));

    // Failing: a path in a missing folder is an error, and nothing is left behind.
    let missing = out.file("no/such/folder/screen.png");
    let err = lab.srv().call_err_within(
        "vm_screenshot",
        json!({"name": name, "path": missing.as_str()}),
        STEP,
    );
    assert!(!err.is_empty());
    assert!(!Path::new(&missing).exists());
    assert!(!out.join("no").exists(), "no folder created: {err}");
    assert_no_capture_left(&lab, name, "after a failed screenshot");
    eprintln!("screenshot latency (BIOS VM, TCG): inline {inline_ms} ms, to a file {file_ms} ms");

    // A 10 MB serial log of a stopped VM: the tail comes back quickly through a bounded read.
    lab.srv().call_ok_within(
        "stop_vm",
        json!({"name": name, "force": true, "timeout": 10}),
        STEP,
    );
    lab.killer.kill_all();
    let mut big = String::with_capacity(10_600_000);
    let mut n = 0u32;
    while big.len() < 10 * 1024 * 1024 {
        n += 1;
        big.push_str(&format!(
            "log line {n:07} the quick brown fox jumps over the lazy dog\r\n"
        ));
    }
    std::fs::write(&serial_log, &big).expect("write the big serial log");
    let t = Instant::now();
    let sc = lab
        .srv()
        .call_ok("vm_serial_read", json!({"name": name, "tail_lines": 5}));
    let read_ms = t.elapsed().as_millis();
    let want: Vec<String> = (n - 4..=n)
        .map(|i| format!("log line {i:07} the quick brown fox jumps over the lazy dog"))
        .collect();
    assert_eq!(sc["lines"], json!(want), "the last five lines, without \\r");
    assert_eq!(sc["log_size"].as_u64(), Some(big.len() as u64));
    assert!(
        read_ms < 500,
        "tail of a 10 MB log took {read_ms} ms; the read must be bounded"
    );
    eprintln!(
        "vm_serial_read tail_lines=5 of a {} byte log: {read_ms} ms",
        big.len()
    );
    let err = lab
        .srv()
        .call_err("vm_serial_read", json!({"name": name, "tail_lines": 0}));
    assert!(err.contains("tail_lines"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// The test guest: one sandbox, driven through keyboard, mouse, serial console and screen

/// One step of the journey.
type Step = fn(&mut Lab, &str);

#[test]
fn test_guest_journey_keyboard_mouse_serial_screen() {
    let mut lab = Lab::new("drv");
    let name = "drive";
    let t = Instant::now();
    crate::common::view::boot_test_sandbox(&mut lab, name);
    eprintln!("sandbox_vm ready in {} ms", t.elapsed().as_millis());

    let steps: [(&str, Step); 8] = [
        ("serial console", serial_console),
        ("typing", typing),
        ("typing with delay_ms 0", typing_unpaced),
        ("typing while the vCPU waits for a core", typing_starved),
        ("keys", keys),
        ("mouse", mouse),
        ("screenshot", sandbox_screenshot),
        ("PS/2 mouse without a tablet driver", ps2_without_tablet),
    ];
    for (label, step) in steps {
        let t = Instant::now();
        step(&mut lab, name);
        eprintln!("step {label}: {} ms", t.elapsed().as_millis());
    }

    let sc = lab
        .srv()
        .call_ok_within("sandbox_destroy", json!({"name": name}), STEP);
    assert!(
        sc.get("cleanup_errors")
            .and_then(Value::as_array)
            .is_none_or(|e| e.is_empty()),
        "sandbox_destroy: {sc}"
    );
}

/// The kernel console reaches vm_serial_read; the serial shell answers through
/// vm_serial_write / vm_serial_wait; a wait for text that never comes times out on time.
fn serial_console(lab: &mut Lab, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let sc = lab
            .srv()
            .call_ok("vm_serial_read", json!({"name": name, "tail_lines": 500}));
        let text = sc["text"].as_str().unwrap_or("");
        if text.contains("Linux version") || text.contains("mcqemu-test-guest: ready") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no boot line on the serial console: {text:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    lab.srv().call_ok_within(
        "vm_serial_wait",
        json!({"name": name, "pattern": "press Enter to activate", "timeout": 30, "offset": 0}),
        STEP,
    );
    lab.srv().call_ok(
        "vm_serial_write",
        json!({"name": name, "text": "", "enter": true}),
    );
    let t = Instant::now();
    let w = lab.srv().call_ok(
        "vm_serial_write",
        json!({"name": name, "text": "echo SERIAL-$((6*7))", "enter": true}),
    );
    let offset = w["offset"].as_u64().expect("write reports the log offset");
    let got = lab.srv().call_ok_within(
        "vm_serial_wait",
        json!({"name": name, "pattern": "SERIAL-42", "timeout": 30, "offset": offset}),
        STEP,
    );
    assert_eq!(got["line"], "SERIAL-42", "{got}");
    assert!(got["offset"].as_u64().unwrap() > offset);
    eprintln!("serial shell answered in {} ms", t.elapsed().as_millis());

    let t = Instant::now();
    let err = lab.srv().call_err(
        "vm_serial_wait",
        json!({"name": name, "pattern": "THIS-NEVER-APPEARS", "timeout": 1}),
    );
    let waited = t.elapsed();
    assert!(err.contains("THIS-NEVER-APPEARS"), "{err}");
    // Capped like vm_type_text, before anything is written.
    let err = lab.srv().call_err(
        "vm_serial_write",
        json!({"name": name, "text": "x".repeat(4097)}),
    );
    assert!(err.contains("4096"), "{err}");
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(3),
        "timeout 1 took {waited:?}"
    );
}

/// The event nodes of the virtio tablet and the PS/2 mouse, polled for: they appear a little
/// after the agent answers.
fn input_nodes(lab: &mut Lab, name: &str) -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let devs = exec(lab, name, "cat /proc/bus/input/devices", 10);
        let text = devs["stdout"].as_str().unwrap_or("").to_string();
        let tablet = event_node(&text, |n| n.contains("Tablet"));
        let mouse = event_node(&text, |n| n.contains("PS/2") && n.contains("Mouse"));
        if let (Some(t), Some(m)) = (tablet, mouse) {
            return (t, m);
        }
        assert!(
            Instant::now() < deadline,
            "tablet or PS/2 mouse missing:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// vm_click reaches the tablet (absolute position, button down and up); vm_mouse_move reaches
/// the PS/2 mouse (relative deltas summing to the request); refused calls send nothing.
fn mouse(lab: &mut Lab, name: &str) {
    let (tablet, mouse) = input_nodes(lab, name);
    let reader = start_event_reader(lab, name, &[&tablet, &mouse]);

    // Refused before anything is sent.
    let r = lab
        .srv()
        .call_keeping("vm_click", json!({"name": name, "x": 99999, "y": 10}), STEP);
    let err = tool_err(&r, "click outside the screen");
    assert!(err.contains("outside"), "{err}");
    let r = lab.srv().call_keeping(
        "vm_mouse_move",
        json!({"name": name, "dx": 20001, "dy": 5}),
        STEP,
    );
    tool_err(&r, "dx over the cap");

    // A click at a fresh position (evdev drops an absolute value equal to the last one).
    let (x, y) = (123u32, 77u32);
    let r = lab
        .srv()
        .call_keeping("vm_click", json!({"name": name, "x": x, "y": y}), STEP);
    let sc = tool_ok(&r, "vm_click");
    let w = sc["screen_width"].as_u64().expect("screen_width") as i64;
    let h = sc["screen_height"].as_u64().expect("screen_height") as i64;
    // Just off the edge of the screen it reported: refused too.
    for (ox, oy) in [(w, 5), (5, h)] {
        let r = lab
            .srv()
            .call_keeping("vm_click", json!({"name": name, "x": ox, "y": oy}), STEP);
        tool_err(&r, "click just off the screen");
    }
    let r = lab.srv().call_keeping(
        "vm_mouse_move",
        json!({"name": name, "dx": 50, "dy": -30, "step": 10, "click": "left"}),
        STEP,
    );
    let sc = tool_ok(&r, "vm_mouse_move");
    assert_eq!(sc["commands"], 5, "{sc}");

    let evs = finish_event_reader(lab, name, reader);
    let (tab, mou) = (&evs[0], &evs[1]);
    let all: Vec<Ev> = tab.iter().chain(mou.iter()).copied().collect();

    let abs_x: Vec<i32> = tab
        .iter()
        .filter(|e| e.0 == EV_ABS && e.1 == 0)
        .map(|e| e.2)
        .collect();
    let abs_y: Vec<i32> = tab
        .iter()
        .filter(|e| e.0 == EV_ABS && e.1 == 1)
        .map(|e| e.2)
        .collect();
    let want_x = (i64::from(x) * 32767 / (w - 1)) as i32;
    let want_y = (i64::from(y) * 32767 / (h - 1)) as i32;
    assert_eq!(
        abs_x,
        vec![want_x],
        "ABS_X on the tablet ({w}x{h}): {tab:?}"
    );
    assert_eq!(
        abs_y,
        vec![want_y],
        "ABS_Y on the tablet ({w}x{h}): {tab:?}"
    );

    let buttons: Vec<i32> = all
        .iter()
        .filter(|e| e.0 == EV_KEY && e.1 == BTN_LEFT)
        .map(|e| e.2)
        .collect();
    assert_eq!(
        buttons,
        vec![1, 0, 1, 0],
        "BTN_LEFT down and up for the click and the move's click; tablet {tab:?} mouse {mou:?}"
    );
    let tab_buttons = tab.iter().filter(|e| e.0 == EV_KEY).count();
    assert!(
        tab_buttons >= 2,
        "the click's button events land on the tablet"
    );

    let rel = |code: u16| -> i32 {
        mou.iter()
            .filter(|e| e.0 == EV_REL && e.1 == code)
            .map(|e| e.2)
            .sum()
    };
    assert_eq!(rel(0), 50, "sum of REL_X on the PS/2 mouse: {mou:?}");
    assert_eq!(rel(1), -30, "sum of REL_Y on the PS/2 mouse: {mou:?}");
    assert!(
        !tab.iter().any(|e| e.0 == EV_REL),
        "no relative events on the tablet"
    );
    assert_no_capture_left(lab, name, "after vm_click");
}

/// vm_screenshot of the booted test guest: a real screen with something on it.
fn sandbox_screenshot(lab: &mut Lab, name: &str) {
    let t = Instant::now();
    let r = lab
        .srv()
        .call_tool_within("vm_screenshot", json!({"name": name}), STEP);
    let ms = t.elapsed().as_millis();
    let (w, h, distinct) = check_inline_screenshot(&r, "sandbox vm_screenshot");
    assert!(w >= 320 && h >= 200, "screen {w}x{h}");
    assert!(distinct > 1, "the console screen is blank ({w}x{h})");
    assert_no_capture_left(lab, name, "after the sandbox screenshot");
    eprintln!("sandbox screenshot {w}x{h} in {ms} ms");
}

/// A guest without a tablet driver: with virtio_input unloaded QEMU routes buttons to the
/// PS/2 mouse too. Clicks after relative motion must survive QEMU's 4-packet PS/2 queue
/// (back to back, a down and an up that found it full merged into nothing), and all of the
/// motion must arrive, before the click.
fn ps2_without_tablet(lab: &mut Lab, name: &str) {
    let (_, mouse) = input_nodes(lab, name);
    exec(lab, name, "rmmod virtio_input", 20);
    let reader = start_event_reader(lab, name, &[&mouse]);
    let n = 8;
    for i in 0..n {
        let sign = if i % 2 == 0 { 1 } else { -1 };
        let r = lab.srv().call_keeping(
            "vm_mouse_move",
            json!({"name": name, "dx": 600 * sign, "dy": -250 * sign, "step": 120,
                   "click": "left", "double": true}),
            STEP,
        );
        tool_ok(&r, "vm_mouse_move with a double click");
    }
    let evs = finish_event_reader(lab, name, reader);
    let mou = &evs[0];
    let buttons: Vec<i32> = mou
        .iter()
        .filter(|e| e.0 == EV_KEY && e.1 == BTN_LEFT)
        .map(|e| e.2)
        .collect();
    assert_eq!(
        buttons,
        [1, 0].repeat(2 * n),
        "every click of {n} double clicks after motion: {mou:?}"
    );
    // All motion of each call arrives before its first button press: the running sums at
    // each press alternate between (600, -250) and (0, 0).
    let (mut x, mut y) = (0i32, 0i32);
    let mut at_press = Vec::new();
    for e in mou {
        match *e {
            (EV_REL, 0, v) => x += v,
            (EV_REL, 1, v) => y += v,
            (EV_KEY, BTN_LEFT, 1) => at_press.push((x, y)),
            _ => {}
        }
    }
    let want: Vec<(i32, i32)> = (0..n)
        .flat_map(|i| {
            let p = if i % 2 == 0 { (600, -250) } else { (0, 0) };
            [p, p]
        })
        .collect();
    assert_eq!(at_press, want, "pointer position at each press");

    // Paced input reports progress once it runs past a second (300 moves of 1 px in 100 paced
    // groups, then 2 flushes: 302 commands), and a short move sends none for its token.
    let (r, took, progress) = lab
        .srv()
        .try_call_with_token(
            "vm_mouse_move",
            json!({"name": name, "dx": 300, "step": 1}),
            STEP,
        )
        .expect("a long paced move");
    tool_ok(&r, "a long paced move");
    assert!(took >= Duration::from_secs(1), "{took:?}");
    assert!(!progress.is_empty(), "no progress in {took:?}");
    let last = &progress[progress.len() - 1]["params"];
    assert!(last["total"].as_f64() == Some(302.0), "{last}");
    let (r, _, progress) = lab
        .srv()
        .try_call_with_token("vm_mouse_move", json!({"name": name, "dx": 10}), STEP)
        .expect("a short move");
    tool_ok(&r, "a short move");
    assert!(progress.is_empty(), "{progress:?}");
}
