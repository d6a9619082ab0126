//! Inside a guest, through its agent (and mcqemu's data channel): sessions to the agent,
//! programs run (`run`), streamed (`stream`) and spooled (`spool`, `background`), folder
//! listings, copies of trees both ways (`copy`), the clock and the randomness of clones.
//!
//! Guest-agent operations several tools use: a session to a VM's agent, a program run to its
//! end (guest_exec, cloud-init waits, image_prepare, clones' clocks), the agent's and OS's
//! identity.

pub mod background;
pub mod clock;
pub mod copy;
pub mod exec;
pub mod files;
pub mod launch;
pub mod listing;
pub mod mounts;
pub mod reseed;
pub mod run;
pub mod spool;
pub mod stream;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use self::spool::Launch;
use crate::b64;
use crate::ops::error::OpError;
use crate::ops::session;
use crate::ops::vm::records::lookup;
use crate::ops::work::Work;
use crate::qemu::agent_calls::{self, ExecRequest, ExecStatus, GuestCommand};
use crate::qemu::qga::{Qga, QgaError};

/// How long guest_exec holds one agent session while polling before letting others in. While
/// no host is connected qemu-ga drains the program's output slowly, so stay connected most of
/// the time, but never keep other agent calls to this VM waiting for more than about a second.
const EXEC_POLL_WINDOW: Duration = Duration::from_secs(1);

/// Runs `f` on a synced agent session of VM `name`; failures are explained for that VM.
pub fn with_guest<T>(
    name: &str,
    cmd: &str,
    f: impl FnOnce(&mut Qga) -> Result<T, QgaError>,
) -> Result<T, OpError> {
    let rec = lookup(name)?;
    session::agent(name, &rec, cmd, |q| Ok(f(q)?))
}

/// Most bytes of stdout or stderr that guest_exec returns; the rest is cut and flagged.
/// The agent itself keeps 16 MiB, far more than an agent can read in a tool result.
pub const MAX_OUTPUT: usize = 1024 * 1024;

/// Decodes one captured stream, capped at [`MAX_OUTPUT`]; true when it was cut here or by the
/// agent.
pub fn decode_stream(mut bytes: Vec<u8>, mut cut: bool) -> (String, bool) {
    if bytes.len() > MAX_OUTPUT {
        bytes.truncate(MAX_OUTPUT);
        cut = true;
    }
    (String::from_utf8_lossy(&bytes).into_owned(), cut)
}

/// Runs `command argv...` in VM `name` through its agent (with `stdin`, within `timeout`,
/// with progress), and returns guest_exec's result: exit code or signal, capped output.
pub fn exec(
    ctx: &dyn Work,
    name: &str,
    command: &str,
    argv: &[&str],
    stdin: Option<&str>,
    timeout: Duration,
) -> Result<Executed, OpError> {
    let args: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
    let launch = Launch {
        command,
        args: &args,
        stdin,
        ..Launch::default()
    };
    run_program(ctx, name, &launch, timeout, false)
}

/// How often a live run reads its output files.
const LIVE_EVERY: Duration = Duration::from_millis(900);
/// Most bytes of output one progress notification carries (its last lines).
const LIVE_NOTE: usize = 4096;

/// The output a live run has read and not yet reported.
#[derive(Default)]
struct Live {
    /// The spool slot its output goes to (qemu-ga); None: mcqemu-agent hands the output out
    /// itself while the program runs.
    id: Option<String>,
    offsets: [u64; 2],
    unsent: String,
    read_at: Option<Instant>,
}

impl Live {
    /// Reads what the program wrote since the last read, when it is time to (spooled runs).
    fn read(&mut self, q: &mut Qga) -> Result<(), QgaError> {
        let Some(id) = &self.id else {
            return Ok(());
        };
        if self.read_at.is_some_and(|t| t.elapsed() < LIVE_EVERY) {
            return Ok(());
        }
        self.read_at = Some(Instant::now());
        let (out, err) = spool::paths(id);
        for (i, path) in [out, err].iter().enumerate() {
            let got = spool::read_from(q, path, self.offsets[i], 256 * 1024, u64::MAX)?;
            self.offsets[i] = got.start + got.data.len() as u64;
            self.add(i, &got.data);
        }
        Ok(())
    }

