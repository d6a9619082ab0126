//! Watching the test guest from inside: guest_exec, and readers of /dev/tty1 and of input
//! devices that say on the serial console when they listen (agent calls would queue behind a
//! reader's own guest_exec).

use std::time::Duration;

use super::STEP;

use crate::common::evdev::*;
use crate::common::*;
use serde_json::{json, Value};

/// A guest_exec that must succeed; returns its structured result.
pub fn exec(lab: &mut Lab, name: &str, script: &str, timeout: u64) -> Value {
    let r = lab.srv().call_keeping(
        "guest_exec",
        json!({"name": name, "command": "sh", "args": ["-c", script], "timeout": timeout}),
        Duration::from_secs(timeout + 30),
    );
    tool_ok(&r, &format!("guest_exec {script}"))
}

/// A unique tag for one reader: its markers and files, so nothing left by an earlier reader
/// is mistaken for this one's.
pub fn reader_tag() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!("mcq-rd-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// Waits until a reader reports on the serial console that it is listening. (The serial
/// console, not the agent: agent calls queue behind the reader's own guest_exec.)
pub fn wait_ready(lab: &mut Lab, name: &str, tag: &str, offset: u64) {
    let r = lab.srv().call_keeping(
        "vm_serial_wait",
        json!({"name": name, "pattern": format!("READY-{tag}"), "timeout": 60, "offset": offset}),
        Duration::from_secs(90),
    );
    tool_ok(&r, "reader ready");
}

/// Starts a guest_exec that opens /dev/tty1 (the console the keyboard types into), says so,
/// and prints the first line read from it. Returns the call id once the reader is listening.
pub fn start_tty_reader(lab: &mut Lab, name: &str) -> Value {
    let tag = reader_tag();
    let offset = lab.srv().serial_offset(name);
    let script = format!(
        "exec 3</dev/tty1; echo READY-{tag} > /dev/ttyS0; IFS= read -r line <&3; printf %s \"$line\""
    );
    let id = lab.srv().start_call(
        "guest_exec",
        json!({"name": name, "command": "sh", "args": ["-c", script], "timeout": 90}),
    );
    wait_ready(lab, name, &tag, offset);
    id
}

/// The line the reader started by [`start_tty_reader`] received.
pub fn finish_tty_reader(lab: &mut Lab, id: &Value) -> String {
    let r = lab.srv().finish_call(id, Duration::from_secs(120));
    let sc = tool_ok(&r, "tty reader");
    assert_eq!(sc["exitcode"], 0, "tty reader: {sc}");
    sc["stdout"].as_str().expect("stdout").to_string()
}

/// A guest_exec recording input devices, from [`start_event_reader`].
pub struct EventReader {
    id: Value,
    dir: String,
    devices: usize,
}

/// Starts recording `devices` (/dev/input/eventN) in the guest; returns once every device is
/// open, so nothing sent afterwards can be missed. The recording runs until
/// [`finish_event_reader`] (at most 60 s).
pub fn start_event_reader(lab: &mut Lab, name: &str, devices: &[&str]) -> EventReader {
    let tag = reader_tag();
    let offset = lab.srv().serial_offset(name);
    let d = format!("/tmp/{tag}");
    let mut script = format!("mkdir -p {d}; ");
    let mut opened = Vec::new();
    let mut pids = Vec::new();
    for (k, dev) in devices.iter().enumerate() {
        // The subshell opens the device before saying so, then becomes cat.
        script.push_str(&format!(
            "( exec 3<{dev}; : > {d}/open{k}; exec cat <&3 ) > {d}/ev{k} & p{k}=$!; "
        ));
        opened.push(format!("[ -e {d}/open{k} ]"));
        pids.push(format!("$p{k}"));
    }
    let ks: Vec<String> = (0..devices.len()).map(|k| k.to_string()).collect();
    script.push_str(&format!(
        "i=0; until {}; do [ $i -lt 600 ] || exit 3; sleep 0.05; i=$((i+1)); done; \
         echo READY-{tag} > /dev/ttyS0; \
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
    wait_ready(lab, name, &tag, offset);
    EventReader {
        id,
        dir: d,
        devices: devices.len(),
    }
}

/// Ends the recording (one more second for late events) and returns each device's events.
/// The end is signalled through the serial shell that [`serial_console`] activated: agent
/// calls would queue behind the reader's own guest_exec.
pub fn finish_event_reader(lab: &mut Lab, name: &str, reader: EventReader) -> Vec<Vec<Ev>> {
    let r = lab.srv().call_keeping(
        "vm_serial_write",
        json!({"name": name, "text": format!(": > {}/done", reader.dir), "enter": true}),
        STEP,
    );
    tool_ok(&r, "vm_serial_write (end of recording)");
    let res = lab.srv().finish_call(&reader.id, Duration::from_secs(150));
    let out = tool_ok(&res, "event reader");
    assert_eq!(out["exitcode"], 0, "event reader: {out}");
    let stdout = out["stdout"].as_str().unwrap_or("");
    let parts: Vec<&str> = stdout.split("== ").skip(1).collect();
    assert_eq!(
        parts.len(),
        reader.devices,
        "event reader output: {stdout:?}"
    );
    parts
        .iter()
        .map(|p| parse_events(p.split_once('\n').map(|x| x.1).unwrap_or("")))
        .collect()
}
