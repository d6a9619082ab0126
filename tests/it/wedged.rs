//! Wedged QEMUs do not stall the server: a SIGSTOPped QEMU is reported `frozen` at once and a
//! forced stop ends it within 2 s; a monitor that never answers is reported `unresponsive` by
//! list_vms within a second, however many there are (they are probed in parallel), and by
//! vm_info within 5 s. The bounds are requirements, asserted as such.

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{json, Value};

/// Bound for a launch_vm call (QEMU start-up plus the first QMP session) on a loaded machine.
const LAUNCH: Duration = Duration::from_secs(120);
/// list_vms answers within this, whatever the VMs do.
const LIST_LIMIT: Duration = Duration::from_secs(1);
/// vm_info answers within this, whatever the VM does.
const INFO_LIMIT: Duration = Duration::from_secs(5);
/// A forced stop_vm of a wedged QEMU finishes within this.
const FORCE_LIMIT: Duration = Duration::from_secs(2);

fn signal(pid: i32, sig: i32) {
    assert!(pid > 1);
    // SAFETY: plain kill(2) on a PID this test started (a QEMU or a sleep).
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig}) failed");
}

/// Waits (bounded) until `pid`'s /proc state is (or is not) a stopped state.
fn wait_stopped(pid: i32, stopped: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = pid_state(pid);
        if matches!(st, Some('T') | Some('t')) == stopped {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{pid} stays in state {st:?} (want stopped={stopped})"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs one tool call and returns its structured result and how long it took.
fn timed_ok(s: &mut Server, tool: &str, args: Value) -> (Value, Duration) {
    let t = Instant::now();
    let out = s.call_ok(tool, args);
    (out, t.elapsed())
}

/// The list_vms entry for `name`.
fn entry(listing: &Value, name: &str) -> Value {
    listing["vms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("{name} not in {listing}"))
}

#[test]
fn a_sigstopped_qemu_is_frozen_and_a_forced_stop_ends_it_within_2_s() {
    let lab = Lab::without_server("frozen", 1);
    let mut s = lab.spawn_server();
    let l = lab.launch_on(
        &mut s,
        json!({"name": "ice", "memory_mb": 64, "cpus": 1, "accel": "tcg", "no_net": true}),
        LAUNCH,
    );
    let pid = l["pid"].as_i64().unwrap() as i32;

    signal(pid, libc::SIGSTOP);
    wait_stopped(pid, true);
    let (listing, took) = timed_ok(&mut s, "list_vms", json!({}));
    assert!(took <= LIST_LIMIT, "list_vms took {took:?}");
    let e = entry(&listing, "ice");
    assert_eq!(e["status"], "frozen", "{e}");
    let (info, took) = timed_ok(&mut s, "vm_info", json!({"name": "ice"}));
    assert!(took <= INFO_LIMIT, "vm_info took {took:?}");
    assert_eq!(info["status"], "frozen", "{info}");
    let detail = info["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("stop_vm") && detail.contains("force"),
        "vm_info does not say how to end it: {info}"
    );

    // SIGCONT: it runs again, and says so.
    signal(pid, libc::SIGCONT);
    wait_stopped(pid, false);
    let (listing, _) = timed_ok(&mut s, "list_vms", json!({}));
    assert_eq!(entry(&listing, "ice")["status"], "running", "{listing}");

    signal(pid, libc::SIGSTOP);
    wait_stopped(pid, true);
    let (st, took) = timed_ok(&mut s, "stop_vm", json!({"name": "ice", "force": true}));
    assert!(took <= FORCE_LIMIT, "a forced stop_vm took {took:?}");
    assert_eq!(st["status"], "stopped", "{st}");
    assert!(
        !pid_alive(pid),
        "the frozen QEMU {pid} is still there (state {:?}) after a forced stop_vm",
        pid_state(pid)
    );
    let (listing, _) = timed_ok(&mut s, "list_vms", json!({}));
    assert_eq!(entry(&listing, "ice")["status"], "stopped", "{listing}");
}

/// A monitor socket that accepts every connection and never says a word (no QMP greeting),
/// holding the connections open until dropped.
struct SilentMonitor {
    path: PathBuf,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl SilentMonitor {
    fn start(path: PathBuf) -> SilentMonitor {
        let listener = UnixListener::bind(&path).expect("bind the silent monitor");
        listener.set_nonblocking(true).unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (acc, halt) = (Arc::clone(&accepted), Arc::clone(&stop));
        let acceptor = std::thread::spawn(move || {
            let mut held: Vec<UnixStream> = Vec::new();
            while !halt.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        acc.fetch_add(1, Ordering::SeqCst);
                        held.push(conn);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        SilentMonitor {
            path,
            accepted,
            stop,
            acceptor: Some(acceptor),
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for SilentMonitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
    }
}

/// Writes a registry with one attached VM per (name, socket, pid).
fn write_registry(state: &Path, vms: &[(&str, &Path, i32)]) {
    let mut map = serde_json::Map::new();
    for (name, sock, pid) in vms {
        map.insert(
            name.to_string(),
            json!({"name": name, "source": "attached", "pid": pid,
                   "qmp_socket": sock.to_str().unwrap(), "arch": "x86_64"}),
        );
    }
    let reg = json!({"version": 1, "vms": map});
    std::fs::write(state.join("vms.json"), reg.to_string()).expect("write vms.json");
}

#[test]
fn silent_monitors_are_unresponsive_in_list_vms_within_1_s() {
    let dir = short_runtime_dir("silent");
    let state = dir.subdir("s");
    let runtime = dir.subdir("r");
    const N: usize = 4;
    let monitors: Vec<SilentMonitor> = (0..N)
        .map(|i| SilentMonitor::start(runtime.join(format!("hung{i}.sock"))))
        .collect();
    let sleepers: Vec<StandIn> = (0..N).map(|_| StandIn::start()).collect();
    let names: Vec<String> = (0..N).map(|i| format!("hung{i}")).collect();
    let records: Vec<(&str, &Path, i32)> = (0..N)
        .map(|i| {
            (
                names[i].as_str(),
                monitors[i].path.as_path(),
                sleepers[i].pid(),
            )
        })
        .collect();
    write_registry(&state, &records);
    let mut s = Server::ready_in(&state, &runtime);

    // Probed in parallel: N silent monitors cost one budget, not N.
    let (listing, took) = timed_ok(&mut s, "list_vms", json!({}));
    assert!(
        took <= LIST_LIMIT,
        "list_vms took {took:?} with {N} silent monitors"
    );
    for (name, m) in names.iter().zip(&monitors) {
        let e = entry(&listing, name);
        assert_eq!(e["status"], "unresponsive", "{e}");
        let detail = e["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("force"), "{e}");
        assert!(
            m.accepted() >= 1,
            "{name}'s monitor was never asked: {listing}"
        );
    }
    // Again: the probes of the first listing do not slow down the next.
    let (listing, took) = timed_ok(&mut s, "list_vms", json!({}));
    assert!(took <= LIST_LIMIT, "the second list_vms took {took:?}");
    assert_eq!(entry(&listing, "hung0")["status"], "unresponsive");

    let (info, took) = timed_ok(&mut s, "vm_info", json!({"name": "hung1"}));
    assert!(took <= INFO_LIMIT, "vm_info took {took:?}");
    assert_eq!(info["status"], "unresponsive", "{info}");
    let detail = info["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("stop_vm") && detail.contains("force"),
        "{info}"
    );

    // A forced stop does not wait on the silent monitor for long.
    let victim = sleepers[2].pid();
    let (st, took) = timed_ok(&mut s, "stop_vm", json!({"name": "hung2", "force": true}));
    assert!(took <= FORCE_LIMIT, "a forced stop_vm took {took:?}");
    assert_eq!(st["status"], "stopped", "{st}");
    assert!(!pid_alive(victim), "the process behind hung2 survived");
    let (listing, took) = timed_ok(&mut s, "list_vms", json!({}));
    assert!(took <= LIST_LIMIT, "list_vms took {took:?}");
    assert_eq!(entry(&listing, "hung2")["status"], "stopped", "{listing}");
    assert_eq!(entry(&listing, "hung3")["status"], "unresponsive");
}