    /// Waits up to `wait` in the guest for output past what was read (mcqemu-agent's own
    /// command: no spool files), and takes what came.
    fn read_native(&mut self, q: &mut Qga, pid: i64, wait: Duration) -> Result<(), QgaError> {
        let offsets = (self.offsets[0], self.offsets[1]);
        let got = agent_calls::exec_output(q, pid, offsets, wait)?;
        let (out, err) = got.streams();
        self.offsets = [got.out_next, got.err_next];
        self.add(0, &out);
        self.add(1, &err);
        Ok(())
    }

    fn add(&mut self, stream: usize, data: &[u8]) {
        let text = String::from_utf8_lossy(data);
        for line in text.split_inclusive('\n') {
            if stream == 1 {
                self.unsent.push_str("stderr: ");
            }
            self.unsent.push_str(line);
        }
    }

    /// The note for the next progress notification: the unsent output's last lines.
    fn take_note(&mut self) -> Option<String> {
        if self.unsent.is_empty() {
            return None;
        }
        let text = std::mem::take(&mut self.unsent);
        let mut cut = text.len().saturating_sub(LIVE_NOTE);
        while !text.is_char_boundary(cut) {
            cut += 1;
        }
        Some(if cut > 0 {
            format!("...{}", &text[cut..])
        } else {
            text
        })
    }
}

