//! Arm guests, end to end over MCP: `launch_vm {arch: "aarch64"}` on QEMU's `virt` board under
//! TCG with the aarch64 test guest (tests/guest/build_guest.py --arch aarch64: Debian's arm64
//! kernel, busybox and qemu-guest-agent in a self-made initramfs).
//!
//! What the issue "Arm guests and Arm hosts" asks of such a guest: the agent answers and runs
//! programs, files travel both ways byte for byte, a live snapshot brings the guest's state
//! back, the screen (virtio-gpu: the virt board has no VGA) shows what the guest draws, text
//! typed on the USB keyboard arrives exactly, a click lands on the tablet, a sandbox and a
//! template clone become ready, UEFI firmware boots the kernel, and `firmware: "bios"` without
//! a kernel is refused before anything starts.
//!
//! Arm guests are emulated instruction by instruction on an x86 host (about 6 s from QEMU's
//! start to the agent here), so every test takes all of this binary's guest slots: one guest
//! at a time, one vCPU each. Every QEMU is SIGKILLed on the way out, pass or fail.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::evdev::*;
use common::*;
use mcqemu::b64;
use serde_json::{json, Map, Value};

/// Bound for calls that boot or wait on a guest, or move a VM's whole RAM.
const SLOW: Duration = Duration::from_secs(240);
/// Bound for one ordinary step.
const STEP: Duration = Duration::from_secs(60);
/// How long a launched guest may take until its agent answers.
const AGENT_WAIT: Duration = Duration::from_secs(120);
/// The guest's serial console on the virt board (a PL011).
const SERIAL: &str = "/dev/ttyAMA0";

// ---------------------------------------------------------------------------------------------
// Fixtures

/// A lab holding every guest slot of this binary (so one Arm guest runs at a time) and a
/// server of its own. The guest is built first, never while holding the slots.
fn arm_lab(label: &str) -> (Lab, Server) {
    test_guest_arm64();
    let lab = Lab::without_server(label, QEMU_SLOTS);
    let server = lab.spawn_server();
    (lab, server)
}

/// launch_vm-style arguments for the aarch64 test guest: 256 MiB, one vCPU, the kernel booted
/// directly, plus `extra` (which may override any of them).
fn arm_args(extra: Value) -> Map<String, Value> {
    let g = test_guest_arm64();
    let mut m = Map::new();
    m.insert("arch".into(), json!("aarch64"));
    m.insert("kernel".into(), json!(g.kernel));
    m.insert("initrd".into(), json!(g.initrd));
    m.insert("append".into(), json!(g.append));
    m.insert("memory_mb".into(), json!(256));
    m.insert("cpus".into(), json!(1));
    for (k, v) in extra.as_object().expect("extra is an object") {
        m.insert(k.clone(), v.clone());
    }
    m
}

