//! Lifetimes: when a VM ends by itself.
//!
//! A lifetime is a deadline (`ttl_s`, then `on_ttl`) and an idle limit (`idle_s`, then
//! `on_idle`), kept in the record. Sandboxes get one unless asked otherwise; launched VMs,
//! which may be a person's installs, get none. The watcher (`mcqemu watch`, one per state
//! folder, started here when needed) carries them out with no server running.
//!
//! What counts as activity is [`super::activity`]'s.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use serde_json::Map;

use crate::ops::error::OpError;
use crate::qemu::vm;
use crate::state::paths;

use super::activity::now_f;
pub use super::activity::{activity_file, busy, forward_ports, last_activity, touch, Seen};
use crate::state::record::{Lifetime, Record};
use crate::state::registry::RegistryError;

/// A sandbox's deadline unless asked otherwise: a day.
pub const SANDBOX_TTL_S: u64 = 24 * 3600;
/// A sandbox's idle limit unless asked otherwise: 15 minutes.
pub const SANDBOX_IDLE_S: u64 = 15 * 60;
/// A pooled clone's idle limit: it is kept busy by a server's pool keeper, and ends this long
/// after the last server that kept its pool is gone.
pub const POOL_IDLE_S: u64 = 10 * 60;
/// The longest lifetime or idle limit: 30 days.
pub const MAX_S: u64 = 30 * 24 * 3600;
/// The shortest idle limit: a call in progress is seen by the watcher through a touch each
/// second, so a shorter limit could end a VM in the middle of one.
pub const MIN_IDLE_S: u64 = 5;

/// What an end does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Stop QEMU; the record and disks stay.
    Stop,
    /// Save the sandbox to disk (sandbox_suspend); the next tool naming it resumes it.
    Suspend,
    /// Destroy the sandbox (sandbox_destroy).
    Destroy,
}

/// Every action's name, as [`Action::parse`] takes them.
pub const ACTIONS: [&str; 3] = ["stop", "suspend", "destroy"];

impl Action {
    /// The action named `s`.
    pub fn parse(s: &str) -> Result<Action, OpError> {
        match s {
            "stop" => Ok(Action::Stop),
            "suspend" => Ok(Action::Suspend),
            "destroy" => Ok(Action::Destroy),
            other => Err(OpError::invalid(format!(
                "unknown end action {other:?}; use stop, suspend or destroy"
            ))),
        }
    }

    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Stop => "stop",
            Action::Suspend => "suspend",
            Action::Destroy => "destroy",
        }
    }
}

/// What kind of VM a lifetime is for: its defaults and the actions it allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// launch_vm: no lifetime unless asked; only `stop` (its disks may be a person's).
    Launched,
    /// sandbox_vm, sandbox_fork, a clone: a day, and suspend after 15 idle minutes.
    Sandbox,
    /// A pooled clone not yet handed out: destroyed 10 minutes after no server keeps it.
    Pooled,
}

/// The kind of VM a record is.
pub fn kind_of(rec: &Record) -> Kind {
    if rec.pooled.is_some() {
        Kind::Pooled
    } else if rec.sandbox.as_ref().is_some_and(|s| s.overlay.is_some()) {
        Kind::Sandbox
    } else {
        Kind::Launched
    }
}

/// A caller's lifetime parameters; each None keeps the kind's default, 0 means none.
#[derive(Debug, Clone, Default)]
pub struct Asked {
    /// Seconds to live.
    pub ttl_s: Option<u64>,
    /// Seconds idle allowed.
    pub idle_s: Option<u64>,
    /// What idleness does.
    pub on_idle: Option<String>,
    /// What the deadline does.
    pub on_ttl: Option<String>,
}

