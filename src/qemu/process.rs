//! QEMU processes: spawned detached with a pidfile, liveness (a zombie is not alive), identity
//! from /proc/PID/cmdline, and verified kill escalation.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long QEMU may take to start (parse options, open images, bind its QMP socket).
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// What starting QEMU produced.
#[derive(Debug)]
pub struct Started {
    /// The daemon's PID, when the pidfile could be read.
    pub pid: Option<i32>,
    /// A warning to pass on (e.g. unreadable pidfile).
    pub warning: Option<String>,
}

/// Why QEMU did not start.
#[derive(Debug)]
pub enum SpawnError {
    /// The binary is not installed or not on PATH.
    NotInstalled(String),
    /// The binary could not be executed.
    Exec {
        /// The binary.
        binary: String,
        /// Why exec failed.
        error: std::io::Error,
    },
    /// Waiting for the starting process failed.
    Wait(std::io::Error),
    /// QEMU did not start within [`START_TIMEOUT`] and was killed.
    Timeout,
    /// QEMU exited with an error while starting.
    Failed {
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it wrote to stderr, trimmed (may be empty).
        stderr: String,
    },
}

impl std::fmt::Display for SpawnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpawnError::NotInstalled(binary) => write!(
                f,
                "{binary} is not installed or not on PATH (Debian: apt-get install \
                 qemu-system-x86 for x86_64)"
            ),
            SpawnError::Exec { binary, error } => write!(f, "cannot start {binary}: {error}"),
            SpawnError::Wait(e) => write!(f, "cannot wait for QEMU: {e}"),
            SpawnError::Timeout => write!(
                f,
                "QEMU did not finish starting within {} s and was killed",
                START_TIMEOUT.as_secs()
            ),
            SpawnError::Failed { status, stderr } if stderr.is_empty() => {
                write!(f, "QEMU failed to start: exit status {status}")
            }
            SpawnError::Failed { stderr, .. } => write!(f, "QEMU failed to start: {stderr}"),
        }
    }
}

impl std::error::Error for SpawnError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SpawnError::Exec { error, .. } | SpawnError::Wait(error) => Some(error),
            _ => None,
        }
    }
}

/// What a child runs between fork and exec (async-signal-safe calls only), e.g. joining the
/// namespaces of a VM's egress proxy.
pub type PreExec = Box<dyn Fn() -> std::io::Result<()> + Send + Sync>;

/// `enter` after turning transparent huge pages off for the child (PR_SET_THP_DISABLE, kept
/// across exec): QEMU asks for huge pages on its translation buffer and its own RAM blocks, and
/// each 2 MiB page a clone touches there is its own memory (4.6 MiB of a 256 MiB clone's 42 MiB
/// of Pss_Anon). For VMs whose guest RAM is a file (templates, clones, forks, resumes), which
/// gets no huge pages anyway.
pub fn without_thp(enter: Option<PreExec>) -> PreExec {
    Box::new(move || {
        // SAFETY: prctl is a plain system call, async-signal-safe, touching no parent memory.
        unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        match &enter {
            Some(f) => f(),
            None => Ok(()),
        }
    })
}

/// The program (and its first arguments) that every QEMU is started under, set once by the
/// front end: `mcqemu supervise --state DIR`, which waits for QEMU and records why it ended
/// (only a parent learns an exit status or a signal). Unset (the library's unit tests), QEMU
/// is started directly.
static SUPERVISOR: OnceLock<Vec<std::ffi::OsString>> = OnceLock::new();

/// The file beside a VM's QMP socket `socket` that QEMU's supervisor holds locked from QEMU's
/// start until it has written QEMU's end: a look that finds QEMU gone before then waits on it.
/// It moves with its folder (a pooled clone's).
pub fn supervisor_lock(socket: &Path) -> PathBuf {
    socket.with_file_name("supervisor.lock")
}

/// Starts every later QEMU under `prefix` (called once, before the first launch), which gets
/// `--socket QMP -- BINARY ARGV...` after it.
pub fn supervise_with(prefix: Vec<std::ffi::OsString>) {
    let _ = SUPERVISOR.set(prefix);
}

