//! The VM rows: real QEMUs (TCG) driven through the server. This file holds what the sections
//! share, the diskless BIOS VM section (vm_info, list_vms, stop_vm, launch_vm against bare
//! QEMU) and the cleanup between sections; `guest.rs` holds the test-guest sections.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{cmdline, drain, try_read_pidfile, try_run, try_test_guest, Server, VmKiller};
use crate::guest::{guest_rows, sandbox_rows};
use crate::report::{Bench, Stats, Table};
use crate::{
    env_count, structured, Dirs, Res, ToolCalls, LAUNCH_OVERHEAD_TARGET, LIST_VMS_TARGET,
    QEMU_IMG_TIMEOUT, STOP_TARGET, VM_INFO_TARGET,
};

/// The system emulator the VM rows launch (the server runs `qemu-system-{arch}` too).
const QEMU_BIN: &str = "qemu-system-x86_64";
/// Longest wait for a tool call that starts or stops a QEMU or moves megabytes through a guest.
pub const VM_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// sandbox_vm's own wait for the agent (wait_agent_s).
pub const SANDBOX_WAIT_S: u64 = 60;
/// Longest wait for a sandbox_vm call: its agent wait plus launching.
pub const SANDBOX_CALL_TIMEOUT: Duration = Duration::from_secs(SANDBOX_WAIT_S + 60);
/// Longest a test guest may take from launch until its agent answers.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest wait for a bare QEMU's daemonizing parent to exit.
const BARE_START_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for a pidfile, or for a SIGKILLed QEMU to be gone.
const PID_WAIT: Duration = Duration::from_secs(5);
/// Longest wait for a freshly booted diskless BIOS VM to go idle.
const IDLE_WAIT: Duration = Duration::from_secs(30);
/// Dead records in the registry for the list_vms row.
const GHOSTS: usize = 100;

/// What the VM rows share.
pub struct VmBench<'a> {
    dirs: &'a Dirs,
    /// Kills whatever QEMU of the bench is left (PIDs it is told, and `*.pid` files under the
    /// bench's temp folder).
    pub killer: &'a VmKiller,
    /// Rows of a few QMP round trips: the bench's own repetitions.
    pub quick: Bench,
    /// Rows that start or stop a QEMU, or wait for the guest.
    pub slow: Bench,
    /// The 8 MiB guest_file_read row.
    pub bulk: Bench,
    /// Guest boots for the sandbox_vm rows (each paired with a reference boot).
    pub boots: usize,
}

/// All VM rows. A section that cannot run prints SKIPPED rows; one that fails prints an ERROR
/// line (counted, so the bench exits non-zero) and the next section still runs. Every VM is
/// stopped before this returns.
pub fn vm_rows(n: usize, table: &mut Table, dirs: &Dirs, base_image: &Path) {
    let vm_n = env_count("MCQEMU_BENCH_VM_N", n.min(20));
    let killer = VmKiller::new(dirs.tmp.path());
    let vb = VmBench {
        dirs,
        killer: &killer,
        quick: Bench { n, warmup: 3 },
        slow: Bench { n: vm_n, warmup: 1 },
        bulk: Bench {
            n: vm_n.min(10),
            warmup: 1,
        },
        boots: env_count("MCQEMU_BENCH_BOOTS", n.min(10)),
    };
    table.section("VM tools: real QEMU (TCG), driven over MCP");

    let diskless = "diskless VM: vm_info, list_vms, stop_vm, launch_vm";
    let guest_rows_name = "test guest: guest_exec, guest_file_read, screen, keys, mouse";
    let sandbox_name = "test guest: sandbox_vm readiness";
    let qemu = match try_run(QEMU_BIN, &[OsStr::new("--version")], QEMU_IMG_TIMEOUT) {
        Ok(out) => String::from_utf8_lossy(&out)
            .lines()
            .next()
            .unwrap_or("")
            .to_string(),
        Err(e) => {
            let why = format!("{QEMU_BIN} is not usable ({e})");
            for row in [diskless, guest_rows_name, sandbox_name] {
                table.skip_row(row, &why);
            }
            return;
        }
    };
    table.note(&format!("{qemu}; accel tcg (1 vCPU per VM)"));
    table.note(&format!(
        "repetitions: {n} for QMP-sized rows, {} for rows that start/stop/exec, {} for the \
         8 MiB read, {} guest boots (x2) for sandbox_vm",
        vb.slow.n, vb.bulk.n, vb.boots
    ));

    if let Err(e) = diskless_rows(&vb, table) {
        table.error_row(diskless, &e);
    }
    vb.cleanup(table);

    match try_test_guest() {
        Err(e) => {
            let why = format!("the test guest could not be built: {e}");
            table.skip_row(guest_rows_name, &why);
            table.skip_row(sandbox_name, &why);
        }
        Ok(guest) => {
            if let Err(e) = guest_rows(&vb, table, &guest) {
                table.error_row(guest_rows_name, &e);
            }
            vb.cleanup(table);
            if let Err(e) = sandbox_rows(&vb, table, &guest, base_image) {
                table.error_row(sandbox_name, &e);
            }
        }
    }
    vb.cleanup(table);
}

