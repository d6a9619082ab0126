//! Key chords and text as QMP `input-send-event` commands, paced by mcqemu itself.
//!
//! Both tools send every key this way, never with QEMU's `send-key`: `send-key` queues its
//! events in QEMU with a hold-time pause after every press *and* every release (a one-key
//! chord takes two hold times there), and returns at once, while `input-send-event` goes
//! straight to the keyboard, past that queue. Chords sent with `send-key` and text sent right
//! after therefore interleaved: in the Debian installer, the last of 16 backspaces that cleared
//! a field arrived after the first characters typed into it and deleted them (QEMU's trace
//! showed the guest reading every scancode, in that interleaved order). Planned as plain
//! [`Step`]s, so the order and pacing are unit-tested, then sent by [`crate::ops::screen::input::run`].

use std::time::Duration;

use serde::Serialize;

use crate::ops::error::OpError;
use crate::ops::screen::input::{self, Step};
use crate::ops::session;
use crate::ops::vm::records;
use crate::ops::work::Work;
use crate::qemu::keys::{self, key_event, KeyEvent};
use crate::state::registry::Record;

/// Longest text vm_type_text accepts.
pub const MAX_TEXT: usize = 4096;

/// A running VM that has a keyboard: keys sent to a VM without one would go nowhere, and the
/// tool would report a success that did not happen.
fn live(name: &str) -> Result<Record, OpError> {
    let rec = records::lookup_live(name, "launch it first")?;
    if records::input(&rec, records::InputKind::Keyboard).is_none() {
        return Err(OpError::invalid(format!(
            "VM {name:?} has no keyboard device (machine {}), so keys would go nowhere; launch \
             it with one, e.g. extra_args [\"-device\", \"virtio-keyboard-pci\"]",
            rec.machine_kind().unwrap_or_else(|| "?".into())
        )));
    }
    Ok(rec)
}

/// vm_send_keys's request: key chords by name ("ctrl+alt+del", "ret"), each held `hold`, with
/// `delay` between chords.
#[derive(Debug, Clone)]
pub struct KeysRequest {
    /// The VM.
    pub name: String,
    /// The chords as given.
    pub specs: Vec<String>,
    /// How long each chord is held.
    pub hold: Duration,
    /// The pause between chords.
    pub delay: Duration,
}

crate::described! {
    /// What vm_send_keys sent (its result, in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct KeysSent {
        /// The VM.
        pub name: String,
        /// Chords sent.
        pub sent: usize,
        /// Each chord as QEMU key codes.
        pub chords: Vec<Vec<&'static str>>,
    }
}

/// Sends the chords, unless a person holds the VM; a cancel releases what was pressed.
pub fn send_keys(work: &dyn Work, req: &KeysRequest) -> Result<KeysSent, OpError> {
    let name = &req.name;
    crate::ops::vm::hold::check_agent(name, "vm_send_keys")?;
    if req.specs.is_empty() {
        return Err(OpError::invalid(
            "keys is empty; give at least one key or chord",
        ));
    }
    let chords: Vec<Vec<&'static str>> = req
        .specs
        .iter()
        .map(|s| keys::chord(s))
        .collect::<Result<_, _>>()?;
    let rec = live(name)?;
    let plan = chord_plan(&chords, req.hold, req.delay);
    let sent = session::monitor(name, &rec, |q| Ok(input::run(q, &plan, rec.pid, work)?))?;
    if !sent.complete {
        return Err(OpError::cancelled(format!(
            "cancelled after {} of {} key commands (keys pressed were released)",
            sent.commands,
            input::commands(&plan)
        )));
    }
    Ok(KeysSent {
        name: name.clone(),
        sent: chords.len(),
        chords,
    })
}

/// vm_type_text's request: text on a US layout, Enter after it if asked, `gap` after each
/// batch.
#[derive(Debug, Clone)]
pub struct TextRequest {
    /// The VM.
    pub name: String,
    /// At most [`MAX_TEXT`] characters.
    pub text: String,
    /// Press Enter afterwards.
    pub enter: bool,
    /// The pause after each batch.
    pub gap: Duration,
}