/// Starts `binary argv...` detached: in its own session, stdin on /dev/null, stdout and stderr
/// into `log`, and ready once something listens on `ready_socket` (QEMU's QMP socket). QEMU's
/// own `-daemonize` cannot be used: it forks after QEMU has entered its seccomp sandbox, which
/// (with `spawn=deny`) kills it with SIGSYS. Under a supervisor ([`supervise_with`]) QEMU is
/// its child, the PID returned is QEMU's (from `pidfile`), and both share a process group. A
/// waiter thread reaps the child whenever it exits while this server runs; after the server
/// exits it is reparented like any daemon.
pub fn spawn_detached(
    binary: &str,
    argv: &[String],
    pidfile: &Path,
    ready_socket: &Path,
    log: &Path,
    enter: Option<PreExec>,
) -> Result<Started, SpawnError> {
    let _ = std::fs::remove_file(pidfile);
    let log_file = std::fs::File::create(log).map_err(SpawnError::Wait)?;
    let log_err = log_file.try_clone().map_err(SpawnError::Wait)?;
    let supervisor = SUPERVISOR.get();
    let mut cmd = match supervisor {
        Some(prefix) => {
            // The supervisor cannot say "not installed" as clearly: look first.
            let found = if binary.contains('/') {
                Path::new(binary).is_file()
            } else {
                std::env::var_os("PATH")
                    .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(binary).is_file()))
            };
            if !found {
                return Err(SpawnError::NotInstalled(binary.to_string()));
            }
            let mut c = Command::new(&prefix[0]);
            c.args(&prefix[1..])
                .arg("--socket")
                .arg(ready_socket)
                .arg("--")
                .arg(binary)
                .args(argv);
            c
        }
        None => {
            let mut c = Command::new(binary);
            c.args(argv);
            c
        }
    };
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(log_file))
        .stderr(Stdio::from(log_err));
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            match &enter {
                Some(f) => f(),
                None => Ok(()),
            }
        });
    }
    let mut child = cmd.spawn().map_err(|error| {
        if let (Some(prefix), std::io::ErrorKind::NotFound) = (supervisor, error.kind()) {
            // mcqemu's own binary is gone (replaced by an upgrade while this server ran).
            SpawnError::Exec {
                binary: format!(
                    "{} (mcqemu's own binary, QEMU's supervisor: restart the server)",
                    Path::new(&prefix[0]).display()
                ),
                error,
            }
        } else if error.kind() == std::io::ErrorKind::NotFound {
            SpawnError::NotInstalled(binary.to_string())
        } else {
            SpawnError::Exec {
                binary: binary.to_string(),
                error,
            }
        }
    })?;
    let pid = child.id() as i32;
    let (wtx, wrx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(format!("qemu-{pid}-reaper"))
        .spawn(move || {
            let _ = wtx.send(child.wait());
        })
        .map_err(SpawnError::Wait)?;
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        match wrx.try_recv() {
            Ok(Ok(status)) => {
                let text = std::fs::read(log).unwrap_or_default();
                let tail = &text[text.len().saturating_sub(64 * 1024)..];
                return Err(SpawnError::Failed {
                    status,
                    stderr: String::from_utf8_lossy(tail).trim().to_string(),
                });
            }
            Ok(Err(e)) => return Err(SpawnError::Wait(e)),
            Err(_) => {}
        }
        if super::sock::is_socket(ready_socket)
            && super::sock::connect(ready_socket, Duration::from_millis(50)).is_ok()
        {
            if supervisor.is_none() {
                return Ok(Started {
                    pid: Some(pid),
                    warning: None,
                });
            }
            return Ok(match supervised_pid(pid, pidfile) {
                Some(q) => Started {
                    pid: Some(q),
                    warning: None,
                },
                None => Started {
                    pid: None,
                    warning: Some(format!(
                        "QEMU runs, but its PID could not be read from {} or its supervisor \
                            (PID {pid}); stop_vm reaches it through QMP only",
                        pidfile.display()
                    )),
                },
            });
        }
        if Instant::now() >= deadline {
            // SAFETY: kill(2) on our own child's process group (it and a supervised QEMU),
            // which the reaper has not reaped yet.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            // SAFETY: as above, the child itself (had setsid not run yet).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = wrx.recv_timeout(Duration::from_secs(5));
            return Err(SpawnError::Timeout);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A supervised QEMU's PID: from its pidfile when the supervisor is its parent, else the
/// supervisor's first child.
fn supervised_pid(supervisor: i32, pidfile: &Path) -> Option<i32> {
    let parent_of = |p: i32| -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        let rest = &stat[stat.rfind(')')? + 1..];
        rest.split_whitespace().nth(1)?.parse().ok()
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let from_file = std::fs::read_to_string(pidfile)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
            .filter(|p| *p > 0 && parent_of(*p) == Some(supervisor));
        if from_file.is_some() {
            return from_file;
        }
        let child =
            std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children"))
                .ok()
                .and_then(|t| t.split_whitespace().next()?.parse::<i32>().ok());
        if child.is_some() || Instant::now() >= deadline {
            return child;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The seccomp mode the kernel enforces on a process (`Seccomp:` in /proc/PID/status):
/// "filter" for QEMU's `-sandbox on`, "strict", or "off"; None when the process is gone.
pub fn seccomp(pid: i32) -> Option<&'static str> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let mode = status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))?
        .trim();
    Some(match mode {
        "2" => "filter",
        "1" => "strict",
        _ => "off",
    })
}

/// The process state letter from /proc/PID/stat (R, S, D, Z, T, ...), or None if gone.
pub fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rfind(')').map(|i| &stat[i + 1..])?;
    after.trim_start().chars().next()
}

/// Alive: the PID exists and is neither a zombie nor dead. A thread-group leader that exited
/// before its other threads already reads as a zombie while they still run (and still hold
/// its sockets open, as QEMU's do for a few milliseconds after SIGKILL), so a zombie leader
/// with a live thread counts as alive.
pub fn alive(pid: i32) -> bool {
    pid > 0
        && match state(pid) {
            None | Some('X') | Some('x') => false,
            Some('Z') => live_thread(pid),
            Some(_) => true,
        }
}

fn live_thread(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|t| {
        std::fs::read_to_string(t.path().join("stat"))
            .ok()
            .and_then(|stat| {
                let after = &stat[stat.rfind(')')? + 1..];
                after.trim_start().chars().next()
            })
            .is_some_and(|c| !matches!(c, 'Z' | 'X' | 'x'))
    })
}

/// The arguments of a live process.
pub fn cmdline(pid: i32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
    )
}

