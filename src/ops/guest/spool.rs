//! Programs whose output is read while they run. qemu-ga's own guest-exec hands a program's
//! output back only once it has exited, so a program that must be watched (live output in a
//! call's progress, a background process read by offsets) runs under a small `sh` wrapper that
//! sends its stdout and stderr into two files of a root-only folder in the guest; the agent's
//! file commands read them as they grow. The same wrapper applies `env` and `cwd`, so the guest
//! needs `/bin/sh` (and `setsid`, when it has one, for background processes).

use crate::ops::error::OpError;
use std::time::Duration;

use crate::b64;
use crate::ops::guest::stream::{spawn, CHUNK};
use crate::qemu::agent_calls::{self, ExecRequest, ExecStatus, FileHandle, Whence};
use crate::qemu::qga::{self, Qga, QgaError};

/// How long closing a guest file may take.
const CLOSE_WITHIN: Duration = Duration::from_secs(10);

/// The folder in the guest that holds the output files: made 0700 by the wrapper, and refused
/// when it is a link or not root's (another user of the guest cannot plant it).
pub const GUEST_DIR: &str = "/tmp/.mcqemu-exec";

/// The exit status the wrapper uses for its own refusals (a missing `cwd`, a foreign folder).
const WRAPPER_FAILED: i64 = 125;
/// What the wrapper's refusal of `cwd` starts with on stderr.
const CWD_MARK: &str = "mcqemu-wrapper: cwd ";

/// The wrapper: `sh -c WRAPPER mcqemu-exec DIR ID CWD BG N K=V... COMMAND ARGS...`. DIR empty:
/// the output stays the agent's (captured as usual); BG non-empty: a new session (setsid) so
/// that a kill reaches the program's children too.
const WRAPPER: &str = r#"d=$1 id=$2 cwd=$3 bg=$4 n=$5; shift 5
while [ "$n" -gt 0 ]; do export "$1"; shift; n=$((n-1)); done
if [ -n "$cwd" ]; then cd "$cwd" 2>/dev/null || { echo "mcqemu-wrapper: cwd $cwd is not a folder" >&2; exit 125; }; fi
if [ -n "$d" ]; then
  [ -d "$d" ] || mkdir -m 0700 "$d" 2>/dev/null
  if [ -L "$d" ] || [ ! -d "$d" ] || [ ! -O "$d" ]; then echo "mcqemu-wrapper: $d is not the agent user's own folder" >&2; exit 125; fi
  if [ -n "$bg" ] && command -v setsid >/dev/null 2>&1; then exec setsid "$@" >"$d/$id.out" 2>"$d/$id.err"; fi
  exec "$@" >"$d/$id.out" 2>"$d/$id.err"
fi
exec "$@""#;

/// How one program is to be started.
#[derive(Debug, Clone, Default)]
pub struct Launch<'a> {
    /// The program (a path, or a name looked up in the guest's PATH).
    pub command: &'a str,
    /// Its arguments, each passed whole.
    pub args: &'a [String],
    /// Text fed to its standard input.
    pub stdin: Option<&'a str>,
    /// Added to the program's environment (names checked by [`check_env`]).
    pub env: &'a [(String, String)],
    /// The program's working folder (absolute).
    pub cwd: Option<&'a str>,
    /// The spool id: the output goes into `GUEST_DIR/ID.out` and `.err`. None: captured.
    pub spool: Option<&'a str>,
    /// A new session for the program (background processes).
    pub session: bool,
    /// A user's program: run as a container image's User (mcqemu's own helpers stay root).
    pub image_user: bool,
}

impl Launch<'_> {
    /// True when the plain guest-exec does: no wrapper is needed.
    pub fn plain(&self) -> bool {
        self.env.is_empty() && self.cwd.is_none() && self.spool.is_none()
    }

    /// The guest-exec arguments for mcqemu-agent, which takes env and cwd itself: the
    /// program is started as it is, with no wrapper and no shell (spool and session are the
    /// wrapper's, and not looked at).
    pub fn native_request(&self) -> ExecRequest {
        let mut req = ExecRequest::captured(self.command, self.args);
        if !self.env.is_empty() {
            req.env = Some(self.env.iter().map(|(k, v)| format!("{k}={v}")).collect());
            req.env_merge = Some(true);
        }
        req.cwd = self.cwd.map(str::to_string);
        req.input_data = self.stdin.map(|input| b64::encode(input.as_bytes()));
        req.as_image_user = self.image_user.then_some(true);
        req
    }

    /// The guest-exec arguments.
    pub fn request(&self) -> ExecRequest {
        let (path, arg): (&str, Vec<String>) = if self.plain() {
            (self.command, self.args.to_vec())
        } else {
            let mut a = vec![
                "-c".to_string(),
                WRAPPER.to_string(),
                "mcqemu-exec".to_string(),
                self.spool.map_or(String::new(), |_| GUEST_DIR.to_string()),
                self.spool.unwrap_or_default().to_string(),
                self.cwd.unwrap_or_default().to_string(),
                if self.session { "1" } else { "" }.to_string(),
                self.env.len().to_string(),
            ];
            a.extend(self.env.iter().map(|(k, v)| format!("{k}={v}")));
            a.push(self.command.to_string());
            a.extend(self.args.iter().cloned());
            ("/bin/sh", a)
        };
        let mut req = ExecRequest::captured(path, &arg);
        req.input_data = self.stdin.map(|input| b64::encode(input.as_bytes()));
        req
    }
}

