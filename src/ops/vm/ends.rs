//! Why a VM ended. Whoever ends a QEMU on purpose (stop_vm, sandbox_suspend, the watcher)
//! writes its intent into the record first (`ending`); QEMU's supervisor, its parent, sees the
//! exit status when it ends and writes the reason (`end`): the intent when there is a fresh
//! one, else what the status, QEMU's last words and the OOM killer's count say. A line per end
//! goes to `ends.log` in the state folder.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use serde_json::Map;

use crate::qemu::process::supervisor_lock;
use crate::state::record::{text, End, Record};
use crate::state::registry::RegistryError;
use crate::state::{lockfile, paths};

/// How long an intent stays fresh: longer than any stop waits.
const INTENT_FRESH_S: i64 = 900;
/// Largest `ends.log` before it is rotated to `ends.log.1`.
const LOG_MAX: u64 = 1 << 20;

/// Why-words, one per kind of end.
pub const ASKED: &str = "asked";
/// The deadline passed.
pub const TTL: &str = "ttl";
/// Idle too long.
pub const IDLE: &str = "idle";
/// The guest powered itself off (QEMU exited 0 on its own).
pub const GUEST_POWEROFF: &str = "guest_poweroff";
/// QEMU died of a fault, or exited with an error.
pub const CRASHED: &str = "crashed";
/// The host's OOM killer.
pub const OOM: &str = "oom";
/// A signal from outside mcqemu.
pub const KILLED: &str = "killed";

/// An end as intended or seen, ready for the record.
pub fn end(reason: &str, tool: Option<&str>, detail: impl Into<String>) -> End {
    End {
        reason: Some(reason.to_string()),
        tool: tool.map(str::to_string),
        detail: Some(detail.into()).filter(|d: &String| !d.is_empty()),
        at: Some(crate::clock::now_secs()),
        exit_code: None,
        signal: None,
        other: Map::new(),
    }
}

/// Writes VM `name`'s intent to end now (before its QEMU is told). Best effort: a registry
/// that cannot be written loses only the reason.
pub fn intend(name: &str, intent: End) {
    intend_if(name, intent, |_| true);
}

/// Writes VM `name`'s intent to end when `due` says its record still is, under one registry
/// lock; false when it is not (or is gone, or the registry could not be written: logged).
pub fn intend_if(name: &str, intent: End, due: impl FnOnce(&Record) -> bool) -> bool {
    let n = name.to_string();
    let written = crate::state::registry::shared().update(move |vms| {
        let Some(r) = vms.get_mut(&n) else {
            return Ok::<_, RegistryError>(false);
        };
        if !due(r) {
            return Ok(false);
        }
        r.ending = Some(intent);
        Ok(true)
    });
    written.unwrap_or_else(|e| {
        crate::log::stderr("warn", &format!("VM {name}: cannot write why it ends: {e}"));
        false
    })
}

/// Writes VM `name`'s end at once (its QEMU is gone and no supervisor will say more, or is
/// too late to): the watcher's suspends.
pub fn set_end(name: &str, e: End) {
    let n = name.to_string();
    let written = crate::state::registry::shared().update(move |vms| {
        if let Some(r) = vms.get_mut(&n) {
            r.ending = None;
            r.end = Some(e);
        }
        Ok::<_, RegistryError>(())
    });
    if let Err(e) = written {
        crate::log::stderr(
            "warn",
            &format!("VM {name}: cannot write why it ended: {e}"),
        );
    }
}

/// Takes back an intent whose end did not happen (the tool failed).
pub fn withdraw(name: &str) {
    let n = name.to_string();
    let _ = crate::state::registry::shared().update(move |vms| {
        if let Some(r) = vms.get_mut(&n) {
            r.ending = None;
        }
        Ok::<_, RegistryError>(())
    });
}

/// How QEMU's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// Its exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that killed it.
    pub signal: Option<i32>,
}

/// The end of a QEMU that exited with `exit`, whose log ends with `log_tail`, while the OOM
/// killer killed `oom_delta` processes, given the intent written before (if any).
pub fn classify(exit: Exit, log_tail: &str, oom_delta: u64, intent: Option<&End>, now: i64) -> End {
    let fresh = intent.filter(|i| {
        i.reason.is_some()
            && i.at
                .is_some_and(|at| now - at <= INTENT_FRESH_S && at <= now + 5)
    });
    let mut e = match (fresh, exit.signal, exit.code) {
        (Some(i), _, _) => i.clone(),
        (None, Some(libc::SIGKILL), _) if oom_delta > 0 => end(
            OOM,
            None,
            format!(
                "QEMU was killed (SIGKILL) while the host's OOM killer killed {oom_delta} \
                 process(es): the host ran out of memory"
            ),
        ),
        (None, Some(sig), _) if is_fault(sig) => end(
            CRASHED,
            None,
            format!("QEMU crashed ({}); see its log", signal_name(sig)),
        ),
        (None, Some(sig), _) => end(
            KILLED,
            None,
            format!(
                "QEMU was killed by {} from outside mcqemu",
                signal_name(sig)
            ),
        ),
        (None, None, Some(0)) => match terminated_by(log_tail) {
            Some(words) => end(KILLED, None, format!("QEMU was told to end: {words}")),
            None => end(
                GUEST_POWEROFF,
                None,
                "the guest powered off (QEMU exited on its own with status 0)",
            ),
        },
        (None, _, code) => end(
            CRASHED,
            None,
            format!(
                "QEMU exited with status {}{}",
                code.unwrap_or(-1),
                last_line(log_tail)
                    .map(|l| format!(": {l}"))
                    .unwrap_or_default()
            ),
        ),
    };
    e.at = Some(now);
    e.exit_code = exit.code.map(i64::from);
    e.signal = exit.signal.map(i64::from);
    e
}