crate::described! {
    /// What vm_type_text sent (its result, in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct Typed {
        /// The VM.
        pub name: String,
        /// Characters typed.
        pub characters: usize,
        /// Key batches sent.
        pub commands: usize,
    }
}

/// Types the text, unless a person holds the VM; a cancel releases what was pressed.
pub fn type_text(work: &dyn Work, req: &TextRequest) -> Result<Typed, OpError> {
    let name = &req.name;
    crate::ops::vm::hold::check_agent(name, "vm_type_text")?;
    let mut text = req.text.clone();
    if text.chars().count() > MAX_TEXT {
        return Err(OpError::invalid(format!(
            "text is longer than {MAX_TEXT} characters; split it into several calls"
        )));
    }
    if req.enter {
        text.push('\n');
    }
    let events = keys::type_events(&text)?;
    let plan = text_plan(&events, req.gap);
    let rec = live(name)?;
    let commands = input::commands(&plan);
    let sent = session::monitor(name, &rec, |q| Ok(input::run(q, &plan, rec.pid, work)?))?;
    if !sent.complete {
        return Err(OpError::cancelled(format!(
            "cancelled after {} of {commands} key batches",
            sent.commands
        )));
    }
    Ok(Typed {
        name: name.clone(),
        characters: events.len(),
        commands,
    })
}

/// Key events per command: half of QEMU's PS/2 keyboard queue, which holds 16 bytes and
/// drops what does not fit before the guest reads it (a typed character is one byte per
/// event, no extended keys). A guest busy with other work can leave a whole command unread
/// through one pause (traced in the Debian installer under TCG: the vCPU ran the pause's
/// time without reading the keyboard, and the next full command of 16 was dropped whole);
/// half the queue leaves room for the next one.
pub const EVENTS_PER_COMMAND: usize = 8;
/// Keys pressed (or released) in one command of a chord: an extended key (arrows, right ctrl,
/// ...) is two bytes per event, so four fill half the PS/2 queue.
const CHORD_KEYS_PER_COMMAND: usize = 4;
/// The shortest pause after a command of key events: the guest must drain the keyboard queue
/// before the next command arrives, or keys are lost (measured: 0 ms loses keys under TCG).
pub const MIN_GAP: Duration = Duration::from_millis(10);

/// Presses (or releases) `keys` in order, at most [`CHORD_KEYS_PER_COMMAND`] a command.
fn chord_edge(plan: &mut Vec<Step>, keys: &[&str], down: bool) {
    for (i, part) in keys.chunks(CHORD_KEYS_PER_COMMAND).enumerate() {
        if i > 0 {
            plan.push(Step::Pause(MIN_GAP));
        }
        plan.push(Step::Send(
            part.iter().map(|k| key_event(k, down)).collect(),
        ));
    }
}

/// Each chord: its keys pressed in order, held `hold`, released in reverse order, then
/// `delay` (also after the last: vm_send_keys promises it, and agents use it as "press, then
/// wait"; it also keeps the next call's keys from joining these).
pub fn chord_plan(chords: &[Vec<&str>], hold: Duration, delay: Duration) -> Vec<Step> {
    let mut plan = Vec::new();
    for c in chords {
        chord_edge(&mut plan, c, true);
        plan.push(Step::Pause(hold));
        let up: Vec<&str> = c.iter().rev().copied().collect();
        chord_edge(&mut plan, &up, false);
        plan.push(Step::Pause(delay.max(MIN_GAP)));
    }
    plan
}