/// Checks `env` names (a shell's `export NAME=...` must take them as they are).
pub fn check_env(env: &[(String, String)]) -> Result<(), OpError> {
    for (k, v) in env {
        let ok = !k.is_empty()
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(OpError::invalid(format!(
                "env name {k:?} is not a valid variable name (letters, digits and _, not \
                 starting with a digit)"
            )));
        }
        if v.contains('\0') {
            return Err(OpError::invalid(format!(
                "env {k}'s value contains a NUL byte"
            )));
        }
    }
    Ok(())
}

/// Checks `cwd`: an absolute path without NUL bytes.
pub fn check_cwd(cwd: &str) -> Result<(), OpError> {
    if !cwd.starts_with('/') || cwd.contains('\0') {
        return Err(OpError::invalid(format!(
            "cwd {cwd:?} must be an absolute path in the guest (starting with /)"
        )));
    }
    Ok(())
}

/// The refusal the wrapper reported, if the program never started: a final guest-exec-status.
pub fn wrapper_refusal(status: &ExecStatus) -> Option<String> {
    if status.exitcode != Some(WRAPPER_FAILED) {
        return None;
    }
    let err = String::from_utf8_lossy(&status.stderr()).into_owned();
    let line = err.lines().next()?;
    if let Some(rest) = line.strip_prefix(CWD_MARK) {
        return Some(format!(
            "cwd: {} in the guest; nothing was run",
            rest.trim()
        ));
    }
    line.strip_prefix("mcqemu-wrapper: ")
        .map(|r| format!("{r}; nothing was run"))
}

/// A spool id: unique per call, safe as a file name.
pub fn new_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{}-{}-{n}-{nanos:x}",
        crate::clock::now_secs(),
        std::process::id()
    )
}

/// A foreground run's spool slot: its files are reused by later runs of this server (the
/// wrapper's `>` empties them), so a run leaves no `rm` to wait for. Given back on drop.
pub struct Slot {
    n: usize,
    /// The spool id of the slot's files.
    pub id: String,
}

fn free_slots() -> &'static std::sync::Mutex<Vec<usize>> {
    static FREE: std::sync::OnceLock<std::sync::Mutex<Vec<usize>>> = std::sync::OnceLock::new();
    FREE.get_or_init(|| std::sync::Mutex::new(Vec::new()))
}

impl Slot {
    /// A free slot (a new one when all are taken).
    pub fn take() -> Slot {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let reused = free_slots().lock().ok().and_then(|mut f| f.pop());
        let n = reused.unwrap_or_else(|| NEXT.fetch_add(1, Ordering::Relaxed));
        Slot {
            n,
            id: format!("fg-{}-{n}", std::process::id()),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut f) = free_slots().lock() {
            f.push(self.n);
        }
    }
}

/// Reads guest file `path` from its start, up to `max` bytes (and whether there was more),
/// then empties it when it held anything: open, read, close, and no program to run.
pub fn read_and_empty(q: &mut Qga, path: &str, max: usize) -> Result<(Vec<u8>, bool), QgaError> {
    let handle = match agent_calls::file_open(q, path, "r") {
        Ok(h) => h,
        Err(QgaError::Command { desc, .. }) if desc.contains("No such file") => {
            return Ok((Vec::new(), false))
        }
        Err(e) => return Err(e),
    };
    let mut data = Vec::new();
    let read = loop {
        let want = (max + 1 - data.len()).min(CHUNK);
        let (chunk, eof) = match agent_calls::file_read(q, handle, want) {
            Ok(r) => r,
            Err(e) => break Err(e),
        };
        let empty = chunk.is_empty();
        data.extend_from_slice(&chunk);
        if eof || empty || data.len() > max {
            break Ok(());
        }
    };
    let _ = agent_calls::file_close(q, handle, CLOSE_WITHIN);
    read?;
    if !data.is_empty() {
        let h = agent_calls::file_open(q, path, "w")?;
        agent_calls::file_close(q, h, CLOSE_WITHIN)?;
    }
    let cut = data.len() > max;
    data.truncate(max);
    Ok((data, cut))
}

