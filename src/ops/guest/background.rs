//! Background processes in a guest, known by a handle kept in the VM's registry record (so a
//! restarted server still knows them), read by offsets, and ended with a signal to their whole
//! group. mcqemu-agent keeps them itself (their output in memory, the last [`KEEP`] bytes of
//! each stream, and a process group of their own: no shell in the guest); with qemu-ga they
//! start through the spool wrapper, their output in files in the guest
//! ([`crate::ops::guest::spool`]). Typed requests and results; no MCP here.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Map;

use crate::ops::error::OpError;
use crate::ops::guest::spool::{self, Launch};
use crate::ops::guest::with_guest;
use crate::qemu::agent_calls::{self, ExecStatus};
use crate::qemu::qga::{Qga, QgaError, COMMAND_TIMEOUT};
use crate::state::record::{Background, Ended, Record};

/// Most background processes one VM keeps; the oldest ended ones go first.
const MAX_PER_VM: usize = 64;
/// The output of each stream that stays readable: older output is dropped (and said so).
pub const KEEP: u64 = 8 * 1024 * 1024;
/// Most bytes of one stream that one status call returns.
pub const PER_CALL: usize = 1024 * 1024;
/// How long a kill waits after its signal before it sends SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(5);

crate::described! {
    /// What a start returns.
    #[derive(Debug, Clone, Serialize)]
    pub struct Started {
        /// The VM.
        pub name: String,
        /// The handle for guest_exec_status and guest_exec_kill.
        pub handle: String,
        /// The program's PID in the guest.
        pub pid: i64,
        /// Always true.
        pub background: bool,
    }
}

/// guest_exec_status.
#[derive(Debug, Clone)]
pub struct StatusRequest {
    /// The VM.
    pub name: String,
    /// From guest_exec {background: true}.
    pub handle: String,
    /// Where to read stdout from.
    pub stdout_offset: u64,
    /// Where to read stderr from.
    pub stderr_offset: u64,
    /// Longest wait for new output or the end.
    pub wait: Duration,
}

crate::described! {
    /// A background process as one status call saw it.
    #[derive(Debug, Clone, Serialize)]
    pub struct Status {
        /// The VM.
        pub name: String,
        /// The handle.
        pub handle: String,
        /// The guest PID.
        pub pid: i64,
        /// The program as started.
        pub command: String,
        /// True while it runs.
        pub running: bool,
        /// Its exit code once it exited.
        pub exitcode: Option<i64>,
        /// The signal that ended it.
        pub signal: Option<i64>,
        /// Output from the given offset (lossy UTF-8).
        pub stdout: String,
        /// Errors from the given offset.
        pub stderr: String,
        /// Where the next status call reads stdout from.
        pub stdout_next_offset: u64,
        /// Where the next status call reads stderr from.
        pub stderr_next_offset: u64,
        /// Bytes of stdout between the asked offset and what is still kept, now dropped.
        pub stdout_dropped: u64,
        /// Same for stderr.
        pub stderr_dropped: u64,
        /// True when more output waits past the next offsets.
        pub more: bool,
    }
}

/// The process of `handle` as recorded.
#[derive(Debug, Clone)]
pub struct Known {
    /// The guest PID.
    pub pid: i64,
    /// The command as started.
    pub command: String,
    /// Its exit code and signal, once it ended.
    pub ended: Option<(Option<i64>, Option<i64>)>,
    /// mcqemu-agent keeps it (its output, its group), not the spool wrapper.
    pub native: bool,
}

/// Who keeps a background process's output: recorded as `kept_by`.
const KEPT_BY_AGENT: &str = "mcqemu-agent";