/// The lifetime a VM of `kind` starts with (None: it lives until asked to end).
pub fn resolve(kind: Kind, asked: &Asked, now: i64) -> Result<Option<Lifetime>, OpError> {
    let (ttl, idle, on_idle, on_ttl) = match kind {
        Kind::Launched => (0, 0, Action::Stop, Action::Stop),
        Kind::Sandbox => (SANDBOX_TTL_S, SANDBOX_IDLE_S, Action::Suspend, Action::Stop),
        Kind::Pooled => (0, POOL_IDLE_S, Action::Destroy, Action::Destroy),
    };
    let ttl = checked_s("ttl_s", asked.ttl_s.unwrap_or(ttl))?;
    let idle = checked_idle(asked.idle_s.unwrap_or(idle))?;
    let on_idle = asked
        .on_idle
        .as_deref()
        .map_or(Ok(on_idle), Action::parse)?;
    let on_ttl = asked.on_ttl.as_deref().map_or(Ok(on_ttl), Action::parse)?;
    allowed(kind, on_idle, "on_idle")?;
    allowed(kind, on_ttl, "on_ttl")?;
    if ttl == 0 && idle == 0 {
        return Ok(None);
    }
    Ok(Some(Lifetime {
        ttl_s: (ttl > 0).then_some(ttl),
        deadline: (ttl > 0).then(|| now.saturating_add(ttl as i64)),
        on_ttl: (ttl > 0).then(|| on_ttl.as_str().to_string()),
        idle_s: (idle > 0).then_some(idle),
        on_idle: (idle > 0).then(|| on_idle.as_str().to_string()),
        since: Some(now),
        other: Map::new(),
    }))
}

/// An idle limit: 0 (none) or at least [`MIN_IDLE_S`].
fn checked_idle(s: u64) -> Result<u64, OpError> {
    if s > 0 && s < MIN_IDLE_S {
        return Err(OpError::invalid(format!(
            "idle_s {s} is shorter than {MIN_IDLE_S} s (a call in progress counts as activity \
             once a second); give {MIN_IDLE_S} or more, or 0 for no limit"
        )));
    }
    checked_s("idle_s", s)
}

fn checked_s(what: &str, s: u64) -> Result<u64, OpError> {
    if s > MAX_S {
        return Err(OpError::invalid(format!(
            "{what} {s} is more than 30 days ({MAX_S} s); use 0 for none"
        )));
    }
    Ok(s)
}

/// Refuses an action a kind may not take.
fn allowed(kind: Kind, a: Action, what: &str) -> Result<(), OpError> {
    if kind == Kind::Launched && a != Action::Stop {
        return Err(OpError::invalid(format!(
            "{what}: {:?} is for sandboxes only; a launched VM's disks may be a person's, so \
             it can only stop (use sandbox_vm for a disposable VM)",
            a.as_str()
        )));
    }
    Ok(())
}

// ---- what the tools show

crate::described! {
    /// A lifetime as list_vms, vm_info and vm_lifetime show it (in this order).
    #[derive(Debug, Clone, Serialize, PartialEq)]
    pub struct Shown {
        /// Seconds to live as given.
        pub ttl_s: Option<u64>,
        /// When it ends (ISO 8601, UTC).
        pub deadline: Option<String>,
        /// Seconds left until the deadline (negative once past).
        pub expires_in_s: Option<i64>,
        /// What the deadline does.
        pub on_ttl: Option<String>,
        /// Seconds of idleness allowed.
        pub idle_s: Option<u64>,
        /// What idleness does.
        pub on_idle: Option<String>,
        /// Seconds since its last activity.
        pub idle_for_s: Option<u64>,
        /// Seconds of idleness left (0 while it is being ended).
        pub idle_left_s: Option<u64>,
        /// Its last activity (ISO 8601, UTC) and what it was.
        pub last_activity: Option<String>,
        /// What its last activity was.
        pub last_activity_by: Option<&'static str>,
        /// What keeps it from idling now (a hold, a background process).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub busy: Option<String>,
    }
}

