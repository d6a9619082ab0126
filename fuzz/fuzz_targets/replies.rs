//! QMP and guest-agent replies: the fuzz bytes are what QEMU (or qemu-ga) sends, over one end
//! of a socket pair; the real clients run on the other end. Nothing may panic, every call
//! returns within its bound, and each call's outcome (value, error kind, QEMU's error class
//! and text, the events kept, the version read off the greeting) is what a small model of
//! the protocol predicts from the same bytes. What the clients write must be well-formed too.
//!
//! The first byte picks the mode (`% 6`): 0 QMP, 2 guest agent, 4 the bare line reader
//! (`LineStream`, with a size cap of 4 × the second byte) with the peer closing after the
//! bytes, so a call that needs more data sees the connection close; 1, 3 and 5 are the same
//! with the peer holding the connection open, so such a call times out (bounds of a few ms).
//! In agent modes every `$ID` in the bytes becomes the id of the client's
//! `guest-sync-delimited`, which is random per session.
#![no_main]

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use libfuzzer_sys::{fuzz_target, Corpus};
use mcqemu::qemu::qga::{Qga, QgaError};
use mcqemu::qemu::qmp::{Qmp, QmpError};
use mcqemu::qemu::sock::{LineError, LineStream};
use serde_json::{json, Value};

/// Inputs above this are refused: they must fit in the socket buffer unread.
const MAX_INPUT: usize = 64 * 1024;
/// The bound of calls when the peer closes: never reached, the close comes first.
const LONG: Duration = Duration::from_secs(5);
/// The bound of calls when the peer holds the connection open: each ends in a timeout.
const SHORT: Duration = Duration::from_millis(2);
/// Scheduling allowance on top of a call's bound.
const SLACK: Duration = Duration::from_secs(2);
/// QMP's own bound for `qmp_capabilities` inside `from_stream` (not a parameter).
const CAPABILITIES: Duration = Duration::from_secs(5);
/// Replaced by the sync id in agent modes.
const PLACEHOLDER: &[u8] = b"$ID";
/// Stands for the sync id when the model checks an input before the session exists.
const SAMPLE_ID: u64 = 3_141_592_653_589_793;

/// How a call ended, as the model sees it.
#[derive(Debug, Clone, PartialEq)]
enum Why {
    Timeout,
    Closed,
    Garbage,
    /// No greeting (QMP) or no sync reply (agent) in time.
    Silent,
    Command(String, String),
}

fn qmp_why(e: QmpError) -> Why {
    match e {
        QmpError::NoGreeting => Why::Silent,
        QmpError::Timeout(_) => Why::Timeout,
        QmpError::Closed => Why::Closed,
        QmpError::Garbage(_) => Why::Garbage,
        QmpError::Command { class, desc } => Why::Command(class, desc),
        // Connect, TooLarge (a 16 MiB cap), Held (session locks): none can happen here.
        e => panic!("unexpected QMP error {e:?}"),
    }
}

fn qga_why(e: QgaError) -> Why {
    match e {
        QgaError::NoAgent => Why::Silent,
        QgaError::Timeout(_) => Why::Timeout,
        QgaError::Closed => Why::Closed,
        QgaError::Garbage(_) => Why::Garbage,
        QgaError::Command { class, desc } => Why::Command(class, desc),
        // Connect, TooLarge (a 48 MiB cap): neither can happen here.
        e => panic!("unexpected agent error {e:?}"),
    }
}

/// The complete lines of `bytes`; a last piece without its newline is never a line.
fn lines(bytes: &[u8]) -> Vec<&[u8]> {
    let mut v: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    v.pop();
    v
}

/// What reading past the last complete line gives.
fn end(held: bool) -> Why {
    if held {
        Why::Timeout
    } else {
        Why::Closed
    }
}

/// Runs `f`, checking it returns within `bound` (plus scheduling slack).
fn timed<T>(what: &str, bound: Duration, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let r = f();
    let took = start.elapsed();
    assert!(
        took <= bound + SLACK,
        "{what} took {took:?}, bound {bound:?}"
    );
    r
}

/// One message per complete line: ASCII blanks trimmed, blank lines skipped, the rest JSON
/// (strict UTF-8) or garbage. `strip` drops a delimiter byte first (the agent's 0xFF).
fn messages(bytes: &[u8], strip: Option<u8>) -> VecDeque<Option<Value>> {
    lines(bytes)
        .into_iter()
        .filter_map(|l| {
            let mut l = l.to_vec();
            if let Some(b) = strip {
                l.retain(|c| *c != b);
            }
            let t = l.trim_ascii();
            (!t.is_empty()).then(|| serde_json::from_slice(t).ok())
        })
        .collect()
}

