//! Clones of a template, as the bench sections that start them (templates, stock, arm64) all
//! do: one sandbox_vm from a template checked and timed, its first command and clock, its
//! destroy, the last-resort cleanup of a section's VMs and template, a process's memory from
//! smaps, the host's load.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{Server, VmKiller};
use crate::report::Table;
use crate::{structured, Res, ToolCalls};

/// The agent wait given to sandbox_vm (wait_agent_s), and the bound on its call.
const AGENT_WAIT_S: u64 = 60;
const CLONE_TIMEOUT: Duration = Duration::from_secs(AGENT_WAIT_S + 60);
/// Longest wait for sandbox_destroy, template_delete and guest_exec.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// The host's 1-, 5- and 15-minute load averages (/proc/loadavg), for the notes: the two runs
/// are compared, and other work on the machine slows either.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// What one clone's sandbox_vm gave: the server's ready_ms, the client's round trip, its PID.
pub struct Cloned {
    pub ready: Duration,
    pub round_trip: Duration,
    pub pid: i32,
    pub qga: Option<String>,
    /// The server's own account of the clone's steps (`steps_ms`), in milliseconds.
    pub steps: Vec<(String, f64)>,
}

/// sandbox_vm of one clone of `template`, which must come up with its agent ready; its QEMU is
/// tracked by `killer` for the last-resort kill.
pub fn clone_vm(server: &mut Server, killer: &VmKiller, template: &str, name: &str) -> Res<Cloned> {
    let t0 = Instant::now();
    let r = server.tool_within(
        "sandbox_vm",
        json!({"template": template, "name": name, "port_forwards": [],
               "wait_agent_s": AGENT_WAIT_S}),
        CLONE_TIMEOUT,
    )?;
    let round_trip = t0.elapsed();
    let s = structured(&r)?;
    checked_clone(killer, s, round_trip)
}

/// A clone's sandbox_vm result (tracked by `killer` first), which must say its agent is ready.
pub fn checked_clone(killer: &VmKiller, s: &Value, round_trip: Duration) -> Res<Cloned> {
    killer.track(s);
    if s["agent_ready"] != json!(true) {
        return Err(format!("a clone's agent was not ready: {s}"));
    }
    let ready = s["ready_ms"]
        .as_u64()
        .ok_or_else(|| format!("sandbox_vm gave no ready_ms: {s}"))?;
    let pid = s["pid"]
        .as_i64()
        .ok_or_else(|| format!("sandbox_vm gave no pid: {s}"))? as i32;
    let steps = s["steps_ms"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_f64().map(|ms| (k.clone(), ms)))
                .collect()
        })
        .unwrap_or_default();
    Ok(Cloned {
        ready: Duration::from_millis(ready),
        round_trip,
        pid,
        qga: s["qga_socket"].as_str().map(str::to_string),
        steps,
    })
}

/// The clone's first command, busybox's `adjtimex` (the guest's time to the microsecond;
/// its date has no %N) through guest_exec right after sandbox_vm answered (it waits for the
/// clock the server sets in the background): its round trip, and how far the guest's time
/// lies outside the host's before..after of the call.
pub fn first_command(server: &mut Server, name: &str) -> Res<(Duration, Duration)> {
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64()
    };
    let (t0, before) = (Instant::now(), now());
    let r = server.tool_within(
        "guest_exec",
        json!({"name": name, "command": "adjtimex", "args": []}),
        STEP_TIMEOUT,
    )?;
    let (round_trip, after) = (t0.elapsed(), now());
    let s = structured(&r)?;
    let out = s["stdout"].as_str().unwrap_or_default();
    let field = |key: &str| -> Option<f64> {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(key)?.trim().parse().ok())
    };
    let guest = match (field("time.tv_sec:"), field("time.tv_usec:")) {
        (Some(sec), Some(usec)) => sec + usec / 1e6,
        _ => return Err(format!("adjtimex in clone {name} gave no time: {s}")),
    };
    let skew = if guest < before {
        before - guest
    } else {
        (guest - after).max(0.0)
    };
    Ok((round_trip, Duration::from_secs_f64(skew)))
}

