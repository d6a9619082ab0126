//! Pointer gestures as QMP `input-send-event` command sequences: a click, a drag (button down at
//! one point, moves, up at another) and wheel turns, each optionally with modifier keys held
//! from before the first button change to after the last. Planned as plain [`Step`]s (so the
//! order and pacing are unit-tested) and then sent by [`crate::ops::screen::input::run`].

use std::time::Duration;

use crate::ops::error::OpError;
pub use crate::ops::screen::input::Step;
use crate::qemu::keys;
use crate::qemu::keys::key_event;
use crate::qemu::qmp_calls::{Axis, InputEvent};

/// Maps a coordinate of a scaled image of the screen (`image` pixels along this axis for
/// `screen` screen pixels) to the screen pixel under the image pixel's centre.
pub fn to_screen(pos: i64, image: u32, screen: u32) -> i64 {
    if image >= screen || image == 0 {
        return pos;
    }
    let p = ((pos as f64 + 0.5) * f64::from(screen) / f64::from(image)).floor() as i64;
    p.min(i64::from(screen) - 1)
}

/// Maps image pixel (x, y) of a screenshot at `scale` of a `w`x`h` screen to the screen pixel
/// under it; None when it is outside that image.
pub fn screen_point(x: i64, y: i64, scale: f64, w: u32, h: u32) -> Option<Point> {
    let (iw, ih) = crate::qemu::screen::scaled_size(w, h, scale);
    if x < 0 || y < 0 || x >= i64::from(iw) || y >= i64::from(ih) {
        return None;
    }
    Some(Point {
        x: to_screen(x, iw, w) as u32,
        y: to_screen(y, ih, h) as u32,
    })
}

/// Pause between commands the guest must see separately: QEMU's PS/2 mouse queue holds four
/// packets, and a button change that finds it full is merged into the next one (the tablet's
/// virtqueue is larger, but the guest must still see a down before its up).
pub const PACE: Duration = Duration::from_millis(20);

/// Pause between the release of one click and the press of the next (a double click):
/// libinput, which X and Wayland desktops read input through, drops a press that follows a
/// release within 25 ms as switch bounce, and a guest under TCG can read the tablet's queued
/// events late and close together (measured: a double click at 20 ms reached Tk as one click).
/// Tk's double-click window is 500 ms.
pub const CLICK_GAP: Duration = Duration::from_millis(120);

/// Most modifier keys held at once.
pub const MAX_HOLD: usize = 4;

/// Most intermediate moves of a drag, and most wheel clicks of one scroll.
pub const MAX_STEPS: u32 = 200;

/// The keys `hold` accepts (qcodes; aliases such as `win` map onto them).
const MODIFIERS: &[&str] = &[
    "shift", "shift_r", "ctrl", "ctrl_r", "alt", "alt_r", "altgr", "meta_l", "meta_r",
];

/// A point on a screen of a given size (screen pixels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Point {
    /// Column, 0 at the left.
    pub x: u32,
    /// Row, 0 at the top.
    pub y: u32,
}

/// A wheel direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wheel {
    /// Away from the user (content moves down, a list shows earlier items).
    Up,
    /// Towards the user.
    Down,
}

/// Checks the `hold` list: modifier keys only, each once, at most [`MAX_HOLD`].
pub fn modifiers(names: &[String]) -> Result<Vec<&'static str>, OpError> {
    if names.len() > MAX_HOLD {
        return Err(OpError::invalid(format!(
            "hold lists {} keys; hold at most {MAX_HOLD} modifiers; nothing was sent",
            names.len()
        )));
    }
    let mut out: Vec<&'static str> = Vec::new();
    for n in names {
        let q = keys::qcode(n)
            .filter(|q| MODIFIERS.contains(q))
            .ok_or_else(|| {
                OpError::invalid(format!(
                    "hold {n:?} is not a modifier key; hold shift, ctrl, alt, altgr or win (or \
                 their _r variants); nothing was sent"
                ))
            })?;
        if !out.contains(&q) {
            out.push(q);
        }
    }
    Ok(out)
}

