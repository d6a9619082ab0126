//! Screenshots of a large screen, end to end against a real QEMU (TCG) and the test guest:
//! a 1920x1080 desktop comes back scaled down (area averaging) to the hosts' bound with its
//! scale, other bounds and the byte budget hold, and clicks given in a scaled screenshot's
//! coordinates land on the guest pixel under them (read back from the guest's input events).
//!
//! One guest for the whole file. It sets a 1920x1080 mode on QEMU's standard VGA and shows a
//! known picture (`screenshots/desktop.rs`), so the test knows every pixel the screen holds
//! and checks the returned images against its own area average of the picture.
//!
//! Input is checked where the guest receives it, as in `see_and_drive.rs`: a guest_exec
//! records /dev/input/event* while the test clicks; it says it is listening on the serial
//! console and is told to stop through the serial shell (agent calls would queue behind the
//! recording guest_exec).

mod desktop;

use std::time::{Duration, Instant};

use crate::common::b64::b64_decode;
use crate::common::evdev::*;
use crate::common::*;
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(150);
const STEP: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Images, decoded and computed independently of the code under test

/// An RGB image.
struct Image {
    w: usize,
    h: usize,
    px: Vec<u8>,
}

impl Image {
    fn at(&self, x: usize, y: usize) -> [u8; 3] {
        let i = (y * self.w + x) * 3;
        [self.px[i], self.px[i + 1], self.px[i + 2]]
    }
}

/// Decodes an RGB PNG.
fn decode_rgb(data: &[u8]) -> Image {
    let (w, h, bpp, px) = decode_png(data);
    assert_eq!(bpp, 3, "an 8-bit RGB PNG");
    Image {
        w: w as usize,
        h: h as usize,
        px,
    }
}

/// The exact area average of `src` at `w` x `h`, in floating point: each output pixel is the
/// mean of the source area it covers, partial pixels counted by their covered fraction.
fn area_average(src: &Image, w: usize, h: usize) -> Vec<f32> {
    // Per axis: for each output index, (first source index, weights).
    fn taps(src: usize, dst: usize) -> Vec<(usize, Vec<f32>)> {
        let f = src as f64 / dst as f64;
        (0..dst)
            .map(|i| {
                let (lo, hi) = (i as f64 * f, (i + 1) as f64 * f);
                let first = lo.floor() as usize;
                let last = (hi.ceil() as usize).min(src);
                let ws = (first..last)
                    .map(|j| ((hi.min(j as f64 + 1.0) - lo.max(j as f64)) / f) as f32)
                    .collect();
                (first, ws)
            })
            .collect()
    }
    let (tx, ty) = (taps(src.w, w), taps(src.h, h));
    let mut rows = vec![0f32; src.h * w * 3];
    for y in 0..src.h {
        for (x, (x0, ws)) in tx.iter().enumerate() {
            for c in 0..3 {
                let mut s = 0f32;
                for (k, wt) in ws.iter().enumerate() {
                    s += wt * f32::from(src.px[(y * src.w + x0 + k) * 3 + c]);
                }
                rows[(y * w + x) * 3 + c] = s;
            }
        }
    }
    let mut out = vec![0f32; w * h * 3];
    for (y, (y0, ws)) in ty.iter().enumerate() {
        for (k, wt) in ws.iter().enumerate() {
            let row = &rows[(y0 + k) * w * 3..(y0 + k + 1) * w * 3];
            for (o, v) in out[y * w * 3..(y + 1) * w * 3].iter_mut().zip(row) {
                *o += wt * v;
            }
        }
    }
    out
}

/// Compares an image with the area average of the desktop at its size: (largest difference of
/// one channel, mean difference).
fn compare_with_average(img: &Image, desk: &Image) -> (f32, f32) {
    let want = area_average(desk, img.w, img.h);
    let mut max = 0f32;
    let mut sum = 0f64;
    for (g, w) in img.px.iter().zip(&want) {
        let d = (f32::from(*g) - w).abs();
        max = max.max(d);
        sum += f64::from(d);
    }
    (max, (sum / want.len() as f64) as f32)
}

