//! vm_screen_wait: polls a VM's screen until it differs from a baseline (the screen this
//! server last returned for the VM, or a given digest) and then holds still, and returns it.
//!
//! Each poll is one short monitor session (the VM's status and a screendump into a memory
//! file, as vm_screenshot), so keys and clicks sent meanwhile are not held up; frames are told
//! apart by a digest of their raw pixels ([`Frame::digest`]), and only the final one is scaled
//! and encoded. The decisions (changed, settled, a blink) are [`crate::ops::screen::watch`]'s.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ops::error::OpError;
use crate::ops::screen::memory as screen_memory;
use crate::ops::screen::watch::{Verdict, Watch};
use crate::ops::screen::{self, Capture};
use crate::ops::session;
use crate::ops::work::Work;
use crate::qemu::qmp::{self, QmpError};
use crate::qemu::screen::{Bounds, CaptureError, Frame, Rect};
use crate::qemu::vm;
use crate::state::registry::Record;

/// Time from one poll's start to the next.
pub const POLL: Duration = Duration::from_millis(100);

/// Longest wait a call may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(600);

/// Captures in a row that may fail on the host's side before the wait fails.
const MAX_FAILED_POLLS: u32 = 3;

/// Longest one poll's monitor session may take (a frozen QEMU ends the wait after it).
const POLL_BUDGET: Duration = Duration::from_secs(10);

/// What to wait for.
#[derive(Debug, Clone)]
pub struct WaitRequest {
    /// How long the changed screen must hold still.
    pub stable_ms: u64,
    /// The longest wait (at most [`MAX_TIMEOUT`]).
    pub timeout: Duration,
    /// Only this part of the screen counts.
    pub region: Option<Rect>,
    /// The baseline's digest (a `hash` a screenshot reported) instead of the last screen
    /// returned.
    pub since: Option<u64>,
    /// Bounds of the returned image (as vm_screenshot's).
    pub bounds: Bounds,
}

/// How a wait ended (a timeout included: it is an answer, with its reason).
pub struct WaitOutcome {
    /// The final screen.
    pub capture: Capture,
    /// The screen differs from the baseline.
    pub changed: bool,
    /// It held still for the stable time (false: it was still changing at the timeout).
    pub stable: bool,
    /// From the call's start to the final frame.
    pub waited_ms: u64,
    /// Screens captured.
    pub polls: u32,
    /// Why the wait ended without a settled change, or `None`.
    pub reason: Option<String>,
}

crate::described! {
    /// vm_screen_wait's result (in this order); the PNG goes beside it.
    #[derive(Debug, Clone, serde::Serialize)]
    pub struct Settled {
        /// The VM.
        pub name: String,
        /// The screen differs from the baseline.
        pub changed: bool,
        /// It held still for stable_ms.
        pub stable: bool,
        /// From the call's start to the final frame.
        pub waited_ms: u64,
        /// Screens captured.
        pub polls: u32,
        /// The final screen.
        #[serde(flatten)]
        pub picture: screen::Picture,
        /// Why it ended without a settled change.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub reason: Option<String>,
    }
}

/// vm_screen_wait: VM `name`'s screen once it changed and held still (or as it is at the
/// timeout), and its PNG.
pub fn settle(
    work: &dyn Work,
    name: &str,
    req: &WaitRequest,
) -> Result<(Settled, Vec<u8>), OpError> {
    let rec = crate::ops::vm::records::lookup_live(name, "launch it first")?;
    let got = wait(work, name, &rec, req)?;
    let WaitOutcome {
        capture: cap,
        changed,
        stable,
        waited_ms,
        polls,
        reason,
    } = got;
    let out = Settled {
        name: name.to_string(),
        changed,
        stable,
        waited_ms,
        polls,
        picture: screen::Picture::of(&cap),
        reason,
    };
    Ok((out, cap.shot.png.data))
}

/// The baseline digests (of `region` when given): from `since` or the screen last returned.
/// Empty: nothing was returned yet, and the first frame polled is the baseline.
fn baseline(name: &str, req: &WaitRequest) -> Result<Vec<u64>, OpError> {
    let seen = screen_memory::recall(name);
    let knows = |h: u64| {
        seen.as_ref()
            .is_some_and(|s| s.frames.iter().any(|f| f.0 == h))
    };
    let digests = |r: Option<Rect>| -> Vec<u64> {
        seen.iter()
            .flat_map(|s| s.frames.iter().map(|(_, f)| f.digest(r)))
            .collect()
    };
    match (req.since, req.region) {
        (None, region) => Ok(digests(region)),
        (Some(h), region) if knows(h) => Ok(digests(region)),
        (Some(h), None) => Ok(vec![h]),
        (Some(h), Some(_)) => Err(OpError::invalid(format!(
            "since {} is not the last screen this server returned for VM {name:?}, so its \
             region cannot be compared; call vm_screenshot and pass its hash, or leave since out",
            screen::hash_text(h)
        ))),
    }
}

/// One poll: the VM's run state (`status`, `running`) and its screen, in one session bounded
/// by `budget`.
fn poll(name: &str, rec: &Record, budget: Duration) -> Result<(String, bool, Frame), CaptureError> {
    let dir = vm::state_dir(name);
    let deadline = Instant::now() + budget;
    qmp::with_session_within(&vm::qmp_socket(rec), budget, |q| {
        let st = q.query_status_within(budget.min(qmp::COMMAND_TIMEOUT))?;
        let frame = crate::qemu::screen::capture_by(q, &dir, Some(deadline))?;
        Ok((st.status, st.running, frame))
    })
}