/// Maps a screen pixel to QEMU's absolute axis range 0..=32767.
pub fn abs_axis(pos: u32, size: u32) -> i64 {
    if size <= 1 {
        return 0;
    }
    (i64::from(pos.min(size - 1)) * 32767) / i64::from(size - 1)
}

fn move_to(p: Point, screen: (u32, u32)) -> Step {
    Step::Send(vec![
        InputEvent::Abs {
            axis: Axis::X,
            value: abs_axis(p.x, screen.0),
        },
        InputEvent::Abs {
            axis: Axis::Y,
            value: abs_axis(p.y, screen.1),
        },
    ])
}

fn button(name: &str, down: bool) -> Step {
    Step::Send(vec![InputEvent::Btn {
        button: name.to_string(),
        down,
    }])
}

fn keys_event(hold: &[&str], down: bool) -> Step {
    Step::Send(hold.iter().map(|k| key_event(k, down)).collect())
}

/// Wraps `inner` in the modifiers' presses and releases (reverse order), each paced.
fn held(hold: &[&str], inner: Vec<Step>) -> Vec<Step> {
    if hold.is_empty() {
        return inner;
    }
    let mut up: Vec<&str> = hold.to_vec();
    up.reverse();
    let mut plan = vec![keys_event(hold, true), Step::Pause(PACE)];
    plan.extend(inner);
    plan.extend([Step::Pause(PACE), keys_event(&up, false), Step::Pause(PACE)]);
    plan
}

/// Presses and releases `btn` `count` times (a double click is 2), each change its own
/// command, paced, `gap` between one release and the next press.
fn presses(btn: &str, count: u32, gap: Duration) -> Vec<Step> {
    let mut plan = Vec::new();
    for i in 0..count {
        if i > 0 {
            plan.push(Step::Pause(gap));
        }
        plan.extend([button(btn, true), Step::Pause(PACE), button(btn, false)]);
    }
    plan
}

/// A click (or `count` clicks) of `btn` at `at` with `hold` held.
pub fn click_plan(
    at: Point,
    screen: (u32, u32),
    btn: &str,
    count: u32,
    hold: &[&str],
) -> Vec<Step> {
    let mut plan = vec![move_to(at, screen), Step::Pause(PACE)];
    plan.extend(held(hold, presses(btn, count.clamp(1, 3), CLICK_GAP)));
    plan
}

/// Relative moves sent between two paced pauses. A PS/2 mouse packet is at most 4 bytes and
/// QEMU's queue holds 16; motion that finds it full is held back and summed with what comes
/// next, so a group leaves room and the pause lets the guest read it (traced in CI: five moves
/// sent at once, the guest slow to read, and part of the motion arrived with the click after).
pub const MOVES_PER_PAUSE: usize = 3;

fn rel(dx: i64, dy: i64) -> Step {
    Step::Send(vec![
        InputEvent::Rel {
            axis: Axis::X,
            value: dx,
        },
        InputEvent::Rel {
            axis: Axis::Y,
            value: dy,
        },
    ])
}

/// vm_mouse_move: each segment's moves (a trip to a corner, then the move) in groups of
/// [`MOVES_PER_PAUSE`] with a pause after each; after each segment two empty moves, each
/// followed by a pause, that flush motion QEMU still held back, so the trip is all delivered
/// before the move (summed, the move would vanish into the corner) and the move before the
/// click; then `click`'s button pressed its count of times (a double click is 2), if any.
pub fn relative_plan(segments: &[Vec<(i64, i64)>], click: Option<(&str, u32)>) -> Vec<Step> {
    let mut plan = Vec::new();
    for seg in segments.iter().filter(|s| !s.is_empty()) {
        for group in seg.chunks(MOVES_PER_PAUSE) {
            plan.extend(group.iter().map(|&(x, y)| rel(x, y)));
            plan.push(Step::Pause(PACE));
        }
        for _ in 0..2 {
            plan.extend([rel(0, 0), Step::Pause(PACE)]);
        }
    }
    if let Some((btn, count)) = click {
        plan.extend(presses(btn, count.clamp(1, 3), CLICK_GAP));
    }
    plan
}

