//! The Arm guest's screen, keyboard and tablet, end to end over MCP: on QEMU's `virt` board
//! under TCG with the aarch64 test guest, the screen (virtio-gpu: the virt board has no VGA)
//! shows what the guest draws, text typed on the USB keyboard arrives exactly, and a click
//! lands on the tablet. One guest at a time (the lab holds every slot); every QEMU is
//! SIGKILLed on the way out, pass or fail.

use std::time::{Duration, Instant};

use crate::common::arm64::*;
use crate::common::evdev::*;
use crate::common::*;
use mcqemu::b64;
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Screen, keyboard and tablet

/// An inline vm_screenshot: (width, height, pixels that differ from the top-left one).
fn screenshot(s: &mut Server, name: &str) -> (u32, u32, usize) {
    let r = s.call_tool_within("vm_screenshot", json!({"name": name}), STEP);
    let sc = tool_ok(&r, "vm_screenshot");
    let img = r["content"]
        .as_array()
        .expect("content")
        .iter()
        .find(|c| c["type"] == "image")
        .unwrap_or_else(|| panic!("no image content: {r}"));
    assert_eq!(img["mimeType"], "image/png");
    let bytes = b64::decode(img["data"].as_str().expect("image data")).expect("base64");
    let (w, h, bpp, px) = decode_png(&bytes);
    assert_eq!(sc["width"].as_u64(), Some(u64::from(w)), "{sc}");
    assert_eq!(sc["height"].as_u64(), Some(u64::from(h)), "{sc}");
    let background = &px[..bpp];
    let lit = px.chunks(bpp).filter(|p| *p != background).count();
    (w, h, lit)
}

/// A unique tag for one reader, so nothing an earlier reader left is taken for this one's.
fn reader_tag() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!("a64-rd-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// Waits until a reader says on the serial console that it is listening (agent calls would
/// queue behind the reader's own guest_exec).
fn wait_ready(s: &mut Server, name: &str, tag: &str, offset: u64) {
    s.call_ok_within(
        "vm_serial_wait",
        json!({"name": name, "pattern": format!("READY-{tag}"), "timeout": 60, "offset": offset}),
        Duration::from_secs(90),
    );
}

/// Starts a guest_exec that opens /dev/tty1 (the console the keyboard types into) and prints
/// what it reads up to the first Enter; returns the call id once it listens. It reads one
/// character at a time, at most `max` of them and none more than 10 s after the last, so keys
/// that never come (or a key stuck down, repeating) end it with what did arrive instead of
/// hanging it.
fn start_tty_reader(s: &mut Server, name: &str, max: usize) -> Value {
    let tag = reader_tag();
    let offset = s.serial_offset(name);
    let script = format!(
        "exec 3</dev/tty1; echo READY-{tag} > {SERIAL}; i=0; \
         while [ $i -lt {max} ] && IFS= read -r -n 1 -t 10 c <&3; do \
         [ -z \"$c\" ] && break; printf %s \"$c\"; i=$((i+1)); done"
    );
    let id = s.start_call(
        "guest_exec",
        json!({"name": name, "command": "sh", "args": ["-c", script], "timeout": 90}),
    );
    wait_ready(s, name, &tag, offset);
    id
}

fn finish_tty_reader(s: &mut Server, id: &Value) -> String {
    let r = s.finish_call(id, Duration::from_secs(120));
    let sc = tool_ok(&r, "tty reader");
    assert_eq!(sc["exitcode"], 0, "tty reader: {sc}");
    sc["stdout"].as_str().expect("stdout").to_string()
}

/// The guest's input devices, polled for until a keyboard and a tablet are there (USB devices
/// enumerate a little after the agent answers).
fn input_devices(s: &mut Server, name: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = sh(s, name, "cat /proc/bus/input/devices");
        let keyboard = !event_nodes(&text, |n| n.contains("Keyboard")).is_empty();
        let tablet = !event_nodes(&text, |n| n.contains("Tablet")).is_empty();
        if keyboard && tablet {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "no keyboard or no tablet in the guest:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// One step of the drive journey.
type Step = fn(&mut Server, &str, &str);

/// One boot with the serial shell on, driven through the screen, the keyboard and the tablet:
/// what the guest draws on its console shows in the screenshot, typed text and keys reach
/// /dev/tty1 exactly, and a click lands on the tablet at the position asked for, button down
/// then up. Each step is reported on its own (one failing step does not hide the others); the
/// test fails if any did.
#[test]
fn aarch64_screen_keyboard_and_tablet() {
    let (lab, mut s) = arm_lab("a64drv");
    let vm = "armdrv";
    let append = format!("{} mcqemu.serial_shell=1", test_guest_arm64().append);
    boot(&lab, &mut s, vm, json!({"append": append, "no_net": true}));
    let devices = input_devices(&mut s, vm);
    serial_shell(&mut s, vm);

    let steps: [(&str, Step); 4] = [
        ("screen", screen),
        ("typing", typing),
        ("keys", keys),
        ("click", click),
    ];
    let mut failed = Vec::new();
    for (label, step) in steps {
        let t = Instant::now();
        let run =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| step(&mut s, vm, &devices)));
        match run {
            Ok(()) => eprintln!("step {label}: ok in {:?}", t.elapsed()),
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|m| m.to_string()))
                    .unwrap_or_default();
                eprintln!("step {label}: FAILED after {:?}", t.elapsed());
                failed.push(format!("{label}: {msg}"));
            }
        }
    }
    stop(&mut s, vm);
    assert!(failed.is_empty(), "failed steps:\n{}", failed.join("\n"));
}