/// Signals a process gets for its own fault.
fn is_fault(sig: i32) -> bool {
    matches!(
        sig,
        libc::SIGSEGV
            | libc::SIGABRT
            | libc::SIGBUS
            | libc::SIGILL
            | libc::SIGFPE
            | libc::SIGSYS
            | libc::SIGTRAP
    )
}

/// A signal's name.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

/// QEMU's own words when a signal made it quit ("terminating on signal 15 from pid 42
/// (kill)"), from the end of its log.
fn terminated_by(log_tail: &str) -> Option<String> {
    let line = log_tail
        .lines()
        .rev()
        .take(20)
        .find(|l| l.contains("terminating on signal"))?;
    let at = line.find("terminating on signal")?;
    Some(line[at..].trim().chars().take(200).collect())
}

/// The log's last non-empty line that is not the supervisor's own, shortened.
fn last_line(log_tail: &str) -> Option<String> {
    log_tail
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("mcqemu ["))
        .map(|l| l.chars().take(200).collect())
}

/// Writes the end of the QEMU with PID `pid` (started with QMP socket `socket`) into its
/// record, found by PID or socket (a pooled clone is renamed, a suspended one has no PID). A
/// record that runs another QEMU by now is left alone. Returns the VM's name and its end.
pub fn record_exit(
    pid: i32,
    socket: &Path,
    exit: Exit,
    log: &Path,
    oom_delta: u64,
) -> Option<(String, End)> {
    let tail = crate::state::tail::read_last(log, 16 * 1024)
        .map(|t| t.text())
        .unwrap_or_default();
    let sock = socket.display().to_string();
    let now = crate::clock::now_secs();
    let found = crate::state::registry::shared().update(move |vms| {
        let started_as =
            |r: &Record| text(&r.launch_qmp_socket).or(text(&r.qmp_socket)) == Some(sock.as_str());
        // Its PID and the socket it was started with (a PID alone may be reused). Else a record
        // that let go of its PID (a suspend: no PID, its end not yet written); never one that
        // runs another QEMU, nor one whose end was said already (a suspended record put back
        // after a resume failed keeps its own).
        let by_pid = vms
            .iter()
            .find(|(_, r)| r.pid == Some(i64::from(pid)) && started_as(r))
            .map(|(n, _)| n.clone());
        let hit = by_pid.or_else(|| {
            vms.iter()
                .find(|(_, r)| {
                    started_as(r) && r.pid.is_none() && r.end.is_none() && !runs_another(r, pid)
                })
                .map(|(n, _)| n.clone())
        });
        let Some(name) = hit else {
            return Ok::<_, RegistryError>(None);
        };
        let Some(r) = vms.get_mut(&name) else {
            return Ok(None);
        };
        let e = classify(exit, &tail, oom_delta, r.ending.as_ref(), now);
        r.ending = None;
        r.end = Some(e.clone());
        Ok(Some((name, e)))
    });
    let (name, e) = match found {
        Ok(f) => f?,
        Err(err) => {
            crate::log::stderr(
                "warn",
                &format!("QEMU {pid} ended ({exit:?}), but the registry could not say so: {err}"),
            );
            return None;
        }
    };
    log_end(&name, &e);
    Some((name, e))
}

/// True when record `r` names a live QEMU other than `pid`.
fn runs_another(r: &Record, pid: i32) -> bool {
    crate::qemu::vm::pid(r).is_some_and(|p| p != pid && crate::qemu::process::alive(p))
}

/// One line for the person reading `ends.log` and stderr.
pub fn line(name: &str, e: &End) -> String {
    format!(
        "VM {name} ended: {}{}{}",
        e.reason.as_deref().unwrap_or("unknown"),
        e.tool
            .as_deref()
            .map(|t| format!(" (by {t})"))
            .unwrap_or_default(),
        e.detail
            .as_deref()
            .map(|d| format!(": {d}"))
            .unwrap_or_default()
    )
}