/// Starts `program` (its env and cwd checked by the caller, `ops::guest::exec`) in the
/// background in VM `name`.
pub fn start(name: &str, program: &Launch) -> Result<Started, OpError> {
    let id = spool::new_id();
    let native = crate::ops::guest::agent_is_ours(name)?;
    let launch = Launch {
        spool: (!native).then_some(id.as_str()),
        session: true,
        ..program.clone()
    };
    let (pid, ended) = if native {
        let mut r = launch.native_request();
        r.group = Some(true);
        r.keep_last = Some(KEEP);
        let pid = with_guest(name, "guest-exec", |q| {
            crate::ops::guest::stream::spawn(q, &r)
        })?;
        (pid, None)
    } else {
        with_guest(name, "guest-exec", |q| start_in(q, &launch))??
    };
    let handle = format!("bg-{id}");
    let entry = Background {
        pid: Some(pid),
        command: Some(program.command.to_string()),
        args: Some(program.args.to_vec()),
        spool: (!native).then_some(id),
        kept_by: native.then(|| KEPT_BY_AGENT.to_string()),
        started_at: Some(crate::clock::now_secs()),
        ended,
        other: Map::new(),
    };
    let vm = name.to_string();
    let h = handle.clone();
    crate::state::registry::shared().update(move |vms| {
        let rec = vms
            .get_mut(&vm)
            .ok_or_else(|| OpError::not_found(format!("VM {vm:?} is gone")))?;
        let list = rec.background.get_or_insert_with(BTreeMap::new);
        prune(list);
        list.insert(h, entry);
        Ok::<_, OpError>(())
    })?;
    Ok(Started {
        name: name.to_string(),
        handle,
        pid,
        background: true,
    })
}

/// Drops the oldest ended processes past [`MAX_PER_VM`].
fn prune(m: &mut BTreeMap<String, Background>) {
    while m.len() >= MAX_PER_VM {
        let started = |v: &Background| v.started_at.unwrap_or(0);
        let oldest = m
            .iter()
            .filter(|(_, v)| v.ended.is_some())
            .min_by_key(|(_, v)| started(v))
            .or_else(|| m.iter().min_by_key(|(_, v)| started(v)))
            .map(|(k, _)| k.clone());
        match oldest {
            Some(k) => {
                m.remove(&k);
            }
            None => return,
        }
    }
}

/// What a start saw: the PID, and the end if the program ended at once (the agent says so
/// only once, so it is recorded with the start).
type Spawned = (i64, Option<Ended>);

