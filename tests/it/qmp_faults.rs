//! QMP against misbehaving monitors: a fake monitor (a unix socket the test controls) that
//! never greets, greets and then goes silent, sends garbage, closes mid-message, floods,
//! or sends a line larger than the size cap. Every failure must be bounded in time and say
//! what happened. First the library client directly, then the same faults through MCP, with
//! the fake monitor registered in vms.json as an attached VM.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::io::FromRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::*;
use mcqemu::qemu::qmp::{Qmp, QmpError, MAX_MESSAGE};
use serde_json::{json, Value};

const GREETING: &str = r#"{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}, "package": ""}, "capabilities": ["oob"]}}"#;

/// The greeting bound the library tests pass to `Qmp::connect`.
const GREET: Duration = Duration::from_secs(2);

/// What a fake monitor does with one accepted connection; returns when done (the connection
/// closes) or when `stop` is set.
type Behaviour = fn(UnixStream, &AtomicBool);

/// A unix socket served by the test: accepts connections and hands each to a behaviour on its
/// own thread. Stops (and closes every connection) on drop.
struct FakeMonitor {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
    _dir: TempDir,
}

impl FakeMonitor {
    fn start(label: &str, behaviour: Behaviour) -> FakeMonitor {
        let dir = short_runtime_dir(label);
        let path = dir.join("qmp.sock");
        let listener = UnixListener::bind(&path).expect("bind the fake monitor");
        FakeMonitor::serve(dir, path, listener, Some(behaviour))
    }

    /// A listener that never accepts, with a backlog of one: once it is full, connecting
    /// blocks (EAGAIN), as with a QEMU whose single monitor client is busy.
    fn never_accepting(label: &str) -> FakeMonitor {
        let dir = short_runtime_dir(label);
        let path = dir.join("qmp.sock");
        // SAFETY: plain socket/bind/listen on a fresh fd, handed to UnixListener (which owns
        // and closes it); sockaddr_un is plain data.
        let listener = unsafe {
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0, "socket failed");
            let mut addr: libc::sockaddr_un = std::mem::zeroed();
            addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
            let bytes = path.to_str().unwrap().as_bytes();
            for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
                *d = *s as libc::c_char;
            }
            let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as u32;
            assert_eq!(
                libc::bind(fd, &addr as *const _ as *const libc::sockaddr, len),
                0,
                "bind failed"
            );
            assert_eq!(libc::listen(fd, 1), 0, "listen failed");
            UnixListener::from_raw_fd(fd)
        };
        FakeMonitor::serve(dir, path, listener, None)
    }

    fn serve(
        dir: TempDir,
        path: PathBuf,
        listener: UnixListener,
        behaviour: Option<Behaviour>,
    ) -> FakeMonitor {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let acceptor = std::thread::spawn(move || {
            let Some(behaviour) = behaviour else {
                // Hold the listener (never accepting) until stopped.
                while !stop2.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                drop(listener);
                return;
            };
            listener.set_nonblocking(true).unwrap();
            let mut conns = Vec::new();
            while !stop2.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((s, _)) => {
                        s.set_nonblocking(false).unwrap();
                        let stop3 = Arc::clone(&stop2);
                        conns.push(std::thread::spawn(move || behaviour(s, &stop3)));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => panic!("fake monitor accept failed: {e}"),
                }
            }
            for c in conns {
                let _ = c.join();
            }
        });
        FakeMonitor {
            path,
            stop,
            acceptor: Some(acceptor),
            _dir: dir,
        }
    }
}

impl Drop for FakeMonitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

// ---- behaviours ----

/// Keeps the connection open, doing nothing, until stopped (at most two minutes).
fn hold(_s: &UnixStream, stop: &AtomicBool) {
    let until = Instant::now() + Duration::from_secs(120);
    while !stop.load(Ordering::SeqCst) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn send(s: &mut UnixStream, text: &str) {
    let _ = s.write_all(text.as_bytes());
    let _ = s.flush();
}

/// Reads one command line from the client; None when it went away.
fn read_command(r: &mut BufReader<UnixStream>) -> Option<Value> {
    let mut line = String::new();
    match r.read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => serde_json::from_str(line.trim()).ok(),
    }
}