/// Whether mcqemu-agent answers VM `name`: asked once per QEMU process with guest-info, then
/// remembered (a guest's agent stays what it booted with).
pub(crate) fn agent_is_ours(name: &str) -> Result<bool, OpError> {
    let key = (name.to_string(), lookup(name)?.pid);
    if let Some(ours) = known_agents()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&key)
    {
        return Ok(*ours);
    }
    // An agent that refuses guest-info (a qemu-ga with it blocked) is not ours: it is
    // served the way qemu-ga is.
    let ours = with_guest(name, "guest-info", |q| {
        match agent_calls::info(q, Duration::from_secs(10)) {
            Ok(info) => Ok(info.version.starts_with(agent_calls::OUR_AGENT)),
            Err(QgaError::Command { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    })?;
    remember_agent(key, ours);
    Ok(ours)
}

/// Which VMs' agents are mcqemu-agent, by name and QEMU PID (a relaunch asks again).
type KnownAgents = std::sync::Mutex<std::collections::HashMap<(String, Option<i64>), bool>>;

fn known_agents() -> &'static KnownAgents {
    static KNOWN: std::sync::OnceLock<KnownAgents> = std::sync::OnceLock::new();
    KNOWN.get_or_init(KnownAgents::default)
}

fn remember_agent(key: (String, Option<i64>), ours: bool) {
    let mut k = known_agents().lock().unwrap_or_else(|p| p.into_inner());
    if k.len() > 256 {
        k.clear();
    }
    k.insert(key, ours);
}

/// Notes what VM `name`'s agent is when it is known without asking (a clone runs its
/// template's), so [`agent_is_ours`] costs no guest-info call.
pub(crate) fn note_agent(name: &str, ours: bool) {
    if let Ok(rec) = lookup(name) {
        remember_agent((name.to_string(), rec.pid), ours);
    }
}

/// Runs `launch` in VM `name` (see [`exec`]); `live`: its new lines go out in the call's
/// progress while it runs (mcqemu-agent hands them out itself; with qemu-ga the output goes
/// to spool files in the guest, read as they grow).
pub fn run_program(
    ctx: &dyn Work,
    name: &str,
    launch: &Launch,
    timeout: Duration,
    live: bool,
) -> Result<Executed, OpError> {
    let ours = agent_is_ours(name)?;
    // Only a live run on qemu-ga needs a spool slot (it is held until the run's end).
    let slot = (live && !ours).then(spool::Slot::take);
    let launch = Launch {
        spool: slot.as_ref().map(|s| s.id.as_str()).or(launch.spool),
        ..launch.clone()
    };
    let native = ours && launch.spool.is_none() && !launch.session;
    let req = if native {
        launch.native_request()
    } else {
        launch.request()
    };
    let started = Instant::now();
    let mut run = Run {
        ctx,
        name,
        command: launch.command,
        req,
        native,
        live: live.then(|| Live {
            id: slot.as_ref().map(|s| s.id.clone()),
            ..Live::default()
        }),
        started,
        timeout,
        deadline: started + timeout,
        // Fine at first: most programs are done within milliseconds.
        slice: Duration::from_millis(1),
        pid: None,
        beat_at: None,
    };
    loop {
        // Poll over one session held for a window, sleeping while connected: while no host
        // client is connected, qemu-ga throttles its main loop (it sleeps on every wake-up of
        // the disconnected virtio port), and drains the program's output pipes so slowly that
        // 1 MB of stdout takes ~10 s instead of ~0.4 s and a chatty program stalls on a full
        // pipe. The first window also starts the program, so a quick command needs one
        // session (a reconnect right after a hang-up costs ~100 ms). Releasing the session
        // between windows lets other callers take turns.
        let label = if run.pid.is_none() {
            "guest-exec"
        } else {
            "guest-exec-status"
        };
        let window_end = Instant::now() + EXEC_POLL_WINDOW;
        if let Some(status) = with_guest(name, label, |q| run.window(q, window_end))? {
            return run.result(&status);
        }
        run.check_going_on()?;
        // Between windows, give other agent callers a moment to take the session.
        std::thread::sleep(
            Duration::from_millis(20).min(run.deadline.saturating_duration_since(Instant::now())),
        );
    }
}

/// A program running in the guest, as [`run_program`] polls it.
struct Run<'a> {
    ctx: &'a dyn Work,
    name: &'a str,
    command: &'a str,
    req: ExecRequest,
    /// Started on mcqemu-agent as it is: its end is waited for in the guest.
    native: bool,
    live: Option<Live>,
    started: Instant,
    timeout: Duration,
    deadline: Instant,
    slice: Duration,
    pid: Option<i64>,
    /// When the last heartbeat went out (runs without live output).
    beat_at: Option<Instant>,
}

