//! `mcqemu supervise --state DIR --socket QMP -- QEMU ARGV...` (internal): QEMU's parent for
//! its whole life. It waits for QEMU, and when it ends writes why into the VM's record (only a
//! parent sees an exit status or a signal), then exits with QEMU's status; it holds the VM's
//! `supervisor.lock` until then. Started in its own session by the launch; QEMU shares its
//! process group, its log and its namespaces.

use std::path::PathBuf;
use std::process::Command;

use crate::ops::vm::ends::{self, Exit};

/// Runs the supervisor; its exit code is QEMU's (128 + the signal that killed it).
pub fn main(args: &[String]) -> i32 {
    let mut state: Option<PathBuf> = None;
    let mut socket: Option<PathBuf> = None;
    let mut it = args.iter();
    let mut program: Vec<&String> = Vec::new();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--state" => state = it.next().map(PathBuf::from),
            "--socket" => socket = it.next().map(PathBuf::from),
            "--" => {
                program = it.by_ref().collect();
                break;
            }
            other => return super::usage(&format!("supervise: unknown option {other:?}")),
        }
    }
    let (Some(state), Some(socket), Some((binary, argv))) = (state, socket, program.split_first())
    else {
        return super::usage("supervise needs --state DIR --socket PATH -- QEMU ARGS...");
    };
    // The registry this QEMU's record is in, whatever the environment says later.
    std::env::set_var("MCQEMU_STATE_DIR", &state);
    // The OOM killer's count, sampled every 2 s: a SIGKILL is blamed on it only when the count
    // rose within the last sample or two, not at any time in QEMU's life.
    let oom_seen = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(
        crate::host::procstat::oom_kills().unwrap_or(0),
    ));
    let sampler = oom_seen.clone();
    let _ = std::thread::Builder::new()
        .name("oom-sample".into())
        .spawn(move || loop {
            std::thread::sleep(std::time::Duration::from_secs(2));
            if let Some(n) = crate::host::procstat::oom_kills() {
                sampler.store(n, std::sync::atomic::Ordering::Relaxed);
            }
        });
    // Held until QEMU's end is written: a look that finds QEMU gone before then waits on it
    // instead of calling the end unknown. A folder it cannot be made in costs only that.
    let _writing =
        crate::state::lockfile::try_lock(&crate::qemu::process::supervisor_lock(&socket));
    let mut child = match Command::new(binary).args(argv).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mcqemu [error] cannot start {binary}: {e}");
            return 127;
        }
    };
    let pid = child.id() as i32;
    let status = loop {
        match child.wait() {
            Ok(s) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("mcqemu [error] cannot wait for QEMU (PID {pid}): {e}");
                return 1;
            }
        }
    };
    use std::os::unix::process::ExitStatusExt;
    let exit = Exit {
        code: status.code(),
        signal: status.signal(),
    };
    let oom_delta = crate::host::procstat::oom_kills()
        .unwrap_or(0)
        .saturating_sub(oom_seen.load(std::sync::atomic::Ordering::Relaxed));
    let log = log_path().unwrap_or_default();
    ends::record_exit(pid, &socket, exit, &log, oom_delta);
    match (exit.code, exit.signal) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        _ => 1,
    }
}

/// The file standard error goes to (QEMU's log), read back for QEMU's last words.
fn log_path() -> Option<PathBuf> {
    std::fs::read_link("/proc/self/fd/2")
        .ok()
        .filter(|p| p.is_file())
}