/// Activates the serial shell (it ends the event recording of [`click`]) and checks it answers.
fn serial_shell(s: &mut Server, vm: &str) {
    s.call_ok_within(
        "vm_serial_wait",
        json!({"name": vm, "pattern": "press Enter to activate", "timeout": 30, "offset": 0}),
        STEP,
    );
    s.call_ok(
        "vm_serial_write",
        json!({"name": vm, "text": "", "enter": true}),
    );
    let w = s.call_ok(
        "vm_serial_write",
        json!({"name": vm, "text": "echo SERIAL-$((6*7))", "enter": true}),
    );
    let offset = w["offset"].as_u64().expect("offset");
    let got = s.call_ok_within(
        "vm_serial_wait",
        json!({"name": vm, "pattern": "SERIAL-42", "timeout": 30, "offset": offset}),
        STEP,
    );
    assert_eq!(got["line"], "SERIAL-42", "{got}");
}

/// The screen (virtio-gpu with the kernel's framebuffer console): what the guest draws on tty1
/// shows in the screenshot.
fn screen(s: &mut Server, vm: &str, _: &str) {
    let (w, h, _) = screenshot(s, vm);
    assert!(w >= 640 && h >= 480, "screen {w}x{h}");
    sh(
        s,
        vm,
        "for i in 1 2 3 4 5 6 7 8; do echo 'MCQEMU ARM64 SCREEN TEST ########################' \
         > /dev/tty1; done",
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (w, h, lit) = screenshot(s, vm);
        // Eight lines of 50 characters in an 8x16 font light well over 5000 pixels; a cursor
        // alone lights a few dozen.
        if lit > 5000 {
            eprintln!("screen {w}x{h}: {lit} pixels drawn");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the screen stays blank after the guest drew on tty1 ({w}x{h}, {lit} pixels lit)"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Every printable ASCII character, typed on the keyboard, arrives exactly.
fn typing(s: &mut Server, vm: &str, _: &str) {
    let unit = "The Quick Brown Fox 0123456789 ~!@#$%^&*()_+`-={}[]|\\:;\"'<>,.?/ two  spaces ";
    let text = unit.repeat(2).trim_end().to_string();
    let reader = start_tty_reader(s, vm, text.len() + 10);
    let t = Instant::now();
    let r = s.call_keeping(
        "vm_type_text",
        json!({"name": vm, "text": text, "enter": true}),
        STEP,
    );
    let sc = tool_ok(&r, "vm_type_text");
    assert_eq!(
        sc["characters"].as_u64(),
        Some(text.len() as u64 + 1),
        "{sc}"
    );
    let typed = t.elapsed();
    let got = finish_tty_reader(s, &reader);
    assert_eq!(got, text, "the guest must receive exactly the typed text");
    eprintln!(
        "vm_type_text: {} characters in {typed:?} ({sc})",
        text.len() + 1
    );
}

/// Typed text and key chords arrive in order.
fn keys(s: &mut Server, vm: &str, _: &str) {
    let reader = start_tty_reader(s, vm, 20);
    let r = s.call_keeping("vm_type_text", json!({"name": vm, "text": "abc"}), STEP);
    tool_ok(&r, "type abc");
    let r = s.call_keeping(
        "vm_send_keys",
        json!({"name": vm, "keys": ["shift-x", "space", "minus", "enter"]}),
        STEP,
    );
    let sc = tool_ok(&r, "vm_send_keys");
    assert_eq!(sc["sent"], 4, "{sc}");
    assert_eq!(finish_tty_reader(s, &reader), "abcX -");
}

/// A click, recorded on every tablet the guest has: one of them gets the absolute position
/// asked for and BTN_LEFT down then up.
fn click(s: &mut Server, vm: &str, devices: &str) {
    let tablets = event_nodes(devices, |n| n.contains("Tablet"));
    let tag = reader_tag();
    let dir = format!("/tmp/{tag}");
    let offset = s.serial_offset(vm);
    let mut script = format!("mkdir -p {dir}; ");
    let mut opened = Vec::new();
    let mut pids = Vec::new();
    for (k, dev) in tablets.iter().enumerate() {
        script.push_str(&format!(
            "( exec 3<{dev}; : > {dir}/open{k}; exec cat <&3 ) > {dir}/ev{k} & p{k}=$!; "
        ));
        opened.push(format!("[ -e {dir}/open{k} ]"));
        pids.push(format!("$p{k}"));
    }
    let ks: Vec<String> = (0..tablets.len()).map(|k| k.to_string()).collect();
    script.push_str(&format!(
        "i=0; until {}; do [ $i -lt 600 ] || exit 3; sleep 0.05; i=$((i+1)); done; \
         echo READY-{tag} > {SERIAL}; \
         i=0; while [ ! -e {dir}/done ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; \
         sleep 1; kill {}; wait; \
         for k in {}; do echo \"== $k\"; od -An -v -tx1 {dir}/ev$k; done",
        opened.join(" && "),
        pids.join(" "),
        ks.join(" ")
    ));
    let id = s.start_call(
        "guest_exec",
        json!({"name": vm, "command": "sh", "args": ["-c", script], "timeout": 120}),
    );
    wait_ready(s, vm, &tag, offset);
    let (x, y) = (123u32, 77u32);
    let r = s.call_keeping("vm_click", json!({"name": vm, "x": x, "y": y}), STEP);
    let clicked = try_tool_ok(&r, "vm_click");
    let r = s.call_keeping(
        "vm_serial_write",
        json!({"name": vm, "text": format!(": > {dir}/done"), "enter": true}),
        STEP,
    );
    tool_ok(&r, "vm_serial_write (end of recording)");
    let res = s.finish_call(&id, Duration::from_secs(150));
    // virt has only the absolute tablet: relative motion is refused, never "sent".
    let r = s.call_keeping(
        "vm_mouse_move",
        json!({"name": vm, "dx": 10, "dy": 5}),
        STEP,
    );
    let refused = tool_err(&r, "vm_mouse_move on virt");
    assert!(refused.contains("no relative mouse"), "{refused}");
    let sc = clicked.unwrap_or_else(|e| panic!("{e}"));
    let sw = sc["screen_width"].as_u64().expect("screen_width") as i64;
    let sh_ = sc["screen_height"].as_u64().expect("screen_height") as i64;
    let out = tool_ok(&res, "event reader");
    assert_eq!(out["exitcode"], 0, "event reader: {out}");
    let stdout = out["stdout"].as_str().unwrap_or("");
    let per_device: Vec<Vec<Ev>> = stdout
        .split("== ")
        .skip(1)
        .map(|p| parse_events(p.split_once('\n').map(|x| x.1).unwrap_or("")))
        .collect();
    assert_eq!(per_device.len(), tablets.len(), "{stdout:?}");
    let want_x = (i64::from(x) * 32767 / (sw - 1)) as i32;
    let want_y = (i64::from(y) * 32767 / (sh_ - 1)) as i32;
    let landed = per_device.iter().any(|evs| {
        let abs = |code: u16| -> Vec<i32> {
            evs.iter()
                .filter(|e| e.0 == EV_ABS && e.1 == code)
                .map(|e| e.2)
                .collect()
        };
        let buttons: Vec<i32> = evs
            .iter()
            .filter(|e| e.0 == EV_KEY && e.1 == BTN_LEFT)
            .map(|e| e.2)
            .collect();
        abs(0) == vec![want_x] && abs(1) == vec![want_y] && buttons == vec![1, 0]
    });
    assert!(
        landed,
        "the click at ({x}, {y}) of {sw}x{sh_} lands on a tablet as ABS_X {want_x}, ABS_Y \
         {want_y}, BTN_LEFT down and up: {tablets:?} recorded {per_device:?}"
    );
}
