//! A clone's guest clock. A clone resumes with the clock of the moment its template was saved.
//! The agent's `guest-set-time` with a time puts the host's in at once (settimeofday), then
//! forks `hwclock -w` and answers only when that ends: ~70 ms in a fresh clone, whose guest
//! code QEMU has not translated yet, and up to a second on a distribution whose hwclock waits
//! for an RTC tick. So a clone is ready when its agent first answers, and a thread sets the
//! clock while holding the VM's agent session: the next agent call from this server waits for
//! the session, one from anywhere else in the agent's own queue (qemu-ga runs one command at a
//! time), so the first command of a clone always sees the host's time.

use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::qemu::agent_calls::{self, ExecRequest};
use crate::qemu::qga::{self, Qga, QgaError};
use crate::state::registry::{Record, RegistryError};

/// Bound for guest-set-time (hwclock included) and for the date(1) fallback.
const SET_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest time one connection waits for the agent's first answer before reconnecting.
const SYNC_SLICE: Duration = Duration::from_millis(500);

/// How the clock was set, or why it was not.
pub type Outcome = Result<&'static str, String>;

/// The longest a clone's reseed may take (under TCG on arm64 about a second).
const RESEED_BUDGET: Duration = Duration::from_secs(20);

/// Waits at most `wait` for the agent on `sock` to first answer, then returns the thread that
/// is setting the guest clock (it holds the agent session until done; join it to wait).
/// `reseed`: the guest's arch when its kernel randomness must also be reseeded from the host
/// on that session (a clone of a board without vmgenid): no guest call gets the session
/// before both are done. An error says the agent did not answer.
pub fn answer_then_set(
    sock: &Path,
    wait: Duration,
    reseed: Option<String>,
) -> Result<JoinHandle<Outcome>, String> {
    let (tx, rx) = mpsc::channel::<()>();
    let sock = sock.to_path_buf();
    let setter = std::thread::Builder::new()
        .name("guest-clock".into())
        .spawn(move || set_when_answered(&sock, wait, reseed.as_deref(), tx))
        .map_err(|e| format!("cannot start the thread that sets the guest clock: {e}"))?;
    // The thread sends once the agent answered, or ends (dropping the sender) when it never
    // did; its own loop is bounded by `wait`, this one bounds the wait for it as well.
    match rx.recv_timeout(wait + SYNC_SLICE * 2) {
        Ok(()) => Ok(setter),
        Err(_) => Err(match setter.is_finished().then(|| setter.join()) {
            Some(Ok(Err(why))) => why,
            _ => format!("the guest agent did not answer within {} s", wait.as_secs()),
        }),
    }
}

/// The thread's body: resyncs with the agent until it answers (or `wait` ends), signals
/// `answered` while holding the session, then sets the clock on that same session.
fn set_when_answered(
    sock: &Path,
    wait: Duration,
    reseed: Option<&str>,
    answered: mpsc::Sender<()>,
) -> Outcome {
    let deadline = Instant::now() + wait;
    loop {
        let slice = SYNC_SLICE
            .min(deadline.saturating_duration_since(Instant::now()))
            .max(Duration::from_millis(50));
        let mut synced = false;
        let r = qga::with_agent(sock, slice, |q| -> Result<&'static str, QgaError> {
            synced = true;
            let _ = answered.send(());
            let how = set(q)?;
            if let Some(arch) = reseed {
                let budget = Instant::now() + RESEED_BUDGET;
                let done = crate::ops::guest::reseed::reseed_on(q, arch, budget)
                    .unwrap_or_else(|e| Err(e.to_string()));
                if let Err(why) = done {
                    let why = format!("the guest's kernel randomness was not reseeded: {why}");
                    crate::log::stderr("warn", &format!("{}: {why}", sock.display()));
                    note_in_record(sock, &why, |r, why| r.reseed_warning = Some(why));
                }
            }
            Ok(how)
        });
        match r {
            Ok(how) => return Ok(how),
            Err(e) if synced => {
                let why = format!(
                    "the guest clock was not set ({e}): it runs from the template's save time; \
                     set it with guest_exec (date -u -s @SECONDS)"
                );
                crate::log::stderr("warn", &format!("{}: {why}", sock.display()));
                note_in_record(sock, &why, |r, why| r.clock_warning = Some(why));
                return Err(why);
            }
            Err(_) if Instant::now() >= deadline => {
                return Err(format!(
                    "the guest agent did not answer within {} s",
                    wait.as_secs()
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// Keeps `why` with `set` in the record of the VM whose agent is on `sock` (vm_info shows
/// it): sandbox_vm has answered before the clock is set.
fn note_in_record(sock: &Path, why: &str, set: fn(&mut Record, String)) {
    let (sock, why) = (sock.display().to_string(), why.to_string());
    let _ = crate::state::registry::shared().update(move |vms| {
        for rec in vms.values_mut() {
            if rec.qga_socket.as_deref() == Some(sock.as_str()) {
                set(rec, why.clone());
            }
        }
        Ok::<_, RegistryError>(())
    });
}

fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Sets the guest clock to the host's on a synced session: guest-set-time, or, where the agent
/// cannot (no /sbin/hwclock in the guest), `date -u -s @SECONDS` run through the agent.
fn set(q: &mut Qga) -> Result<&'static str, QgaError> {
    match agent_calls::set_time(q, now().as_nanos() as u64, SET_TIMEOUT) {
        Ok(_) => Ok("guest-set-time"),
        Err(QgaError::Command { .. }) => {
            let at = format!("@{}", now().as_secs());
            match run(q, "date", &["-u", "-s", &at], SET_TIMEOUT)? {
                Some(0) => Ok("date -s"),
                code => Err(QgaError::Command {
                    class: "GenericError".into(),
                    desc: format!(
                        "guest-set-time is unsupported and `date -u -s {at}` exited with {code:?}"
                    ),
                }),
            }
        }
        Err(e) => Err(e),
    }
}

/// Runs `path args...` through the agent on session `q` until it exits (within `timeout`) and
/// returns its exit code (None when a signal ended it).
fn run(q: &mut Qga, path: &str, args: &[&str], timeout: Duration) -> Result<Option<i64>, QgaError> {
    let deadline = Instant::now() + timeout;
    let arg: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let req = ExecRequest {
        capture_output: false,
        ..ExecRequest::captured(path, &arg)
    };
    let pid = agent_calls::exec(q, &req, timeout)?;
    loop {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(10));
        let st = agent_calls::exec_status(q, pid, left)?;
        if st.exited {
            return Ok(st.exitcode);
        }
        if Instant::now() >= deadline {
            return Err(QgaError::Timeout(format!("{path} in the guest")));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
