//! Lifetimes (section `lifetimes`): a clone of a test-guest template with `idle_s: 5` and
//! `on_idle: suspend`, made by a server that then exits: how long after its last activity the
//! watcher suspended it (goal: 5-7 s), and the first guest_exec after it, which resumes it,
//! against the clone's own ready time (goal: at most 2x), beside a fresh clone's own first
//! guest_exec; list_vms with metrics over 100 registered VMs, 8 of them running (goal: 20 ms);
//! and the idle watcher's own CPU (goal: under 0.1 % of a core) and RSS (goal: 4 MB).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{try_test_guest, Server, VmKiller};
use crate::report::{Stats, Table};
use crate::{structured, Dirs, Res, ToolCalls};

const TEMPLATE: &str = "bench-lt";
const STEP: Duration = Duration::from_secs(300);
const RUNNING: usize = 8;
const REGISTERED: usize = 100;

/// The lifetimes section; an ERROR row when something fails. Its VMs are destroyed.
pub fn lifetime_rows(table: &mut Table, dirs: &Dirs) {
    table.section(
        "lifetimes: idle ends with no server, resume on use, list_vms metrics, the watcher",
    );
    let killer = VmKiller::new(dirs.tmp.path());
    let outcome = rows(table, dirs, &killer);
    table.or_error("lifetimes section", outcome);
    if let Ok(mut s) = dirs.server() {
        for i in 0..RUNNING {
            let _ = s.tool_within("sandbox_destroy", json!({"name": format!("lt-{i}")}), STEP);
        }
        let _ = s.tool_within("sandbox_destroy", json!({"name": "lt-ref"}), STEP);
        let _ = s.tool_within("sandbox_destroy", json!({"name": "lt-idle"}), STEP);
        let _ = s.tool_within("template_delete", json!({"name": TEMPLATE}), STEP);
        let _ = s.try_close();
    }
    killer.kill_all();
    // The fake records of the list row go with the section.
    let _ = drop_fakes(&dirs.state);
}

fn epoch_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn entry(list: &Value, name: &str) -> Option<Value> {
    list["vms"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == json!(name))
        .cloned()
}

fn rows(table: &mut Table, dirs: &Dirs, killer: &VmKiller) -> Res<()> {
    let g = try_test_guest()?;
    let mut s = dirs.server()?;
    s.tool_within(
        "template_create",
        json!({"name": TEMPLATE, "kernel": g.kernel, "initrd": g.initrd, "append": g.append,
               "memory_mb": 128, "cpus": 1, "wait_agent_s": 180}),
        STEP,
    )?;
    // For comparison: a fresh clone's own first command. Under TCG a freshly restored guest
    // runs its first program slowly (QEMU translates its code anew), resumed or not.
    let r = s.tool_within(
        "sandbox_vm",
        json!({"name": "lt-ref", "template": TEMPLATE, "port_forwards": []}),
        STEP,
    )?;
    killer.track(structured(&r)?);
    let t = Instant::now();
    let first = s.tool_within(
        "guest_exec",
        json!({"name": "lt-ref", "command": "/bin/sh", "args": ["-c", "echo back"]}),
        STEP,
    )?;
    let clone_first = (t.elapsed(), structured(&first)?["duration_ms"].clone());
    s.tool_within("sandbox_destroy", json!({"name": "lt-ref"}), STEP)?;
    // The idle end, with no server: the clone's server exits right after making it.
    let r = s.tool_within(
        "sandbox_vm",
        json!({"name": "lt-idle", "template": TEMPLATE, "idle_s": 5, "on_idle": "suspend",
               "port_forwards": []}),
        STEP,
    )?;
    let made = structured(&r)?;
    killer.track(made);
    let ready_ms = made["ready_ms"].as_u64().unwrap_or(0);
    let last = epoch_s();
    s.try_close()?;
    let mut ended = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut watcher = None;
    while Instant::now() < deadline {
        watcher = watcher.or_else(|| watcher_pid(&dirs.state));
        let list = list_by_cli(dirs)?;
        // Seen suspended (polled every ~0.2 s; the record's own time is in whole seconds).
        if entry(&list, "lt-idle").is_some_and(|v| v["status"] == json!("suspended")) {
            ended = Some(epoch_s());
            break;
        }
        std::thread::sleep(Duration::from_millis(150));
    }
    let ended = ended.ok_or("lt-idle was not suspended within 30 s of its last activity")?;
    let after = Duration::from_secs_f64((ended - last).max(0.0));
    let ok = after >= Duration::from_secs(5) && after <= Duration::from_secs(7);
    table.note(&format!(
        "idle end: suspended {:.1} s after its last activity (goal 5-7 s): {}",
        after.as_secs_f64(),
        if ok { "met" } else { "MISSED" }
    ));
    let mut s = dirs.server()?;
    let t = Instant::now();
    s.tool_within(
        "guest_exec",
        json!({"name": "lt-idle", "command": "/bin/sh", "args": ["-c", "echo back"]}),
        STEP,
    )?;
    let first = t.elapsed();
    table.time_row(
        "first guest_exec after an idle suspend (resumes it)",
        1,
        &Stats::of(vec![first]),
        Some(Duration::from_millis(2 * ready_ms.max(1))),
    );
    table.note(&format!(
        "the clone's own ready time: {ready_ms} ms (target: 2x)"
    ));
    table.note(&format!(
        "a fresh clone's first guest_exec, no resume: {:.0} ms (the program ran {} ms in the \
         guest)",
        clone_first.0.as_secs_f64() * 1000.0,
        clone_first.1
    ));
    if let Some(line) = s
        .stderr_text()
        .lines()
        .find(|l| l.contains("suspended when idle; resumed in"))
    {
        table.note(line.trim());
    }
    // Idle again in 5 s: it goes, so that the rows below measure an idle watcher.
    s.tool_within("sandbox_destroy", json!({"name": "lt-idle"}), STEP)?;

    // list_vms over 100 records, 8 running.
    for i in 0..RUNNING {
        let r = s.tool_within(
            "sandbox_vm",
            json!({"name": format!("lt-{i}"), "template": TEMPLATE, "port_forwards": []}),
            STEP,
        )?;
        killer.track(structured(&r)?);
    }
    let total = list_len(&mut s)?;
    add_fakes(&dirs.state, "lt-0", REGISTERED.saturating_sub(total))?;
    let list = s.tool("list_vms", json!({}))?;
    let listed = structured(&list)?["vms"].as_array().map_or(0, Vec::len);
    let mut samples = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        s.tool("list_vms", json!({}))?;
        samples.push(t.elapsed());
    }
    table.time_row(
        &format!(
            "list_vms with metrics, {listed} VMs ({} running)",
            RUNNING + 1
        ),
        samples.len(),
        &Stats::of(samples),
        Some(Duration::from_millis(20)),
    );

    // The watcher, idle: every VM has its lifetime far ahead.
    let pid = watcher_pid(&dirs.state)
        .or(watcher)
        .ok_or("no watcher runs")?;
    let cpu0 = cpu_ticks(pid)?;
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(20));
    let cpu = (cpu_ticks(pid)? - cpu0) as f64 / 100.0;
    let pct = cpu / t.elapsed().as_secs_f64() * 100.0;
    table.note(&format!(
        "watcher CPU while idle: {pct:.3} % of a core over 20 s (goal < 0.1 %): {}",
        if pct < 0.1 { "met" } else { "MISSED" }
    ));
    let kb = rss_kb(pid)?;
    table.rss_info_row("watcher RSS (VmRSS, idle, 9 VMs watched)", kb);
    table.note(&format!(
        "goal: 4096 KiB: {}",
        if kb <= 4096 { "met" } else { "MISSED" }
    ));
    // Most of VmRSS is text shared with other processes (libc, the binary): what the watcher
    // alone costs is its Pss, what it holds of its own its anonymous memory.
    if let Ok(r) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) {
        let field = |k: &str| {
            r.lines()
                .find_map(|l| l.strip_prefix(k))
                .map_or("?".to_string(), |v| v.trim().to_string())
        };
        table.note(&format!(
            "watcher Pss {}, anonymous {}",
            field("Pss:"),
            field("Anonymous:")
        ));
    }
    s.try_close()?;
    Ok(())
}

