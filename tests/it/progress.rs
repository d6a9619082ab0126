//! What long calls say while they run, as a client that records every notification sees it:
//! a graceful stop_vm of a guest that ignores ACPI gets progress at least every 10 s and never
//! more than twice a second, and a 10 s vm_serial_wait sends at most 20 notifications.
//! (Hosts such as Claude Code kill a call that stays silent past their idle watchdog; a flood
//! of notifications helps nobody.)

use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{json, Value};

/// Sends a tools/call with a progress token; returns its response and every progress
/// notification with the time it arrived, measured from the request.
fn call_recording(
    s: &mut Server,
    tool: &str,
    args: Value,
    bound: Duration,
) -> (Value, Vec<(Duration, Value)>) {
    let id = json!(s.fresh_id());
    let params = json!({"name": tool, "arguments": args, "_meta": {"progressToken": "beat"}});
    s.send_request(&id, "tools/call", params);
    let t0 = Instant::now();
    let mut seen = Vec::new();
    loop {
        let left = bound.saturating_sub(t0.elapsed());
        let msg = s
            .recv(left)
            .unwrap_or_else(|| panic!("{tool} gave no response within {bound:?}"));
        if msg.get("id") == Some(&id) && msg.get("method").is_none() {
            return (msg, seen);
        }
        if msg["method"] == "notifications/progress" {
            assert_eq!(msg["params"]["progressToken"], "beat", "{msg}");
            seen.push((t0.elapsed(), msg["params"].clone()));
        }
    }
}

/// Checks the cadence of `seen` over a call that took `took`: no gap over 10 s (from the
/// request to the first notification, between them, and to the response), no two within
/// 450 ms and no three within one second (the rule: at most two in any second, as a client
/// reads them), values strictly increasing, and every notification saying what it waits for.
fn assert_cadence(seen: &[(Duration, Value)], took: Duration) {
    let mut last = Duration::ZERO;
    let mut value = f64::MIN;
    for (at, p) in seen {
        assert!(
            *at - last <= Duration::from_secs(10),
            "silent from {last:?} to {at:?}: {seen:?}"
        );
        if last > Duration::ZERO {
            assert!(
                *at - last >= Duration::from_millis(450),
                "two notifications {last:?} and {at:?} apart: {seen:?}"
            );
        }
        let v = p["progress"].as_f64().unwrap();
        assert!(v > value, "progress went from {value} to {v}: {seen:?}");
        assert!(p["message"].as_str().is_some_and(|m| !m.is_empty()), "{p}");
        value = v;
        last = *at;
    }
    assert!(
        took - last <= Duration::from_secs(10),
        "silent for the last {:?}",
        took - last
    );
    for w in seen.windows(3) {
        assert!(
            w[2].0 - w[0].0 > Duration::from_secs(1),
            "three notifications within one second ({:?}, {:?}, {:?}): {seen:?}",
            w[0].0,
            w[1].0,
            w[2].0
        );
    }
}

#[test]
fn a_long_graceful_stop_sends_a_heartbeat_and_no_flood() {
    let mut lab = Lab::new("beat");
    let g = test_guest();
    let l = lab.launch(
        json!({"name": "deaf", "kernel": g.kernel, "initrd": g.initrd, "append": g.append,
               "memory_mb": 128, "cpus": 1}),
        Duration::from_secs(60),
    );
    assert_eq!(l["status"], "running", "{l}");
    let s = lab.srv();
    let deadline = Instant::now() + Duration::from_secs(120);
    while s
        .try_call_ok_within(
            "guest_ping",
            json!({"name": "deaf"}),
            Duration::from_secs(10),
        )
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "the test guest's agent never answered"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // A progress token costs a fast call nothing: no notification, and the response is not
    // held for the heartbeat's half-second gap (Claude Code sends a token on every call).
    for (tool, args) in [
        (
            "guest_exec",
            json!({"name": "deaf", "command": "/bin/true"}),
        ),
        (
            "guest_file_read",
            json!({"name": "deaf", "path": "/proc/version"}),
        ),
        ("vm_info", json!({"name": "deaf"})),
        ("vm_screenshot", json!({"name": "deaf"})),
    ] {
        let mut took = Vec::new();
        for _ in 0..9 {
            let (r, t, progress) = s
                .try_call_with_token(tool, args.clone(), Duration::from_secs(30))
                .unwrap();
            assert_ne!(r["isError"], json!(true), "{tool}: {r}");
            assert!(
                progress.is_empty() || t >= Duration::from_millis(500),
                "{tool} took {t:?} and still sent progress: {progress:?}"
            );
            took.push(t);
        }
        took.sort();
        eprintln!("{tool} with a progress token: median {:?}", took[4]);
        assert!(
            took[4] < Duration::from_millis(450),
            "{tool} with a progress token: median {:?} (a response held for the gap)",
            took[4]
        );
    }

    // The guest ignores ACPI from now on: stop_vm waits out its whole timeout.
    let k = s.call_ok_within(
        "guest_exec",
        json!({"name": "deaf", "command": "/bin/sh", "args": ["-c", "killall acpid; sleep 1"]}),
        Duration::from_secs(60),
    );
    assert_eq!(k["exitcode"], json!(0), "{k}");
    let t0 = Instant::now();
    let (resp, seen) = call_recording(
        s,
        "stop_vm",
        json!({"name": "deaf", "timeout": 20}),
        Duration::from_secs(90),
    );
    let took = t0.elapsed();
    assert_eq!(
        resp["result"]["isError"],
        json!(true),
        "the guest powered off anyway: {resp}"
    );
    assert!(took >= Duration::from_secs(20), "{took:?}");
    eprintln!(
        "stop_vm of a deaf guest: {} notifications over {took:?}",
        seen.len()
    );
    assert!(!seen.is_empty());
    assert_cadence(&seen, took);
    assert!(
        seen.len() as f64 <= took.as_secs_f64() * 2.0 + 1.0,
        "{} notifications in {took:?}",
        seen.len()
    );

    // vm_serial_wait for 10 s on text that never comes: at most 20 notifications.
    let t0 = Instant::now();
    let (resp, seen) = call_recording(
        s,
        "vm_serial_wait",
        json!({"name": "deaf", "pattern": "text-that-never-comes", "timeout": 10}),
        Duration::from_secs(60),
    );
    let took = t0.elapsed();
    eprintln!(
        "vm_serial_wait 10 s: {} notifications over {took:?}: {resp}",
        seen.len()
    );
    assert!(seen.len() <= 20, "{} notifications: {seen:?}", seen.len());
    assert_cadence(&seen, took);
    let f = s.call_ok_within(
        "stop_vm",
        json!({"name": "deaf", "force": true}),
        Duration::from_secs(30),
    );
    assert_eq!(f["status"], "stopped", "{f}");
}
