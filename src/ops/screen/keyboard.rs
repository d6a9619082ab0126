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

use crate::ops::screen::input::{key_event, Step};
use crate::qemu::keys::KeyEvent;

/// Key events per command: QEMU's PS/2 keyboard queue holds 16 bytes and drops what does not
/// fit before the guest reads it; a typed character is one byte per event (no extended keys).
pub const EVENTS_PER_COMMAND: usize = 16;
/// Keys pressed (or released) in one command of a chord: an extended key (arrows, right ctrl,
/// ...) is two bytes per event, so eight fill the PS/2 queue.
const CHORD_KEYS_PER_COMMAND: usize = 8;
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
/// `delay` (also after the last, so the next call's keys cannot join it).
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

/// Text: [`batches`] of press-release pairs, each followed by `gap` (at least [`MIN_GAP`];
/// also after the last, so a following call cannot overflow the queue).
pub fn text_plan(chars: &[Vec<KeyEvent>], gap: Duration) -> Vec<Step> {
    batches(chars)
        .into_iter()
        .flat_map(|b| {
            [
                Step::Send(b.iter().map(|(k, d)| key_event(k, *d)).collect()),
                Step::Pause(gap.max(MIN_GAP)),
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::input::commands;
    use super::*;
    use crate::qemu::keys;
    use serde_json::json;

    /// The plan as text: "+a" a press, "-a" a release, "|" a command boundary, "~N" a pause.
    fn show(plan: &[Step]) -> String {
        plan.iter()
            .map(|s| match s {
                Step::Pause(d) => format!("~{}", d.as_millis()),
                Step::Send(evs) => evs
                    .iter()
                    .map(|e| {
                        let sign = if e["data"]["down"] == json!(true) {
                            "+"
                        } else {
                            "-"
                        };
                        format!("{sign}{}", e["data"]["key"]["data"].as_str().unwrap())
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
                Step::Pause(_) => None,
            })
            .collect();
        assert_eq!(sends, vec![8, 1, 8, 1]);
        assert_eq!(plan.last(), Some(&Step::Pause(MIN_GAP)));
    }

    #[test]
    fn batches_never_exceed_sixteen_events_or_split_a_character() {
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
            "+a -a +b -b +c -c +d -d +e -e +f -f +g -g +h -h | ~10 | \
             +i -i +shift +j -j -shift | ~10"
        );
        assert_eq!(commands(&plan), 2);
    }
}