/// list_vms from a process of its own (`mcqemu call`): no server runs meanwhile.
fn list_by_cli(dirs: &Dirs) -> Res<Value> {
    let out = std::process::Command::new(crate::common::server_bin())
        .args(["call", "list_vms", "{}"])
        .env("MCQEMU_STATE_DIR", &dirs.state)
        .env("MCQEMU_RUNTIME_DIR", &dirs.runtime)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    serde_json::from_slice(&out.stdout).map_err(|e| format!("list_vms: {e}"))
}

fn list_len(s: &mut Server) -> Res<usize> {
    let l = s.tool("list_vms", json!({}))?;
    Ok(structured(&l)?["vms"].as_array().map_or(0, Vec::len))
}

fn watcher_pid(state: &Path) -> Option<i32> {
    let p: i32 = std::fs::read_to_string(state.join("watcher.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Path::new(&format!("/proc/{p}")).exists().then_some(p)
}

fn cpu_ticks(pid: i32) -> Res<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| e.to_string())?;
    let rest = &stat[stat.rfind(')').ok_or("bad stat")? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Ok(n(11) + n(12))
}

fn rss_kb(pid: i32) -> Res<u64> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| "no VmRSS".to_string())
}

/// Stopped sandboxes' records (copies of `like`'s, its QEMU long gone), written beside the
/// real ones under the registry's own lock (the library's registry code, as a second server
/// would).
fn add_fakes(state: &Path, like: &str, n: usize) -> Res<()> {
    let reg = mcqemu::state::registry::Registry::new(state.join("vms.json"));
    reg.update(|vms| {
        let Some(model) = vms.get(like).cloned() else {
            return Ok(Err(format!("no record {like} to copy")));
        };
        for i in 0..n {
            let name = format!("lt-fake-{i:03}");
            let mut rec = model.clone();
            rec.name = Some(name.clone());
            rec.pid = Some(999_999);
            // Its own sockets, as every VM has.
            rec.qmp_socket = Some(format!("/nonexistent/{name}/qmp.sock"));
            rec.launch_qmp_socket = None;
            vms.insert(name, rec);
        }
        Ok::<_, mcqemu::state::registry::RegistryError>(Ok(()))
    })
    .map_err(|e| e.to_string())?
}

fn drop_fakes(state: &Path) -> Res<()> {
    let reg = mcqemu::state::registry::Registry::new(state.join("vms.json"));
    reg.update(|vms| {
        vms.retain(|n, _| !n.starts_with("lt-fake-"));
        Ok::<_, mcqemu::state::registry::RegistryError>(())
    })
    .map_err(|e| e.to_string())
}
