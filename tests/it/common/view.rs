//! What the live-view tests share: a sandbox of the test guest with a shell on its serial
//! console, a guest program that reports the first line typed on the console the keyboard
//! types into (/dev/tty1), so input can be checked to arrive exactly, and a `mcqemu view`
//! process on a lab's folders.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use super::{test_guest, test_roots, tool_ok, Lab, Server, BIN};

/// Bound of one step's call.
const STEP: Duration = Duration::from_secs(60);

/// sandbox_vm `name` of the test guest (128 MiB, 1 vCPU, a serial shell), its agent answering.
pub fn boot_test_sandbox(lab: &mut Lab, name: &str) {
    lab.boot_guest_sandbox(name, &test_guest(), "mcqemu.serial_shell=1");
}

/// Starts a guest program that prints the first line typed on /dev/tty1; returns its call id
/// once it listens (it says so on the serial console). Calls made while it runs must keep
/// other calls' answers (`call_keeping`).
pub fn start_tty_reader(s: &mut Server, name: &str, tag: &str) -> Value {
    let offset = tool_ok(
        &s.call_keeping(
            "vm_serial_read",
            json!({"name": name, "tail_lines": 1}),
            STEP,
        ),
        "vm_serial_read",
    )["offset"]
        .as_u64()
        .expect("offset");
    let script = format!(
        "exec 3</dev/tty1; echo READY-{tag} > /dev/ttyS0; IFS= read -r line <&3; printf %s \"$line\""
    );
    let id = s.start_call(
        "guest_exec",
        json!({"name": name, "command": "sh", "args": ["-c", script], "timeout": 150}),
    );
    let r = s.call_keeping(
        "vm_serial_wait",
        json!({"name": name, "pattern": format!("READY-{tag}"), "timeout": 60, "offset": offset}),
        Duration::from_secs(90),
    );
    tool_ok(&r, "reader ready");
    id
}

/// The line the reader of [`start_tty_reader`] received.
pub fn finish_tty_reader(s: &mut Server, id: &Value) -> String {
    let r = s.finish_call(id, Duration::from_secs(180));
    let sc = tool_ok(&r, "tty reader");
    sc["stdout"].as_str().expect("stdout").to_string()
}

/// A `mcqemu view NAME` process on the lab's folders, and the URL it printed.
pub fn spawn_view(lab: &Lab, name: &str) -> (Child, String) {
    let mut child = Command::new(BIN)
        .args(["view", name])
        .env("MCQEMU_STATE_DIR", lab.state())
        .env("MCQEMU_RUNTIME_DIR", lab.runtime())
        .env("MCQEMU_ROOTS", test_roots())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start mcqemu view");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("the view's stdout"))
        .read_line(&mut line)
        .expect("the URL line");
    (child, line.trim().to_string())
}

/// Polls vm_view_frame as the live view does (each call `since` the frame the view shows) for
/// `learn`, then for 5 s more; returns the frames sent while learning, those sent in the 5 s,
/// and the hash of the frame the view then shows. A screen whose only change is a blinking
/// cursor must send none in the 5 s.
pub fn frames_while_still(
    s: &mut Server,
    name: &str,
    learn: Duration,
) -> (usize, usize, Option<String>) {
    let mut hash: Option<String> = None;
    let mut sent = |s: &mut Server, within: Duration| {
        let end = std::time::Instant::now() + within;
        let mut n = 0;
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left < Duration::from_millis(50) {
                return n;
            }
            let mut args = json!({"name": name, "max_width": 320,
                                  "wait_ms": left.as_millis() as u64});
            if let Some(h) = &hash {
                args["since"] = json!(h);
            }
            let f = s.call_tool_within("vm_view_frame", args, STEP);
            let sc = tool_ok(&f, "vm_view_frame");
            if sc["changed"] == true {
                n += 1;
                hash = sc["hash"].as_str().map(str::to_string);
            }
        }
    };
    let learning = sent(s, learn);
    let window = sent(s, Duration::from_secs(5));
    (learning, window, hash)
}