/// VM `name`'s lifetime as shown; the idle clock only while it runs.
pub fn shown(
    name: &str,
    rec: &Record,
    running: bool,
    tcp: Option<&HashMap<u16, Duration>>,
) -> Option<Shown> {
    let l = rec.lifetime.as_ref()?;
    let now = crate::clock::now_secs();
    let idle = l.idle_s.filter(|_| running).map(|idle_s| {
        let seen = last_activity(name, rec, tcp);
        let idle_for = (now_f() - seen.at).max(0.0) as u64;
        (idle_s, idle_for, seen)
    });
    Some(Shown {
        ttl_s: l.ttl_s,
        deadline: l.deadline.map(crate::clock::iso8601),
        expires_in_s: l.deadline.map(|d| d.saturating_sub(now)),
        on_ttl: l.on_ttl.clone(),
        idle_s: l.idle_s,
        on_idle: l.on_idle.clone(),
        idle_for_s: idle.as_ref().map(|i| i.1),
        idle_left_s: idle.as_ref().map(|i| i.0.saturating_sub(i.1)),
        last_activity: idle.as_ref().map(|i| crate::clock::iso8601(i.2.at as i64)),
        last_activity_by: idle.as_ref().map(|i| i.2.what),
        busy: busy(rec).filter(|_| running),
    })
}

/// vm_lifetime's change to a VM's lifetime; each None leaves that part as it is.
#[derive(Debug, Clone, Default)]
pub struct Change {
    /// A new deadline this many seconds from now (0: none).
    pub ttl_s: Option<u64>,
    /// Move the deadline this many seconds later.
    pub extend_s: Option<u64>,
    /// A new idle limit (0: none); the idle clock starts again.
    pub idle_s: Option<u64>,
    /// What idleness does.
    pub on_idle: Option<String>,
    /// What the deadline does.
    pub on_ttl: Option<String>,
    /// Drop the whole lifetime: the VM lives until asked to end.
    pub clear: bool,
}

crate::described! {
    /// vm_lifetime's result.
    #[derive(Debug, Clone, serde::Serialize)]
    pub struct Changed {
        /// The VM.
        pub name: String,
        /// When it ends by itself now (null: it lives until asked to end).
        pub lifetime: Option<Shown>,
    }
}

/// vm_lifetime: [`change`], with the VM's name.
pub fn apply(name: &str, c: &Change) -> Result<Changed, OpError> {
    Ok(Changed {
        name: name.to_string(),
        lifetime: change(name, c)?,
    })
}

/// Changes VM `name`'s lifetime under the registry lock (a change of nothing only reads it);
/// returns it as shown.
pub fn change(name: &str, c: &Change) -> Result<Option<Shown>, OpError> {
    let reads_only = !c.clear
        && c.ttl_s.is_none()
        && c.extend_s.is_none()
        && c.idle_s.is_none()
        && c.on_idle.is_none()
        && c.on_ttl.is_none();
    if reads_only {
        let rec = crate::ops::vm::records::lookup(name)?;
        let running = vm::measure_process(&rec).is_none_or(|m| m.alive());
        return Ok(shown(name, &rec, running, None));
    }
    let n = name.to_string();
    let c2 = c.clone();
    let now = crate::clock::now_secs();
    let rec = crate::state::registry::shared().update(move |vms| {
        let r = vms.get_mut(&n).ok_or_else(|| {
            OpError::not_found(format!("no VM named {n:?}; list_vms shows the known VMs"))
        })?;
        r.lifetime = changed(kind_of(r), r.lifetime.clone(), &c2, now)?;
        Ok::<_, OpError>(r.clone())
    })?;
    if rec.lifetime.is_some() {
        ensure_watcher();
    }
    let running = vm::measure_process(&rec).is_none_or(|m| m.alive());
    Ok(shown(name, &rec, running, None))
}

