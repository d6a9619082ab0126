//! Running programs to completion, every run bounded: the `mcqemu` CLI and external tools
//! (qemu-img, qemu-system-x86_64, the test-guest builder).

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use super::files::TempDir;
use super::server::BIN;

/// What a finished program run produced.
#[derive(Debug)]
pub struct Finished {
    /// How it exited.
    pub status: ExitStatus,
    /// Everything it wrote to stdout.
    pub stdout: Vec<u8>,
    /// Everything it wrote to stderr.
    pub stderr: Vec<u8>,
}

/// Runs `cmd` to completion, feeding it `stdin` (None: /dev/null); stdout and stderr are piped
/// and drained on their own threads, so a chatty stderr cannot block a program whose stdout is
/// being read. Kills it when it has not finished within `timeout`. An `Err` says the program
/// could not start or did not finish in time; how it exited is the caller's to judge.
pub fn try_run_command(
    cmd: &mut Command,
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> Result<Finished, String> {
    let what = {
        let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy()).collect();
        format!("{} {args:?}", cmd.get_program().to_string_lossy())
    };
    let deadline = Instant::now() + timeout;
    let mut child = cmd
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    let writer = stdin.map(|bytes| {
        let bytes = bytes.to_vec();
        let pipe = child.stdin.take();
        std::thread::spawn(move || {
            if let Some(mut pipe) = pipe {
                let _ = pipe.write_all(&bytes);
            }
        })
    });
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let left = || deadline.saturating_duration_since(Instant::now());
    // Both pipes reach their end when the program exits (or when it closes them).
    let piped = out
        .recv_timeout(left())
        .and_then(|o| err.recv_timeout(left()).map(|e| (o, e)));
    let status = match piped {
        Ok(_) => loop {
            // The pipes close a moment before the exit status is ready.
            match child.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(100))
                }
                Ok(None) => break None,
                Err(e) => return Err(format!("waiting for {what}: {e}")),
            }
        },
        Err(_) => None,
    };
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!("{what} did not finish within {timeout:?}"));
    };
    if let Some(w) = writer {
        let _ = w.join();
    }
    let (stdout, stderr) = piped.unwrap_or_default();
    Ok(Finished {
        status,
        stdout,
        stderr,
    })
}

/// Reads a pipe to its end on a thread; the bytes arrive on the returned channel.
pub fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        let _ = tx.send(buf);
    });
    rx
}

/// Runs `program args` (bounded by `timeout`) and returns its stdout; an `Err` also when it
/// exits unsuccessfully (with its stderr in the message).
pub fn try_run(program: &str, args: &[&OsStr], timeout: Duration) -> Result<Vec<u8>, String> {
    let done = try_run_command(Command::new(program).args(args), None, timeout)?;
    if !done.status.success() {
        return Err(format!(
            "{program} failed ({}): {}",
            done.status,
            String::from_utf8_lossy(&done.stderr).trim()
        ));
    }
    Ok(done.stdout)
}

/// Runs a program to completion (60 s bound) and returns (success, stdout, stderr).
pub fn run_tool(program: &str, args: &[&str]) -> (bool, String, String) {
    let done = try_run_command(
        Command::new(program).args(args),
        None,
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    (
        done.status.success(),
        String::from_utf8_lossy(&done.stdout).into_owned(),
        String::from_utf8_lossy(&done.stderr).into_owned(),
    )
}

/// What a CLI run produced.
#[derive(Debug)]
pub struct CliOutput {
    /// Exit code (None when killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs `mcqemu ARGS` with state and runtime folders inside `tmp`, feeding `stdin` (None:
/// /dev/null), bounded by `timeout`.
pub fn run_cli_with(
    tmp: &TempDir,
    args: &[&str],
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> CliOutput {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env("MCQEMU_STATE_DIR", tmp.join("state"))
        .env("MCQEMU_RUNTIME_DIR", tmp.join("runtime"))
        .env("MCQEMU_ROOTS", super::server::test_roots());
    let done = try_run_command(&mut cmd, stdin, timeout).unwrap_or_else(|e| panic!("{e}"));
    let out = CliOutput {
        code: done.status.code(),
        stdout: String::from_utf8_lossy(&done.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&done.stderr).into_owned(),
    };
    // `mcqemu call TOOL` prints the structured result on success: it must match the tool's
    // output schema as a stdio result must.
    if let (["call", tool, ..], Some(0)) = (args, out.code) {
        if let Ok(sc) = serde_json::from_str::<serde_json::Value>(&out.stdout) {
            let resp = serde_json::json!({"result": {"structuredContent": sc}});
            if let Err(why) = super::schema::check_call_response(tool, &resp) {
                panic!("mcqemu call {tool}: {why}");
            }
        }
    }
    out
}

/// Runs `mcqemu ARGS` (no stdin) with a 60 s bound.
pub fn run_cli(tmp: &TempDir, args: &[&str]) -> CliOutput {
    run_cli_with(tmp, args, None, Duration::from_secs(60))
}

/// Runs a cached artifact builder (`python3 SCRIPT OUT`, which prints JSON) under a file lock in
/// `OUT`, so two test binaries (or a test and the bench) never build at once; the lock wait and
/// the build together are bounded by `timeout`. `what` names the artifact in errors.
pub fn run_locked_builder(
    what: &str,
    script: &std::path::Path,
    out: &std::path::Path,
    timeout: Duration,
) -> Result<serde_json::Value, String> {
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg(out);
    let stdout = run_locked(what, &mut cmd, out, timeout)?;
    let name = script
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    serde_json::from_slice(&stdout).map_err(|e| {
        format!(
            "{name} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&stdout)
        )
    })
}

/// Runs `cmd` under the file lock `lock_dir/.build.lock` (see [`run_locked_builder`]) and
/// returns its stdout; it must exit 0.
pub fn run_locked(
    what: &str,
    cmd: &mut Command,
    lock_dir: &std::path::Path,
    timeout: Duration,
) -> Result<Vec<u8>, String> {
    use std::os::unix::io::AsRawFd;
    let out = lock_dir;
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let lock_path = out.join(".build.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("cannot open the {what} build lock: {e}"))?;
    let deadline = std::time::Instant::now() + timeout;
    // Released when `lock` closes.
    loop {
        // SAFETY: flock on a file descriptor we own; no memory is involved.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            break;
        }
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "another build of the {what} held {} for over {timeout:?}",
                lock_path.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    let built = try_run_command(cmd, None, left.max(Duration::from_secs(1)));
    drop(lock);
    let program = cmd.get_program().to_string_lossy().into_owned();
    let built = built.map_err(|e| format!("{program} (the {what}): {e} (run .ci/setup-host)"))?;
    if !built.status.success() {
        return Err(format!(
            "{program} {:?} (the {what}) failed ({}): {}",
            cmd.get_args().collect::<Vec<_>>(),
            built.status,
            String::from_utf8_lossy(&built.stderr).trim()
        ));
    }
    Ok(built.stdout)
}
