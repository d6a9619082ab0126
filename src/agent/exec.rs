//! Programs the host starts (`guest-exec`), their captured output and their end. As qemu-ga:
//! a program's stdout and stderr are kept up to 16 MiB each ([`super::output`]; the rest is
//! read and dropped, so the program never blocks on a full pipe), and `guest-exec-status` reports it
//! once the program has exited and both pipes have closed, then forgets it. Beyond qemu-ga:
//! `cwd`, an environment added to the agent's own (`env-merge`), and `mcqemu-exec-output`,
//! which hands out the output from given offsets while the program still runs (live output
//! with no spool files), waiting a bounded time for news.
//!
//! Children are reaped in one place ([`Table::reap`], `waitpid(-1)`), which as PID 1 also
//! reaps every orphan of the guest.

use std::collections::HashMap;
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::output::Stream;

/// Programs remembered at once; past it, the oldest that ended is forgotten.
const MAX_PROGRAMS: usize = 1024;
/// Longest wait of one `mcqemu-exec-output`.
pub const MAX_WAIT: Duration = Duration::from_secs(2);

/// What is known of one program, shared with its pipe readers.
#[derive(Debug, Default)]
struct Shared {
    out: Stream,
    err: Stream,
    /// (exit code, signal) once reaped.
    status: Option<(Option<i32>, Option<i32>)>,
}

#[derive(Debug)]
struct Program {
    shared: Arc<(Mutex<Shared>, Condvar)>,
    started: Instant,
}

/// How a program is started.
#[derive(Debug, Default, Clone)]
pub struct Start {
    /// The program (searched in PATH when it has no slash).
    pub path: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// `K=V` entries: its whole environment, or added to the agent's with `merge`.
    pub env: Option<Vec<String>>,
    /// Add `env` to the agent's environment instead of replacing it.
    pub merge: bool,
    /// Its stdin.
    pub input: Option<Vec<u8>>,
    /// Keep its stdout and stderr.
    pub capture: bool,
    /// Its working folder.
    pub cwd: Option<String>,
    /// Its own process group, so that a kill reaches its children too.
    pub group: bool,
    /// Keep the last this many bytes of each stream (a background program's output).
    pub keep_last: Option<usize>,
    /// Run it as a container image's User (guest_exec's programs; mcqemu's own helpers, such
    /// as copies, stay root).
    pub image_user: bool,
}

/// A program's state as reported.
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    /// Ended, and its pipes closed.
    pub exited: bool,
    /// Its exit code.
    pub exitcode: Option<i32>,
    /// The signal that ended it.
    pub signal: Option<i32>,
    /// Its stdout from the asked offset.
    pub out: Vec<u8>,
    /// Its stderr from the asked offset.
    pub err: Vec<u8>,
    /// The stdout offset after `out`.
    pub out_next: usize,
    /// The stderr offset after `err`.
    pub err_next: usize,
    /// The stdout offset of `out`'s first byte (past the asked one when that was dropped).
    pub out_start: usize,
    /// The stderr offset of `err`'s first byte.
    pub err_start: usize,
    /// All the stdout written so far.
    pub out_end: usize,
    /// All the stderr written so far.
    pub err_end: usize,
    /// Stdout went past the cap.
    pub out_truncated: bool,
    /// Stderr went past the cap.
    pub err_truncated: bool,
    /// Whether output was captured at all.
    pub captured: bool,
}

/// Every program started and not yet reported ended.
#[derive(Debug, Default)]
pub struct Table {
    programs: HashMap<i32, Program>,
    captured: HashMap<i32, bool>,
    /// The programs that lead a process group of their own.
    groups: std::collections::HashSet<i32>,
    /// Reap every child (PID 1: orphans are ours to reap), not only the programs started.
    reap_all: bool,
}

impl Table {
    /// An empty table.
    pub fn new() -> Table {
        Table::default()
    }

    /// An empty table that also reaps every other child that ends (for PID 1).
    pub fn reaping_all() -> Table {
        Table {
            reap_all: true,
            ..Table::default()
        }
    }