/// sandbox_vm of a cold boot with `args`, tracked by `killer` for the last-resort kill, which
/// must come up with its agent ready: its result (structured) and its round trip.
pub fn cold_sandbox(
    server: &mut Server,
    killer: &VmKiller,
    args: Value,
    timeout: Duration,
) -> Res<(Value, Duration)> {
    let t0 = Instant::now();
    let r = server.tool_within("sandbox_vm", args, timeout)?;
    let took = t0.elapsed();
    let s = structured(&r)?.clone();
    killer.track(&s);
    if s["agent_ready"] != json!(true) {
        return Err(format!("agent not ready: {s}"));
    }
    Ok((s, took))
}

/// `n` clones of `template` (after one warm-up) with the host folder `share` mounted at
/// /share, each destroyed before the next: their sandbox_vm round trip against `plain`, the
/// plain clones' median (goal: at most 50 ms more, the mount made before the call returns).
pub fn mount_rows(
    table: &mut Table,
    server: &mut Server,
    killer: &VmKiller,
    (template, share): (&str, &std::path::Path),
    n: usize,
    plain: Duration,
) -> Res<()> {
    std::fs::create_dir_all(share).map_err(|e| format!("{}: {e}", share.display()))?;
    std::fs::write(share.join("f"), "shared\n").map_err(|e| e.to_string())?;
    let name = format!("{template}-mnt");
    let mut took = Vec::new();
    for i in 0..=n {
        let t0 = Instant::now();
        let r = server.tool_within(
            "sandbox_vm",
            json!({"template": template, "name": name, "port_forwards": [],
                   "wait_agent_s": AGENT_WAIT_S,
                   "mounts": [{"host": share, "guest": "/share"}]}),
            CLONE_TIMEOUT,
        )?;
        let round_trip = t0.elapsed();
        let s = structured(&r)?;
        checked_clone(killer, s, round_trip)?;
        if s["mounts"][0]["state"] != json!("mounted") {
            return Err(format!("a clone's mount was not made: {s}"));
        }
        destroy(server, &name)?;
        if i > 0 {
            took.push(round_trip);
        }
    }
    let s = crate::report::Stats::of(took);
    let more = s.median.saturating_sub(plain);
    table.time_row(
        "clone with one host folder mounted: round trip",
        n,
        &s,
        Some(plain + Duration::from_millis(50)),
    );
    table.note(&format!(
        "the mount adds {:.0} ms to the plain clone's {:.0} ms (goal <= 50 ms)",
        more.as_secs_f64() * 1000.0,
        plain.as_secs_f64() * 1000.0
    ));
    Ok(())
}

/// sandbox_destroy, which must say it destroyed the sandbox.
pub fn destroy(server: &mut Server, name: &str) -> Res<()> {
    let r = server.tool_within("sandbox_destroy", json!({ "name": name }), STEP_TIMEOUT)?;
    if structured(&r)?["destroyed"] != json!(true) {
        return Err(format!("sandbox_destroy {name} did not destroy it: {r}"));
    }
    Ok(())
}

/// Destroys whatever sandbox whose name starts with `prefix` is left and deletes `template`;
/// a problem becomes a note.
pub fn cleanup(table: &Table, server: &mut Server, prefix: &str, template: &str) {
    let mut problems = Vec::new();
    match server
        .tool("list_vms", json!({}))
        .and_then(|r| Ok(structured(&r)?["vms"].clone()))
    {
        Err(e) => problems.push(e),
        Ok(vms) => {
            for v in vms.as_array().into_iter().flatten() {
                let n = v["name"].as_str().unwrap_or("");
                if n.starts_with(prefix) {
                    if let Err(e) = destroy(server, n) {
                        problems.push(e);
                    }
                }
            }
        }
    }
    let listed = server
        .tool("template_list", json!({}))
        .and_then(|r| Ok(structured(&r)?["templates"].clone()));
    let exists = listed
        .as_ref()
        .map(|t| {
            t.as_array()
                .into_iter()
                .flatten()
                .any(|t| t["name"] == template)
        })
        .unwrap_or(true);
    if exists {
        if let Err(e) =
            server.tool_within("template_delete", json!({ "name": template }), STEP_TIMEOUT)
        {
            problems.push(e);
        }
    }
    for p in problems {
        table.note(&format!("cleanup problem: {p}"));
    }
}

/// A `KEY:` line of /proc/PID/smaps_rollup, in KiB.
pub fn smaps_kb(pid: i32, key: &str) -> Res<u64> {
    let file = format!("/proc/{pid}/smaps_rollup");
    let text = std::fs::read_to_string(&file).map_err(|e| format!("cannot read {file}: {e}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| format!("no {key} line in {file}"))
}
