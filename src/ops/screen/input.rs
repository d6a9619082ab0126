//! Plans of QMP `input-send-event` commands and pauses, and their sending: what the pointer
//! gestures ([`crate::ops::screen::pointer`]) and the keyboard ([`crate::ops::screen::keyboard`])
//! are made of (the events themselves, such as [`crate::qemu::keys::key_event`], are built in
//! `qemu/`). Plans are plain [`Step`]s so their order and pacing are unit-tested; [`run`] sends
//! them.

use std::time::Duration;

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

/// Sends the plan in order. `cancelled` is asked after each step; once it answers yes, only
/// commands that release keys or buttons are still sent (without the pauses), so the guest is
/// not left with anything held down.
pub fn run(q: &mut Qmp, plan: &[Step], cancelled: &dyn Fn() -> bool) -> Result<Sent, QmpError> {
    let mut sent = Sent {
        commands: 0,
        complete: true,
    };
    for step in plan {
        match step {
            Step::Pause(d) if sent.complete => std::thread::sleep(*d),
            Step::Pause(_) => continue,
            Step::Send(events) if sent.complete || releases(events) => {
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
}