    /// Starts a program; its PID.
    pub fn start(&mut self, s: &Start) -> Result<i32, String> {
        let mut cmd = Command::new(&s.path);
        cmd.args(&s.args);
        if let Some(env) = &s.env {
            if !s.merge {
                cmd.env_clear();
            }
            for kv in env {
                match kv.split_once('=') {
                    Some((k, v)) if !k.is_empty() => {
                        cmd.env(k, v);
                    }
                    _ => return Err(format!("env entry {kv:?} is not KEY=VALUE")),
                }
            }
        }
        if let Some(dir) = &s.cwd {
            match std::fs::metadata(dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(format!("cwd {dir:?} is not a folder in the guest")),
                Err(e) => return Err(format!("cwd {dir:?} in the guest: {}", os_text(&e))),
            }
            cmd.current_dir(dir);
        }
        cmd.stdin(if s.input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        let (o, e) = if s.capture {
            (Stdio::piped(), Stdio::piped())
        } else {
            (Stdio::null(), Stdio::null())
        };
        cmd.stdout(o).stderr(e);
        if s.group {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
        }
        if let Some((uid, gid)) = super::root::user().filter(|_| s.image_user) {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(gid);
        }
        let mut child = cmd.spawn().map_err(|e| {
            let where_ = s
                .cwd
                .as_deref()
                .map(|c| format!(" in {c}"))
                .unwrap_or_default();
            format!(
                "Failed to execute child process “{}”{where_} ({})",
                s.path,
                os_text(&e)
            )
        })?;
        let pid = child.id() as i32;
        let mut fresh = Shared::default();
        fresh.out.window = s.keep_last;
        fresh.err.window = s.keep_last;
        let shared = Arc::new((Mutex::new(fresh), Condvar::new()));
        if let (Some(mut stdin), Some(input)) = (child.stdin.take(), s.input.clone()) {
            std::thread::spawn(move || {
                use std::io::Write;
                let _ = stdin.write_all(&input);
            });
        }
        match (child.stdout.take(), child.stderr.take()) {
            (Some(out), Some(err)) => {
                drain(out, Arc::clone(&shared), true);
                drain(err, Arc::clone(&shared), false);
            }
            _ => {
                let mut g = lock(&shared.0);
                g.out.closed = true;
                g.err.closed = true;
            }
        }
        // The Child is dropped unwaited: reaping is [`Table::reap`]'s.
        drop(child);
        self.forget_oldest();
        self.programs.insert(
            pid,
            Program {
                shared,
                started: Instant::now(),
            },
        );
        self.captured.insert(pid, s.capture);
        if s.group {
            self.groups.insert(pid);
        }
        Ok(pid)
    }

    /// Sends `sig` to a program started here: to its whole group when it has one of its own.
    /// False when it had already ended.
    pub fn signal(&mut self, pid: i32, sig: i32) -> Result<bool, String> {
        self.reap();
        let Some(p) = self.programs.get(&pid) else {
            return Err("Invalid parameter 'pid'".into());
        };
        if lock(&p.shared.0).status.is_some() {
            return Ok(false);
        }
        let target = if self.groups.contains(&pid) {
            -pid
        } else {
            pid
        };
        // SAFETY: kill(2) on a child of ours that has not been reaped (so its PID, and its
        // group's, cannot have been reused).
        if unsafe { libc::kill(target, sig) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(format!("cannot signal {pid}: {}", os_text(&e)));
        }
        Ok(true)
    }

    fn forget_oldest(&mut self) {
        if self.programs.len() < MAX_PROGRAMS {
            return;
        }
        let oldest_ended = self
            .programs
            .iter()
            .filter(|(_, p)| lock(&p.shared.0).status.is_some())
            .min_by_key(|(_, p)| p.started)
            .map(|(pid, _)| *pid);
        if let Some(pid) = oldest_ended {
            self.programs.remove(&pid);
            self.captured.remove(&pid);
            self.groups.remove(&pid);
        }
    }

    /// Reaps the programs that ended, and as PID 1 every other child too (an orphan's
    /// zombie is just reaped).
    pub fn reap(&mut self) {
        if self.reap_all {
            loop {
                let mut st: libc::c_int = 0;
                // SAFETY: waitpid with a valid pointer to an int; WNOHANG never blocks.
                let pid = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
                if pid <= 0 {
                    return;
                }
                self.note(pid, st);
            }
        }
        let waiting: Vec<i32> = self
            .programs
            .iter()
            .filter(|(_, p)| lock(&p.shared.0).status.is_none())
            .map(|(pid, _)| *pid)
            .collect();
        for pid in waiting {
            let mut st: libc::c_int = 0;
            // SAFETY: as above, for one child of ours.
            if unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) } == pid {
                self.note(pid, st);
            }
        }
    }

    fn note(&mut self, pid: i32, st: libc::c_int) {
        let Some(p) = self.programs.get(&pid) else {
            return;
        };
        let status = if libc::WIFEXITED(st) {
            (Some(libc::WEXITSTATUS(st)), None)
        } else if libc::WIFSIGNALED(st) {
            (None, Some(libc::WTERMSIG(st)))
        } else {
            return;
        };
        let (m, cv) = &*p.shared;
        lock(m).status = Some(status);
        cv.notify_all();
    }

    /// A program's state, its output from the given offsets; with `wait`, first waits (at
    /// most that long) for output past them or its end. `forget`: an ended program is
    /// removed once reported (guest-exec-status).
    pub fn status(
        &mut self,
        pid: i32,
        from: (usize, usize),
        wait: Duration,
        (forget, max): (bool, usize),
    ) -> Result<Status, String> {
        self.reap();
        let Some(p) = self.programs.get(&pid) else {
            return Err("Invalid parameter 'pid'".into());
        };
        let shared = Arc::clone(&p.shared);
        let captured = self.captured.get(&pid).copied().unwrap_or(false);
        let deadline = Instant::now() + wait.min(MAX_WAIT);
        let (m, cv) = &*shared;
        let mut g = lock(m);
        loop {
            let done = g.status.is_some() && g.out.closed && g.err.closed;
            let news = g.out.end() > from.0 || g.err.end() > from.1;
            let now = Instant::now();
            if done || news || now >= deadline {
                break;
            }
            // Wakes on output, on a pipe closing, or after a short tick to reap the child.
            let tick = (deadline - now).min(Duration::from_millis(20));
            g = cv
                .wait_timeout(g, tick)
                .map(|r| r.0)
                .unwrap_or_else(|p| p.into_inner().0);
            if g.status.is_none() {
                drop(g);
                self.reap();
                g = lock(m);
            }
        }
        let exited = g.status.is_some() && g.out.closed && g.err.closed;
        let (exitcode, signal) = g.status.unwrap_or((None, None));
        let (out_start, out) = g.out.from(from.0, max);
        let (err_start, err) = g.err.from(from.1, max);
        let st = Status {
            exited,
            exitcode: if exited { exitcode } else { None },
            signal: if exited { signal } else { None },
            out_next: out_start + out.len(),
            err_next: err_start + err.len(),
            out: out.to_vec(),
            err: err.to_vec(),
            out_start,
            err_start,
            out_end: g.out.end(),
            err_end: g.err.end(),
            out_truncated: g.out.truncated,
            err_truncated: g.err.truncated,
            captured,
        };
        drop(g);
        if exited && forget {
            self.programs.remove(&pid);
            self.captured.remove(&pid);
            self.groups.remove(&pid);
        }
        Ok(st)
    }

    /// The PIDs of the programs still running (for a shutdown to end them).
    pub fn running(&self) -> Vec<i32> {
        self.programs
            .iter()
            .filter(|(_, p)| lock(&p.shared.0).status.is_none())
            .map(|(pid, _)| *pid)
            .collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reads one pipe to its end into the program's capture, waking status waiters.
fn drain<R: Read + Send + 'static>(mut pipe: R, shared: Arc<(Mutex<Shared>, Condvar)>, out: bool) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match pipe.read(&mut buf) {
                Ok(0) => 0,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => 0,
            };
            let (m, cv) = &*shared;
            let mut g = lock(m);
            let s = if out { &mut g.out } else { &mut g.err };
            if n == 0 {
                s.closed = true;
                cv.notify_all();
                return;
            }
            s.add(&buf[..n]);
            cv.notify_all();
        }
    });
}

