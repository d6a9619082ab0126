//! What counts as a VM's activity, for its idle clock: a tool call that names the VM (the
//! call path touches its activity file, every second while the call runs), an open live view
//! or a person's hold, data moving through its port forwards (the kernel's own clocks of each
//! connection) or its egress proxy, and a background process started by guest_exec that has
//! not been seen to end.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crate::qemu::vm;
use crate::state::record::Record;

/// The file whose modification time is the VM's last tool call.
pub fn activity_file(name: &str) -> PathBuf {
    vm::runtime_dir(name).join("active")
}

/// Notes activity on VM `name` now (a tool call named it). Best effort and cheap: one
/// open and one timestamp, only where its runtime folder exists.
pub fn touch(name: &str) {
    if !crate::state::registry::valid_name(name) {
        return;
    }
    let path = activity_file(name);
    if !path.parent().is_some_and(|d| d.is_dir()) {
        return;
    }
    crate::state::paths::touch(&path);
}

/// When a VM was last active, and through what.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    /// Seconds since the epoch.
    pub at: f64,
    /// What it was: `start`, `tool call`, `port forward`, `egress`.
    pub what: &'static str,
}

fn mtime_secs(p: &std::path::Path) -> Option<f64> {
    let m = std::fs::metadata(p).ok()?.modified().ok()?;
    Some(m.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_secs_f64())
}

/// When a tool call last touched VM `name` (seconds since the epoch), if one did.
pub fn touched_at(name: &str) -> Option<f64> {
    mtime_secs(&activity_file(name))
}

/// Seconds since the epoch, with a fraction.
pub fn now_f() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The host ports of a VM's TCP forwards.
pub fn forward_ports(rec: &Record) -> Vec<u16> {
    vm::forwards(rec).iter().map(|f| f.host).collect()
}

/// VM `name`'s last activity: the latest of its lifetime's start, its last tool call, data on
/// its forwards (`tcp`: per host port, how long ago; asked here when None) and its egress
/// proxy's counters.
pub fn last_activity(name: &str, rec: &Record, tcp: Option<&HashMap<u16, Duration>>) -> Seen {
    let since = rec.lifetime.as_ref().and_then(|l| l.since).unwrap_or(0) as f64;
    let mut seen = Seen {
        at: since,
        what: "start",
    };
    let mut consider = |at: Option<f64>, what: &'static str| {
        if let Some(at) = at.filter(|a| *a > seen.at) {
            seen = Seen { at, what };
        }
    };
    consider(touched_at(name), "tool call");
    consider(
        mtime_secs(&vm::state_dir(name).join(crate::net::egress::stats::FILE)),
        "egress",
    );
    let ports = forward_ports(rec);
    if !ports.is_empty() {
        let asked;
        let tcp = match tcp {
            Some(t) => t,
            None => {
                asked = crate::host::tcp_diag::last_data_by_port(&ports).unwrap_or_default();
                &asked
            }
        };
        let now = now_f();
        let latest = ports.iter().filter_map(|p| tcp.get(p)).min();
        consider(latest.map(|d| now - d.as_secs_f64()), "port forward");
    }
    seen
}

/// What keeps a VM from idling however long ago its last activity was: a person's hold (the
/// live view's takeover), or a background process not seen to end.
pub fn busy(rec: &Record) -> Option<String> {
    if rec.hold.is_some() {
        return Some("a person holds it (live view takeover)".into());
    }
    let running: Vec<&String> = rec
        .background
        .iter()
        .flatten()
        .filter(|(_, b)| b.ended.is_none())
        .map(|(h, _)| h)
        .collect();
    if !running.is_empty() {
        return Some(format!(
            "background process(es) {} not seen to end",
            running
                .iter()
                .map(|h| h.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    None
}