/// A reply's outcome: `return`, or `error` with its class and text (defaults when missing),
/// or neither.
fn decode(m: &Value) -> Option<Result<Value, Why>> {
    if let Some(r) = m.get("return") {
        return Some(Ok(r.clone()));
    }
    let e = m.get("error")?;
    Some(Err(Why::Command(
        e["class"].as_str().unwrap_or("GenericError").into(),
        e["desc"].as_str().unwrap_or("unknown error").into(),
    )))
}

/// The QMP client as a model: a greeting, then replies matched by id, stale replies skipped
/// and events kept on the way.
#[derive(Clone)]
struct QmpModel {
    msgs: VecDeque<Option<Value>>,
    held: bool,
    events: Vec<Value>,
    next_id: u64,
}

impl QmpModel {
    fn new(bytes: &[u8], held: bool) -> Self {
        QmpModel {
            msgs: messages(bytes, None),
            held,
            events: Vec::new(),
            next_id: 1,
        }
    }

    fn read(&mut self) -> Result<Value, Why> {
        match self.msgs.pop_front() {
            None => Err(end(self.held)),
            Some(None) => Err(Why::Garbage),
            Some(Some(v)) => Ok(v),
        }
    }

    fn keep(&mut self, ev: Value) {
        if self.events.len() >= 1000 {
            self.events.remove(0);
        }
        self.events.push(ev);
    }

    fn handshake(&mut self) -> Result<String, Why> {
        let greeting = match self.read() {
            Err(Why::Timeout) => return Err(Why::Silent),
            other => other?,
        };
        let v = &greeting.get("QMP").ok_or(Why::Garbage)?["version"]["qemu"];
        let version = format!("{}.{}.{}", v["major"], v["minor"], v["micro"]);
        self.execute()?;
        Ok(version)
    }

    fn execute(&mut self) -> Result<Value, Why> {
        let id = format!("mcq-{}", self.next_id);
        self.next_id += 1;
        loop {
            let m = self.read()?;
            if m.get("event").is_some() {
                self.keep(m);
                continue;
            }
            let ours = m.get("id").and_then(Value::as_str) == Some(id.as_str());
            match (ours, decode(&m)) {
                (false, Some(_)) => continue, // a stale reply
                (_, None) => return Err(Why::Garbage),
                (true, Some(outcome)) => return outcome,
            }
        }
    }

