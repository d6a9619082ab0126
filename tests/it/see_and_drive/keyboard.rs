//! The keyboard steps of the test guest's journey: exact text at the default pace, with
//! delay_ms 0, and while the guest's vCPUs wait for a core; chords and refused input.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::guest_io::{finish_tty_reader, start_tty_reader};
use super::STEP;
use crate::common::*;
use serde_json::json;

/// A long line with every kind of printable character arrives exactly.
pub fn typing(lab: &mut Lab, name: &str) {
    let unit = "The Quick Brown Fox 0123456789 ~!@#$%^&*()_+`-={}[]|\\:;\"'<>,.?/ \
                'single' \"double\" back\\slash  two  spaces ";
    let mut text = String::new();
    while text.chars().count() < 220 {
        text.push_str(unit);
    }
    let text = text.trim_end().to_string();
    assert!(text.len() >= 200);
    let reader = start_tty_reader(lab, name);
    let t = Instant::now();
    let r = lab.srv().call_keeping(
        "vm_type_text",
        json!({"name": name, "text": text, "enter": true}),
        STEP,
    );
    let typed_ms = t.elapsed().as_millis();
    let sc = tool_ok(&r, "vm_type_text");
    assert_eq!(sc["characters"].as_u64(), Some(text.len() as u64 + 1));
    let got = finish_tty_reader(lab, &reader);
    assert_eq!(got, text, "the guest must receive exactly the typed text");
    eprintln!(
        "vm_type_text: {} characters in {typed_ms} ms ({} commands)",
        text.len() + 1,
        sc["commands"]
    );
}

/// Chords and aliases; invalid input is refused before anything is sent (the line the guest
/// reads holds only what the valid calls typed).
pub fn keys(lab: &mut Lab, name: &str) {
    let reader = start_tty_reader(lab, name);
    let t = STEP;
    let r = lab.srv().call_keeping(
        "vm_send_keys",
        json!({"name": name, "keys": ["q", "no-such-key"]}),
        t,
    );
    let err = tool_err(&r, "unknown key");
    assert!(err.contains("no-such-key"), "{err}");
    let r = lab.srv().call_keeping(
        "vm_send_keys",
        json!({"name": name, "keys": ["ctrl-bogus"]}),
        t,
    );
    tool_err(&r, "unknown chord part");
    let r = lab.srv().call_keeping(
        "vm_type_text",
        json!({"name": name, "text": "z".repeat(4097)}),
        t,
    );
    let err = tool_err(&r, "4097 characters");
    assert!(err.contains("4096"), "{err}");
    let r = lab.srv().call_keeping(
        "vm_type_text",
        json!({"name": name, "text": "zz\u{e9}zz"}),
        t,
    );
    let err = tool_err(&r, "non-ASCII text");
    assert!(err.contains("position 2"), "{err}");

    let r = lab
        .srv()
        .call_keeping("vm_type_text", json!({"name": name, "text": "abc"}), t);
    tool_ok(&r, "type abc");
    let r = lab.srv().call_keeping(
        "vm_send_keys",
        json!({"name": name, "keys": ["shift-x", "space", "minus", "enter"]}),
        t,
    );
    let sc = tool_ok(&r, "vm_send_keys");
    assert_eq!(sc["sent"], 4);
    assert_eq!(
        sc["chords"],
        json!([["shift", "x"], ["spc"], ["minus"], ["ret"]])
    );
    assert_eq!(finish_tty_reader(lab, &reader), "abcX -");
}

/// Typing stays exact with delay_ms 0: the tool keeps a minimum pause between key batches
/// (without it, a long text lost keys under TCG).
pub fn typing_unpaced(lab: &mut Lab, name: &str) {
    let unit = "Pack my box with 5 dozen liquor jugs! {[(<\\'\"|\"'/>)]} ~`@#$%^&*_+=-; ";
    let mut text = String::new();
    while text.len() < 1000 {
        text.push_str(unit);
    }
    let reader = start_tty_reader(lab, name);
    let t = Instant::now();
    let r = lab.srv().call_keeping(
        "vm_type_text",
        json!({"name": name, "text": text, "enter": true, "delay_ms": 0}),
        STEP,
    );
    tool_ok(&r, "vm_type_text delay_ms 0");
    let ms = t.elapsed().as_millis();
    assert_eq!(finish_tty_reader(lab, &reader), text);
    eprintln!(
        "vm_type_text delay_ms=0: {} characters in {ms} ms",
        text.len() + 1
    );
}

/// Typing stays exact while the guest's vCPU waits for a core: both cores spin and, for 60 ms
/// of every 100, every QEMU thread but the main one runs under SCHED_IDLE, so the monitor takes
/// keys while the vCPU can hardly drain its 16-byte PS/2 queue. CI once lost a batch of keys
/// under a fixed 10 ms pause; the loss depends on where the vCPU is preempted (holding QEMU's
/// big lock, it stalls the monitor too), so this load shows it only sometimes.
pub fn typing_starved(lab: &mut Lab, name: &str) {
    let list = tool_ok(
        &lab.srv().call_keeping("list_vms", json!({}), STEP),
        "list_vms",
    );
    let pid = list["vms"]
        .as_array()
        .and_then(|v| v.iter().find(|vm| vm["name"] == name))
        .and_then(|vm| vm["pid"].as_i64())
        .unwrap_or_else(|| panic!("list_vms has no pid for {name}: {list}")) as i32;
    let unit = "Starved vCPUs still get ~`@#$%^&*_+=-; every key! ";
    let text = unit.repeat(20);
    let reader = start_tty_reader(lab, name);
    let starver = Starver::start(pid);
    let t = Instant::now();
    let r = lab.srv().call_keeping(
        "vm_type_text",
        json!({"name": name, "text": text, "enter": true, "delay_ms": 0}),
        STEP,
    );
    let ms = t.elapsed().as_millis();
    drop(starver);
    tool_ok(&r, "vm_type_text while starved");
    assert_eq!(finish_tty_reader(lab, &reader), text);
    eprintln!(
        "vm_type_text with a starved vCPU: {} characters in {ms} ms",
        text.len() + 1
    );
}

/// The load of [`typing_starved`], until dropped.
struct Starver {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Starver {
    fn start(pid: i32) -> Starver {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for _ in 0..2 {
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::black_box(0u64);
                }
            }));
        }
        let s = stop.clone();
        threads.push(std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let tids = worker_threads(pid);
                set_policy(&tids, libc::SCHED_IDLE);
                std::thread::sleep(Duration::from_millis(60));
                set_policy(&tids, libc::SCHED_OTHER);
                std::thread::sleep(Duration::from_millis(40));
            }
        }));
        Starver { stop, threads }
    }
}

impl Drop for Starver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The threads of QEMU `pid` but its main one (which runs the monitor).
fn worker_threads(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .filter(|&t| t != pid)
                .collect()
        })
        .unwrap_or_default()
}

fn set_policy(tids: &[i32], policy: i32) {
    let param = libc::sched_param { sched_priority: 0 };
    for &t in tids {
        // SAFETY: a plain syscall on a thread id with a valid parameter; a thread that ended
        // meanwhile only makes it fail.
        unsafe { libc::sched_setscheduler(t, policy, &param) };
    }
}
