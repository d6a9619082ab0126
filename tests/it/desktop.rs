//! Computer use on a real desktop, end to end (TCG): the desktop test image (Xorg, openbox and a
//! full-screen Tk program that logs every input event it receives; `common/desktop.rs`)
//! booted once as a sandbox (1 vCPU, 512 MiB), then driven only through the tools an agent has: vm_screenshot
//! (widgets found by their colour in unscaled and scaled screenshots), vm_click (single,
//! double, right, shift), vm_drag (a slider; a ctrl-drag on a canvas), vm_scroll (a list) and
//! vm_type_text (a text field). Each gesture is checked through the program's own record of
//! what it received: the widget, the button, the modifiers, and the root-window pixel, which
//! must be the screen pixel the tool reported. Run at 1280x800, then again (scaled
//! screenshots) at 1920x1080 after `desktop-mode` switches the mode with xrandr.
//!
//! Also prints, for the README: boot to desktop, and key-to-screen-change latency.

use std::time::{Duration, Instant};

use crate::common::b64::b64_decode;
use crate::common::desktop::*;
use crate::common::*;
use serde_json::{json, Value};

const STEP: Duration = Duration::from_secs(60);
/// Longest wait from launch to the program's first `ready` record.
const BOOT: Duration = Duration::from_secs(300);
const VM: &str = "desk";

/// A decoded screenshot: RGB pixels, its size and the scale the tool reported.
struct Shot {
    w: u32,
    h: u32,
    rgb: Vec<u8>,
    scale: f64,
}

impl Shot {
    fn px(&self, x: u32, y: u32) -> [u8; 3] {
        let i = ((y * self.w + x) * 3) as usize;
        [self.rgb[i], self.rgb[i + 1], self.rgb[i + 2]]
    }

    /// The centre of the pixels within 24 of `colour` on every channel, and their count.
    fn find(&self, colour: [u8; 3]) -> Option<(i64, i64, u64)> {
        let (mut sx, mut sy, mut n) = (0u64, 0u64, 0u64);
        for y in 0..self.h {
            for x in 0..self.w {
                let p = self.px(x, y);
                if (0..3).all(|c| p[c].abs_diff(colour[c]) <= 24) {
                    sx += u64::from(x);
                    sy += u64::from(y);
                    n += 1;
                }
            }
        }
        (n > 0).then(|| ((sx / n) as i64, (sy / n) as i64, n))
    }
}

fn screenshot(s: &mut Server, args: Value) -> Shot {
    let mut a = json!({"name": VM});
    a.as_object_mut()
        .unwrap()
        .extend(args.as_object().unwrap().clone());
    let r = s.call_tool_within("vm_screenshot", a, STEP);
    let sc = tool_ok(&r, "vm_screenshot");
    let img = r["content"]
        .as_array()
        .and_then(|c| c.iter().find(|b| b["type"] == "image"))
        .unwrap_or_else(|| panic!("no image in {r}"));
    let png = b64_decode(img["data"].as_str().unwrap());
    let dec = png::Decoder::new(std::io::Cursor::new(png));
    let mut reader = dec.read_info().expect("PNG header");
    let mut buf = vec![0; reader.output_buffer_size().expect("size")];
    let info = reader.next_frame(&mut buf).expect("PNG data");
    assert_eq!(info.color_type, png::ColorType::Rgb, "RGB screenshots");
    buf.truncate(info.buffer_size());
    Shot {
        w: info.width,
        h: info.height,
        rgb: buf,
        scale: sc["scale"].as_f64().unwrap_or(1.0),
    }
}

/// A tool call that must succeed; returns its structured result.
fn call(s: &mut Server, tool: &str, mut args: Value) -> Value {
    args["name"] = json!(VM);
    s.call_ok_within(tool, args, STEP)
}

/// The root-window pixel of a press must be the screen pixel the tool says it used.
fn assert_at(ev: &Value, sx: &Value, sy: &Value, what: &str) {
    assert_eq!(
        ev["root"],
        json!([sx, sy]),
        "{what}: landed elsewhere: {ev}"
    );
}

const RED: [u8; 3] = [0xd0, 0x30, 0x30];
const BLUE: [u8; 3] = [0x30, 0x50, 0xd0];

