//! Carrying out an end, through the tools' own operations: the intent is written first (so the
//! VM's supervisor records the right reason), then sandbox_suspend's, stop_vm's or
//! sandbox_destroy's code runs, each end on a thread of its own so that one slow guest does
//! not hold up the others. A suspend that is refused (a VM with mounts cannot be saved) stops
//! the VM instead.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::ops::sandbox::{destroy, suspend};
use crate::ops::vm::activity;
use crate::ops::vm::ends;
use crate::ops::vm::lifetime::Action;
use crate::ops::vm::stop;
use crate::ops::work::Detached;
use crate::state::record::Record;

/// How long a stop waits for the guest to power off before it ends QEMU.
const GRACEFUL: Duration = Duration::from_secs(10);
/// How long after a failed end the watcher tries again.
const RETRY: Duration = Duration::from_secs(60);

/// The action that destroys.
pub const DESTROY: Action = Action::Destroy;

/// The action a lifetime names; a record edited by hand to nonsense stops.
pub fn action(name: Option<&str>) -> Action {
    name.and_then(|n| Action::parse(n).ok())
        .unwrap_or(Action::Stop)
}

/// The VMs being ended now, and those whose end failed lately.
#[derive(Default)]
pub struct Ending {
    names: Arc<Mutex<HashSet<String>>>,
    failed: Arc<Mutex<HashMap<String, Instant>>>,
}

impl Ending {
    /// True while VM `name`'s end runs, and for a while after it failed (a wedged VM is not
    /// tried every second).
    pub fn is_ending(&self, name: &str) -> bool {
        let failed_lately = self
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .is_some_and(|t| t.elapsed() < RETRY);
        failed_lately
            || self
                .names
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(name)
    }

    /// True while any end runs: the watcher does not exit under one.
    pub fn any(&self) -> bool {
        !self
            .names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Ends VM `name` by `action` on a thread of its own, for `reason` (for idleness, with
    /// its limit `idle_s`: checked once more against the record before anything is done).
    pub fn start(
        &self,
        name: &str,
        rec: &Record,
        action: Action,
        reason: &str,
        detail: String,
        idle_s: Option<u64>,
    ) {
        self.names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string());
        let (names, name, rec, reason) = (
            self.names.clone(),
            name.to_string(),
            rec.clone(),
            reason.to_string(),
        );
        let failed = self.failed.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("end-{name}"))
            .spawn({
                let (names, name) = (names.clone(), name.clone());
                move || {
                    let ok = end(&name, &rec, action, &reason, &detail, idle_s);
                    let mut f = failed.lock().unwrap_or_else(|p| p.into_inner());
                    if ok {
                        f.remove(&name);
                    } else {
                        f.insert(name.clone(), Instant::now());
                    }
                    drop(f);
                    names
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&name);
                }
            });
        if spawned.is_err() {
            names
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&name);
        }
    }
}

/// True when record `r` is still due to end for `reason` now: the watcher decided from a look
/// a moment ago, and since then a person may have taken it over, a tool call may have used it,
/// or vm_lifetime may have moved its limits.
fn still_due(name: &str, r: &Record, reason: &str, idle_s: Option<u64>) -> bool {
    let Some(l) = &r.lifetime else {
        return false;
    };
    let now = crate::clock::now_secs();
    match (reason, idle_s) {
        (ends::TTL, _) => r.hold.is_none() && l.deadline.is_some_and(|d| d <= now),
        (_, Some(limit)) => {
            let touched = activity::touched_at(name).unwrap_or(0.0);
            let latest = touched.max(l.since.unwrap_or(0) as f64);
            r.hold.is_none()
                && l.idle_s == Some(limit)
                && activity::now_f() - latest >= limit as f64 - 0.5
        }
        _ => false,
    }
}

/// Ends VM `name` by `action`, for `reason`, and says how it went on stderr; false when it
/// could not.
fn end(
    name: &str,
    rec: &Record,
    action: Action,
    reason: &str,
    detail: &str,
    idle_s: Option<u64>,
) -> bool {
    let why = format!("{detail}; on_{reason}: {}", action.as_str());
    let intent = ends::end(reason, Some("watcher"), why.clone());
    // Checked and the intent written under one registry lock: a hold taken, a call made or a
    // lifetime changed since the look wins.
    if !ends::intend_if(name, intent.clone(), |r| still_due(name, r, reason, idle_s)) {
        crate::log::stderr(
            "info",
            &format!("VM {name} is no longer due to end ({reason}); left running"),
        );
        return true;
    }
    crate::log::stderr("notice", &format!("ending VM {name}: {why}"));
    let ctx = Detached;
    let sandbox = rec.sandbox.is_some();
    let outcome = match action {
        Action::Suspend if sandbox => match suspend::suspend(&ctx, name) {
            Ok(s) => {
                // Said at once, not left to its supervisor: the next tool call resumes it only
                // when it reads that idleness suspended it.
                ends::set_end(name, intent.clone());
                Ok(format!("suspended to {}", s.path))
            }
            Err(e) => {
                crate::log::stderr(
                    "warn",
                    &format!("VM {name} cannot be suspended ({e}); it is stopped instead"),
                );
                stop_it(name)
            }
        },
        Action::Destroy if sandbox => match destroy::destroy(&ctx, name) {
            Ok(d) if d.destroyed => {
                // Its record is gone with it: the end is said here, not by its supervisor.
                ends::log_end(name, &intent);
                Ok("destroyed".into())
            }
            Ok(d) => Err(format!("not all destroyed: {}", d.errors.join("; "))),
            Err(e) => Err(e.to_string()),
        },
        _ => stop_it(name),
    };
    match outcome {
        Ok(how) => {
            crate::log::stderr("notice", &format!("VM {name}: {how}"));
            true
        }
        Err(e) => {
            ends::withdraw(name);
            crate::log::stderr(
                "error",
                &format!(
                    "VM {name} could not be ended: {e}; tried again in {} s",
                    RETRY.as_secs()
                ),
            );
            false
        }
    }
}

/// stop_vm's stop: the guest powered off (10 s), else QEMU ended.
fn stop_it(name: &str) -> Result<String, String> {
    let ctx = Detached;
    match stop::stop(&ctx, name, false, GRACEFUL) {
        Ok(s) => Ok(format!("stopped ({})", s.method)),
        Err(_) => stop::stop(&ctx, name, true, GRACEFUL)
            .map(|s| format!("stopped ({})", s.method))
            .map_err(|e| e.to_string()),
    }
}