impl VmBench<'_> {
    /// A fresh, initialized server on the bench's state and runtime folders.
    pub fn server(&self) -> Res<Server> {
        self.dirs.server()
    }

    /// launch_vm; returns its structured result and remembers the PID for the last-resort kill.
    pub fn launch(&self, server: &mut Server, args: Value) -> Res<Value> {
        let r = server.tool_within("launch_vm", args, VM_CALL_TIMEOUT)?;
        let s = structured(&r)?.clone();
        self.killer.track(&s);
        Ok(s)
    }

    /// stop_vm force=true, which must report the VM stopped.
    pub fn stop(&self, server: &mut Server, name: &str) -> Res<()> {
        let r = server.tool_within(
            "stop_vm",
            json!({"name": name, "force": true}),
            VM_CALL_TIMEOUT,
        )?;
        let s = structured(&r)?;
        if s["status"] != json!("stopped") {
            return Err(format!("stop_vm {name} did not stop it: {s}"));
        }
        Ok(())
    }

    /// The bench's MCQEMU_STATE_DIR.
    pub fn state(&self) -> &Path {
        &self.dirs.state
    }

    /// The bench's MCQEMU_RUNTIME_DIR.
    pub fn runtime(&self) -> &Path {
        &self.dirs.runtime
    }

    pub fn serial_log(&self, name: &str) -> PathBuf {
        self.dirs.state.join("vms").join(name).join("serial.log")
    }

    /// Stops every VM the registry still shows alive (sandbox_destroy for sandboxes, stop_vm
    /// force=true otherwise), then SIGKILLs whatever QEMU of this bench is left.
    pub fn cleanup(&self, table: &Table) {
        let mut problems = Vec::new();
        let mut stopped = Vec::new();
        match self.server() {
            Err(e) => problems.push(e),
            Ok(mut server) => {
                let listed = server
                    .tool("list_vms", json!({}))
                    .and_then(|r| Ok(structured(&r)?["vms"].clone()));
                match listed {
                    Err(e) => problems.push(e),
                    Ok(vms) => {
                        for v in vms.as_array().into_iter().flatten() {
                            let name = v["name"].as_str().unwrap_or("").to_string();
                            if v["status"] == json!("stopped") || name.is_empty() {
                                continue;
                            }
                            let done = if v["sandbox"].is_object() {
                                server.tool_within(
                                    "sandbox_destroy",
                                    json!({"name": name}),
                                    VM_CALL_TIMEOUT,
                                )
                            } else {
                                server.tool_within(
                                    "stop_vm",
                                    json!({"name": name, "force": true}),
                                    VM_CALL_TIMEOUT,
                                )
                            };
                            match done {
                                Ok(_) => stopped.push(name),
                                Err(e) => problems.push(e),
                            }
                        }
                    }
                }
                if let Err(e) = server.try_close() {
                    problems.push(e);
                }
            }
        }
        if !stopped.is_empty() {
            table.note(&format!("cleanup stopped left-over VMs: {stopped:?}"));
        }
        for p in problems {
            table.note(&format!("cleanup problem: {p}"));
        }
        let killed = self.killer.kill_all();
        if !killed.is_empty() {
            table.note(&format!("cleanup SIGKILLed left-over QEMU PIDs {killed:?}"));
        }
    }
}