/// The points a drag passes through after `from`: `steps` evenly spaced, the last `to`.
pub fn drag_path(from: Point, to: Point, steps: u32) -> Vec<Point> {
    let n = steps.clamp(1, MAX_STEPS) as i64;
    let lerp =
        |a: u32, b: u32, i: i64| (i64::from(a) + (i64::from(b) - i64::from(a)) * i / n) as u32;
    (1..=n)
        .map(|i| Point {
            x: lerp(from.x, to.x, i),
            y: lerp(from.y, to.y, i),
        })
        .collect()
}

/// A drag: to `from`, modifiers down, `btn` down, moves along [`drag_path`] with `step_pause`
/// between them, `btn` up at `to`, modifiers up.
pub fn drag_plan(
    from: Point,
    to: Point,
    screen: (u32, u32),
    btn: &str,
    hold: &[&str],
    steps: u32,
    step_pause: Duration,
) -> Vec<Step> {
    let mut inner = vec![button(btn, true), Step::Pause(PACE)];
    for p in drag_path(from, to, steps) {
        inner.push(move_to(p, screen));
        inner.push(Step::Pause(step_pause.max(Duration::from_millis(1))));
    }
    inner.push(button(btn, false));
    let mut plan = vec![move_to(from, screen), Step::Pause(PACE)];
    plan.extend(held(hold, inner));
    plan
}

/// `clicks` wheel clicks towards `dir` at `at`, with `hold` held.
pub fn scroll_plan(
    at: Point,
    screen: (u32, u32),
    dir: Wheel,
    clicks: u32,
    hold: &[&str],
) -> Vec<Step> {
    let btn = match dir {
        Wheel::Up => "wheel-up",
        Wheel::Down => "wheel-down",
    };
    let mut plan = vec![move_to(at, screen), Step::Pause(PACE)];
    // Wheel notches are relative motion to the guest (REL_WHEEL), not buttons: no bounce
    // filter applies, so the short pace is enough (3 notches: 3 presses seen by Tk).
    plan.extend(held(hold, presses(btn, clicks.clamp(1, MAX_STEPS), PACE)));
    plan
}

#[cfg(test)]
mod tests {
    use super::super::input::commands;
    use super::*;

    fn sends(plan: &[Step]) -> Vec<Vec<InputEvent>> {
        plan.iter()
            .filter_map(|s| match s {
                Step::Send(e) => Some(e.clone()),
                Step::Pause(_) | Step::Drain(_) => None,
            })
            .collect()
    }

    fn kind(e: &InputEvent) -> String {
        let sign = |down: &bool| if *down { "+" } else { "-" };
        let axis = |a: &Axis| if *a == Axis::X { "x" } else { "y" };
        match e {
            InputEvent::Abs { axis: a, value } => format!("{}={value}", axis(a)),
            InputEvent::Btn { button, down } => format!("{button}{}", sign(down)),
            InputEvent::Key { qcode, down } => format!("{qcode}{}", sign(down)),
            InputEvent::Rel { .. } => "rel".to_string(),
        }
    }

    fn flat(plan: &[Step]) -> Vec<String> {
        sends(plan)
            .iter()
            .map(|c| c.iter().map(kind).collect::<Vec<_>>().join(","))
            .collect()
    }

    #[test]
    fn a_shift_click_holds_shift_around_the_button_and_moves_first() {
        let plan = click_plan(Point { x: 0, y: 799 }, (1280, 800), "left", 1, &["shift"]);
        assert_eq!(
            flat(&plan),
            ["x=0,y=32767", "shift+", "left+", "left-", "shift-"]
        );
        // Every change is its own command with a pause between.
        for w in plan.windows(2) {
            assert!(
                !(matches!(w[0], Step::Send(_)) && matches!(w[1], Step::Send(_))),
                "{w:?}"
            );
        }
    }

    #[test]
    fn a_double_right_click_is_two_paced_presses() {
        let plan = click_plan(Point { x: 10, y: 10 }, (100, 100), "right", 2, &[]);
        assert_eq!(flat(&plan)[1..], ["right+", "right-", "right+", "right-"]);
        assert!(plan.contains(&Step::Pause(CLICK_GAP)));
    }

