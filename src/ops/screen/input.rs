//! Plans of QMP `input-send-event` commands and pauses, and their sending: what the pointer
//! gestures ([`crate::ops::screen::pointer`]) and the keyboard ([`crate::ops::screen::keyboard`])
//! are made of (the events themselves, such as [`crate::qemu::keys::key_event`], are built in
//! `qemu/`). Plans are plain [`Step`]s so their order and pacing are unit-tested; [`run`] sends
//! them.

use std::time::{Duration, Instant};

use crate::host::threads::{Sample, Threads};

use crate::qemu::qmp::{Qmp, QmpError};
use crate::qemu::qmp_calls::InputEvent;

/// One thing to do: send these events in one command, or wait.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// One `input-send-event` command with these events.
    Send(Vec<InputEvent>),
    /// A pause.
    Pause(Duration),
}

/// The number of commands a plan sends.
pub fn commands(plan: &[Step]) -> usize {
    plan.iter().filter(|s| matches!(s, Step::Send(_))).count()
}

/// What [`run`] sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    /// Commands sent.
    pub commands: usize,
    /// False when `cancelled` stopped it early (what was pressed was still released).
    pub complete: bool,
}

/// The longest a pause stretches while the guest's vCPUs have not run since the last
/// command; past it the guest is taken to be wedged and later pauses are wall time alone.
const SETTLE_MAX: Duration = Duration::from_secs(2);
/// How often a stretched pause looks at the vCPUs again.
const SETTLE_POLL: Duration = Duration::from_millis(2);

/// Sends the plan in order. `cancelled` is asked after each step; once it answers yes, only
/// commands that release keys or buttons are still sent (without the pauses), so the guest is
/// not left with anything held down.
///
/// With the QEMU's `pid`, a pause after a command lasts its time *and* until the vCPUs have
/// taken the events: they have run since the command and sleep again, or have run as long as
/// the pause (a busy guest). A guest's PS/2 queue holds 16 bytes, and on a loaded host a
/// vCPU can wait longer than any fixed pause for a core.
pub fn run(
    q: &mut Qmp,
    plan: &[Step],
    pid: Option<i64>,
    cancelled: &dyn Fn() -> bool,
) -> Result<Sent, QmpError> {
    let mut vcpus = match pid {
        Some(pid) => match u32::try_from(pid) {
            // Pacing by the vCPUs is a refinement: a QEMU that cannot say paces by wall time.
            Ok(pid) => q
                .running_vcpu_threads()
                .ok()
                .flatten()
                .map(|t| Threads::new(pid, t)),
            Err(_) => None,
        },
        None => None,
    };
    let mut sent = Sent {
        commands: 0,
        complete: true,
    };
    let mut before = None;
    for step in plan {
        match step {
            Step::Pause(d) if sent.complete => {
                if !settle(*d, vcpus.as_ref(), before.take()) {
                    vcpus = None;
                }
            }
            Step::Pause(_) => continue,
            Step::Send(events) if sent.complete || releases(events) => {
                before = vcpus.as_ref().and_then(Threads::sample);
                q.send_input(events)?;
                sent.commands += 1;
            }
            Step::Send(_) => continue,
        }
        if sent.complete && cancelled() {
            sent.complete = false;
        }
    }
    Ok(sent)
}

/// Waits `d`, then until the vCPUs took what was sent after `before` (see [`run`]), at most
/// [`SETTLE_MAX`]. False when they did not within it.
fn settle(d: Duration, vcpus: Option<&Threads>, before: Option<Sample>) -> bool {
    let start = Instant::now();
    std::thread::sleep(d);
    let (Some(vcpus), Some(before)) = (vcpus, before) else {
        return true;
    };
    loop {
        let Some(now) = vcpus.sample() else {
            return true;
        };
        if taken(d, before, now) {
            return true;
        }
        if start.elapsed() >= SETTLE_MAX {
            return false;
        }
        std::thread::sleep(SETTLE_POLL);
    }
}

/// Whether vCPUs sampled `before` a command and `now` have taken its events: they ran since
/// and sleep again (the wake-up the command caused has been served), or ran for `d` (a busy
/// guest never sleeps but had the time the pause assumes).
fn taken(d: Duration, before: Sample, now: Sample) -> bool {
    let ran = now.ran.saturating_sub(before.ran);
    ran >= d || (ran > Duration::ZERO && now.asleep)
}

/// Whether a command only releases buttons or keys.
fn releases(events: &[InputEvent]) -> bool {
    events.iter().all(|e| e.down() == Some(false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qemu::keys::key_event;
    use crate::qemu::qmp_calls::Axis;

    #[test]
    fn a_plan_counts_its_commands_and_only_releases_pass_a_cancel() {
        let plan = [
            Step::Send(vec![key_event("a", true)]),
            Step::Pause(Duration::from_millis(1)),
            Step::Send(vec![key_event("a", false)]),
        ];
        assert_eq!(commands(&plan), 2);
        assert!(!releases(&[key_event("a", true), key_event("b", false)]));
        assert!(releases(&[key_event("a", false)]));
        assert!(releases(&[InputEvent::Btn {
            button: "left".into(),
            down: false
        }]));
        assert!(!releases(&[InputEvent::Abs {
            axis: Axis::X,
            value: 1
        }]));
    }

    #[test]
    fn a_pause_ends_once_the_vcpus_ran_and_sleep_or_ran_its_length() {
        let at = |ms: u64, asleep: bool| Sample {
            ran: Duration::from_millis(ms),
            asleep,
        };
        let d = Duration::from_millis(10);
        assert!(
            !taken(d, at(5, true), at(5, true)),
            "not run since: not taken"
        );
        assert!(
            !taken(d, at(5, true), at(9, false)),
            "running, short of the pause"
        );
        assert!(taken(d, at(5, true), at(6, true)), "ran and sleeps again");
        assert!(
            taken(d, at(5, false), at(15, false)),
            "a busy guest had the pause"
        );
    }

    #[test]
    fn a_pause_without_vcpus_to_watch_is_wall_time() {
        let t = Instant::now();
        assert!(settle(Duration::from_millis(5), None, None));
        assert!(t.elapsed() >= Duration::from_millis(5));
    }
}