/// `old` with change `c` made, for a VM of `kind`, at `now`.
pub fn changed(
    kind: Kind,
    old: Option<Lifetime>,
    c: &Change,
    now: i64,
) -> Result<Option<Lifetime>, OpError> {
    if c.clear {
        return Ok(None);
    }
    let mut l = old.unwrap_or_default();
    if let Some(t) = c.ttl_s {
        let t = checked_s("ttl_s", t)?;
        l.ttl_s = (t > 0).then_some(t);
        l.deadline = (t > 0).then(|| now.saturating_add(t as i64));
    }
    if let Some(e) = c.extend_s {
        let e = checked_s("extend_s", e)?;
        let Some(d) = l.deadline else {
            return Err(OpError::invalid(
                "extend_s moves a deadline, and this VM has none; set ttl_s instead",
            ));
        };
        l.deadline = Some(d.max(now).saturating_add(e as i64));
        l.ttl_s = Some(l.ttl_s.unwrap_or(0).saturating_add(e));
    }
    if let Some(i) = c.idle_s {
        let i = checked_idle(i)?;
        l.idle_s = (i > 0).then_some(i);
    }
    let fallback = resolve(kind, &Asked::default(), now)?.unwrap_or_default();
    let pick = |asked: &Option<String>, have: &Option<String>, dflt: &Option<String>| {
        asked
            .clone()
            .or_else(|| have.clone())
            .or_else(|| dflt.clone())
            .unwrap_or_else(|| "stop".into())
    };
    let on_idle = pick(&c.on_idle, &l.on_idle, &fallback.on_idle);
    let on_ttl = pick(&c.on_ttl, &l.on_ttl, &fallback.on_ttl);
    allowed(kind, Action::parse(&on_idle)?, "on_idle")?;
    allowed(kind, Action::parse(&on_ttl)?, "on_ttl")?;
    l.on_idle = l.idle_s.map(|_| on_idle);
    l.on_ttl = l.deadline.map(|_| on_ttl);
    l.since = Some(now);
    if l.deadline.is_none() && l.idle_s.is_none() {
        return Ok(None);
    }
    Ok(Some(l))
}

// ---- the watcher's start

/// The lock a state folder's watcher holds while it runs.
pub fn watcher_lock() -> PathBuf {
    paths::state_dir().join("watcher.lock")
}

/// Starts this state folder's watcher unless one runs (its lock is held). Called after a
/// lifetime is written and when a server starts; cheap when one runs. Returns its PID when
/// one was started.
pub fn ensure_watcher() -> Option<u32> {
    let lock = watcher_lock();
    match crate::state::lockfile::try_lock(&lock) {
        Ok(Some(free)) => drop(free),
        Ok(None) => return None,
        Err(e) => {
            crate::log::stderr(
                "warn",
                &format!(
                    "cannot check the lifetime watcher's lock {}: {e}",
                    lock.display()
                ),
            );
            return None;
        }
    }
    match spawn_watcher() {
        Ok(pid) => Some(pid),
        Err(e) => {
            crate::log::stderr(
                "warn",
                &format!("cannot start the lifetime watcher (VMs will not end on time): {e}"),
            );
            None
        }
    }
}

/// Starts `mcqemu watch` detached (its own session, stdin and stdout on /dev/null, stderr
/// appended to `watcher.log`), reaped by a thread of this process while it runs.
fn spawn_watcher() -> Result<u32, OpError> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe()
        .map_err(|e| OpError::host(format!("cannot find mcqemu's binary: {e}")))?;
    let state = paths::state_dir();
    std::fs::create_dir_all(&state)
        .map_err(|e| OpError::host(format!("{}: {e}", state.display())))?;
    let log_path = state.join("watcher.log");
    if std::fs::metadata(&log_path).is_ok_and(|m| m.len() > 1 << 20) {
        let _ = std::fs::rename(&log_path, state.join("watcher.log.1"));
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| OpError::host(format!("{}: {e}", log_path.display())))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("watch")
        .arg("--state")
        .arg(&state)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log);
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| OpError::host(format!("cannot start the watcher: {e}")))?;
    let pid = child.id();
    let _ = std::thread::Builder::new()
        .name("watcher-reaper".into())
        .spawn(move || {
            let _ = child.wait();
        });
    Ok(pid)
}