    #[test]
    fn a_ctrl_drag_presses_at_the_start_moves_and_releases_at_the_end() {
        let from = Point { x: 100, y: 200 };
        let to = Point { x: 400, y: 260 };
        let plan = drag_plan(from, to, (1281, 801), "left", &["ctrl", "alt"], 3, PACE);
        let f = flat(&plan);
        let abs = |p: Point| format!("x={},y={}", abs_axis(p.x, 1281), abs_axis(p.y, 801));
        assert_eq!(
            f,
            [
                abs(from),
                "ctrl+,alt+".into(),
                "left+".into(),
                abs(Point { x: 200, y: 220 }),
                abs(Point { x: 300, y: 240 }),
                abs(to),
                "left-".into(),
                "alt-,ctrl-".into(),
            ]
        );
        assert_eq!(commands(&plan), 8);
    }

    #[test]
    fn relative_motion_is_paced_in_groups_and_flushed_before_the_next_segment_and_the_click() {
        let home = vec![(-120, -120); 4];
        let mv = vec![(60, 30); 2];
        let plan = relative_plan(&[home, mv, vec![]], Some(("left", 2)));
        // Moves as their x, pauses as "|", buttons as flat() names them.
        let seen: Vec<String> = plan
            .iter()
            .map(|s| match s {
                Step::Pause(_) | Step::Drain(_) => "|".to_string(),
                Step::Send(e) => match &e[0] {
                    InputEvent::Rel { value, .. } => value.to_string(),
                    other => kind(other),
                },
            })
            .collect();
        let want = [
            "-120", "-120", "-120", "|", "-120", "|", "0", "|", "0", "|", // the trip, flushed
            "60", "60", "|", "0", "|", "0", "|", // the move, flushed
            "left+", "|", "left-", "|", "left+", "|", "left-", // the double click
        ];
        assert_eq!(seen, want);
        assert!(plan.contains(&Step::Pause(CLICK_GAP)));
        assert!(relative_plan(&[vec![]], None).is_empty());
    }

    #[test]
    fn drag_paths_end_at_the_target_and_go_backwards_too() {
        let p = drag_path(Point { x: 500, y: 10 }, Point { x: 0, y: 10 }, 7);
        assert_eq!(p.len(), 7);
        assert_eq!(*p.last().unwrap(), Point { x: 0, y: 10 });
        assert!(p.windows(2).all(|w| w[0].x > w[1].x));
        assert_eq!(
            drag_path(Point { x: 1, y: 1 }, Point { x: 9, y: 9 }, 0).len(),
            1
        );
    }

    #[test]
    fn scrolling_sends_wheel_presses_at_the_point() {
        let plan = scroll_plan(Point { x: 5, y: 5 }, (11, 11), Wheel::Down, 2, &[]);
        assert_eq!(
            flat(&plan),
            [
                "x=16383,y=16383",
                "wheel-down+",
                "wheel-down-",
                "wheel-down+",
                "wheel-down-"
            ]
        );
        let up = scroll_plan(Point { x: 5, y: 5 }, (11, 11), Wheel::Up, 1, &["ctrl"]);
        assert_eq!(flat(&up)[1..], ["ctrl+", "wheel-up+", "wheel-up-", "ctrl-"]);
    }

    #[test]
    fn hold_takes_modifiers_only() {
        let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            modifiers(&list(&["Shift", "ctrl", "shift"])).unwrap(),
            ["shift", "ctrl"]
        );
        assert_eq!(modifiers(&list(&["win"])).unwrap(), ["meta_l"]);
        assert!(modifiers(&list(&["a"]))
            .unwrap_err()
            .msg
            .contains("not a modifier"));
        assert!(modifiers(&list(&["shift", "ctrl", "alt", "altgr", "meta_l"])).is_err());
    }

    #[test]
    fn axis_scaling_clamps_to_the_screen() {
        assert_eq!(abs_axis(0, 1024), 0);
        assert_eq!(abs_axis(1023, 1024), 32767);
        assert_eq!(abs_axis(5000, 1024), 32767);
        assert_eq!(abs_axis(3, 1), 0);
    }
}
