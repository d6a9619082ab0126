//! vm_screen_wait end to end against a real QEMU (TCG) and the test guest's VGA text screen
//! (720x400, SeaBIOS's cursor blinking on row 3 in every screendump): a still screen gives changed false at
//! its timeout, a line the guest prints two seconds later is seen and returned once it holds
//! still, a region ignores changes outside it and sees those inside, `since` takes an older
//! screen's hash, and a paused or frozen VM answers at once instead of waiting.
//!
//! The guest prints (a background guest_exec) into the VGA text buffer at rows it chooses,
//! and says on the serial console when it has: that is when the change happened, for
//! measuring the wait's overhead.

use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(150);
const STEP: Duration = Duration::from_secs(60);

/// Waits for the test guest's agent.
fn wait_agent(lab: &mut Lab, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while lab.srv().call_tool("guest_ping", json!({"name": name}))["isError"] != json!(false) {
        assert!(Instant::now() < deadline, "the guest agent never answered");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits for `mark` on the serial console after `offset`; returns when it was seen.
fn wait_mark(lab: &mut Lab, name: &str, mark: &str, offset: u64) -> Instant {
    lab.srv().call_ok_within(
        "vm_serial_wait",
        json!({"name": name, "pattern": mark, "timeout": 30, "offset": offset}),
        STEP,
    );
    Instant::now()
}

/// Starts a print of `text` at `row` (0-based) of the VGA text screen `delay` seconds from now
/// (in the background), written into the text buffer at 0xb8000 through /dev/mem (the test
/// guest has no console on VGA); `mark` goes to the serial console right after it. Returns
/// the serial offset to wait from.
fn print_later(lab: &mut Lab, name: &str, delay: u32, row: u32, text: &str, mark: &str) -> u64 {
    // Each cell: the character, then its attribute (white on black, octal for printf).
    let cells: String = text.chars().map(|c| format!("{c}\\017")).collect();
    let at = 0xb8000 + row * 80 * 2;
    let write =
        format!("printf '{cells}' | dd of=/dev/mem bs=1 seek={at} conv=notrunc 2>/dev/null");
    let offset = lab.srv().serial_offset(name);
    let script = format!("(sleep {delay}; {write}; echo {mark} > /dev/ttyS0) >/dev/null 2>&1 &");
    lab.srv().call_ok_within(
        "guest_exec",
        json!({"name": name, "command": "sh", "args": ["-c", script], "timeout": 30}),
        STEP,
    );
    offset
}

fn screen_wait(lab: &mut Lab, args: Value, within: Duration) -> Value {
    let r = lab.srv().call_tool_within("vm_screen_wait", args, within);
    let sc = tool_ok(&r, "vm_screen_wait");
    let image = r["content"]
        .as_array()
        .and_then(|c| c.iter().find(|b| b["type"] == "image"));
    assert!(image.is_some(), "vm_screen_wait returns the screen: {r}");
    assert_eq!(sc["hash"].as_str().map(str::len), Some(16), "{sc}");
    sc
}

#[test]
fn screen_wait_sees_changes_settles_on_a_blinking_console_and_never_hangs() {
    let guest = test_guest();
    let mut lab = Lab::new("swait");
    let name = "swait";
    let r = lab.srv().call_tool_within(
        "launch_vm",
        json!({
            "name": name, "memory_mb": 256, "cpus": 1, "no_net": true,
            "kernel": guest.kernel, "initrd": guest.initrd,
            "append": guest.append,
        }),
        LONG,
    );
    lab.track(&r);
    let launched = tool_ok(&r, "launch_vm");
    wait_agent(&mut lab, name);
    std::thread::sleep(Duration::from_millis(500));
    let shot = lab.srv().call_ok("vm_screenshot", json!({"name": name}));
    let h0 = shot["hash"]
        .as_str()
        .expect("vm_screenshot reports hash")
        .to_string();
    assert_eq!(h0.len(), 16, "{shot}");

    // Nothing happens: changed false at the timeout, though the cursor blinks all along.
    let t = Instant::now();
    let sc = screen_wait(
        &mut lab,
        json!({"name": name, "stable_ms": 300, "timeout_s": 2}),
        STEP,
    );
    let idle_ms = t.elapsed().as_millis();
    assert_eq!(sc["changed"], false, "{sc}");
    let reason = sc["reason"].as_str().unwrap_or("");
    assert!(reason.contains("did not change"), "{sc}");
    assert!((1900..6000).contains(&idle_ms), "{idle_ms} ms: {sc}");
    eprintln!("still screen: {} polls in {idle_ms} ms", sc["polls"]);

    // A line printed 2 s later: seen, and returned once it held still for 500 ms.
    let offset = print_later(&mut lab, name, 2, 19, "SCREEN-WAIT-ONE", "PRINTED-1");
    let t = Instant::now();
    let id = lab.srv().start_call(
        "vm_screen_wait",
        json!({"name": name, "stable_ms": 500, "timeout_s": 30}),
    );
    let printed = wait_mark(&mut lab, name, "PRINTED-1", offset);
    let r = lab.srv().finish_call(&id, STEP);
    let done = Instant::now();
    let sc = tool_ok(&r, "vm_screen_wait (a line printed later)");

    assert_eq!(
        (sc["changed"].clone(), sc["stable"].clone()),
        (json!(true), json!(true)),
        "{sc}"
    );
    assert!(sc.get("reason").is_none(), "{sc}");
    let h1 = sc["hash"].as_str().unwrap_or("").to_string();
    assert_ne!(h1, h0, "{sc}");
    let waited = sc["waited_ms"].as_u64().unwrap_or(0);
    assert!(waited >= 1500, "returned before the print: {sc}");
    let after_print = done.duration_since(printed).as_millis() as i64;
    eprintln!(
        "change seen: waited {waited} ms ({} polls) for a print at {} ms; returned {after_print} \
         ms after the guest said it printed (stable_ms 500: overhead ~{} ms)",
        sc["polls"],
        printed.duration_since(t).as_millis(),
        after_print - 500
    );
    assert!(
        after_print >= 400,
        "returned before the screen held still: {after_print} ms"
    );

    // A region (rows 0-9, the blinking cursor in it) ignores a print at row 21, and sees one
    // at row 5.
    let top = json!({"x": 0, "y": 0, "width": 720, "height": 160});
    let offset = print_later(&mut lab, name, 1, 21, "SCREEN-WAIT-TWO", "PRINTED-2");
    let sc = screen_wait(
        &mut lab,
        json!({"name": name, "stable_ms": 300, "timeout_s": 4, "region": top}),
        STEP,
    );
    assert_eq!(sc["changed"], false, "a change outside the region: {sc}");
    wait_mark(&mut lab, name, "PRINTED-2", offset);
    // `since` an older screen (h1, before row 21 was printed): changed at once.
    let t = Instant::now();
    let sc = screen_wait(
        &mut lab,
        json!({"name": name, "stable_ms": 300, "timeout_s": 20, "since": h1}),
        STEP,
    );
    assert_eq!(sc["changed"], true, "{sc}");
    assert!(t.elapsed() < Duration::from_secs(10), "{sc}");
    print_later(&mut lab, name, 1, 5, "SCREEN-WAIT-THREE", "PRINTED-3");
    let sc = screen_wait(
        &mut lab,
        json!({"name": name, "stable_ms": 300, "timeout_s": 30, "region": top}),
        STEP,
    );
    assert_eq!(sc["changed"], true, "a change inside the region: {sc}");

    // Paused: an error at once, not a wait.
    lab.srv().call_ok("pause_vm", json!({"name": name}));
    let t = Instant::now();
    let err = lab.srv().call_err_within(
        "vm_screen_wait",
        json!({"name": name, "timeout_s": 60}),
        STEP,
    );
    assert!(err.contains("paused") && err.contains("resume"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    lab.srv().call_ok("resume_vm", json!({"name": name}));

    // A frozen QEMU (SIGSTOP): an error within the timeout, naming the monitor.
    let pid = launched["pid"].as_i64().expect("launch_vm reports pid") as i32;
    // SAFETY: signals to the QEMU this test launched.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let t = Instant::now();
    let r = lab.srv().call_tool_within(
        "vm_screen_wait",
        json!({"name": name, "timeout_s": 3}),
        STEP,
    );
    let took = t.elapsed();
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let err = tool_err(&r, "vm_screen_wait on a frozen QEMU");
    assert!(err.contains("did not answer"), "{err}");
    assert!(took < Duration::from_secs(8), "{took:?}");

    lab.srv()
        .call_ok_within("stop_vm", json!({"name": name, "force": true}), STEP);
}
