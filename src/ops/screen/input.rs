//! Plans of QMP `input-send-event` commands and pauses, and their sending: what the pointer
//! gestures ([`crate::ops::screen::pointer`]) and the keyboard ([`crate::ops::screen::keyboard`])
//! are made of (the events themselves, such as [`crate::qemu::keys::key_event`], are built in
//! `qemu/`). Plans are plain [`Step`]s so their order and pacing are unit-tested; [`run`] sends
//! them.

use std::time::{Duration, Instant};

use crate::host::threads::{Sample, Threads};
use crate::ops::work::Work;

use crate::qemu::qmp::{Qmp, QmpError};
use crate::qemu::qmp_calls::InputEvent;

/// One thing to do: send these events in one command, or wait.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// One `input-send-event` command with these events.
    Send(Vec<InputEvent>),
    /// A pause.
    Pause(Duration),
    /// The end of a plan: until the guest took what was sent (as a pause of this length
    /// decides it), with only a few polls of its own; a plan's last step, so the next call
    /// cannot overflow the queue but a call is not longer than that. This length of wall
    /// time where the vCPUs cannot be watched.
    Drain(Duration),
}

/// The number of commands a plan sends.
pub fn commands(plan: &[Step]) -> usize {
    plan.iter().filter(|s| matches!(s, Step::Send(_))).count()
}

/// The plan with its last pause made a [`Step::Drain`]: the guest must still take the last
/// command before the call ends, but the pause's own time helps nobody once nothing follows
/// (a third of vm_type_text's 10 characters).
pub fn drained(mut plan: Vec<Step>) -> Vec<Step> {
    if let Some(last) = plan.last_mut() {
        if let Step::Pause(d) = *last {
            *last = Step::Drain(d);
        }
    }
    plan
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
/// How long a plan runs before its commands are reported as progress: a fast call (a click,
/// a word) pays nothing for a progress token.
const QUIET: Duration = Duration::from_secs(1);
/// How often a stretched pause looks at the vCPUs again.
const SETTLE_POLL: Duration = Duration::from_millis(2);

/// Sends the plan in order. The call's cancel is asked after each step; once it answers yes,
/// only commands that release keys or buttons are still sent (without the pauses), so the
/// guest is not left with anything held down. Past [`QUIET`], each command sent is reported
/// as progress (a paced plan of a long text or a long move runs for seconds).
///
/// With the QEMU's `pid`, a pause after a command lasts its time *and* until the vCPUs have
/// taken the events: they have run since the command and sleep again, or have run twice as
/// long as the pause (a busy guest). A guest's PS/2 queue holds 16 bytes, and on a loaded host a
/// vCPU can wait longer than any fixed pause for a core.
pub fn run(
    q: &mut Qmp,
    plan: &[Step],
    pid: Option<i64>,
    work: &dyn Work,
) -> Result<Sent, QmpError> {
    let start = Instant::now();
    let total = commands(plan);
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
            Step::Pause(d) | Step::Drain(d) if sent.complete => {
                let before = before.take();
                let wall = match step {
                    Step::Drain(_) => drain_wall(*d, vcpus.is_some() && before.is_some()),
                    _ => *d,
                };
                if !settle(wall, *d, vcpus.as_ref(), before) {
                    vcpus = None;
                }
            }
            Step::Pause(_) | Step::Drain(_) => continue,
            Step::Send(events) if sent.complete || releases(events) => {
                before = vcpus.as_ref().and_then(Threads::sample);
                q.send_input(events)?;
                sent.commands += 1;
                if start.elapsed() >= QUIET {
                    work.progress(
                        sent.commands as f64,
                        Some(total as f64),
                        &format!(
                            "sent {} of {total} input commands, each paced until the guest \
                             read it",
                            sent.commands
                        ),
                    );
                }
            }
            Step::Send(_) => continue,
        }
        if sent.complete && work.cancelled() {
            sent.complete = false;
        }
    }
    Ok(sent)
}

/// The least a [`Step::Drain`] of `d` waits: a few polls when the vCPUs are watched (a vCPU
/// the command woke can wait for QEMU's global lock longer than one poll and look done), the
/// whole `d` when they are not.
fn drain_wall(d: Duration, watched: bool) -> Duration {
    if watched {
        d.min(SETTLE_POLL * 3)
    } else {
        d
    }
}