/// True when `pid`'s command line proves it is the VM with this QMP socket: a PID reused by
/// another program, or by another VM, does not pass.
pub fn is_our_vm(pid: i32, qmp_socket: &Path) -> bool {
    let Some(args) = cmdline(pid) else {
        return false;
    };
    let sock = super::cmdline::qopt(&qmp_socket.to_string_lossy());
    let want = format!("unix:{sock},");
    args.iter().any(|a| a.starts_with(&want))
}

/// Sends `sig` to `pid`; false when it no longer exists.
pub fn signal(pid: i32, sig: i32) -> bool {
    // SAFETY: kill(2) with a positive pid has no memory-safety preconditions.
    pid > 0 && unsafe { libc::kill(pid, sig) } == 0
}

/// Waits until `pid` is no longer alive, up to `limit`. True when it died.
pub fn wait_dead(pid: i32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if !alive(pid) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A process that outlived SIGKILL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillError {
    /// Its PID.
    pub pid: i32,
    /// Its state letter after SIGKILL (D: stuck in the kernel), None when it was unreadable.
    pub state: Option<char>,
}

impl std::fmt::Display for KillError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "process {} survived SIGKILL for 5 s (state {:?}); it may be stuck in the kernel (D \
             state)",
            self.pid, self.state
        )
    }
}

impl std::error::Error for KillError {}

/// SIGTERM, then SIGKILL, each verified. Returns the steps taken, or an error when even
/// SIGKILL did not end it.
pub fn terminate(pid: i32) -> Result<Vec<&'static str>, KillError> {
    terminate_within(pid, Duration::from_secs(3))
}

/// [`terminate`], giving SIGTERM `term_wait` (zero: straight to SIGKILL, which also ends a
/// stopped process).
pub fn terminate_within(pid: i32, term_wait: Duration) -> Result<Vec<&'static str>, KillError> {
    let mut steps = Vec::new();
    if !alive(pid) {
        return Ok(steps);
    }
    if !term_wait.is_zero() {
        signal(pid, libc::SIGTERM);
        steps.push("SIGTERM");
        if wait_dead(pid, term_wait) {
            return Ok(steps);
        }
    }
    signal(pid, libc::SIGKILL);
    steps.push("SIGKILL");
    if wait_dead(pid, Duration::from_secs(5)) {
        return Ok(steps);
    }
    Err(KillError {
        pid,
        state: state(pid),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_alive_and_dead_pid_is_not() {
        assert!(alive(std::process::id() as i32));
        assert!(!alive(i32::MAX - 1));
        assert!(!alive(0));
    }

    #[test]
    fn zombie_is_not_alive_and_terminate_verifies() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        assert!(alive(pid));
        let steps = terminate(pid).unwrap();
        assert_eq!(steps, vec!["SIGTERM"]);
        assert!(!alive(pid), "a zombie must read as dead");
        let _ = child.wait();
    }
}