    fn next_event(&mut self) -> Result<Option<Value>, Why> {
        match self.read() {
            Ok(m) if m.get("event").is_some() => {
                self.keep(m.clone());
                Ok(Some(m))
            }
            Ok(_) | Err(Why::Timeout) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

fn fuzz_qmp(data: &[u8], held: bool) -> Corpus {
    let mut model = QmpModel::new(data, held);
    if held && model.clone().handshake() == Err(Why::Timeout) {
        // qmp_capabilities would wait its fixed 5 s for a reply that never comes.
        return Corpus::Reject;
    }
    let (client, mut peer) = UnixStream::pair().expect("socketpair");
    peer.write_all(data)
        .expect("the input fits in the socket buffer");
    if !held {
        peer.shutdown(Shutdown::Write).expect("shutdown");
    }
    let bound = if held { SHORT } else { LONG };

    let want = model.handshake();
    let got = timed("from_stream", bound + CAPABILITIES, || {
        Qmp::from_stream(client, bound)
    });
    match (got, want) {
        (Err(e), want) => assert_eq!(Err(qmp_why(e)), want.map(|_| ()), "handshake"),
        (Ok(_), Err(w)) => panic!("handshake succeeded, the model says {w:?}"),
        (Ok(mut qmp), Ok(version)) => {
            assert_eq!(qmp.version, version, "version from the greeting");
            let got = timed("execute", bound, || {
                qmp.execute_within("query-status", None, bound)
            });
            assert_eq!(got.map_err(qmp_why), model.execute(), "query-status");

            let got = timed("hmp", bound, || qmp.hmp("info version", bound));
            let want = model
                .execute()
                .map(|r| r.as_str().unwrap_or("").to_string());
            assert_eq!(got.map_err(qmp_why), want, "hmp");

            let args = json!({"device": "drive0", "force": true, "n": [1, "two", null]});
            let got = timed("execute", bound, || {
                qmp.execute_within("eject", Some(args), bound)
            });
            assert_eq!(got.map_err(qmp_why), model.execute(), "eject");

            let got = timed("next_event", bound, || qmp.next_event(bound));
            assert_eq!(got.map_err(qmp_why), model.next_event(), "next_event");
            assert_eq!(qmp.events, model.events, "events kept");
        }
    }

    // What the client sent: one command per line, ids mcq-1, mcq-2, ... in order.
    let mut sent = Vec::new();
    peer.shutdown(Shutdown::Write).ok();
    peer.read_to_end(&mut sent)
        .expect("read what the client sent");
    let sent = lines(&sent);
    assert_eq!(
        sent.len() as u64,
        model.next_id - 1,
        "commands sent vs commands run"
    );
    for (i, line) in sent.iter().enumerate() {
        let v: Value = serde_json::from_slice(line).expect("the client sends JSON");
        assert!(v["execute"].is_string(), "no execute: {v}");
        assert_eq!(v["id"], format!("mcq-{}", i + 1), "command ids");
    }
    Corpus::Keep
}

/// The agent client as a model: 0xFF bytes dropped; the sync discards everything up to
/// `{"return": id}` (garbage included), then one message answers each command.
struct QgaModel {
    msgs: VecDeque<Option<Value>>,
    held: bool,
}

impl QgaModel {
    fn new(bytes: &[u8], held: bool) -> Self {
        QgaModel {
            msgs: messages(bytes, Some(0xFF)),
            held,
        }
    }

    fn sync(&mut self, id: u64) -> Result<(), Why> {
        loop {
            match self.msgs.pop_front() {
                None if self.held => return Err(Why::Silent),
                None => return Err(Why::Closed),
                Some(Some(v)) if v.get("return").and_then(Value::as_u64) == Some(id) => {
                    return Ok(())
                }
                Some(_) => {}
            }
        }
    }

    fn execute(&mut self) -> Result<Value, Why> {
        match self.msgs.pop_front() {
            None => Err(end(self.held)),
            Some(None) => Err(Why::Garbage),
            Some(Some(v)) => decode(&v).unwrap_or(Err(Why::Garbage)),
        }
    }
}

/// `data` with every placeholder replaced by `id`.
fn template(data: &[u8], id: u64) -> Vec<u8> {
    let id = id.to_string();
    let mut out = Vec::with_capacity(data.len());
    let mut rest = data;
    while !rest.is_empty() {
        if rest.starts_with(PLACEHOLDER) {
            out.extend_from_slice(id.as_bytes());
            rest = &rest[PLACEHOLDER.len()..];
        } else {
            out.push(rest[0]);
            rest = &rest[1..];
        }
    }
    out
}

/// Messages from the fake agent's thread.
enum Peer {
    /// The id of the client's sync request.
    SyncId(u64),
    /// Everything is written.
    Written,
}

fn fuzz_agent(data: &[u8], held: bool) -> Corpus {
    if held {
        // Held open, a missing sync reply costs the whole sync bound, and the bytes must sit
        // in the socket buffer before the commands' short bounds start.
        let placeholders = data
            .windows(PLACEHOLDER.len())
            .filter(|w| *w == PLACEHOLDER);
        if data.len() + placeholders.count() * 16 > MAX_INPUT
            || QgaModel::new(&template(data, SAMPLE_ID), true)
                .sync(SAMPLE_ID)
                .is_err()
        {
            return Corpus::Reject;
        }
    }
    let (client, mut peer) = UnixStream::pair().expect("socketpair");
    let (tx, rx) = mpsc::channel();
    let bytes = data.to_vec();
    let agent = std::thread::spawn(move || {
        // Read the sync request (0xFF, JSON, newline), answer with the templated bytes, then
        // keep reading until the client hangs up.
        let mut sent = Vec::new();
        let mut buf = [0u8; 4096];
        while !sent.contains(&b'\n') {
            match peer.read(&mut buf) {
                Ok(0) | Err(_) => return sent,
                Ok(n) => sent.extend_from_slice(&buf[..n]),
            }
        }
        let first = lines(&sent)[0].strip_prefix(&[0xFF]).unwrap_or_default();
        let request: Value = serde_json::from_slice(first).unwrap_or_default();
        let Some(id) = request["arguments"]["id"].as_u64() else {
            return sent;
        };
        let _ = tx.send(Peer::SyncId(id));
        let _ = peer.write_all(&template(&bytes, id));
        if !held {
            let _ = peer.shutdown(Shutdown::Write);
        }
        let _ = tx.send(Peer::Written);
        let _ = peer.read_to_end(&mut sent);
        sent
    });

    let sync_bound = LONG;
    let got = timed("from_stream", sync_bound, || {
        Qga::from_stream(client, sync_bound)
    });
    let id = match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Peer::SyncId(id)) => id,
        _ => panic!("the client sent no readable guest-sync-delimited"),
    };
    let mut model = QgaModel::new(&template(data, id), held);
    let want = model.sync(id);
    let mut calls = 0;
    match (got, want) {
        (Err(e), want) => assert_eq!(Err(qga_why(e)), want, "sync"),
        (Ok(_), Err(w)) => panic!("sync succeeded, the model says {w:?}"),
        (Ok(mut qga), Ok(())) => {
            if held {
                // Short bounds from here on: all the bytes must be there first.
                let written = rx.recv_timeout(Duration::from_secs(10));
                assert!(
                    matches!(written, Ok(Peer::Written)),
                    "the agent never wrote"
                );
            }
            let bound = if held { SHORT } else { LONG };
            let commands = [
                ("guest-ping", None),
                ("guest-info", None),
                ("guest-exec-status", Some(json!({"pid": 7}))),
            ];
            for (cmd, args) in commands {
                let got = timed(cmd, bound, || qga.execute_within(cmd, args, bound));
                assert_eq!(got.map_err(qga_why), model.execute(), "{cmd}");
                calls += 1;
            }
        }
    }

    // What the client sent: 0xFF and the sync, then one command per line.
    let sent = agent.join().expect("the fake agent");
    let sent = lines(&sent);
    assert_eq!(sent.len(), 1 + calls, "requests sent vs calls made");
    assert_eq!(sent[0].first(), Some(&0xFF), "the sync starts with 0xFF");
    for line in &sent {
        let line = line.strip_prefix(&[0xFF]).unwrap_or(line);
        let v: Value = serde_json::from_slice(line).expect("the client sends JSON");
        assert!(v["execute"].is_string(), "no execute: {v}");
    }
    Corpus::Keep
}

/// The bare line reader: lines come back exactly, and only a pending line longer than the
/// cap is refused.
fn fuzz_lines(data: &[u8], held: bool) -> Corpus {
    let Some((&cap, data)) = data.split_first() else {
        return Corpus::Reject;
    };
    let cap = usize::from(cap) * 4;
    let (client, mut peer) = UnixStream::pair().expect("socketpair");
    peer.write_all(data)
        .expect("the input fits in the socket buffer");
    if !held {
        peer.shutdown(Shutdown::Write).expect("shutdown");
    }
    let bound = if held { SHORT } else { LONG };
    let mut conn = LineStream::new(client, cap);
    let mut want = data.split(|b| *b == b'\n').peekable();
    loop {
        let got = timed("read_line", bound, || {
            conn.read_line(Instant::now() + bound)
        });
        // What is left: the next complete line, or the last piece (no newline).
        let next = want.next().unwrap_or_default();
        let complete = want.peek().is_some();
        match got {
            Ok(line) => {
                assert!(complete, "a line without its newline: {line:?}");
                assert_eq!(line, next, "line");
            }
            Err(LineError::TooLarge) => {
                assert!(next.len() > cap, "{} bytes refused, cap {cap}", next.len());
                return Corpus::Keep;
            }
            Err(e) => {
                assert!(!complete, "{e:?} before the line {next:?}");
                assert!(
                    next.len() <= cap,
                    "{e:?}, not TooLarge: {} bytes",
                    next.len()
                );
                assert_eq!(
                    e,
                    if held {
                        LineError::Timeout
                    } else {
                        LineError::Closed
                    }
                );
                return Corpus::Keep;
            }
        }
    }
}

fn init() {
    // libFuzzer's main is not Rust's: SIGPIPE still kills. A write to a closed socket must be
    // an error instead.
    // SAFETY: setting a signal disposition to SIG_IGN before any thread runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

fuzz_target!(init: init(), |data: &[u8]| -> Corpus {
    let Some((&mode, rest)) = data.split_first() else {
        return Corpus::Reject;
    };
    if data.len() > MAX_INPUT {
        return Corpus::Reject;
    }
    let held = mode % 2 == 1;
    match mode % 6 / 2 {
        0 => fuzz_qmp(rest, held),
        1 => fuzz_agent(rest, held),
        _ => fuzz_lines(rest, held),
    }
});