/// The centre of the red marker in an image (the mean position of its red pixels, weighted by
/// how red they are), in image pixel coordinates.
fn marker_centre(img: &Image) -> (f64, f64) {
    let (mut sx, mut sy, mut sw) = (0f64, 0f64, 0f64);
    for y in 0..img.h {
        for x in 0..img.w {
            let [r, g, b] = img.at(x, y).map(i32::from);
            let redness = r - g.max(b) - 150;
            if redness > 0 {
                let wt = f64::from(redness);
                sx += wt * x as f64;
                sy += wt * y as f64;
                sw += wt;
            }
        }
    }
    assert!(sw > 0.0, "no marker in the {}x{} image", img.w, img.h);
    (sx / sw, sy / sw)
}

// ---------------------------------------------------------------------------------------------
// Tool calls

/// vm_screenshot with `extra` arguments, inline: checks the result's fields against the image
/// it carries and returns (structured result, decoded image, PNG size).
fn shot_inline(lab: &mut Lab, name: &str, extra: Value) -> (Value, Image, usize) {
    let mut args = json!({"name": name});
    for (k, v) in extra.as_object().unwrap() {
        args[k] = v.clone();
    }
    let r = lab
        .srv()
        .call_tool_within("vm_screenshot", args.clone(), STEP);
    let sc = tool_ok(&r, &format!("vm_screenshot {args}"));
    let images: Vec<&Value> = r["content"]
        .as_array()
        .expect("content")
        .iter()
        .filter(|c| c["type"] == "image")
        .collect();
    assert_eq!(images.len(), 1, "one image block: {r}");
    assert_eq!(images[0]["mimeType"], "image/png");
    let data = b64_decode(images[0]["data"].as_str().expect("image data"));
    assert_eq!(sc["bytes"].as_u64(), Some(data.len() as u64), "bytes: {sc}");
    let img = decode_rgb(&data);
    assert_eq!(sc["width"].as_u64(), Some(img.w as u64), "width: {sc}");
    assert_eq!(sc["height"].as_u64(), Some(img.h as u64), "height: {sc}");
    assert!(sc["path"].is_null());
    check_scale(&sc);
    (sc, img, data.len())
}

/// The scale a result gives agrees with its sizes: each edge is the screen's times the scale,
/// rounded (as vm_click maps them back).
fn check_scale(sc: &Value) {
    let s = sc["scale"].as_f64().expect("scale");
    let (sw, sh) = (
        sc["screen_width"].as_f64().unwrap(),
        sc["screen_height"].as_f64().unwrap(),
    );
    let (w, h) = (
        sc["width"].as_f64().unwrap(),
        sc["height"].as_f64().unwrap(),
    );
    assert!(s > 0.0 && s <= 1.0, "scale {s}");
    assert_eq!(
        w,
        (sw * s).round().clamp(1.0, sw),
        "width at scale {s}: {sc}"
    );
    assert_eq!(
        h,
        (sh * s).round().clamp(1.0, sh),
        "height at scale {s}: {sc}"
    );
}

// ---------------------------------------------------------------------------------------------
// Recording the guest's input events (as see_and_drive.rs does)

fn exec(lab: &mut Lab, name: &str, script: &str) -> Value {
    let r = lab.srv().call_keeping(
        "guest_exec",
        json!({"name": name, "command": "sh", "args": ["-c", script], "timeout": 30}),
        STEP,
    );
    tool_ok(&r, &format!("guest_exec {script}"))
}