/// True when guest file `path` exists (it can be opened for reading).
pub fn exists(q: &mut Qga, path: &str) -> Result<bool, QgaError> {
    match agent_calls::file_open(q, path, "r") {
        Ok(h) => {
            agent_calls::file_close(q, h, CLOSE_WITHIN)?;
            Ok(true)
        }
        Err(QgaError::Command { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The guest paths of spool `id`'s stdout and stderr files.
pub fn paths(id: &str) -> (String, String) {
    (
        format!("{GUEST_DIR}/{id}.out"),
        format!("{GUEST_DIR}/{id}.err"),
    )
}

/// What one read of a spool file found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Slice {
    /// The file's size now (0 when it does not exist yet).
    pub size: u64,
    /// Where `data` starts (past `from` when older output was dropped).
    pub start: u64,
    /// The bytes read.
    pub data: Vec<u8>,
}

/// Reads up to `max` bytes of guest file `path` from `from` on, keeping only the last `keep`
/// bytes of the file reachable (older output counts as dropped). A missing file reads as
/// empty: the wrapper has not made it yet.
pub fn read_from(
    q: &mut Qga,
    path: &str,
    from: u64,
    max: usize,
    keep: u64,
) -> Result<Slice, QgaError> {
    let handle = match agent_calls::file_open(q, path, "r") {
        Ok(h) => h,
        Err(QgaError::Command { desc, .. }) if desc.contains("No such file") => {
            return Ok(Slice::default())
        }
        Err(e) => return Err(e),
    };
    let read = read_open(q, handle, from, max, keep);
    let _ = agent_calls::file_close(q, handle, CLOSE_WITHIN);
    read
}

fn read_open(
    q: &mut Qga,
    handle: FileHandle,
    from: u64,
    max: usize,
    keep: u64,
) -> Result<Slice, QgaError> {
    let size = agent_calls::file_seek(q, handle, 0, Whence::End)?;
    let start = from.max(size.saturating_sub(keep)).min(size);
    if start == size || max == 0 {
        return Ok(Slice {
            size,
            start,
            data: Vec::new(),
        });
    }
    agent_calls::file_seek(q, handle, start as i64, Whence::Set)?;
    let want = ((size - start) as usize).min(max);
    let mut data = Vec::with_capacity(want);
    while data.len() < want {
        let (chunk, _) = agent_calls::file_read(q, handle, (want - data.len()).min(CHUNK))?;
        if chunk.is_empty() {
            break;
        }
        data.extend_from_slice(&chunk);
    }
    data.truncate(want);
    Ok(Slice { size, start, data })
}

/// Runs `launch` to its end on session `q` (a short helper program: a listing, a kill),
/// polling within `timeout`; returns the agent's final status.
pub fn run_in(q: &mut Qga, launch: &Launch, timeout: Duration) -> Result<ExecStatus, QgaError> {
    let pid = spawn(q, &launch.request())?;
    let deadline = std::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(2);
    loop {
        let s = agent_calls::exec_status(q, pid, qga::COMMAND_TIMEOUT)?;
        if s.exited {
            return Ok(s);
        }
        if std::time::Instant::now() >= deadline {
            return Err(QgaError::Timeout(format!(
                "{} (still running in the guest as pid {pid})",
                launch.command
            )));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_launch_is_the_program_itself_and_a_wrapped_one_keeps_every_argument_whole() {
        let args = vec!["a b".to_string(), "$HOME".to_string(), "'q'".to_string()];
        let plain = Launch {
            command: "ls",
            args: &args,
            ..Launch::default()
        };
        assert_eq!(plain.request(), ExecRequest::captured("ls", &args));
        let env = vec![("A_1".to_string(), "x y=z".to_string())];
        let wrapped = Launch {
            command: "ls",
            args: &args,
            env: &env,
            cwd: Some("/srv"),
            spool: Some("id1"),
            ..Launch::default()
        };
        let r = wrapped.request();
        assert_eq!(r.path, "/bin/sh");
        let a = r.arg;
        assert_eq!(
            &a[2..],
            &[
                "mcqemu-exec",
                GUEST_DIR,
                "id1",
                "/srv",
                "",
                "1",
                "A_1=x y=z",
                "ls",
                "a b",
                "$HOME",
                "'q'"
            ]
        );
    }

    #[test]
    fn env_names_and_cwd_are_checked() {
        assert!(check_env(&[("PATH".into(), "/bin".into())]).is_ok());
        for bad in ["", "1A", "A-B", "A B", "A=B"] {
            assert!(check_env(&[(bad.into(), "v".into())]).is_err(), "{bad}");
        }
        assert!(check_cwd("/tmp").is_ok());
        assert!(check_cwd("tmp").is_err());
        assert!(check_cwd("-x").is_err());
    }

    #[test]
    fn the_wrappers_own_refusal_is_told_apart_from_a_program_exiting_125() {
        let status = |code: i64, err: &str| ExecStatus {
            exited: true,
            exitcode: Some(code),
            err_data: Some(b64::encode(err.as_bytes())),
            ..ExecStatus::default()
        };
        let r = wrapper_refusal(&status(125, "mcqemu-wrapper: cwd /nope is not a folder\n"));
        assert!(r.is_some_and(|m| m.starts_with("cwd: /nope")));
        assert_eq!(wrapper_refusal(&status(125, "my program failed\n")), None);
        assert_eq!(
            wrapper_refusal(&status(0, "mcqemu-wrapper: cwd /x is not a folder")),
            None
        );
    }
}