/// Starts `launch` and waits (briefly, bounded) for the wrapper to have either refused or
/// handed over to the program.
fn start_in(q: &mut Qga, launch: &Launch) -> Result<Result<Spawned, OpError>, QgaError> {
    let pid = crate::ops::guest::stream::spawn(q, &launch.request())?;
    // The wrapper refuses a missing cwd before it makes the output files: wait (bounded) for
    // either the refusal or the files.
    let out = spool::paths(launch.spool.unwrap_or_default()).0;
    let until = Instant::now() + Duration::from_secs(10);
    let mut pause = Duration::from_millis(1);
    while Instant::now() < until {
        let s = agent_calls::exec_status(q, pid, COMMAND_TIMEOUT)?;
        if s.exited {
            if let Some(why) = spool::wrapper_refusal(&s) {
                return Ok(Err(OpError::invalid(why)));
            }
            let ended = Ended {
                exitcode: s.exitcode,
                signal: s.signal,
                other: Map::new(),
            };
            return Ok(Ok((pid, Some(ended))));
        }
        if spool::exists(q, &out)? {
            break;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
    Ok(Ok((pid, None)))
}

/// The process of `handle` in VM `name`, or an error naming where it is (or that it is not).
fn known(name: &str, handle: &str) -> Result<(Known, String), OpError> {
    let vms = crate::state::registry::shared().load();
    let Some(rec) = vms.get(name) else {
        return Err(OpError::not_found(format!(
            "no VM named {name:?}; list_vms shows the known VMs"
        )));
    };
    let of = |r: &Record| r.background.as_ref().and_then(|m| m.get(handle)).cloned();
    if let Some(p) = of(rec) {
        return Ok((
            Known {
                pid: p.pid.unwrap_or(0),
                command: p.command.unwrap_or_default(),
                ended: p.ended.map(|e| (e.exitcode, e.signal)),
                native: p.kept_by.as_deref() == Some(KEPT_BY_AGENT),
            },
            p.spool.unwrap_or_default(),
        ));
    }
    if let Some((other, _)) = vms.iter().find(|(_, r)| of(r).is_some()) {
        return Err(OpError::invalid(format!(
            "handle {handle:?} belongs to VM {other:?}, not {name:?}"
        )));
    }
    Err(OpError::not_found(format!(
        "VM {name:?} has no background process {handle:?}; vm_info lists its background \
         processes (guest_exec with background=true starts one)"
    )))
}

/// Records that `handle` ended, as the agent said (it says so only once).
fn record_end(name: &str, handle: &str, exitcode: Option<i64>, signal: Option<i64>) {
    let (name, handle) = (name.to_string(), handle.to_string());
    let _ = crate::state::registry::shared().update(move |vms| {
        if let Some(p) = vms
            .get_mut(&name)
            .and_then(|r| r.background.as_mut())
            .and_then(|m| m.get_mut(&handle))
        {
            p.ended = Some(Ended {
                exitcode,
                signal,
                other: Map::new(),
            });
        }
        Ok::<_, OpError>(())
    });
}

/// Whether the process still runs: (running, exitcode, signal), recording its end.
fn poll_end(q: &mut Qga, name: &str, handle: &str, k: &mut Known) -> Result<bool, QgaError> {
    if k.ended.is_some() {
        return Ok(false);
    }
    if k.native {
        // Asked without collecting it: guest-exec-status would make the agent forget it
        // (and its output).
        let s = match native_output(
            q,
            k.pid,
            (i64::MAX as u64, i64::MAX as u64),
            Duration::ZERO,
            0,
        )? {
            Some(s) if !s.exited => return Ok(true),
            Some(s) => (s.exitcode, s.signal),
            None => (None, None),
        };
        record_end(name, handle, s.0, s.1);
        k.ended = Some(s);
        return Ok(false);
    }
    let s = match agent_calls::exec_status(q, k.pid, COMMAND_TIMEOUT) {
        Ok(s) => s,
        // The agent forgot it (restarted, or answered its end to another caller).
        Err(QgaError::Command { desc, .. }) if desc.contains("Invalid parameter") => ExecStatus {
            exited: true,
            ..ExecStatus::default()
        },
        Err(e) => return Err(e),
    };
    if !s.exited {
        return Ok(true);
    }
    let (code, sig) = (s.exitcode, s.signal);
    record_end(name, handle, code, sig);
    k.ended = Some((code, sig));
    Ok(false)
}

/// guest_exec_status: the state and the output past the given offsets, waiting up to `wait`
/// for new output or the end.
pub fn status(req: &StatusRequest, cancelled: &dyn Fn() -> bool) -> Result<Status, OpError> {
    let (mut k, id) = known(&req.name, &req.handle)?;
    if k.native {
        return native_status(req, &mut k, cancelled);
    }
    let deadline = Instant::now() + req.wait;
    let (out, errp) = spool::paths(&id);
    loop {
        let seen = with_guest(&req.name, "guest-exec-status", |q| {
            let running = poll_end(q, &req.name, &req.handle, &mut k)?;
            let o = spool::read_from(q, &out, req.stdout_offset, PER_CALL, KEEP)?;
            let e = spool::read_from(q, &errp, req.stderr_offset, PER_CALL, KEEP)?;
            Ok((running, o, e))
        })?;
        let (running, o, e) = seen;
        let new = !o.data.is_empty() || !e.data.is_empty();
        if !running || new || Instant::now() >= deadline || cancelled() {
            return Ok(shape(req, &k, running, o, e));
        }
        std::thread::sleep(Duration::from_millis(200).min(deadline - Instant::now()));
    }
}

/// The agent's view of its program `pid`: output past `from`, at most `max` bytes a stream,
/// waiting up to `wait` for news. None: the agent no longer knows it (the guest rebooted).
fn native_output(
    q: &mut Qga,
    pid: i64,
    from: (u64, u64),
    wait: Duration,
    max: u64,
) -> Result<Option<agent_calls::ExecOutput>, QgaError> {
    match agent_calls::exec_output_capped(q, pid, from, wait, Some(max)) {
        Ok(o) => Ok(Some(o)),
        Err(QgaError::Command { desc, .. }) if desc.contains("Invalid parameter") => Ok(None),
        Err(e) => Err(e),
    }
}

/// guest_exec_status on a process mcqemu-agent keeps: its output straight from the agent,
/// waiting there (a short wait at a time) for news or the end.
fn native_status(
    req: &StatusRequest,
    k: &mut Known,
    cancelled: &dyn Fn() -> bool,
) -> Result<Status, OpError> {
    let deadline = Instant::now() + req.wait;
    loop {
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .min(Duration::from_secs(2));
        let from = (req.stdout_offset, req.stderr_offset);
        let got = with_guest(&req.name, "mcqemu-exec-output", |q| {
            native_output(q, k.pid, from, wait, PER_CALL as u64)
        })?;
        let Some(o) = got else {
            if k.ended.is_none() {
                record_end(&req.name, &req.handle, None, None);
                k.ended = Some((None, None));
            }
            let none = || spool::Slice {
                size: 0,
                start: 0,
                data: Vec::new(),
            };
            return Ok(shape(req, k, false, none(), none()));
        };
        if o.exited && k.ended.is_none() {
            record_end(&req.name, &req.handle, o.exitcode, o.signal);
            k.ended = Some((o.exitcode, o.signal));
        }
        let slice = |data: &Option<String>, start: u64, end: u64| spool::Slice {
            size: end,
            start,
            data: data
                .as_deref()
                .and_then(|d| crate::b64::decode(d).ok())
                .unwrap_or_default(),
        };
        let out = slice(&o.out_data, o.out_start, o.out_end);
        let errs = slice(&o.err_data, o.err_start, o.err_end);
        let new = !out.data.is_empty() || !errs.data.is_empty();
        if o.exited || new || Instant::now() >= deadline || cancelled() {
            return Ok(shape(req, k, !o.exited, out, errs));
        }
    }
}

/// A status call's result from what the guest's output files gave (`o`, `e`): offsets that
/// never go backwards past what was asked for, output past the kept window counted as dropped.
pub fn shape(
    req: &StatusRequest,
    k: &Known,
    running: bool,
    o: spool::Slice,
    e: spool::Slice,
) -> Status {
    let (exitcode, signal) = k.ended.unwrap_or((None, None));
    let o_next = o.start + o.data.len() as u64;
    let e_next = e.start + e.data.len() as u64;
    Status {
        name: req.name.clone(),
        handle: req.handle.clone(),
        pid: k.pid,
        command: k.command.clone(),
        running,
        exitcode,
        signal,
        stdout: String::from_utf8_lossy(&o.data).into_owned(),
        stderr: String::from_utf8_lossy(&e.data).into_owned(),
        stdout_next_offset: o_next.max(req.stdout_offset.min(o.size)),
        stderr_next_offset: e_next.max(req.stderr_offset.min(e.size)),
        stdout_dropped: o.start.saturating_sub(req.stdout_offset),
        stderr_dropped: e.start.saturating_sub(req.stderr_offset),
        more: o_next < o.size || e_next < e.size,
    }
}

/// guest_exec_kill.
#[derive(Debug, Clone)]
pub struct KillRequest {
    /// The VM.
    pub name: String,
    /// The handle.
    pub handle: String,
    /// The signal's number (TERM by default; KILL follows after a grace).
    pub signal: i32,
}

crate::described! {
    /// What a kill did.
    #[derive(Debug, Clone, Serialize)]
    pub struct Killed {
        /// The VM.
        pub name: String,
        /// The handle.
        pub handle: String,
        /// The guest PID.
        pub pid: i64,
        /// False when it had already ended.
        pub signalled: bool,
        /// True when SIGKILL had to follow.
        pub forced: bool,
        /// Its exit code, if it exited.
        pub exitcode: Option<i64>,
        /// The signal that ended it.
        pub signal: Option<i64>,
    }
}

/// The signal numbers guest_exec_kill takes by name.
pub fn signal_number(name: &str) -> Option<i32> {
    let n = name.trim_start_matches("SIG").to_ascii_uppercase();
    Some(match n.as_str() {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "KILL" => 9,
        "USR1" => 10,
        "USR2" => 12,
        "TERM" => 15,
        "CONT" => 18,
        "STOP" => 19,
        _ => return n.parse().ok().filter(|v| (1..=64).contains(v)),
    })
}

/// Sends `sig` to the process's session (its children too), falling back to the process;
/// mcqemu-agent signals its group itself.
fn send(q: &mut Qga, k: &Known, sig: i32) -> Result<(), QgaError> {
    let pid = k.pid;
    if k.native {
        return agent_calls::kill(q, pid, sig).map(|_| ());
    }
    let args = vec![
        "-c".to_string(),
        format!("kill -{sig} -- -{pid} 2>/dev/null || kill -{sig} {pid}"),
    ];
    let launch = Launch {
        command: "/bin/sh",
        args: &args,
        ..Launch::default()
    };
    spool::run_in(q, &launch, Duration::from_secs(5)).map(|_| ())
}

/// guest_exec_kill: the signal, then (for catchable ones) up to [`KILL_GRACE`] for it to end,
/// then SIGKILL. Its output stays readable by guest_exec_status (the files are in the
/// guest's /tmp).
pub fn kill(req: &KillRequest) -> Result<Killed, OpError> {
    let (mut k, _) = known(&req.name, &req.handle)?;
    let (name, handle) = (req.name.clone(), req.handle.clone());
    let outcome = with_guest(&req.name, "guest-exec", |q| {
        if !poll_end(q, &name, &handle, &mut k)? {
            return Ok((false, false));
        }
        send(q, &k, req.signal)?;
        let stops = ![19, 18].contains(&req.signal);
        let until = Instant::now() + KILL_GRACE;
        while stops && Instant::now() < until {
            if !poll_end(q, &name, &handle, &mut k)? {
                return Ok((true, false));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if !stops {
            return Ok((true, false));
        }
        send(q, &k, 9)?;
        let until = Instant::now() + KILL_GRACE;
        while Instant::now() < until {
            if !poll_end(q, &name, &handle, &mut k)? {
                return Ok((true, true));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok((true, true))
    })?;
    let (exitcode, signal) = k.ended.unwrap_or((None, None));
    Ok(Killed {
        name: req.name.clone(),
        handle: req.handle.clone(),
        pid: k.pid,
        signalled: outcome.0,
        forced: outcome.1,
        exitcode,
        signal,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(signal_number("TERM"), Some(15));
        assert_eq!(signal_number("SIGKILL"), Some(9));
        assert_eq!(signal_number("int"), Some(2));
        assert_eq!(signal_number("9"), Some(9));
        assert_eq!(signal_number("0"), None);
        assert_eq!(signal_number("BOGUS"), None);
    }

    #[test]
    fn pruning_keeps_the_newest_and_drops_ended_ones_first() {
        let mut m = BTreeMap::new();
        for i in 0..MAX_PER_VM as i64 {
            let p = Background {
                started_at: Some(i),
                ended: (i == 5).then(Ended::default),
                ..Background::default()
            };
            m.insert(format!("h{i}"), p);
        }
        prune(&mut m);
        assert_eq!(m.len(), MAX_PER_VM - 1);
        assert!(!m.contains_key("h5") && m.contains_key("h0"));
    }

    #[test]
    fn a_status_past_the_kept_window_says_what_was_dropped() {
        let req = StatusRequest {
            name: "v".into(),
            handle: "h".into(),
            stdout_offset: 10,
            stderr_offset: 0,
            wait: Duration::ZERO,
        };
        let k = Known {
            pid: 1,
            command: "c".into(),
            ended: None,
            native: false,
        };
        let o = spool::Slice {
            size: 100,
            start: 40,
            data: b"abc".to_vec(),
        };
        let s = shape(&req, &k, true, o, spool::Slice::default());
        assert_eq!(s.stdout_dropped, 30);
        assert_eq!(s.stdout_next_offset, 43);
        assert!(s.more);
        assert_eq!(s.stderr_next_offset, 0);
    }
}