/// Greets, answers qmp_capabilities properly, and returns the reader for the next command.
fn handshake(s: &mut UnixStream) -> Option<BufReader<UnixStream>> {
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    send(s, &format!("{GREETING}\n"));
    let mut r = BufReader::new(s.try_clone().ok()?);
    let caps = read_command(&mut r)?;
    assert_eq!(caps["execute"], "qmp_capabilities");
    send(s, &format!("{}\n", json!({"return": {}, "id": caps["id"]})));
    Some(r)
}

fn silent(s: UnixStream, stop: &AtomicBool) {
    hold(&s, stop);
}

fn greet_then_silent(mut s: UnixStream, stop: &AtomicBool) {
    send(&mut s, &format!("{GREETING}\n"));
    hold(&s, stop);
}

fn garbage(mut s: UnixStream, stop: &AtomicBool) {
    send(&mut s, "this is not QMP at all\n");
    hold(&s, stop);
}

fn json_but_no_greeting(mut s: UnixStream, stop: &AtomicBool) {
    send(&mut s, "{\"return\": {}}\n");
    hold(&s, stop);
}

fn close_mid_greeting(mut s: UnixStream, _stop: &AtomicBool) {
    send(&mut s, &GREETING[..30]);
    // Dropping the stream closes the connection.
}

fn close_mid_reply(mut s: UnixStream, _stop: &AtomicBool) {
    let Some(mut r) = handshake(&mut s) else {
        return;
    };
    if let Some(cmd) = read_command(&mut r) {
        let reply = json!({"return": {"status": "running", "running": true}, "id": cmd["id"]});
        let text = reply.to_string();
        send(&mut s, &text[..text.len() / 2]);
    }
}

/// Writes `total` bytes of 'x' without a newline (stops early when the client goes away).
fn write_huge(s: &mut UnixStream, total: usize, stop: &AtomicBool) {
    let _ = s.set_write_timeout(Some(Duration::from_secs(30)));
    let chunk = vec![b'x'; 256 * 1024];
    let mut sent = 0;
    while sent < total && !stop.load(Ordering::SeqCst) {
        if s.write_all(&chunk).is_err() {
            return;
        }
        sent += chunk.len();
    }
}

fn huge_greeting(mut s: UnixStream, stop: &AtomicBool) {
    send(&mut s, "{\"QMP\": \"");
    write_huge(&mut s, MAX_MESSAGE + (2 << 20), stop);
    hold(&s, stop);
}

fn huge_reply(mut s: UnixStream, stop: &AtomicBool) {
    let Some(mut r) = handshake(&mut s) else {
        return;
    };
    if read_command(&mut r).is_some() {
        send(&mut s, "{\"return\": \"");
        write_huge(&mut s, MAX_MESSAGE + (2 << 20), stop);
    }
    hold(&s, stop);
}