/// An I/O error's text without Rust's "(os error N)".
pub fn os_text(e: &std::io::Error) -> String {
    let t = e.to_string();
    match t.find(" (os error") {
        Some(i) => t[..i].to_string(),
        None => t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(t: &mut Table, s: Start) -> Status {
        let pid = t.start(&s).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let st = t
                .status(pid, (0, 0), Duration::from_millis(200), (true, usize::MAX))
                .unwrap();
            if st.exited || Instant::now() > deadline {
                return st;
            }
        }
    }

    #[test]
    fn runs_programs_with_input_env_cwd_and_reports_their_end_once() {
        let mut t = Table::new();
        let st = run(
            &mut t,
            Start {
                path: "sh".into(),
                args: vec![
                    "-c".into(),
                    "cat; echo \"$A $PWD\"; echo e >&2; exit 3".into(),
                ],
                env: Some(vec!["A=x y".into()]),
                merge: true,
                input: Some(b"in\n".to_vec()),
                capture: true,
                cwd: Some("/".into()),
                ..Start::default()
            },
        );
        assert!(st.exited);
        assert_eq!(st.exitcode, Some(3));
        assert_eq!(st.out, b"in\nx y /\n");
        assert_eq!(st.err, b"e\n");
        let st = run(
            &mut t,
            Start {
                path: "sh".into(),
                args: vec!["-c".into(), "kill -9 $$".into()],
                capture: true,
                ..Start::default()
            },
        );
        assert_eq!((st.exitcode, st.signal), (None, Some(9)));
        assert!(t.programs.is_empty(), "reported programs are forgotten");
        assert!(t
            .status(12345678, (0, 0), Duration::ZERO, (true, usize::MAX))
            .is_err());
        let err = t
            .start(&Start {
                path: "/no/such/program".into(),
                ..Start::default()
            })
            .unwrap_err();
        assert!(
            err.contains("/no/such/program") && err.contains("No such file"),
            "{err}"
        );
    }

    #[test]
    fn output_is_handed_out_from_offsets_while_the_program_runs() {
        let mut t = Table::new();
        let pid = t
            .start(&Start {
                path: "sh".into(),
                args: vec!["-c".into(), "echo one; sleep 0.5; echo two".into()],
                capture: true,
                ..Start::default()
            })
            .unwrap();
        let st = t
            .status(pid, (0, 0), Duration::from_secs(2), (false, usize::MAX))
            .unwrap();
        assert_eq!(st.out, b"one\n");
        assert!(!st.exited);
        let st = t
            .status(
                pid,
                (st.out_next, 0),
                Duration::from_secs(2),
                (false, usize::MAX),
            )
            .unwrap();
        assert_eq!(st.out, b"two\n");
        let st = loop {
            let st = t
                .status(pid, (8, 0), Duration::from_secs(1), (true, usize::MAX))
                .unwrap();
            if st.exited {
                break st;
            }
        };
        assert_eq!((st.exitcode, st.out.len(), st.out_next), (Some(0), 0, 8));
    }

    #[test]
    fn a_kill_reaches_the_programs_whole_group() {
        let mut t = Table::new();
        let pid = t
            .start(&Start {
                path: "sh".into(),
                args: vec!["-c".into(), "sleep 30 & echo $!; wait".into()],
                capture: true,
                group: true,
                keep_last: Some(4096),
                ..Start::default()
            })
            .unwrap();
        let st = t
            .status(pid, (0, 0), Duration::from_secs(2), (false, usize::MAX))
            .unwrap();
        let child: i32 = String::from_utf8_lossy(&st.out).trim().parse().unwrap();
        assert_eq!(t.signal(pid, libc::SIGTERM), Ok(true));
        let deadline = Instant::now() + Duration::from_secs(5);
        let st = loop {
            let st = t
                .status(pid, (0, 0), Duration::from_millis(200), (false, usize::MAX))
                .unwrap();
            if st.exited || Instant::now() > deadline {
                break st;
            }
        };
        assert_eq!(st.signal, Some(libc::SIGTERM));
        // Gone, or a zombie waiting for whoever inherited it.
        let alive = || {
            std::fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|s| {
                !s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!alive(), "the group's other member got the signal too");
        assert_eq!(t.signal(pid, libc::SIGTERM), Ok(false), "it had ended");
    }
}