/// Appends the end to `ends.log` in the state folder (one JSON object a line, rotated past
/// 1 MiB) and says it on stderr.
pub fn log_end(name: &str, e: &End) {
    crate::log::stderr("notice", &line(name, e));
    let path = paths::state_dir().join("ends.log");
    if std::fs::metadata(&path).is_ok_and(|m| m.len() > LOG_MAX) {
        let _ = std::fs::rename(&path, path.with_extension("log.1"));
    }
    let mut obj = e.to_map();
    obj.insert("name".into(), name.into());
    let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    else {
        return;
    };
    let _ = writeln!(f, "{}", serde_json::Value::Object(obj));
}

/// The end a VM shows while it is not running: its recorded end; the intent of whoever ended
/// it while its supervisor has not written the end yet (a stop returns as soon as QEMU is
/// gone); the end its supervisor is writing this moment, waited for; or `unknown` for a
/// stopped VM whose end nobody saw (started by an older mcqemu, or attached).
pub fn shown(rec: &Record, running: bool) -> Option<End> {
    if running {
        return None;
    }
    if rec.end.is_some() {
        return rec.end.clone();
    }
    let fresh_intent = rec.ending.as_ref().filter(|i| {
        i.at.is_some_and(|at| crate::clock::now_secs() - at <= INTENT_FRESH_S)
    });
    if let Some(i) = fresh_intent {
        return Some(i.clone());
    }
    if let Some(e) = being_written(rec) {
        return Some(e);
    }
    let mut unknown = end(
        "unknown",
        None,
        "no supervisor saw this QEMU end (started by an older mcqemu, or attached)",
    );
    unknown.at = None;
    Some(unknown)
}

/// How long a look at a VM whose QEMU is gone waits for its supervisor to write why: the
/// supervisor reaps QEMU and writes at once (milliseconds), so this is reached only by one
/// that is itself stuck.
const SUPERVISOR_WAIT: Duration = Duration::from_secs(2);

/// The end of a spawned VM whose QEMU (its recorded PID) is gone while its supervisor still
/// holds [`supervisor_lock`]: waited for, then read again from the registry. Found by the
/// suite: a guest's power-off seen by vm_info between QEMU's exit and the supervisor's write
/// was called `unknown`. None when no supervisor is at work (an older mcqemu's VM, an attached
/// QEMU, a supervisor killed with its QEMU) or it is stuck.
fn being_written(rec: &Record) -> Option<End> {
    let pid = crate::qemu::vm::pid(rec).filter(|_| crate::qemu::vm::spawned(rec))?;
    if crate::qemu::process::alive(pid) {
        return None;
    }
    let lock = supervisor_lock(&crate::qemu::vm::qmp_socket(rec));
    std::fs::symlink_metadata(&lock).ok()?;
    if !lockfile::wait_free(&lock, SUPERVISOR_WAIT) {
        return None;
    }
    let now = crate::state::registry::shared().load();
    now.values()
        .find(|r| r.qmp_socket == rec.qmp_socket && (r.pid == rec.pid || r.pid.is_none()))
        .and_then(|r| r.end.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(code: Option<i32>, signal: Option<i32>) -> Exit {
        Exit { code, signal }
    }

    #[test]
    fn classifies_each_kind_of_end() {
        let now = 1_000_000;
        fn c(x: Exit, log: &str, oom: u64, intent: Option<&End>) -> End {
            classify(x, log, oom, intent, 1_000_000)
        }
        assert_eq!(
            c(exit(Some(0), None), "", 0, None).reason.unwrap(),
            GUEST_POWEROFF
        );
        let k = c(exit(None, Some(libc::SIGKILL)), "", 0, None);
        assert_eq!((k.reason.unwrap().as_str(), k.signal), (KILLED, Some(9)));
        assert_eq!(
            c(exit(None, Some(libc::SIGKILL)), "", 1, None)
                .reason
                .unwrap(),
            OOM
        );
        let s = c(exit(None, Some(libc::SIGSEGV)), "", 3, None);
        assert_eq!(s.reason.unwrap(), CRASHED);
        assert!(s.detail.unwrap().contains("SIGSEGV"));
        let t = c(
            exit(Some(0), None),
            "qemu-system-x86_64: terminating on signal 15 from pid 42 (kill)\n",
            0,
            None,
        );
        assert_eq!(t.reason.unwrap(), KILLED);
        assert!(t.detail.unwrap().contains("from pid 42"));
        let e = c(exit(Some(1), None), "qemu: hardware error: boom\n", 0, None);
        assert_eq!(e.reason.unwrap(), CRASHED);
        assert!(e.detail.unwrap().contains("hardware error"));
        // A fresh intent wins over what the status says; a stale one does not.
        let mut i = end(IDLE, Some("watcher"), "idle for 5 s");
        i.at = Some(now - 3);
        let w = c(exit(None, Some(libc::SIGKILL)), "", 0, Some(&i));
        assert_eq!((w.reason.unwrap().as_str(), w.signal), (IDLE, Some(9)));
        i.at = Some(now - 5000);
        assert_eq!(
            c(exit(Some(0), None), "", 0, Some(&i)).reason.unwrap(),
            GUEST_POWEROFF
        );
    }
}