impl Run<'_> {
    /// One polling window over one agent session: starts the program the first time, then
    /// polls its status (reading live output and reporting progress) until it exits (its
    /// final status), or the window, the deadline or a cancel ends the window (None).
    fn window(&mut self, q: &mut Qga, window_end: Instant) -> Result<Option<ExecStatus>, QgaError> {
        let pid = match self.pid {
            Some(p) => p,
            None => {
                let p = crate::ops::guest::stream::spawn(q, &self.req)?;
                let msg = format!(
                    "guest_exec in {}: {} (guest pid {p})",
                    self.name, self.command
                );
                self.ctx.log("info", &msg);
                self.pid = Some(p);
                p
            }
        };
        loop {
            // The final status carries the whole capture (up to 16 MiB of stdout and of
            // stderr, in base64): under TCG that reply alone can take several seconds.
            let status = agent_calls::exec_status(q, pid, crate::qemu::qga::COMMAND_TIMEOUT)?;
            if status.exited {
                return Ok(Some(match self.live.as_ref().and_then(|l| l.id.as_ref()) {
                    Some(id) if spool::wrapper_refusal(&status).is_none() => {
                        with_spooled_output(q, status, id)?
                    }
                    _ => status,
                }));
            }
            let now = Instant::now();
            if self.ctx.cancelled() || now >= self.deadline || now >= window_end {
                self.report(q, pid)?;
                return Ok(None);
            }
            let wait = self.slice.min(self.deadline - now).min(window_end - now);
            match self.live.as_mut() {
                // mcqemu-agent: the wait is in the guest, and ends as soon as output comes.
                Some(l) if l.id.is_none() => {
                    l.read_native(q, pid, NATIVE_WAIT.min(self.deadline - now))?;
                }
                // Without live output too: asked past any output, the agent answers as soon
                // as the program ends (no polling slices on the host).
                None if self.native => {
                    let past = (i64::MAX as u64, i64::MAX as u64);
                    let wait = NATIVE_WAIT.min(self.deadline - now).min(window_end - now);
                    agent_calls::exec_output_capped(q, pid, past, wait, Some(0))?;
                }
                _ => std::thread::sleep(wait),
            }
            self.report(q, pid)?;
            self.slice = (self.slice * 2).min(Duration::from_millis(250));
        }
    }

    /// Progress while the program runs: what it printed lately, on a live run (on
    /// mcqemu-agent the first lines at once, then what came meanwhile at most every
    /// [`NOTE_GAP`], so that the progress layer's coalescing never drops a line); otherwise a
    /// heartbeat with the time it has run, at most every [`HEARTBEAT_GAP`] and none in the
    /// call's first second (a fast call with a token costs nothing).
    fn report(&mut self, q: &mut Qga, pid: i64) -> Result<(), QgaError> {
        let elapsed = self.started.elapsed();
        let since_sent = self.beat_at.map(|t| t.elapsed());
        let note = match self.live.as_mut() {
            Some(l) if l.id.is_none() => {
                if since_sent.is_none_or(|d| d >= NOTE_GAP) {
                    l.take_note()
                } else {
                    None
                }
            }
            Some(l) if elapsed >= MIN_QUIET => {
                l.read(q)?;
                l.take_note()
            }
            _ => None,
        };
        let beat_due = since_sent.map_or(elapsed >= HEARTBEAT_GAP, |d| d >= HEARTBEAT_GAP);
        if note.is_none() && !beat_due {
            return Ok(());
        }
        self.beat_at = Some(Instant::now());
        let native = self.live.as_ref().is_some_and(|l| l.id.is_none());
        let (done, total) = (elapsed.as_secs_f64(), Some(self.timeout.as_secs_f64()));
        match note {
            // Lines the caller asked to follow on mcqemu-agent: the first need not wait for
            // the call's first half second.
            Some(out) => {
                let what = format!("{} (pid {pid}) printed:\n{out}", self.command);
                if native {
                    self.ctx.progress_output(done, total, &what);
                } else {
                    self.ctx.progress(done, total, &what);
                }
            }
            None => {
                let what = format!(
                    "{} running in the guest (pid {pid}) for {} s",
                    self.command,
                    elapsed.as_secs()
                );
                self.ctx.progress(done, total, &what);
            }
        }
        Ok(())
    }

    /// guest_exec's result from the program's final status.
    fn result(&self, status: &ExecStatus) -> Result<Executed, OpError> {
        if let Some(why) = spool::wrapper_refusal(status) {
            return Err(OpError::host(why));
        }
        let stdout = decode_stream(status.stdout(), status.out_truncated);
        let stderr = decode_stream(status.stderr(), status.err_truncated);
        Ok(Executed {
            name: self.name.to_string(),
            pid: self.pid.unwrap_or(0),
            exitcode: status.exitcode,
            signal: status.signal,
            stdout: stdout.0,
            stderr: stderr.0,
            stdout_truncated: stdout.1,
            stderr_truncated: stderr.1,
            duration_ms: self.started.elapsed().as_millis() as u64,
        })
    }

    /// An error once the caller cancelled or the deadline passed (the program keeps running).
    fn check_going_on(&self) -> Result<(), OpError> {
        let (command, pid) = (self.command, self.pid.unwrap_or(0));
        if self.ctx.cancelled() {
            return Err(OpError::cancelled(format!(
                "cancelled; {command} is still running in the guest as pid {pid}"
            )));
        }
        if Instant::now() >= self.deadline {
            return Err(OpError::timed_out(format!(
                "{command} did not finish within {} s; it is still running in the guest as pid \
                 {pid} (stop it with guest_exec command=\"kill\" args=[\"{pid}\"])",
                self.timeout.as_secs_f64()
            )));
        }
        Ok(())
    }
}