/// Polls guest_ping until the agent answers; returns the time since `since`.
fn wait_agent(s: &mut Server, name: &str, since: Instant) -> Duration {
    let deadline = Instant::now() + AGENT_WAIT;
    loop {
        let r = s.call_tool_within("guest_ping", json!({"name": name}), STEP);
        if r["isError"] == json!(false) {
            return since.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "the agent of {name} did not answer within {AGENT_WAIT:?}: {}",
            r["content"]
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// launch_vm of the aarch64 test guest named `name` with `extra` arguments, tracked for
/// killing; waits for its agent. Returns the launch result and the time to the agent.
fn boot(lab: &Lab, s: &mut Server, name: &str, extra: Value) -> (Value, Duration) {
    let mut args = arm_args(extra);
    args.insert("name".into(), json!(name));
    let t = Instant::now();
    let launched = lab.launch_on(s, Value::Object(args), SLOW);
    let ready = wait_agent(s, name, t);
    eprintln!("{name}: launch_vm to agent in {ready:?}");
    (launched, ready)
}

/// `sh -c SCRIPT` in the guest; must exit 0; returns stdout.
fn sh(s: &mut Server, name: &str, script: &str) -> String {
    let r = s.call_ok_within(
        "guest_exec",
        json!({"name": name, "command": "sh", "args": ["-c", script], "timeout": 60}),
        SLOW,
    );
    assert_eq!(r["exitcode"], json!(0), "sh -c {script:?} failed: {r}");
    r["stdout"].as_str().expect("stdout").to_string()
}

fn write_text(s: &mut Server, name: &str, path: &str, text: &str) {
    let r = s.call_ok(
        "guest_file_write",
        json!({"name": name, "path": path, "content": text}),
    );
    assert_eq!(r["bytes_written"], json!(text.len()), "{r}");
}

fn read_text(s: &mut Server, name: &str, path: &str) -> String {
    let r = s.call_ok("guest_file_read", json!({"name": name, "path": path}));
    assert_eq!(r["truncated"], json!(false), "{r}");
    r["content"].as_str().expect("content").to_string()
}

/// A fresh qcow2 image of `size` made with qemu-img directly.
fn qcow2(path: &Path, size: &str) {
    let (ok, out, err) = run_tool(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", path.to_str().unwrap(), size],
    );
    assert!(ok, "qemu-img create failed: {out}{err}");
}

/// QEMU's own argv, read from /proc.
fn qemu_argv(launched: &Value) -> Vec<String> {
    let pid = launched["pid"].as_i64().expect("pid") as i32;
    cmdline(pid).unwrap_or_else(|| panic!("QEMU {pid} is gone"))
}

/// The value following `opt` in an argv.
fn opt_value<'a>(argv: &'a [String], opt: &str) -> Option<&'a str> {
    argv.iter()
        .position(|a| a == opt)
        .and_then(|i| argv.get(i + 1))
        .map(String::as_str)
}

fn stop(s: &mut Server, name: &str) {
    let r = s.call_ok_within("stop_vm", json!({"name": name, "force": true}), STEP);
    assert_eq!(r["status"], json!("stopped"), "{r}");
}

// ---------------------------------------------------------------------------------------------
// Refused before anything starts

/// The virt board has no BIOS: `firmware: "bios"` without a kernel would run nothing, so it is
/// a clear error, and no QEMU, record or socket is left.
#[test]
fn aarch64_bios_without_kernel_is_refused_with_nothing_started() {
    let lab = Lab::without_server("a64bios", 0);
    let mut s = lab.spawn_server();
    let name = "nobios";
    let r = s.call_tool_within(
        "launch_vm",
        json!({"name": name, "arch": "aarch64", "firmware": "bios", "memory_mb": 128,
               "cpus": 1, "no_net": true}),
        STEP,
    );
    lab.track(&r);
    let err = tool_err(&r, "launch_vm aarch64 firmware=bios without a kernel");
    let lower = err.to_lowercase();
    assert!(
        lower.contains("bios") && lower.contains("kernel") && lower.contains("uefi"),
        "the error names the BIOS, the kernel and the way out (uefi): {err}"
    );
    let l = s.call_ok("list_vms", json!({}));
    assert!(
        !l["vms"]
            .as_array()
            .expect("vms")
            .iter()
            .any(|v| v["name"] == name),
        "a refused launch left a record: {l}"
    );
    let left = qemu_pids_mentioning(lab.dir.path());
    assert!(left.is_empty(), "a refused launch started QEMU {left:?}");
    assert!(
        !lab.runtime().join(name).exists(),
        "a refused launch left its runtime folder"
    );
    assert!(
        !lab.vm_dir(name).join("uefi-vars.fd").exists(),
        "a refused launch copied a UEFI variable store"
    );
}

// ---------------------------------------------------------------------------------------------
// The agent, files and a live snapshot

/// launch_vm arch aarch64 with a kernel: the QEMU is an aarch64 `virt` machine with `-cpu
/// max` under TCG; the agent answers, guest_exec runs programs on an aarch64 kernel, text and
/// a binary file make the round trip byte for byte, and a live snapshot restores the guest's
/// memory and disk.
#[test]
fn aarch64_agent_files_and_live_snapshot() {
    let (lab, mut s) = arm_lab("a64agent");
    let vm = "arm";
    let disk = s.tmp.join("disk.qcow2");
    qcow2(&disk, "16M");
    let (launched, _) = boot(
        &lab,
        &mut s,
        vm,
        json!({"disks": [disk.to_str().unwrap()], "no_net": true}),
    );
    assert_eq!(launched["arch"], json!("aarch64"), "{launched}");
    assert!(
        launched["machine"]
            .as_str()
            .is_some_and(|m| m.starts_with("virt")),
        "{launched}"
    );
    let argv = qemu_argv(&launched);
    assert!(
        argv[0].ends_with("qemu-system-aarch64"),
        "QEMU binary: {argv:?}"
    );
    // `max` (its options may follow: pauth-impdef=on makes TCG much faster on QEMU 7.2).
    assert!(
        opt_value(&argv, "-cpu").is_some_and(|c| c == "max" || c.starts_with("max,")),
        "-cpu max under TCG: {argv:?}"
    );
    let info = s.call_ok("vm_info", json!({"name": vm}));
    assert_eq!(info["status"], json!("running"), "{info}");
    assert_eq!(info["record"]["arch"], json!("aarch64"), "{info}");

    // The agent and programs.
    let p = s.call_ok("guest_ping", json!({"name": vm}));
    assert_eq!(p["ok"], json!(true), "{p}");
    assert_eq!(sh(&mut s, vm, "uname -m"), "aarch64\n");
    let r = s.call_ok_within(
        "guest_exec",
        json!({"name": vm, "command": "sh", "args": ["-c", "echo out; echo err >&2; exit 3"],
               "timeout": 30}),
        SLOW,
    );
    assert_eq!(r["exitcode"], json!(3), "{r}");
    assert_eq!(r["stdout"], json!("out\n"), "{r}");
    assert_eq!(r["stderr"], json!("err\n"), "{r}");

    // Files: text (with an append) and 1 MiB of binary, byte-exact both ways.
    let text = "hello from the x86 host\nline two ✓\n";
    write_text(&mut s, vm, "/tmp/hello.txt", text);
    assert_eq!(read_text(&mut s, vm, "/tmp/hello.txt"), text);
    let r = s.call_ok(
        "guest_file_write",
        json!({"name": vm, "path": "/tmp/hello.txt", "content": "appended\n", "append": true}),
    );
    assert_eq!(r["bytes_written"], json!(9), "{r}");
    assert_eq!(
        read_text(&mut s, vm, "/tmp/hello.txt"),
        format!("{text}appended\n")
    );
    let data = pseudo_random(1 << 20, 0xa64_0001);
    let t = Instant::now();
    let w = s.call_ok_within(
        "guest_file_write",
        json!({"name": vm, "path": "/tmp/blob.bin", "content": b64::encode(&data),
               "encoding": "base64"}),
        SLOW,
    );
    assert_eq!(w["bytes_written"], json!(data.len()), "{w}");
    let sum = sh(&mut s, vm, "sha256sum /tmp/blob.bin");
    assert!(sum.starts_with(&sha256_hex(&data)), "{sum}");
    let r = s.call_ok_within(
        "guest_file_read",
        json!({"name": vm, "path": "/tmp/blob.bin", "max_bytes": 2 << 20, "encoding": "base64"}),
        SLOW,
    );
    let back = b64::decode(r["content"].as_str().expect("content")).expect("base64");
    assert!(back == data, "the 1 MiB file came back different");
    eprintln!("1 MiB file round trip: {:?}", t.elapsed());

    // A live snapshot: a tmpfs file (guest RAM) and the first sector of the virtio disk.
    write_text(&mut s, vm, "/tmp/state.txt", "before the snapshot\n");
    let fill = |ch: char| {
        format!(
            "head -c 512 /dev/zero | tr '\\000' '{ch}' | dd of=/dev/vda bs=512 count=1 \
             conv=fsync 2>/dev/null"
        )
    };
    let sector = "echo 3 > /proc/sys/vm/drop_caches; head -c 512 /dev/vda | tr -d B | wc -c";
    sh(&mut s, vm, &fill('B'));
    assert_eq!(sh(&mut s, vm, sector).trim(), "0", "the sector is all B");
    let t = Instant::now();
    let c = s.call_ok_within("vm_snapshot_create", json!({"name": vm, "tag": "s1"}), SLOW);
    eprintln!("vm_snapshot_create took {:?}", t.elapsed());
    assert_eq!(c["action"], json!("created"), "{c}");
    assert_eq!(c["status"], json!("running"), "{c}");
    write_text(&mut s, vm, "/tmp/state.txt", "after the snapshot\n");
    sh(&mut s, vm, &fill('C'));
    assert_eq!(sh(&mut s, vm, sector).trim(), "512", "the sector is all C");
    let t = Instant::now();
    let r = s.call_ok_within(
        "vm_snapshot_restore",
        json!({"name": vm, "tag": "s1"}),
        SLOW,
    );
    eprintln!("vm_snapshot_restore took {:?}", t.elapsed());
    assert_eq!(r["action"], json!("restored"), "{r}");
    assert_eq!(r["status"], json!("running"), "{r}");
    wait_agent(&mut s, vm, Instant::now());
    assert_eq!(
        read_text(&mut s, vm, "/tmp/state.txt"),
        "before the snapshot\n"
    );
    assert_eq!(
        sh(&mut s, vm, sector).trim(),
        "0",
        "the sector is all B again"
    );
    stop(&mut s, vm);
}

// ---------------------------------------------------------------------------------------------
// Screen, keyboard and tablet

/// Decodes a PNG fully: (width, height, bytes per pixel, pixels).
fn decode_png(data: &[u8]) -> (u32, u32, usize, Vec<u8>) {
    let dec = png::Decoder::new(std::io::Cursor::new(data));
    let mut reader = dec.read_info().expect("PNG header decodes");
    let mut buf = vec![
        0;
        reader
            .output_buffer_size()
            .expect("PNG buffer size fits memory")
    ];
    let info = reader.next_frame(&mut buf).expect("PNG image data decodes");
    buf.truncate(info.buffer_size());
    let bpp = info.color_type.samples() * usize::from(info.bit_depth as u8).div_ceil(8);
    (info.width, info.height, bpp, buf)
}

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

/// The serial log's current size, for waiting on output written from now on.
fn serial_offset(s: &mut Server, name: &str) -> u64 {
    s.call_ok("vm_serial_read", json!({"name": name, "tail_lines": 1}))["offset"]
        .as_u64()
        .expect("serial offset")
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
    let offset = serial_offset(s, name);
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
    let offset = serial_offset(s, vm);
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

// ---------------------------------------------------------------------------------------------
// UEFI

/// The firmware the virt board boots by default starts the kernel (its EFI stub) itself: the
/// guest sees EFI, and its agent answers.
#[test]
fn aarch64_uefi_firmware_boots_the_kernel() {
    let (lab, mut s) = arm_lab("a64uefi");
    let vm = "armefi";
    let (launched, ready) = boot(&lab, &mut s, vm, json!({"firmware": "uefi"}));
    let argv = qemu_argv(&launched);
    assert!(
        argv.iter().any(|a| a.contains("if=pflash")),
        "UEFI firmware on pflash: {argv:?}"
    );
    assert!(
        lab.vm_dir(vm).join("uefi-vars.fd").is_file(),
        "the VM's own variable store"
    );
    let efi = sh(
        &mut s,
        vm,
        "[ -d /sys/firmware/efi ] && echo efi || echo none",
    );
    assert_eq!(efi, "efi\n", "the kernel was started by UEFI firmware");
    assert_eq!(sh(&mut s, vm, "uname -m"), "aarch64\n");
    eprintln!("UEFI boot to agent: {ready:?}");
    stop(&mut s, vm);
}

// ---------------------------------------------------------------------------------------------
// Sandboxes and templates

const MARKER: &str = "made-by-the-arm64-template-setup";

/// A sandbox of the aarch64 guest becomes ready and goes away cleanly; a template saved from a
/// booted aarch64 guest clones into a sandbox that is ready without booting and has the
/// template's state.
#[test]
fn aarch64_sandbox_and_template_clone() {
    let (lab, mut s) = arm_lab("a64tpl");

    // A sandbox on a small base image.
    let base = s.tmp.join("base.qcow2");
    qcow2(&base, "16M");
    let mut args = arm_args(json!({"wait_agent_s": AGENT_WAIT.as_secs()}));
    args.insert("base_image".into(), json!(base.to_str().unwrap()));
    args.insert("name".into(), json!("armsb"));
    let t = Instant::now();
    let r = s.call_tool_within("sandbox_vm", Value::Object(args), SLOW);
    lab.track(&r);
    let sb = tool_ok(&r, "sandbox_vm aarch64");
    assert_eq!(sb["agent_ready"], json!(true), "agent not ready: {sb}");
    eprintln!("aarch64 sandbox ready in {:?}", t.elapsed());
    assert_eq!(sh(&mut s, "armsb", "uname -m"), "aarch64\n");
    let d = s.call_ok_within("sandbox_destroy", json!({"name": "armsb"}), STEP);
    assert_eq!(d["destroyed"], json!(true), "{d}");

    // A template and a clone of it.
    let mut args = arm_args(json!({
        "wait_agent_s": AGENT_WAIT.as_secs(),
        "setup": [{"command": "/bin/sh", "args": ["-c", format!("echo {MARKER} > /root/marker")],
                   "timeout": 60}],
    }));
    args.insert("name".into(), json!("armtpl"));
    let t = Instant::now();
    let tpl = s.call_ok_within("template_create", Value::Object(args), SLOW);
    eprintln!(
        "aarch64 template_create: {:?}, save_ms {}",
        t.elapsed(),
        tpl["save_ms"]
    );
    assert_eq!(tpl["name"], json!("armtpl"), "{tpl}");
    let t = Instant::now();
    let r = s.call_tool_within(
        "sandbox_vm",
        json!({"template": "armtpl", "name": "armclone"}),
        SLOW,
    );
    lab.track(&r);
    let c = tool_ok(&r, "sandbox_vm from the aarch64 template");
    assert_eq!(c["agent_ready"], json!(true), "clone not ready: {c}");
    eprintln!(
        "aarch64 clone ready in {:?} (ready_ms {})",
        t.elapsed(),
        c["ready_ms"]
    );
    assert_eq!(
        sh(&mut s, "armclone", "cat /root/marker"),
        format!("{MARKER}\n")
    );
    assert_eq!(sh(&mut s, "armclone", "uname -m"), "aarch64\n");
    let d = s.call_ok_within("sandbox_destroy", json!({"name": "armclone"}), STEP);
    assert_eq!(d["destroyed"], json!(true), "{d}");
    let del = s.call_ok_within("template_delete", json!({"name": "armtpl"}), STEP);
    assert!(del.is_object(), "{del}");
}

/// sandbox_vm from template `tpl` named `name`, ready; then the first 32 bytes its
/// /dev/urandom gives, in hex, read at once.
fn clone_and_read_urandom(lab: &Lab, s: &mut Server, tpl: &str, name: &str) -> String {
    let t = Instant::now();
    let r = s.call_tool_within("sandbox_vm", json!({"template": tpl, "name": name}), SLOW);
    lab.track(&r);
    let c = tool_ok(&r, "sandbox_vm from the aarch64 template");
    assert_eq!(c["agent_ready"], json!(true), "clone not ready: {c}");
    let bytes = sh(s, name, "head -c 32 /dev/urandom | od -An -tx1");
    eprintln!(
        "{name}: ready in {:?} (ready_ms {}, steps {}), uptime {}, urandom {}",
        t.elapsed(),
        c["ready_ms"],
        c["steps_ms"],
        sh(s, name, "cat /proc/uptime").trim(),
        bytes.split_whitespace().collect::<String>()
    );
    bytes.split_whitespace().collect()
}

/// Issue 25: the virt board has no vmgenid, so nothing tells a clone's kernel it was forked;
/// two clones of one aarch64 template must still read different bytes from /dev/urandom the
/// moment they are handed out (each is reseeded from the host first).
#[test]
fn aarch64_clones_of_one_template_read_different_random_bytes() {
    let (lab, mut s) = arm_lab("a64rng");
    // The template's CRNG is used just before it is saved, so its state is fresh then: a clone
    // resumed from it does not reach the kernel's own reseed interval before its first read.
    let mut args = arm_args(json!({
        "wait_agent_s": AGENT_WAIT.as_secs(),
        "setup": [{"command": "/bin/sh", "args": ["-c", "head -c 64 /dev/urandom >/dev/null; cat /proc/uptime"],
                   "timeout": 60}],
    }));
    args.insert("name".into(), json!("rngtpl"));
    s.call_ok_within("template_create", Value::Object(args), SLOW);
    let a = clone_and_read_urandom(&lab, &mut s, "rngtpl", "rng1");
    let d = s.call_ok_within("sandbox_destroy", json!({"name": "rng1"}), STEP);
    assert_eq!(d["destroyed"], json!(true), "{d}");
    let b = clone_and_read_urandom(&lab, &mut s, "rngtpl", "rng2");
    assert_eq!((a.len(), b.len()), (64, 64), "32 bytes each: {a} / {b}");
    assert_ne!(
        a, b,
        "two clones of one template read the same /dev/urandom bytes"
    );
    let d = s.call_ok_within("sandbox_destroy", json!({"name": "rng2"}), STEP);
    assert_eq!(d["destroyed"], json!(true), "{d}");
    s.call_ok_within("template_delete", json!({"name": "rngtpl"}), STEP);
}