/// Activates the test guest's serial shell (kernel command line `mcqemu.serial_shell=1`).
fn serial_shell(lab: &mut Lab, name: &str) {
    lab.srv().call_ok_within(
        "vm_serial_wait",
        json!({"name": name, "pattern": "press Enter to activate", "timeout": 60, "offset": 0}),
        Duration::from_secs(90),
    );
    lab.srv().call_ok(
        "vm_serial_write",
        json!({"name": name, "text": "", "enter": true}),
    );
    let w = lab.srv().call_ok(
        "vm_serial_write",
        json!({"name": name, "text": "echo SHELL-$((6*7))", "enter": true}),
    );
    lab.srv().call_ok_within(
        "vm_serial_wait",
        json!({"name": name, "pattern": "SHELL-42", "timeout": 30,
               "offset": w["offset"].as_u64().unwrap_or(0)}),
        STEP,
    );
}

/// The event nodes of the virtio tablet and the PS/2 mouse.
fn input_nodes(lab: &mut Lab, name: &str) -> (String, String) {
    let node = |devices: &str, pred: &dyn Fn(&str) -> bool| -> Option<String> {
        devices.split("\n\n").find_map(|block| {
            let n = block.lines().find_map(|l| l.strip_prefix("N: Name=\""))?;
            if !pred(n) {
                return None;
            }
            let handlers = block.lines().find_map(|l| l.strip_prefix("H: Handlers="))?;
            handlers
                .split_whitespace()
                .find(|h| h.starts_with("event"))
                .map(|h| format!("/dev/input/{h}"))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = exec(lab, name, "cat /proc/bus/input/devices")["stdout"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let tablet = node(&text, &|n| n.contains("Tablet"));
        let mouse = node(&text, &|n| n.contains("PS/2") && n.contains("Mouse"));
        if let (Some(t), Some(m)) = (tablet, mouse) {
            return (t, m);
        }
        assert!(
            Instant::now() < deadline,
            "no tablet or PS/2 mouse:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Starts recording `devices` in the guest; returns (call id, folder) once every device is
/// open, so nothing sent afterwards is missed.
fn start_recording(lab: &mut Lab, name: &str, devices: &[&str]) -> (Value, String) {
    let offset = lab.srv().serial_offset(name);
    let d = "/tmp/mcq-rec";
    let mut script = format!("rm -rf {d}; mkdir -p {d}; ");
    let mut opened = Vec::new();
    let mut pids = Vec::new();
    for (k, dev) in devices.iter().enumerate() {
        script.push_str(&format!(
            "( exec 3<{dev}; : > {d}/open{k}; exec cat <&3 ) > {d}/ev{k} & p{k}=$!; "
        ));
        opened.push(format!("[ -e {d}/open{k} ]"));
        pids.push(format!("$p{k}"));
    }
    let ks: Vec<String> = (0..devices.len()).map(|k| k.to_string()).collect();
    script.push_str(&format!(
        "i=0; until {}; do [ $i -lt 600 ] || exit 3; sleep 0.05; i=$((i+1)); done; \
         echo READY-mcq-rec > /dev/ttyS0; \
         i=0; while [ ! -e {d}/done ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; \
         sleep 1; kill {}; wait; \
         for k in {}; do echo \"== $k\"; od -An -v -tx1 {d}/ev$k; done",
        opened.join(" && "),
        pids.join(" "),
        ks.join(" ")
    ));
    let id = lab.srv().start_call(
        "guest_exec",
        json!({"name": name, "command": "sh", "args": ["-c", script], "timeout": 120}),
    );
    let r = lab.srv().call_keeping(
        "vm_serial_wait",
        json!({"name": name, "pattern": "READY-mcq-rec", "timeout": 60, "offset": offset}),
        Duration::from_secs(90),
    );
    tool_ok(&r, "recorder ready");
    (id, d.to_string())
}

/// Ends the recording (through the serial shell) and returns each device's events.
fn finish_recording(lab: &mut Lab, name: &str, id: &Value, dir: &str, n: usize) -> Vec<Vec<Ev>> {
    let r = lab.srv().call_keeping(
        "vm_serial_write",
        json!({"name": name, "text": format!(": > {dir}/done"), "enter": true}),
        STEP,
    );
    tool_ok(&r, "vm_serial_write (end of recording)");
    let res = lab.srv().finish_call(id, Duration::from_secs(150));
    let out = tool_ok(&res, "recorder");
    assert_eq!(out["exitcode"], 0, "recorder: {out}");
    let stdout = out["stdout"].as_str().unwrap_or("");
    let parts: Vec<&str> = stdout.split("== ").skip(1).collect();
    assert_eq!(parts.len(), n, "recorder output: {stdout:?}");
    parts
        .iter()
        .map(|p| {
            let hex = p.split_once('\n').map(|x| x.1).unwrap_or("");
            parse_events(hex)
        })
        .collect()
}

/// The screen pixel a tablet position stands for on an axis of `size` pixels (QEMU maps
/// pixel p to p * 32767 / (size - 1)).
fn abs_to_pixel(abs: i32, size: usize) -> f64 {
    f64::from(abs) * (size - 1) as f64 / 32767.0
}

// ---------------------------------------------------------------------------------------------
// The test

#[test]
fn screenshots_of_a_1920x1080_desktop_are_bounded_and_clicks_map_back() {
    let guest = test_guest();
    let desk = Image {
        w: desktop::W,
        h: desktop::H,
        px: desktop::picture(),
    };
    let mut lab = Lab::new("shots");
    let name = "shots";
    let t = Instant::now();
    let r = lab.srv().call_tool_within(
        "launch_vm",
        json!({
            "name": name, "memory_mb": 256, "cpus": 1, "no_net": true,
            "kernel": guest.kernel, "initrd": guest.initrd,
            "append": format!("{} mcqemu.serial_shell=1", guest.append),
        }),
        LONG,
    );
    lab.track(&r);
    tool_ok(&r, "launch_vm");
    let deadline = Instant::now() + Duration::from_secs(120);
    while lab.srv().call_tool("guest_ping", json!({"name": name}))["isError"] != json!(false) {
        assert!(Instant::now() < deadline, "the guest agent never answered");
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("test guest up in {} ms", t.elapsed().as_millis());

    // The text console: within every bound already, returned as it is.
    let (sc, img, _) = shot_inline(&mut lab, name, json!({}));
    assert_eq!((img.w, img.h), (720, 400), "{sc}");
    assert_eq!(sc["scale"], json!(1.0));
    assert_eq!(
        (sc["screen_width"].as_u64(), sc["screen_height"].as_u64()),
        (Some(720), Some(400))
    );

    // The desktop on a 1920x1080 screen.
    let t = Instant::now();
    desktop::show(name, &desk.px, |tool, args| {
        lab.srv().try_call_ok_within(tool, args, LONG)
    })
    .unwrap_or_else(|e| panic!("putting the desktop on the guest's screen: {e}"));
    eprintln!("desktop shown in {} ms", t.elapsed().as_millis());

    // The full screen on request: exactly the picture (nothing lost on the way).
    let (sc, full, _) = shot_inline(
        &mut lab,
        name,
        json!({"max_edge": 16384, "max_bytes": 100_000_000}),
    );
    assert_eq!((full.w, full.h), (1920, 1080), "{sc}");
    assert_eq!(sc["scale"], json!(1.0));
    assert!(
        full.px == desk.px,
        "the full-size screenshot differs from the picture shown"
    );

    // The default: scaled to 1568 on the longer edge, with its scale; a proper reduction
    // (the area average of the screen, within rounding); under 1 MB.
    let (sc, img, bytes) = shot_inline(&mut lab, name, json!({}));
    assert_eq!((img.w, img.h), (1568, 882), "{sc}");
    assert_eq!(sc["scale"], json!(0.8166), "{sc}");
    assert_eq!(
        (sc["screen_width"].as_u64(), sc["screen_height"].as_u64()),
        (Some(1920), Some(1080))
    );
    assert!(bytes <= 750_000, "the default PNG is {bytes} bytes");
    let (max, mean) = compare_with_average(&img, &desk);
    eprintln!("default screenshot: 1568x882, {bytes} PNG bytes; vs the exact area average: max {max:.2}, mean {mean:.3}");
    assert!(
        max <= 2.0 && mean <= 0.6,
        "not the area average: max {max}, mean {mean}"
    );
    let scaled = img;

    // The screen resource is bounded the same way (clients hand it to the model as it is).
    let uri = format!("mcqemu://vm/{name}/screen");
    let r = lab.srv().request("resources/read", json!({ "uri": uri }));
    let blob = r["result"]["contents"][0]["blob"]
        .as_str()
        .unwrap_or_else(|| panic!("no screen blob: {r}"));
    let res = decode_rgb(&b64_decode(blob));
    assert_eq!(
        (res.w, res.h),
        (1568, 882),
        "the screen resource is not bounded"
    );
    assert!(
        res.px == scaled.px,
        "the screen resource differs from vm_screenshot's default image"
    );

    // Other bounds: the longer edge, width and height together (the tighter wins), and a
    // byte budget that needs more than the size bounds.
    let (sc, img, _) = shot_inline(&mut lab, name, json!({"max_edge": 800}));
    assert_eq!((img.w, img.h), (800, 450), "{sc}");
    let (max, _) = compare_with_average(&img, &desk);
    assert!(max <= 2.0, "max_edge 800: off the area average by {max}");
    let (sc, img, _) = shot_inline(
        &mut lab,
        name,
        json!({"max_width": 1000, "max_height": 300}),
    );
    assert!(img.w <= 1000 && (299..=300).contains(&img.h), "{sc}");
    let (sc, img, bytes) = shot_inline(&mut lab, name, json!({"max_bytes": 120_000}));
    assert!(bytes <= 120_000, "max_bytes 120000 gave {bytes}: {sc}");
    assert!(
        sc["scale"].as_f64().unwrap() < 0.8166 && img.w < 1568,
        "{sc}"
    );

    // Saved to a file: the full screen unless bounds are given.
    let out = TempDir::new("shots");
    for (extra, want) in [
        (json!({}), (1920, 1080)),
        (json!({"max_edge": 1568}), (1568, 882)),
    ] {
        let dest = out.file("screen.png");
        let mut args = json!({"name": name, "path": dest.as_str()});
        for (k, v) in extra.as_object().unwrap() {
            args[k] = v.clone();
        }
        let sc = lab.srv().call_ok_within("vm_screenshot", args, STEP);
        check_scale(&sc);
        let saved = decode_rgb(&std::fs::read(&dest).expect("saved PNG"));
        assert_eq!((saved.w, saved.h), want, "{sc}");
        assert_eq!(
            (sc["width"].as_u64(), sc["height"].as_u64()),
            (Some(want.0 as u64), Some(want.1 as u64))
        );
    }

    // Clicks in the scaled screenshot's coordinates. The marker's centre as the screenshot
    // shows it, clicked there with the screenshot's scale, must land on the marker's centre
    // on the screen; the image's last pixel is the screen's last pixel.
    serial_shell(&mut lab, name);
    let (tablet, mouse) = input_nodes(&mut lab, name);
    let (cx, cy) = marker_centre(&scaled);
    let (x, y) = (cx.round() as i64, cy.round() as i64);
    let scale = 0.8166;
    let (id, dir) = start_recording(&mut lab, name, &[&tablet, &mouse]);
    let sc = lab.srv().call_ok(
        "vm_click",
        json!({"name": name, "x": x, "y": y, "scale": scale}),
    );
    let (sx, sy) = (
        sc["screen_x"].as_i64().unwrap(),
        sc["screen_y"].as_i64().unwrap(),
    );
    let (mx0, my0) = (desktop::MARKER_X as i64, desktop::MARKER_Y as i64);
    let m = desktop::MARKER_SIZE as i64;
    eprintln!("marker centre in the screenshot ({cx:.2}, {cy:.2}); clicked ({x}, {y}) -> screen ({sx}, {sy})");
    assert!(
        (mx0..mx0 + m).contains(&sx) && (my0..my0 + m).contains(&sy),
        "({sx}, {sy}) is off the marker at ({mx0}, {my0}), {m} px: {sc}"
    );
    let centre = (mx0 as f64 + m as f64 / 2.0, my0 as f64 + m as f64 / 2.0);
    assert!(
        (sx as f64 - centre.0).abs() <= 1.0 && (sy as f64 - centre.1).abs() <= 1.0,
        "({sx}, {sy}) is not the marker's centre {centre:?}"
    );
    let sc = lab.srv().call_ok(
        "vm_click",
        json!({"name": name, "x": 1567, "y": 881, "scale": scale}),
    );
    assert_eq!(
        (sc["screen_x"].as_i64(), sc["screen_y"].as_i64()),
        (Some(1919), Some(1079)),
        "{sc}"
    );
    // Just off the screenshot: refused, nothing sent.
    let err = lab.srv().call_err(
        "vm_click",
        json!({"name": name, "x": 1568, "y": 10, "scale": scale}),
    );
    assert!(err.contains("1568x882"), "{err}");
    let err = lab.srv().call_err(
        "vm_click",
        json!({"name": name, "x": 5, "y": 5, "scale": 1.2245}),
    );
    assert!(err.contains("scale"), "{err}");
    // Relative motion in screenshot pixels: 100 image pixels are 122 screen pixels.
    let sc = lab.srv().call_ok(
        "vm_mouse_move",
        json!({"name": name, "dx": 100, "dy": -50, "scale": scale, "step": 20}),
    );
    assert_eq!(
        (sc["screen_dx"].as_i64(), sc["screen_dy"].as_i64()),
        (Some(122), Some(-61)),
        "{sc}"
    );
    let evs = finish_recording(&mut lab, name, &id, &dir, 2);
    let (tab, mou) = (&evs[0], &evs[1]);

    // What the guest received: the tablet's absolute positions, as guest pixels.
    let abs = |axis: u16| -> Vec<i32> {
        tab.iter()
            .filter(|e| e.0 == EV_ABS && e.1 == axis)
            .map(|e| e.2)
            .collect()
    };
    let (ax, ay) = (abs(0), abs(1));
    assert_eq!(ax.len(), 2, "two ABS_X positions: {tab:?}");
    assert_eq!(ay.len(), 2, "two ABS_Y positions: {tab:?}");
    let (gx, gy) = (abs_to_pixel(ax[0], 1920), abs_to_pixel(ay[0], 1080));
    eprintln!(
        "the guest's tablet got ({}, {}): guest pixel ({gx:.2}, {gy:.2})",
        ax[0], ay[0]
    );
    assert!(
        (gx - sx as f64).abs() < 0.5 && (gy - sy as f64).abs() < 0.5,
        "the guest got pixel ({gx:.2}, {gy:.2}), the click said ({sx}, {sy})"
    );
    assert!(
        (mx0 as f64..(mx0 + m) as f64).contains(&gx)
            && (my0 as f64..(my0 + m) as f64).contains(&gy),
        "the guest's pointer ({gx:.2}, {gy:.2}) is off the marker"
    );
    assert_eq!(
        (ax[1], ay[1]),
        (32767, 32767),
        "the last pixel is the tablet's far corner"
    );
    let buttons: Vec<i32> = tab
        .iter()
        .filter(|e| e.0 == EV_KEY && e.1 == BTN_LEFT)
        .map(|e| e.2)
        .collect();
    assert_eq!(
        buttons,
        vec![1, 0, 1, 0],
        "two clicks on the tablet: {tab:?}"
    );
    let rel = |code: u16| -> i32 {
        mou.iter()
            .filter(|e| e.0 == EV_REL && e.1 == code)
            .map(|e| e.2)
            .sum()
    };
    assert_eq!(
        (rel(0), rel(1)),
        (122, -61),
        "PS/2 motion in screen pixels: {mou:?}"
    );

    lab.srv()
        .call_ok_within("stop_vm", json!({"name": name, "force": true}), STEP);
}