/// Why a poll failed, in terms of the VM and of the wait.
fn explain(name: &str, rec: &Record, e: CaptureError, waited: Duration) -> OpError {
    let waited = waited.as_secs_f64();
    match e {
        CaptureError::Qmp(QmpError::NoGreeting | QmpError::Timeout(_))
            if vm::pid(rec).is_some_and(crate::qemu::process::alive) =>
        {
            OpError::busy(format!(
                "VM {name:?}: QEMU did not answer its monitor within {} s (frozen, overloaded, \
                 or another call holds the monitor); the screen wait ended after {waited:.1} s. \
                 Retry, see vm_info, or stop_vm with force=true",
                POLL_BUDGET.as_secs()
            ))
        }
        CaptureError::Qmp(e) => OpError::host(session::explain_qmp(name, rec, &e)),
        other => OpError::host(format!("screenshot of {name:?} failed: {other}")),
    }
}

/// The error for a VM that is not running: its screen cannot change.
fn not_running(name: &str, status: &str) -> OpError {
    let next = if status == "paused" {
        "vm_resume it, then wait again"
    } else {
        "see vm_info; vm_screenshot shows the screen as it is"
    };
    OpError::invalid(format!(
        "VM {name:?} is {status}, not running: its screen cannot change, so there is nothing \
         to wait for; {next}"
    ))
}

/// Waits as `req` says; see the module doc. Fails at once when the VM is not running (paused
/// included), and when its QEMU stops answering; a timeout is an outcome with its reason.
pub fn wait(
    work: &dyn Work,
    name: &str,
    rec: &Record,
    req: &WaitRequest,
) -> Result<WaitOutcome, OpError> {
    let started = Instant::now();
    let deadline = started + req.timeout.min(MAX_TIMEOUT);
    let mut watch = Watch::new(baseline(name, req)?, req.stable_ms);
    // The latest distinct frames (region digest, frame), newest last: what a settled set is.
    let mut recent: VecDeque<(u64, Arc<Frame>)> = VecDeque::new();
    let mut polls = 0u32;
    let mut failed = 0u32;
    loop {
        work.check_cancel()?;
        let tick = Instant::now();
        let budget = deadline
            .saturating_duration_since(tick)
            .clamp(Duration::from_secs(1), POLL_BUDGET);
        let (status, running, frame) = match poll(name, rec, budget) {
            Ok(got) => {
                failed = 0;
                got
            }
            // A capture that failed on this host's side (not the monitor's): the next poll
            // takes another.
            Err(CaptureError::Io(e)) if failed < MAX_FAILED_POLLS => {
                failed += 1;
                work.log(
                    "warning",
                    &format!("screen wait on {name:?}: {e}; polling again"),
                );
                std::thread::sleep(POLL);
                continue;
            }
            Err(e) => return Err(explain(name, rec, e, started.elapsed())),
        };
        polls += 1;
        if !running {
            return Err(not_running(name, &status));
        }
        let digest = frame.digest(req.region);
        let frame = Arc::new(frame);
        keep_recent(&mut recent, digest, &frame);
        let at_ms = started.elapsed().as_millis() as u64;
        if let Verdict::Settled(set) = watch.observe(at_ms, digest) {
            let frames = set
                .iter()
                .filter_map(|d| recent.iter().find(|(r, _)| r == d).map(|(_, f)| f.clone()))
                .collect();
            return outcome(name, frames, req, (true, true, at_ms, polls), None);
        }
        let now = Instant::now();
        if now >= deadline {
            let (changed, stable, reason) = timed_out(&watch, digest, req);
            let facts = (changed, stable, at_ms, polls);
            return outcome(name, vec![frame], req, facts, Some(reason));
        }
        let said = if watch.moved() {
            "the screen changed; waiting for it to hold still"
        } else {
            "waiting for the screen to change"
        };
        work.progress(
            started.elapsed().as_secs_f64(),
            Some(req.timeout.as_secs_f64()),
            said,
        );
        let next = (tick + POLL).min(deadline);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

/// Keeps `frame` (region digest `digest`) among the latest 3 distinct frames, newest last.
fn keep_recent(recent: &mut VecDeque<(u64, Arc<Frame>)>, digest: u64, frame: &Arc<Frame>) {
    if recent.back().is_none_or(|(d, _)| *d != digest) {
        recent.retain(|(d, _)| *d != digest);
        recent.push_back((digest, frame.clone()));
        if recent.len() > 3 {
            recent.pop_front();
        }
    }
}

/// (changed, stable, reason) of a wait that timed out on a frame with digest `digest`.
fn timed_out(watch: &Watch, digest: u64, req: &WaitRequest) -> (bool, bool, String) {
    let moved = watch.moved();
    let changed = moved && !watch.baseline().contains(&digest);
    let secs = req.timeout.as_secs_f64();
    let reason = if moved {
        format!(
            "the screen changed but did not hold still for {} ms within {secs} s",
            req.stable_ms
        )
    } else {
        format!("the screen did not change within {secs} s")
    };
    (changed, !moved, reason)
}

/// The outcome from the final `frames` (the returned one first), remembered as the VM's
/// last returned screen; `facts` are (changed, stable, waited_ms, polls).
fn outcome(
    name: &str,
    frames: Vec<Arc<Frame>>,
    req: &WaitRequest,
    facts: (bool, bool, u64, u32),
    reason: Option<String>,
) -> Result<WaitOutcome, OpError> {
    let first = frames
        .first()
        .cloned()
        .ok_or_else(|| OpError::host("internal: a settled screen without its frame"))?;
    let capture = screen::finish(first, &req.bounds)
        .map_err(|e| OpError::host(format!("screenshot of {name:?} failed: {e}")))?;
    screen_memory::remember(name, frames);
    let (changed, stable, waited_ms, polls) = facts;
    Ok(WaitOutcome {
        capture,
        changed,
        stable,
        waited_ms,
        polls,
        reason,
    })
}