/// Least time between two notes of a live run's output on mcqemu-agent: the progress layer's
/// own gap (500 ms; it keeps only the latest message of a gap), so each note is sent whole.
const NOTE_GAP: Duration = Duration::from_millis(500);

/// Longest wait in the guest for a live run's output on mcqemu-agent (it answers as soon as
/// some comes, or the program ends).
const NATIVE_WAIT: Duration = Duration::from_millis(250);

/// Least time between two heartbeats of a run without live output, and the silence before
/// its first.
const HEARTBEAT_GAP: Duration = Duration::from_secs(1);

/// A live run's output is read from the call's first half second on (a call done sooner
/// says nothing, and reads nothing it would not report).
const MIN_QUIET: Duration = Duration::from_millis(450);

/// The final status of a spooled run with its output files in place of the capture (both
/// capped past [`MAX_OUTPUT`]), the files emptied for the slot's next run.
fn with_spooled_output(
    q: &mut Qga,
    mut status: ExecStatus,
    id: &str,
) -> Result<ExecStatus, QgaError> {
    let (out, err) = spool::paths(id);
    let (bytes, cut) = spool::read_and_empty(q, &out, MAX_OUTPUT)?;
    (status.out_data, status.out_truncated) = (Some(b64::encode(&bytes)), cut);
    let (bytes, cut) = spool::read_and_empty(q, &err, MAX_OUTPUT)?;
    (status.err_data, status.err_truncated) = (Some(b64::encode(&bytes)), cut);
    Ok(status)
}

crate::described! {
    /// guest_exec's result (in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct Executed {
        /// The VM.
        pub name: String,
        /// The program's guest PID.
        pub pid: i64,
        /// Its exit code, when it exited normally.
        pub exitcode: Option<i64>,
        /// The signal that ended it.
        pub signal: Option<i64>,
        /// Its stdout (lossy UTF-8, capped at [`MAX_OUTPUT`]).
        pub stdout: String,
        /// Its stderr.
        pub stderr: String,
        /// Its stdout was cut (here or by the agent).
        pub stdout_truncated: bool,
        /// Its stderr was cut.
        pub stderr_truncated: bool,
        /// How long the call took.
        pub duration_ms: u64,
    }
}

/// The agent's version, the guest OS and the agent commands enabled: guest_info's result.
pub fn info(name: &str) -> Result<AgentInfo, OpError> {
    let (info, os) = with_guest(name, "guest-info", |q| {
        let info = agent_calls::info(q, Duration::from_secs(10))?;
        let os = agent_calls::os_info(q, Duration::from_secs(10)).ok();
        Ok((info, os))
    })?;
    let (enabled, disabled): (Vec<GuestCommand>, Vec<GuestCommand>) =
        info.supported_commands.into_iter().partition(|c| c.enabled);
    let names = |cs: Vec<GuestCommand>| cs.into_iter().map(|c| c.name).collect();
    Ok(AgentInfo {
        name: name.to_string(),
        version: info.version,
        os,
        enabled_commands: names(enabled),
        disabled_commands: names(disabled),
    })
}

crate::described! {
    /// The guest agent and OS (guest_info's result, in this order).
    #[derive(Debug, Clone, serde::Serialize)]
    pub struct AgentInfo {
        /// The VM.
        pub name: String,
        /// qemu-ga's version.
        pub version: String,
        /// guest-get-osinfo's answer, when the agent has it.
        pub os: Option<Value>,
        /// Agent commands the guest allows.
        pub enabled_commands: Vec<String>,
        /// Agent commands the guest's configuration blocks.
        pub disabled_commands: Vec<String>,
    }
}