/// Waits `wall`, then until the vCPUs took what was sent after `before` (see [`run`]; `d` is
/// the pause that decides it), at most [`SETTLE_MAX`]. False when they did not within it.
/// A look at the vCPUs that fails ends it once `d` has passed, as a plain pause.
fn settle(wall: Duration, d: Duration, vcpus: Option<&Threads>, before: Option<Sample>) -> bool {
    let start = Instant::now();
    std::thread::sleep(wall);
    let (Some(vcpus), Some(before)) = (vcpus, before) else {
        std::thread::sleep(d.saturating_sub(start.elapsed()));
        return true;
    };
    let mut prev = None;
    loop {
        let Some(now) = vcpus.sample() else {
            std::thread::sleep(d.saturating_sub(start.elapsed()));
            return true;
        };
        if taken(d, before, prev, now) {
            return true;
        }
        if start.elapsed() >= SETTLE_MAX {
            return false;
        }
        prev = Some(now);
        std::thread::sleep(SETTLE_POLL);
    }
}

/// Whether vCPUs sampled `before` a command, then `prev` and `now` one poll apart, have taken
/// its events: they ran since the command and then slept through a whole poll (the wake-up
/// the command caused has been served), or ran for twice `d` (a busy guest never sleeps).
/// Asleep at one look is not enough: a TCG vCPU waiting for QEMU's global lock to read the
/// keyboard's port sleeps too, for a moment. And a busy guest is given twice the pause:
/// traced in the Debian installer under TCG, a guest busy through the whole pause had not
/// read a command of keys when the next one came, now and then twice in a row.
fn taken(d: Duration, before: Sample, prev: Option<Sample>, now: Sample) -> bool {
    let ran = now.ran.saturating_sub(before.ran);
    let idle = prev.is_some_and(|p| p.asleep && now.asleep && p.ran == now.ran);
    ran >= d * 2 || (ran > Duration::ZERO && idle)
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
    fn a_pause_ends_once_the_vcpus_ran_and_slept_a_whole_poll_or_ran_twice_its_length() {
        let at = |ms: u64, asleep: bool| Sample {
            ran: Duration::from_millis(ms),
            asleep,
        };
        let d = Duration::from_millis(10);
        assert!(
            !taken(d, at(5, true), Some(at(5, true)), at(5, true)),
            "not run since: not taken"
        );
        assert!(
            !taken(d, at(5, true), None, at(9, false)),
            "running, short of the pause"
        );
        assert!(
            !taken(d, at(5, true), None, at(6, true)),
            "asleep at one look may be a wait for QEMU's lock"
        );
        assert!(
            !taken(d, at(5, true), Some(at(6, true)), at(7, true)),
            "ran between the looks: not idle"
        );
        assert!(
            taken(d, at(5, true), Some(at(6, true)), at(6, true)),
            "ran, then slept through a poll"
        );
        assert!(
            !taken(d, at(5, false), None, at(15, false)),
            "a busy guest that ran one pause may not have read the keys yet"
        );
        assert!(
            taken(d, at(5, false), None, at(25, false)),
            "a busy guest had twice the pause"
        );
    }

    #[test]
    fn only_a_plans_last_pause_becomes_a_drain() {
        let (a, p) = (
            Step::Send(vec![key_event("a", true)]),
            Step::Pause(Duration::from_millis(7)),
        );
        assert_eq!(
            drained(vec![a.clone(), p.clone(), a.clone(), p.clone()]),
            [
                a.clone(),
                p.clone(),
                a.clone(),
                Step::Drain(Duration::from_millis(7))
            ]
        );
        assert_eq!(drained(vec![p.clone(), a.clone()]), [p, a]);
        assert!(drained(Vec::new()).is_empty());
    }

    #[test]
    fn a_drain_waits_a_few_polls_when_watching_and_its_whole_length_when_not() {
        let d = Duration::from_millis(30);
        assert_eq!(drain_wall(d, true), SETTLE_POLL * 3);
        assert_eq!(
            drain_wall(Duration::from_millis(1), true),
            Duration::from_millis(1)
        );
        assert_eq!(drain_wall(d, false), d);
        // Watching promised but no sample to compare with: still the whole length.
        let t = Instant::now();
        assert!(settle(Duration::ZERO, Duration::from_millis(5), None, None));
        assert!(t.elapsed() >= Duration::from_millis(5));
    }

    #[test]
    fn a_pause_without_vcpus_to_watch_is_wall_time() {
        let t = Instant::now();
        assert!(settle(
            Duration::from_millis(5),
            Duration::from_millis(5),
            None,
            None
        ));
        assert!(t.elapsed() >= Duration::from_millis(5));
    }
}