/// launch_vm arguments of the diskless BIOS VM.
fn bios_args(name: &str) -> Value {
    json!({"name": name, "memory_mb": 64, "cpus": 1, "accel": "tcg"})
}

// ---- diskless BIOS VM: vm_info, list_vms, stop_vm, launch_vm against bare QEMU ----

fn diskless_rows(vb: &VmBench, table: &mut Table) -> Res<()> {
    let mut server = vb.server()?;
    let bios = "bench-bios";
    let launched = vb.launch(&mut server, bios_args(bios))?;
    // A diskless BIOS VM spends its first seconds in SeaBIOS and iPXE (DHCP, PXE); a busy TCG
    // vCPU slows QEMU's monitor, so the QMP-sized rows are measured once the VM is idle.
    let pid = launched["pid"].as_i64().ok_or("launch_vm gave no pid")? as i32;
    match wait_idle(pid, IDLE_WAIT) {
        Some(after) => table.note(&format!(
            "BIOS VM idle (SeaBIOS/iPXE done) {} s after launch; vm_info and list_vms run on \
             the idle VM",
            after.as_secs_f64().round()
        )),
        None => table.note(&format!(
            "BIOS VM still busy {} s after launch; measuring anyway",
            IDLE_WAIT.as_secs()
        )),
    }
    vb.quick.time(
        table,
        "vm_info (running diskless BIOS VM)",
        Some(VM_INFO_TARGET),
        || {
            let r = server.tool("vm_info", json!({ "name": bios }))?;
            let s = structured(&r)?;
            match s["status"].as_str() {
                Some("running") => Ok(()),
                _ => Err(format!("vm_info does not show {bios} running: {s}")),
            }
        },
    )?;
    server.try_close()?;

    // list_vms: 100 dead records written before the server starts, plus the live VM.
    set_ghosts(&vb.dirs.state, vb.dirs.tmp.path(), true)?;
    let listed = (|| {
        let mut server = vb.server()?;
        vb.quick.time(
            table,
            "list_vms (100 dead records + 1 live VM)",
            Some(LIST_VMS_TARGET),
            || {
                let r = server.tool("list_vms", json!({}))?;
                let vms = structured(&r)?["vms"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let live = vms
                    .iter()
                    .filter(|v| v["status"] != json!("stopped"))
                    .count();
                if vms.len() != GHOSTS + 1 || live != 1 {
                    return Err(format!(
                        "list_vms showed {} VMs, {live} alive; expected {} and 1",
                        vms.len(),
                        GHOSTS + 1
                    ));
                }
                Ok(())
            },
        )?;
        server.try_close()
    })();
    set_ghosts(&vb.dirs.state, vb.dirs.tmp.path(), false)?;
    listed?;

    let mut server = vb.server()?;
    vb.stop(&mut server, bios)?;

    // Forced stop of a running VM: launched (untimed), left running briefly, stopped (timed).
    let stop = "bench-stop";
    vb.slow.measure(
        table,
        "stop_vm force=true (running BIOS VM)",
        Some(STOP_TARGET),
        || {
            vb.launch(&mut server, bios_args(stop))?;
            std::thread::sleep(Duration::from_millis(200));
            let t0 = Instant::now();
            vb.stop(&mut server, stop)?;
            Ok(t0.elapsed())
        },
    )?;

    // launch_vm against QEMU's own start-up. Each repetition runs, back to back (so all see
    // the same background load): the bench's minimal QEMU command; launch_vm's exact QEMU
    // argv started directly, timed to the parent's exit and again to the end of the QMP
    // session launch_vm opens right after it (query-kvm, query-status); and launch_vm over
    // MCP. Daemons are killed and launched VMs force-stopped outside the timed parts.
    let name = "bench-launch";
    let s = vb.launch(&mut server, bios_args(name))?;
    let argv = s["pid"]
        .as_i64()
        .and_then(|p| cmdline(p as i32))
        .ok_or("could not read launch_vm's QEMU command line from /proc")?;
    vb.stop(&mut server, name)?;

    let bare_dir = vb.dirs.tmp.join("bare");
    std::fs::create_dir_all(&bare_dir).map_err(|e| format!("cannot create bare/: {e}"))?;
    let qmp = bare_dir.join("qmp.sock");
    let plain: Vec<String> = [
        "-display",
        "none",
        "-machine",
        "q35",
        "-accel",
        "tcg",
        "-m",
        "64",
        "-daemonize",
        "-pidfile",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        bare_dir.join("qemu.pid").display().to_string(),
        "-qmp".to_string(),
        format!("unix:{},server=on,wait=off", qmp.display()),
    ])
    .collect();

    let rt = vb.dirs.runtime.join(name).display().to_string();
    let sd = vb.dirs.state.join("vms").join(name).display().to_string();
    let same_dir = vb.dirs.tmp.join("bare-same");
    std::fs::create_dir_all(&same_dir).map_err(|e| format!("cannot create bare-same/: {e}"))?;
    let same_s = same_dir.display().to_string();
    // launch_vm starts QEMU detached itself (QEMU's -daemonize forks after entering its
    // seccomp sandbox, which spawn=deny forbids): the bare run daemonizes the same argv
    // without -sandbox, so both are timed to the same point (QMP listening).
    let mut same: Vec<String> = Vec::new();
    let mut args = argv.iter().skip(1);
    while let Some(a) = args.next() {
        if a == "-sandbox" {
            args.next();
            continue;
        }
        same.push(a.replace(&rt, &same_s).replace(&sd, &same_s));
    }
    same.push("-daemonize".into());
    if same.iter().any(|a| a.contains(&rt) || a.contains(&sd)) {
        return Err(format!(
            "could not move launch_vm's argv to {same_s}: {same:?}"
        ));
    }
    let same_qmp = same_dir.join("qmp.sock");

    let (mut plain_t, mut same_t, mut same_qmp_t, mut mcp_t) = (vec![], vec![], vec![], vec![]);
    for i in 0..vb.slow.warmup + vb.slow.n {
        let run = |e: String| format!("launch_vm vs bare qemu (run {}): {e}", i + 1);
        let (a, _) = bare_start(vb.killer, &plain, &bare_dir, None).map_err(run)?;
        let (b, c) = bare_start(vb.killer, &same, &same_dir, Some(&same_qmp)).map_err(run)?;
        let t0 = Instant::now();
        vb.launch(&mut server, bios_args(name)).map_err(run)?;
        let d = t0.elapsed();
        vb.stop(&mut server, name).map_err(run)?;
        if i >= vb.slow.warmup {
            plain_t.push(a);
            same_t.push(b);
            same_qmp_t.push(c.unwrap_or(b));
            mcp_t.push(d);
        }
    }
    let n = vb.slow.n;
    let row = |table: &mut Table, name: &str, v: Vec<Duration>| {
        let s = Stats::of(v);
        table.time_row(name, n, &s, None);
        s
    };
    let plain_s = row(table, "bare qemu -daemonize (minimal argv)", plain_t);
    let same_s = row(table, "bare qemu -daemonize (launch_vm's argv)", same_t);
    let same_qmp_s = row(table, "  ... + launch_vm's first QMP session", same_qmp_t);
    let mcp = row(table, "launch_vm (diskless BIOS, via MCP)", mcp_t);
    table.diff_row(
        "launch_vm - bare qemu (median diff)",
        mcp.median,
        plain_s.median,
        LAUNCH_OVERHEAD_TARGET,
    );
    table.diff_info_row(
        "launch_vm - same-argv qemu (median diff)",
        mcp.median,
        same_s.median,
    );
    table.diff_info_row(
        "launch_vm - same argv + QMP (median diff)",
        mcp.median,
        same_qmp_s.median,
    );
    server.try_close()
}