/// Groups per-character events into commands of at most [`EVENTS_PER_COMMAND`] events, never
/// splitting a character (so a cancel between commands never leaves shift down).
pub fn batches(chars: &[Vec<KeyEvent>]) -> Vec<Vec<KeyEvent>> {
    let mut out: Vec<Vec<KeyEvent>> = Vec::new();
    for c in chars {
        match out.last_mut() {
            Some(last) if last.len() + c.len() <= EVENTS_PER_COMMAND => {
                last.extend(c.iter().copied())
            }
            _ => out.push(c.clone()),
        }
    }
    out
}

/// Text: [`batches`] of press-release pairs, each followed by `gap` (at least [`MIN_GAP`]);
/// the last by a [`Step::Drain`], so a following call cannot overflow the queue.
pub fn text_plan(chars: &[Vec<KeyEvent>], gap: Duration) -> Vec<Step> {
    input::drained(
        batches(chars)
            .into_iter()
            .flat_map(|b| {
                [
                    Step::Send(b.iter().map(|(k, d)| key_event(k, *d)).collect()),
                    Step::Pause(gap.max(MIN_GAP)),
                ]
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::super::input::commands;
    use super::*;
    use crate::qemu::keys;
    use crate::qemu::qmp_calls::InputEvent;

    /// The plan as text: "+a" a press, "-a" a release, "|" a command boundary, "~N" a pause.
    fn show(plan: &[Step]) -> String {
        plan.iter()
            .map(|s| match s {
                Step::Pause(d) => format!("~{}", d.as_millis()),
                Step::Drain(d) => format!("~{}.", d.as_millis()),
                Step::Send(evs) => evs
                    .iter()
                    .map(|e| match e {
                        InputEvent::Key { qcode, down } => {
                            format!("{}{qcode}", if *down { "+" } else { "-" })
                        }
                        other => format!("{other:?}"),
                    })
                    .collect::<Vec<_>>()
                    .join(" "),
            })
            .collect::<Vec<_>>()
            .join(" | ")
    }

    #[test]
    fn a_chord_is_pressed_held_then_released_in_reverse_in_separate_commands() {
        let plan = chord_plan(
            &[vec!["ctrl", "alt", "delete"], vec!["ret"]],
            Duration::from_millis(100),
            Duration::from_millis(50),
        );
        assert_eq!(
            show(&plan),
            "+ctrl +alt +delete | ~100 | -delete -alt -ctrl | ~50 | +ret | ~100 | -ret | ~50"
        );
    }

    #[test]
    fn chord_delay_has_a_floor_and_long_chords_fit_the_ps2_queue() {
        let nine: Vec<&str> = vec!["up"; 9];
        let plan = chord_plan(&[nine], Duration::from_millis(1), Duration::ZERO);
        let sends: Vec<usize> = plan
            .iter()
            .filter_map(|s| match s {
                Step::Send(e) => Some(e.len()),
                Step::Pause(_) | Step::Drain(_) => None,
            })
            .collect();
        assert_eq!(sends, vec![4, 4, 1, 4, 4, 1]);
        assert_eq!(plan.last(), Some(&Step::Pause(MIN_GAP)));
    }

    #[test]
    fn batches_never_exceed_half_the_ps2_queue_or_split_a_character() {
        let ev = keys::type_events("Hello, World! \"quoted\" \\ back").unwrap();
        let b = batches(&ev);
        assert!(b.iter().all(|c| c.len() <= EVENTS_PER_COMMAND));
        let flat: Vec<KeyEvent> = b.into_iter().flatten().collect();
        let orig: Vec<KeyEvent> = ev.into_iter().flatten().collect();
        assert_eq!(flat, orig);
    }

    #[test]
    fn text_is_sent_in_order_with_a_pause_after_every_command() {
        let ev = keys::type_events("abcdefghiJ").unwrap();
        let plan = text_plan(&ev, Duration::ZERO);
        assert_eq!(
            show(&plan),
            "+a -a +b -b +c -c +d -d | ~10 | +e -e +f -f +g -g +h -h | ~10 | \
             +i -i +shift +j -j -shift | ~10."
        );
        assert_eq!(commands(&plan), 3);
    }
}