/// After the handshake: events every 10 ms, never a reply.
fn event_flood(mut s: UnixStream, stop: &AtomicBool) {
    let Some(mut r) = handshake(&mut s) else {
        return;
    };
    if read_command(&mut r).is_none() {
        return;
    }
    let until = Instant::now() + Duration::from_secs(120);
    while !stop.load(Ordering::SeqCst) && Instant::now() < until {
        let ev = json!({"event": "RTC_CHANGE", "data": {"offset": 0}, "timestamp": {"seconds": 0, "microseconds": 0}});
        if s.write_all(format!("{ev}\n").as_bytes()).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// After the handshake: replies, but always to some other id.
fn wrong_ids(mut s: UnixStream, stop: &AtomicBool) {
    let Some(mut r) = handshake(&mut s) else {
        return;
    };
    if read_command(&mut r).is_none() {
        return;
    }
    let until = Instant::now() + Duration::from_secs(120);
    while !stop.load(Ordering::SeqCst) && Instant::now() < until {
        if s.write_all(b"{\"return\": {}, \"id\": \"someone-else\"}\n")
            .is_err()
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// After the handshake: a message that is neither a reply nor an event.
fn stray_message(mut s: UnixStream, stop: &AtomicBool) {
    let Some(mut r) = handshake(&mut s) else {
        return;
    };
    if read_command(&mut r).is_some() {
        send(&mut s, "{\"hello\": \"world\"}\n");
    }
    hold(&s, stop);
}

// ---- helpers ----

/// Runs `f` and returns its result with how long it took.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t0 = Instant::now();
    let r = f();
    (r, t0.elapsed())
}

fn connect_err(path: &Path) -> (QmpError, Duration) {
    let (r, took) = timed(|| Qmp::connect(path, GREET));
    match r {
        Ok(_) => panic!("Qmp::connect to {} succeeded", path.display()),
        Err(e) => (e, took),
    }
}

fn assert_within(took: Duration, limit: Duration, what: &str) {
    assert!(took < limit, "{what} took {took:?} (limit {limit:?})");
}

// ---------------------------------------------------------------------------------------------
// The client library against fake monitors

#[test]
fn a_monitor_that_never_greets_is_no_greeting() {
    let fake = FakeMonitor::start("ng", silent);
    let (e, took) = connect_err(&fake.path);
    assert!(matches!(e, QmpError::NoGreeting), "{e:?}");
    assert!(e.to_string().contains("greeting"), "{e}");
    assert!(took >= GREET - Duration::from_millis(100), "{took:?}");
    assert_within(
        took,
        GREET + Duration::from_secs(3),
        "never-greeting monitor",
    );
}

#[test]
fn a_monitor_with_a_full_backlog_is_no_greeting() {
    let fake = FakeMonitor::never_accepting("bl");
    // Fill the backlog the way QEMU's busy monitor does.
    let mut held = Vec::new();
    let full = loop {
        match mcqemu::qemu::sock::connect(&fake.path, Duration::from_millis(100)) {
            Ok(s) => held.push(s),
            Err(e) => break e,
        }
        assert!(held.len() < 64, "the backlog never filled");
    };
    assert_eq!(full.kind(), std::io::ErrorKind::TimedOut, "{full}");
    let (e, took) = connect_err(&fake.path);
    assert!(matches!(e, QmpError::NoGreeting), "{e:?}");
    assert_within(took, GREET + Duration::from_secs(3), "full backlog");
}

#[test]
fn a_monitor_that_never_answers_capabilities_times_out() {
    let fake = FakeMonitor::start("nc", greet_then_silent);
    let (e, took) = connect_err(&fake.path);
    match &e {
        QmpError::Timeout(cmd) => assert!(cmd.contains("qmp_capabilities"), "{e}"),
        other => panic!("expected a timeout on qmp_capabilities, got {other:?}"),
    }
    assert!(e.to_string().contains("did not answer"), "{e}");
    assert_within(took, Duration::from_secs(10), "silent after greeting");
}

#[test]
fn a_monitor_that_sends_garbage_is_garbage() {
    let fake = FakeMonitor::start("gb", garbage);
    let (e, took) = connect_err(&fake.path);
    match &e {
        QmpError::Garbage(m) => assert!(m.contains("this is not QMP"), "{e}"),
        other => panic!("expected Garbage, got {other:?}"),
    }
    assert!(e.to_string().contains("not QMP"), "{e}");
    assert_within(took, Duration::from_secs(2), "garbage");

    let fake = FakeMonitor::start("ng2", json_but_no_greeting);
    let (e, took) = connect_err(&fake.path);
    match &e {
        QmpError::Garbage(m) => assert!(m.contains("expected a greeting"), "{e}"),
        other => panic!("expected Garbage, got {other:?}"),
    }
    assert_within(took, Duration::from_secs(2), "JSON without a greeting");
}

#[test]
fn a_monitor_that_closes_mid_message_is_closed() {
    let fake = FakeMonitor::start("cg", close_mid_greeting);
    let (e, took) = connect_err(&fake.path);
    assert!(matches!(e, QmpError::Closed), "{e:?}");
    assert!(e.to_string().contains("closed"), "{e}");
    assert_within(took, Duration::from_secs(2), "close mid-greeting");

    let fake = FakeMonitor::start("cr", close_mid_reply);
    let mut q = Qmp::connect(&fake.path, GREET).expect("handshake");
    assert_eq!(q.version, "7.2.0");
    let (r, took) = timed(|| q.execute_within("query-status", None, Duration::from_secs(10)));
    assert!(matches!(r, Err(QmpError::Closed)), "{r:?}");
    assert_within(took, Duration::from_secs(3), "close mid-reply");
}

#[test]
fn a_line_over_the_cap_is_too_large() {
    let fake = FakeMonitor::start("hg", huge_greeting);
    let (e, took) = connect_err(&fake.path);
    assert!(matches!(e, QmpError::TooLarge), "{e:?}");
    assert!(e.to_string().contains(&MAX_MESSAGE.to_string()), "{e}");
    assert_within(took, Duration::from_secs(10), "huge greeting");

    let fake = FakeMonitor::start("hr", huge_reply);
    let mut q = Qmp::connect(&fake.path, GREET).expect("handshake");
    let (r, took) = timed(|| q.execute_within("query-status", None, Duration::from_secs(30)));
    assert!(matches!(r, Err(QmpError::TooLarge)), "{r:?}");
    assert_within(took, Duration::from_secs(10), "huge reply");
}

#[test]
fn events_or_other_ids_never_stretch_a_command_past_its_bound() {
    for (label, behaviour) in [("ev", event_flood as Behaviour), ("id", wrong_ids)] {
        let fake = FakeMonitor::start(label, behaviour);
        let mut q = Qmp::connect(&fake.path, GREET).expect("handshake");
        let bound = Duration::from_secs(2);
        let (r, took) = timed(|| q.execute_within("query-status", None, bound));
        match &r {
            Err(QmpError::Timeout(cmd)) => assert_eq!(cmd, "query-status"),
            other => panic!("{label}: expected a timeout, got {other:?}"),
        }
        assert!(
            took >= bound - Duration::from_millis(100),
            "{label}: {took:?}"
        );
        assert_within(took, bound + Duration::from_secs(3), label);
        if label == "ev" {
            assert!(q.event_names().iter().all(|n| n == "RTC_CHANGE"));
            assert!(!q.events.is_empty(), "events were not kept");
            assert!(q.events.len() <= 1000, "events are unbounded");
        }
    }
    let fake = FakeMonitor::start("st", stray_message);
    let mut q = Qmp::connect(&fake.path, GREET).expect("handshake");
    let r = q.execute_within("query-status", None, Duration::from_secs(5));
    match &r {
        Err(QmpError::Garbage(m)) => assert!(m.contains("unexpected message"), "{m}"),
        other => panic!("expected Garbage, got {other:?}"),
    }
}

#[test]
fn missing_or_dead_sockets_fail_at_once() {
    let dir = short_runtime_dir("dead");
    let (e, took) = connect_err(&dir.join("missing.sock"));
    assert!(matches!(e, QmpError::Connect(_)), "{e:?}");
    assert!(e.to_string().contains("missing.sock"), "{e}");
    assert_within(took, Duration::from_secs(1), "missing socket");

    let dead = dir.join("dead.sock");
    drop(UnixListener::bind(&dead).unwrap());
    let (e, took) = connect_err(&dead);
    assert!(matches!(e, QmpError::Connect(_)), "{e:?}");
    assert_within(took, Duration::from_secs(1), "dead socket");
}

// ---------------------------------------------------------------------------------------------
// The same faults through MCP

/// A server whose registry holds `records` (written before it starts: attach_vm would check
/// QMP, which these monitors fail on purpose).
fn server_with(records: Value) -> (Server, TempDir) {
    let dir = short_runtime_dir("mcp");
    let state = dir.subdir("s");
    let runtime = dir.subdir("r");
    std::fs::write(
        state.join("vms.json"),
        json!({"version": 1, "vms": records}).to_string(),
    )
    .unwrap();
    (Server::ready_in(&state, &runtime), dir)
}

fn status_in(listing: &Value, name: &str) -> Value {
    listing["vms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in {listing}"))
        .clone()
}

/// The checks of a_busy_monitor_reads_as_busy_not_exited_over_mcp for one record (each QMP
/// attempt on that monitor costs the 5 s greeting bound, so the two records run in parallel).
fn busy_checks(s: &mut Server, name: &str) {
    let (l, took) = timed(|| s.call_ok("list_vms", json!({})));
    assert_within(took, Duration::from_secs(15), "list_vms");
    let e = status_in(&l, name);
    // A monitor that accepts and never greets may be held by another client or stuck: the
    // two cannot be told apart from outside, and both are reported unresponsive (with the
    // advice to force a stop), not as an exited VM.
    assert_eq!(e["status"], "unresponsive", "{e}");
    assert!(
        e["detail"]
            .as_str()
            .unwrap_or("")
            .contains("another operation holds the monitor"),
        "{e}"
    );

    let (info, took) = timed(|| s.call_ok("vm_info", json!({"name": name})));
    assert_within(took, Duration::from_secs(15), "vm_info");
    assert_eq!(info["status"], "unresponsive", "{info}");
    let detail = info["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains("another operation holds the monitor"),
        "{info}"
    );
    assert!(!detail.contains("has exited"), "{info}");

    for tool in ["pause_vm", "resume_vm"] {
        let (err, took) = timed(|| s.call_err(tool, json!({"name": name})));
        assert_within(took, Duration::from_secs(25), tool);
        assert!(
            err.contains("another operation holds the monitor"),
            "{tool} {name}: {err}"
        );
        assert!(!err.contains("has exited"), "{tool} {name}: {err}");
    }
}

#[test]
fn a_busy_monitor_reads_as_busy_not_exited_over_mcp() {
    let fake = FakeMonitor::start("busy", silent);
    let stand = StandIn::start();
    let sock = fake.path.to_str().unwrap();
    let (mut with_pid, _d1) = server_with(json!({
        "withpid": {"qmp_socket": sock, "source": "attached", "pid": stand.pid()}
    }));
    let (mut no_pid, _d2) = server_with(json!({
        "nopid": {"qmp_socket": sock, "source": "attached"}
    }));
    std::thread::scope(|sc| {
        let a = sc.spawn(|| busy_checks(&mut with_pid, "withpid"));
        let b = sc.spawn(|| {
            busy_checks(&mut no_pid, "nopid");
            // A graceful stop cannot reach the monitor either, and says so (it signals
            // nothing).
            let err = no_pid.call_err("stop_vm", json!({"name": "nopid", "timeout": 1}));
            assert!(err.contains("another operation holds the monitor"), "{err}");
        });
        let (ra, rb) = (a.join(), b.join());
        if let Err(p) = ra.and(rb) {
            std::panic::resume_unwind(p);
        }
    });
    assert!(pid_alive(stand.pid()));
}

#[test]
fn a_garbage_monitor_reads_as_unreachable_over_mcp() {
    let fake = FakeMonitor::start("mg", garbage);
    let stand = StandIn::start();
    let (mut s, _dir) = server_with(json!({
        "noisy": {"qmp_socket": fake.path.to_str().unwrap(), "source": "attached", "pid": stand.pid()}
    }));
    let e = status_in(&s.call_ok("list_vms", json!({})), "noisy");
    assert_eq!(e["status"], "unreachable", "{e}");
    assert!(e["detail"].as_str().unwrap().contains("not QMP"), "{e}");
    let info = s.call_ok("vm_info", json!({"name": "noisy"}));
    assert_eq!(info["status"], "unreachable", "{info}");
    let err = s.call_err("pause_vm", json!({"name": "noisy"}));
    assert!(err.contains("not QMP"), "{err}");
    assert!(!err.contains("has exited"), "{err}");
}

#[test]
fn a_huge_reply_over_mcp_is_a_bounded_error() {
    let fake = FakeMonitor::start("mh", huge_reply);
    let (mut s, _dir) = server_with(json!({
        "big": {"qmp_socket": fake.path.to_str().unwrap(), "source": "attached"}
    }));
    let (err, took) = timed(|| s.call_err("pause_vm", json!({"name": "big"})));
    assert!(err.contains("exceeded"), "{err}");
    assert_within(took, Duration::from_secs(25), "pause_vm on a huge reply");
    s.assert_alive();
}