/// Waits (bounded) until QEMU `pid` uses at most 1 clock tick of CPU per half second;
/// returns how long that took, or None when it stayed busy.
fn wait_idle(pid: i32, limit: Duration) -> Option<Duration> {
    let cpu_ticks = || -> Option<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let f: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
        // utime and stime: fields 14 and 15 of stat, 12 and 13 after the command name.
        Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
    };
    let t0 = Instant::now();
    let mut last = cpu_ticks()?;
    while t0.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(500));
        let now = cpu_ticks()?;
        if now.saturating_sub(last) <= 1 {
            return Some(t0.elapsed());
        }
        last = now;
    }
    None
}

/// Adds (or removes) the dead registry records of the list_vms row, while no server runs.
fn set_ghosts(state: &Path, tmp: &Path, add: bool) -> Res<()> {
    let file = state.join("vms.json");
    let mut top: Value = match std::fs::read(&file) {
        Ok(b) => serde_json::from_slice(&b)
            .map_err(|e| format!("{} is not JSON: {e}", file.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => json!({"version": 1, "vms": {}}),
        Err(e) => return Err(format!("cannot read {}: {e}", file.display())),
    };
    let vms = top
        .get_mut("vms")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| format!("{} has no vms object", file.display()))?;
    for i in 0..GHOSTS {
        let name = format!("ghost-{i:03}");
        if add {
            let sock = tmp.join(format!("nonexistent-{i}.sock"));
            vms.insert(
                name,
                json!({"qmp_socket": sock.display().to_string(), "pid": null, "source": "spawned", "arch": "x86_64"}),
            );
        } else {
            vms.remove(&name);
        }
    }
    let part = state.join("vms.json.bench-tmp");
    let bytes = serde_json::to_vec_pretty(&top).map_err(|e| e.to_string())?;
    std::fs::write(&part, bytes)
        .and_then(|_| std::fs::rename(&part, &file))
        .map_err(|e| format!("cannot write {}: {e}", file.display()))
}

/// Runs `qemu-system-x86_64 ARGS` (which daemonize with `-pidfile DIR/qemu.pid`) the way the
/// server does (stdin and stdout on /dev/null, stderr piped) and times it until the daemonizing
/// parent exits; with `qmp`, also until the QMP session launch_vm opens right after start-up
/// (greeting, capabilities, query-kvm, query-status) has finished. Then SIGKILLs the daemon
/// (untimed).
fn bare_start(
    killer: &VmKiller,
    args: &[String],
    dir: &Path,
    qmp: Option<&Path>,
) -> Res<(Duration, Option<Duration>)> {
    let pidfile = dir.join("qemu.pid");
    for f in [
        "qemu.pid",
        "qmp.sock",
        "qga.sock",
        "serial.sock",
        "serial.log",
    ] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    let t0 = Instant::now();
    let mut child = Command::new(QEMU_BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {QEMU_BIN}: {e}"))?;
    let parent = child.id() as i32;
    let stderr = drain(child.stderr.take());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let status = child.wait();
        let _ = tx.send((status, Instant::now()));
    });
    let (status, exited) = match rx.recv_timeout(BARE_START_TIMEOUT) {
        Ok((Ok(status), at)) => (status, at),
        Ok((Err(e), _)) => return Err(format!("waiting for {QEMU_BIN}: {e}")),
        Err(_) => {
            // SAFETY: kill(2) on our own child's PID; no memory is involved.
            unsafe { libc::kill(parent, libc::SIGKILL) };
            return Err(format!(
                "{QEMU_BIN} did not daemonize within {} s",
                BARE_START_TIMEOUT.as_secs()
            ));
        }
    };
    let took = exited - t0;
    if !status.success() {
        let err = stderr.recv_timeout(PID_WAIT).unwrap_or_default();
        return Err(format!(
            "{QEMU_BIN} failed to start ({status}): {}",
            String::from_utf8_lossy(&err).trim()
        ));
    }
    let pid = try_read_pidfile(&pidfile, PID_WAIT).map_err(|e| format!("{QEMU_BIN}: {e}"));
    if let Ok(pid) = pid {
        killer.track_pid(pid);
    }
    let with_qmp = qmp.map(|sock| {
        mcqemu::qemu::qmp::with_session(sock, |q| {
            q.execute("query-kvm", None)?;
            q.execute("query-status", None)
        })
        .map(|_| t0.elapsed())
        .map_err(|e| format!("QMP on {}: {e}", sock.display()))
    });
    let pid = pid?;
    if !killer.kill(pid) {
        return Err(format!(
            "daemonized QEMU {pid} was not ours or already gone"
        ));
    }
    Ok((took, with_qmp.transpose()?))
}