#[test]
fn a_desktop_driven_by_screenshots_clicks_drags_wheel_and_keys() {
    let image = test_desktop_image();
    let lab = Lab::without_server("desktop", 1);
    let roots = desktop_roots();
    let mut s = Server::try_start_with(
        TempDir::new("srv"),
        &lab.state(),
        &lab.runtime(),
        &[("MCQEMU_ROOTS", roots.as_str())],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    s.initialize(NEWEST);
    let t0 = Instant::now();
    let r = s.call_tool_within(
        "sandbox_vm",
        json!({"name": VM, "base_image": image.disk, "kernel": image.kernel,
               "initrd": image.initrd, "append": image.append, "memory_mb": 512, "cpus": 1,
               "wait_agent_s": 240}),
        BOOT,
    );
    lab.track(&r);
    let sb = tool_ok(&r, "sandbox_vm");
    assert_eq!(sb["agent_ready"], json!(true), "{sb}");
    let agent_ms = t0.elapsed().as_millis();
    let mut ev = Events::new(VM, &image.events);
    let ready = ev.wait_within(&mut s, 0, "the program's ready record", BOOT, |v| {
        is(v, "ready", "")
    });
    eprintln!(
        "boot to desktop: agent {agent_ms} ms, program ready {} ms after sandbox_vm started",
        t0.elapsed().as_millis()
    );
    assert_eq!(ready["screen"], json!([1280, 800]), "{ready}");

    clicks_1280(&mut s, &mut ev, &ready);
    drag_and_wheel_1280(&mut s, &mut ev, &ready);
    modifiers_and_typing_1280(&mut s, &mut ev, &ready);
    key_latency(&mut s, &mut ev, &ready);
    view_1024(&lab, &mut s, &mut ev);

    let mark = ev.mark();
    let t = Instant::now();
    let out = crate::common::sh(&mut s, VM, "desktop-mode 1920x1080");
    assert_eq!(out.trim(), "1920x1080");
    let ready = ev.wait(&mut s, mark, "ready at 1920x1080", |v| {
        is(v, "ready", "") && v["screen"] == json!([1920, 1080])
    });
    eprintln!(
        "mode switch to 1920x1080 and program restart: {:?}",
        t.elapsed()
    );
    drive_1920(&mut s, &mut ev, &ready);
    let d = s.call_tool_within("sandbox_destroy", json!({"name": VM}), STEP);
    tool_ok(&d, "sandbox_destroy");
    eprintln!("desktop test: {:?} in all", t0.elapsed());
}

/// At 1280x800, screenshots unscaled (and one at max_edge 640, scale 0.5).
fn clicks_1280(s: &mut Server, ev: &mut Events, ready: &Value) {
    // The full-size screenshot shows the buttons where the program put them. The program
    // says it is ready 300 ms after it starts; under TCG its first paint can come later, so the
    // screen is watched (bounded) for the button rather than read once.
    let until = Instant::now() + Duration::from_secs(30);
    let (shot, found) = loop {
        let shot = screenshot(s, json!({}));
        let found = shot.find(RED);
        if found.is_some() || Instant::now() >= until {
            break (shot, found);
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!((shot.w, shot.h, shot.scale), (1280, 800, 1.0));
    let (ok_x, ok_y) = centre(ready, "ok");
    let (fx, fy, _) = found.expect("the red OK button in the screenshot within 30 s");
    assert!(
        (fx - ok_x).abs() <= 3 && (fy - ok_y).abs() <= 3,
        "OK at ({fx}, {fy}), program says ({ok_x}, {ok_y})"
    );

    // A click on the OK button found in a half-size screenshot, at that screenshot's scale.
    let half = screenshot(s, json!({"max_edge": 640}));
    assert_eq!((half.w, half.h), (640, 400));
    let (hx, hy, _) = half.find(RED).expect("OK in the scaled screenshot");
    let m = ev.mark();
    let c = call(
        s,
        "vm_click",
        json!({"x": hx, "y": hy, "scale": half.scale}),
    );
    let press = ev.wait(s, m, "scaled click on OK", |v| is(v, "press", "ok"));
    assert_at(&press, &c["screen_x"], &c["screen_y"], "scaled click");
    assert_eq!(press["button"], 1);
    ev.wait(s, m, "OK activated", |v| is(v, "button", "ok"));

    // Double-click on a list item: Tk sees a double press.
    let (lx, ly, _, _) = rect(ready, "list");
    let m = ev.mark();
    call(
        s,
        "vm_click",
        json!({"x": lx + 60, "y": ly + 40, "double": true}),
    );
    ev.wait(s, m, "double-click on the list", |v| {
        is(v, "double", "list") && v["button"] == 1
    });

    // Right-click on the canvas opens the menu; a click on its entry chooses it.
    let (cx, cy) = centre(ready, "canvas");
    let m = ev.mark();
    let c = call(s, "vm_click", json!({"x": cx, "y": cy, "button": "right"}));
    let press = ev.wait(s, m, "right-click", |v| {
        is(v, "press", "canvas") && v["button"] == 3
    });
    assert_at(&press, &c["screen_x"], &c["screen_y"], "right-click");
    let shown = ev.wait(s, m, "menu shown", |v| is(v, "menu_shown", ""));
    let paste = &shown["entries"]["Paste"];
    let m = ev.mark();
    call(s, "vm_click", json!({"x": paste[0], "y": paste[1]}));
    ev.wait(s, m, "menu entry Paste chosen", |v| {
        is(v, "menu", "") && v["item"] == "Paste"
    });
}

/// At 1280x800: a slider dragged, a list scrolled both ways.
fn drag_and_wheel_1280(s: &mut Server, ev: &mut Events, ready: &Value) {
    // Drag the slider from 0 to the middle.
    let from = &ready["widgets"]["scale_slider"]["0"];
    let to = &ready["widgets"]["scale_slider"]["50"];
    let m = ev.mark();
    call(
        s,
        "vm_drag",
        json!({"x": from[0], "y": from[1], "to_x": to[0], "to_y": to[1]}),
    );
    // The program records the slider's values as Tk handles the motion, which on a loaded
    // host trails the drag: wait for it to reach the middle, then read what came after.
    ev.wait(s, m, "the slider near 50", |v| {
        is(v, "scale", "scale") && v["value"].as_i64().is_some_and(|x| (48..=52).contains(&x))
    });
    let got = ev.since(s, m);
    let last = got
        .iter()
        .rev()
        .find(|v| is(v, "scale", "scale"))
        .unwrap_or_else(|| panic!("no scale event: {got:#?}"));
    let val = last["value"].as_i64().unwrap();
    assert!(
        (48..=52).contains(&val),
        "slider dragged to {val}, not ~50: {got:#?}"
    );

    // Scroll the list down three notches: three wheel presses and a list moved.
    let (lcx, lcy) = centre(ready, "list");
    let m = ev.mark();
    call(
        s,
        "vm_scroll",
        json!({"x": lcx, "y": lcy, "direction": "down", "clicks": 3}),
    );
    ev.wait(s, m, "list scrolled", |v| {
        is(v, "yview", "list") && v["first"].as_f64() > Some(0.0)
    });
    // Tk reports a press that follows another of the same button within its double-click
    // time as "double" (its more specific binding).
    let wheel_down =
        |v: &Value| (is(v, "press", "list") || is(v, "double", "list")) && v["button"] == 5;
    ev.wait_count(s, m, "three wheel-down presses", 3, wheel_down);
    let got = ev.since(s, m);
    let wheels = got.iter().filter(|v| wheel_down(v)).count();
    assert_eq!(wheels, 3, "three wheel-down presses: {got:#?}");
    let m = ev.mark();
    call(
        s,
        "vm_scroll",
        json!({"x": lcx, "y": lcy, "direction": "up", "clicks": 10}),
    );
    ev.wait(s, m, "list back at the top", |v| {
        is(v, "yview", "list") && v["first"] == 0.0
    });
}

/// At 1280x800: shift-click, ctrl-drag and typing.
fn modifiers_and_typing_1280(s: &mut Server, ev: &mut Events, ready: &Value) {
    // Shift-click: item 02, then shift-click on item 06 selects 02..06 (extended selection).
    let row = |item: &str| ready["widgets"]["list_rows"][item].clone();
    let (i2, i6) = (row("item 02"), row("item 06"));
    let m = ev.mark();
    call(s, "vm_click", json!({"x": i2[0], "y": i2[1]}));
    ev.wait(s, m, "item 02 selected", |v| {
        is(v, "select", "list") && v["items"] == json!(["item 02"])
    });
    let m = ev.mark();
    call(
        s,
        "vm_click",
        json!({"x": i6[0], "y": i6[1], "hold": ["shift"]}),
    );
    let sel = ev.wait(s, m, "shift-click range", |v| {
        is(v, "select", "list") && v["items"].as_array().map(Vec::len) > Some(1)
    });
    assert_eq!(
        sel["items"],
        json!(["item 02", "item 03", "item 04", "item 05", "item 06"])
    );
    let press = ev
        .since(s, m)
        .into_iter()
        .find(|v| is(v, "press", "list"))
        .unwrap();
    assert!(has_mod(&press, "shift"), "{press}");

    // Ctrl-drag on the canvas: pressed and released where asked, ctrl held, motion between.
    let (x0, y0, _, _) = rect(ready, "canvas");
    let m = ev.mark();
    let d = call(
        s,
        "vm_drag",
        json!({"x": x0 + 100, "y": y0 + 80, "to_x": x0 + 400, "to_y": y0 + 300, "hold": ["ctrl"]}),
    );
    let rel = ev.wait(s, m, "ctrl-drag release", |v| {
        is(v, "release", "canvas") && v["button"] == 1
    });
    assert_eq!(rel["drag_from"], json!([100, 80]), "{rel}");
    assert_eq!(rel["root"], d["to"], "{rel}");
    assert!(has_mod(&rel, "control"), "{rel}");
    assert!(rel["moves"].as_i64() >= Some(3), "{rel}");

    // Type into the field.
    let (ex, ey) = centre(ready, "entry");
    call(s, "vm_click", json!({"x": ex, "y": ey}));
    let m = ev.mark();
    let text = "Hello, Desktop! 42 <&>";
    call(s, "vm_type_text", json!({"text": text}));
    ev.wait(s, m, "typed text", |v| {
        is(v, "text", "entry") && v["value"] == text
    });
}

/// At 1920x1080 the default screenshot is scaled (1568 px wide): every position comes from it.
fn drive_1920(s: &mut Server, ev: &mut Events, ready: &Value) {
    let shot = screenshot(s, json!({}));
    assert_eq!(shot.w, 1568, "scaled to 1568 px");
    assert!(shot.scale < 0.82 && shot.scale > 0.81, "{}", shot.scale);
    let (bx, by, _) = shot.find(BLUE).expect("the blue Cancel button");
    let m = ev.mark();
    let c = call(
        s,
        "vm_click",
        json!({"x": bx, "y": by, "scale": shot.scale}),
    );
    let press = ev.wait(s, m, "scaled click on Cancel", |v| is(v, "press", "cancel"));
    assert_at(
        &press,
        &c["screen_x"],
        &c["screen_y"],
        "scaled click at 1920x1080",
    );
    ev.wait(s, m, "Cancel activated", |v| is(v, "button", "cancel"));

    // The slider, dragged to 100 in screenshot coordinates.
    let k = shot.scale;
    let img = |v: &Value| (v.as_f64().unwrap() * k).round() as i64;
    let from = &ready["widgets"]["scale_slider"]["0"];
    let to = &ready["widgets"]["scale_slider"]["100"];
    let m = ev.mark();
    call(
        s,
        "vm_drag",
        json!({"x": img(&from[0]), "y": img(&from[1]), "to_x": img(&to[0]) + 20, "to_y": img(&to[1]), "scale": k}),
    );
    ev.wait(s, m, "slider at 100", |v| {
        is(v, "scale", "scale") && v["value"] == 100
    });

    // A scaled scroll on the list.
    let (lx, ly) = centre(ready, "list");
    let m = ev.mark();
    call(
        s,
        "vm_scroll",
        json!({"x": (lx as f64 * k) as i64, "y": (ly as f64 * k) as i64, "scale": k, "clicks": 2}),
    );
    ev.wait(s, m, "scaled scroll", |v| {
        is(v, "yview", "list") && v["first"].as_f64() > Some(0.0)
    });

    // A scaled shift+ctrl drag on the canvas: pressed and released on the screen pixels under
    // the screenshot's, both modifiers held.
    let (x0, y0, _, _) = rect(ready, "canvas");
    let (ax, ay) = (((x0 + 50) as f64 * k) as i64, ((y0 + 50) as f64 * k) as i64);
    let m = ev.mark();
    let d = call(
        s,
        "vm_drag",
        json!({"x": ax, "y": ay, "to_x": ax + 200, "to_y": ay + 150, "scale": k,
               "hold": ["shift", "ctrl"]}),
    );
    let rel = ev.wait(s, m, "scaled drag release", |v| {
        is(v, "release", "canvas") && v["button"] == 1
    });
    let from = &d["from"];
    let local = |i: usize, o: i64| from[i].as_i64().unwrap() - o;
    assert_eq!(
        rel["drag_from"],
        json!([local(0, x0), local(1, y0)]),
        "{rel} {d}"
    );
    assert_eq!(rel["root"], d["to"], "{rel}");
    assert!(has_mod(&rel, "control") && has_mod(&rel, "shift"), "{rel}");
}

/// Key-to-screen-change latency: a key typed into the field (whose cursor does not blink:
/// nothing else changes the screen), then full screenshots until one differs. Printed for
/// the README (no timed assert): the vm_type_text call, and from its start to the first
/// changed screenshot's return.
fn key_latency(s: &mut Server, ev: &mut Events, ready: &Value) {
    let (ex, ey) = centre(ready, "entry");
    call(s, "vm_click", json!({"x": ex, "y": ey}));
    let mut samples = Vec::new();
    for ch in ["x", "y", "z", "w", "v"] {
        let before = screenshot(s, json!({})).rgb;
        let m = ev.mark();
        let t = Instant::now();
        call(s, "vm_type_text", json!({"text": ch}));
        let typed = t.elapsed().as_millis();
        let mut polls = 0;
        loop {
            polls += 1;
            if screenshot(s, json!({})).rgb != before {
                break;
            }
            assert!(
                t.elapsed() < EVENT_SEEN,
                "the screen did not change after typing {ch:?}"
            );
        }
        samples.push((typed, t.elapsed().as_millis(), polls));
        ev.wait(s, m, "latency key", |v| {
            is(v, "key", "entry") && v["char"] == ch
        });
    }
    eprintln!("key to screen change (type ms, changed screenshot ms, screenshots): {samples:?}");
}

/// The live view a person takes over, at 1024x768 in Chromium (`tests/browser/view_desktop.mjs`
/// on the page `mcqemu view` serves, drawn scaled to the page): a click at a point of the
/// scaled image lands on the matching screen pixel, typed text arrives exactly and ctrl+a as a
/// chord. Prints each click's time from the page to the program (the program's clock turned
/// into the host's).
fn view_1024(lab: &Lab, s: &mut Server, ev: &mut Events) {
    let mark = ev.mark();
    let out = crate::common::sh(s, VM, "desktop-mode 1024x768");
    assert_eq!(out.trim(), "1024x768");
    let ready = ev.wait(s, mark, "ready at 1024x768", |v| {
        is(v, "ready", "") && v["screen"] == json!([1024, 768])
    });
    let (ok, (cx, cy, _, _), entry) = (
        centre(&ready, "ok"),
        rect(&ready, "canvas"),
        centre(&ready, "entry"),
    );
    // Odd points, so that a mapping off by one shows; the entry last, which takes the keys.
    let targets = [ok, (cx + 37, cy + 53), (cx + 211, cy + 149), entry];
    let offset = guest_clock_offset_ms(s, VM).unwrap_or_else(|e| panic!("{e}"));
    let (node, chromium) = (
        crate::common::browser::node_dir(),
        crate::common::browser::chromium(),
    );
    let (mut view, url) = crate::common::view::spawn_view(lab, VM);
    let text = "Typed in the view: a-Z 0-9 <&>";
    let spec = json!({"screen": [1024, 768], "clicks": targets, "gap_ms": 700, "text": text});
    let m = ev.mark();
    let seen = crate::common::browser::run_node(
        &node,
        "view_desktop.mjs",
        &[url.as_str(), &spec.to_string()],
        &[("CHROMIUM", chromium.as_str())],
    );
    let _ = view.kill();
    let _ = view.wait();
    eprintln!("the desktop in the view: {seen}");
    assert_eq!(seen["console_errors"], json!([]), "{seen}");
    assert_eq!(seen["elsewhere"], json!([]), "{seen}");
    assert!(
        seen["steps"]["drawn"][0].as_f64() < Some(1024.0),
        "the view was meant to draw the screen scaled: {seen}"
    );
    // The batch "xéy": x and y arrived, é (no US key) was named on the page.
    ev.wait(s, m, "text typed in the view", |v| {
        is(v, "text", "entry") && v["value"] == format!("{text}xy")
    });
    let status = seen["steps"]["status_after_typing"]
        .as_str()
        .unwrap_or_default();
    assert!(
        status.contains("not typed") && status.contains('é'),
        "{seen}"
    );
    let chord = ev.wait(s, m, "ctrl+a from the view", |v| {
        is(v, "key", "entry") && v["keysym"] == "a" && has_mod(v, "control")
    });
    assert!(chord["t"].is_number(), "{chord}");
    // Chords arrive as pressed: shift held with ctrl, and ctrl+! as ctrl+shift+1.
    ev.wait(s, m, "ctrl+shift+a from the view", |v| {
        is(v, "key", "entry") && v["keysym"] == "A" && has_mod(v, "control") && has_mod(v, "shift")
    });
    ev.wait(s, m, "ctrl+shift+1 from the view", |v| {
        is(v, "key", "entry")
            && v["keysym"] == "exclam"
            && has_mod(v, "control")
            && has_mod(v, "shift")
    });
    let presses: Vec<Value> = ev
        .since(s, m)
        .into_iter()
        .filter(|v| is(v, "press", "") && v["button"] == 1)
        .collect();
    let clicks = seen["clicks"].as_array().expect("the clicks made");
    assert_eq!(presses.len(), clicks.len(), "presses: {presses:#?}");
    let mut latency = Vec::new();
    for (click, press) in clicks.iter().zip(&presses) {
        // A pixel of the page spans 1024/800 screen pixels: the press is within one of it.
        for (axis, k) in [(0, "x"), (1, "y")] {
            let want = click[k].as_i64().unwrap();
            let got = press["root"][axis].as_i64().unwrap();
            assert!(
                (got - want).abs() <= 1,
                "a click at {click} in the view landed at {} in the guest",
                press["root"]
            );
        }
        let made = click["t"].as_f64().unwrap();
        latency.push((press["t"].as_f64().unwrap() * 1000.0 - offset - made).round());
    }
    eprintln!("click in the view to the program's press (ms): {latency:?}");
    // A window whose text cursor blinks (Tk's default 600/300 ms; the test program's own
    // cursor is steady): once the view has seen it blink, no frame goes out in 5 s.
    let blinker = "import tkinter as tk; r = tk.Tk(); r.geometry('220x60+40+40'); \
                   e = tk.Entry(r); e.pack(); r.after(300, e.focus_force); r.mainloop()";
    let bg = s.call_ok(
        "guest_exec",
        json!({"name": VM, "command": "python3", "args": ["-c", blinker],
               "env": {"DISPLAY": ":0"}, "background": true}),
    );
    let handle = bg["handle"].as_str().expect("a handle").to_string();
    std::thread::sleep(Duration::from_secs(3));
    let (learning, window, hash) =
        crate::common::view::frames_while_still(s, VM, Duration::from_secs(4));
    eprintln!("vm_view_frame on the desktop: {learning} frames while learning, {window} in 5 s");
    assert!(
        learning >= 2,
        "the text cursor was not seen blinking: {learning} frames while learning"
    );
    assert_eq!(window, 0, "frames sent for a blinking text cursor");
    // A real change still goes out at once.
    s.call_ok("vm_type_text", json!({"name": VM, "text": "z"}));
    let f = s.call_tool_within(
        "vm_view_frame",
        json!({"name": VM, "since": hash, "wait_ms": 10000, "max_width": 320}),
        Duration::from_secs(60),
    );
    let sc = tool_ok(&f, "vm_view_frame after typing");
    assert_eq!(
        sc["changed"],
        json!(true),
        "a real change was held back: {sc}"
    );
    s.call_ok("guest_exec_kill", json!({"name": VM, "handle": handle}));
    let info = s.call_ok("vm_info", json!({"name": VM}));
    assert!(
        info["held"].is_null(),
        "the hold outlived the hand-back: {info}"
    );
}