/// Clears a record's end and intent and restarts its idle clock: its QEMU runs (again).
pub fn running_again(r: &mut Record, now: i64) {
    r.end = None;
    r.ending = None;
    if let Some(l) = r.lifetime.as_mut() {
        l.since = Some(now);
    }
}

/// Writes `lifetime` into VM `name`'s record (a pooled clone handed out, say) and starts the
/// watcher when there is one to keep.
pub fn set(name: &str, lifetime: Option<Lifetime>) -> Result<(), OpError> {
    let n = name.to_string();
    let has = lifetime.is_some();
    crate::state::registry::shared().update(move |vms| {
        if let Some(r) = vms.get_mut(&n) {
            r.lifetime = lifetime;
        }
        Ok::<_, RegistryError>(())
    })?;
    if has {
        ensure_watcher();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_get_their_defaults_and_allowed_actions() {
        let now = 1000;
        assert_eq!(
            resolve(Kind::Launched, &Asked::default(), now).unwrap(),
            None
        );
        let s = resolve(Kind::Sandbox, &Asked::default(), now)
            .unwrap()
            .unwrap();
        assert_eq!(s.deadline, Some(now + SANDBOX_TTL_S as i64));
        assert_eq!(s.on_idle.as_deref(), Some("suspend"));
        let asked = Asked {
            idle_s: Some(5),
            on_idle: Some("destroy".into()),
            ttl_s: Some(0),
            ..Asked::default()
        };
        let s = resolve(Kind::Sandbox, &asked, now).unwrap().unwrap();
        assert_eq!((s.deadline, s.idle_s), (None, Some(5)));
        let bad = Asked {
            idle_s: Some(5),
            on_idle: Some("suspend".into()),
            ..Asked::default()
        };
        let e = resolve(Kind::Launched, &bad, now).unwrap_err();
        assert!(e.msg.contains("sandboxes only"), "{}", e.msg);
        let too_long = Asked {
            ttl_s: Some(MAX_S + 1),
            ..Asked::default()
        };
        assert!(resolve(Kind::Sandbox, &too_long, now).is_err());
        let too_short = Asked {
            idle_s: Some(MIN_IDLE_S - 1),
            ..Asked::default()
        };
        let e = resolve(Kind::Sandbox, &too_short, now).unwrap_err();
        assert!(e.msg.contains("shorter than"), "{}", e.msg);
        assert!(Action::parse("explode").is_err());
    }

    #[test]
    fn changes_extend_set_and_clear() {
        let now = 1000;
        let l = resolve(Kind::Sandbox, &Asked::default(), now).unwrap();
        let ext = Change {
            extend_s: Some(60),
            ..Change::default()
        };
        let l2 = changed(Kind::Sandbox, l.clone(), &ext, now + 10)
            .unwrap()
            .unwrap();
        assert_eq!(l2.deadline, Some(now + SANDBOX_TTL_S as i64 + 60));
        assert_eq!(l2.since, Some(now + 10));
        let clear = Change {
            clear: true,
            ..Change::default()
        };
        assert_eq!(
            changed(Kind::Sandbox, l.clone(), &clear, now).unwrap(),
            None
        );
        let none = Change {
            ttl_s: Some(0),
            idle_s: Some(0),
            ..Change::default()
        };
        assert_eq!(changed(Kind::Sandbox, l, &none, now).unwrap(), None);
        let e = changed(Kind::Launched, None, &ext, now).unwrap_err();
        assert!(e.msg.contains("has none"), "{}", e.msg);
        let set = Change {
            idle_s: Some(30),
            ..Change::default()
        };
        let l3 = changed(Kind::Launched, None, &set, now).unwrap().unwrap();
        assert_eq!((l3.idle_s, l3.on_idle.as_deref()), (Some(30), Some("stop")));
    }
}
