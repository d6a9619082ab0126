//! The mouse tools' operations: a click through the absolute tablet (vm_click), relative motion
//! through a PS/2-style mouse (vm_mouse_move), and the planned gestures (vm_drag, vm_scroll)
//! sent at points of a screenshot. Each reads the current screen size in the same monitor
//! session, so coordinates read off a scaled screenshot land on the pixels under them.

use std::time::Duration;

use serde::Serialize;

use super::input::{self, Step};
use super::pointer::{abs_axis, relative_plan, screen_point, Point, CLICK_GAP};
use crate::ops::error::OpError;
use crate::ops::session::{self, SessionError};
use crate::ops::vm::records;
use crate::ops::work::Work;
use crate::qemu::qmp::{Qmp, QmpError};
use crate::qemu::qmp_calls::{Axis, InputEvent};
use crate::qemu::screen::scaled_size;

/// Largest |dx| or |dy| for vm_mouse_move.
pub const MAX_DELTA: i64 = 20000;

/// Pause between mouse commands the guest must see separately. QEMU's PS/2 mouse queue holds
/// four packets; a button change that finds it full (say, behind relative motion) is merged
/// into the next one, so a down and an up sent back to back can vanish as a whole click.
const MOUSE_PACE: Duration = Duration::from_millis(20);

/// The refusal for a point outside the screenshot (or screen) it was read from.
pub fn outside(x: i64, y: i64, scale: f64, w: u32, h: u32) -> OpError {
    let (iw, ih) = scaled_size(w, h, scale);
    OpError::invalid(if scale < 1.0 {
        format!(
            "({x}, {y}) is outside the {iw}x{ih} screenshot (scale {scale}) of the {w}x{h} \
             screen; nothing was sent"
        )
    } else {
        format!("({x}, {y}) is outside the {w}x{h} screen; nothing was sent")
    })
}

/// The screen's size, read in an open monitor session (a capture: QMP tells no size alone).
fn screen_size(q: &mut Qmp, name: &str) -> Result<(u32, u32), SessionError<QmpError>> {
    let frame = super::capture_in(q, name)?;
    Ok((frame.width, frame.height))
}

/// vm_click: a point of a screenshot at `scale`, a button, modifiers held around the click.
#[derive(Debug, Clone)]
pub struct ClickRequest {
    /// The VM.
    pub name: String,
    /// Column of the point, in pixels of the screenshot at `scale` (-1: none given).
    pub x: i64,
    /// Row of the point, likewise.
    pub y: i64,
    /// The scale of the screenshot the point was read from (1: screen pixels).
    pub scale: f64,
    /// left, right or middle.
    pub button: String,
    /// Two clicks, a double-click's gap apart.
    pub double: bool,
    /// Modifier keys (qcodes) held around the click.
    pub hold: Vec<&'static str>,
}

crate::described! {
    /// Where a click landed.
    #[derive(Debug, Clone, Serialize)]
    pub struct Clicked {
        /// The VM.
        pub name: String,
        /// The point as given.
        pub x: i64,
        /// The point as given.
        pub y: i64,
        /// The scale as given.
        pub scale: f64,
        /// The screen pixel clicked: column.
        pub screen_x: u32,
        /// The screen pixel clicked: row.
        pub screen_y: u32,
        /// The button clicked.
        pub button: String,
        /// The modifiers held.
        pub hold: Vec<&'static str>,
        /// The screen's size when clicked.
        pub screen_width: u32,
        /// The screen's height.
        pub screen_height: u32,
    }
}

/// Clicks at the request's point, unless a person holds the VM or the point is off screen.
pub fn click(req: &ClickRequest) -> Result<Clicked, OpError> {
    let name = &req.name;
    crate::ops::vm::hold::check_agent(name, "vm_click")?;
    let rec = records::lookup_live(name, "launch it first")?;
    let (w, h, at) = session::monitor(name, &rec, |q| {
        let (w, h) = screen_size(q, name)?;
        let Some(at) = screen_point(req.x, req.y, req.scale, w, h) else {
            return Ok((w, h, None));
        };
        q.send_input(&[
            InputEvent::Abs {
                axis: Axis::X,
                value: abs_axis(at.x, w),
            },
            InputEvent::Abs {
                axis: Axis::Y,
                value: abs_axis(at.y, h),
            },
        ])?;
        press_keys(q, &req.hold, true)?;
        click_cmds(q, &req.button, req.double)?;
        press_keys(q, &req.hold, false)?;
        Ok((w, h, Some(at)))
    })?;
    let at = at.ok_or_else(|| outside(req.x, req.y, req.scale, w, h))?;
    Ok(Clicked {
        name: name.clone(),
        x: req.x,
        y: req.y,
        scale: req.scale,
        screen_x: at.x,
        screen_y: at.y,
        button: req.button.clone(),
        hold: req.hold.clone(),
        screen_width: w,
        screen_height: h,
    })
}

fn button_event(button: &str, down: bool) -> InputEvent {
    InputEvent::Btn {
        button: button.to_string(),
        down,
    }
}

fn click_cmds(q: &mut Qmp, button: &str, double: bool) -> Result<(), QmpError> {
    for i in 0..if double { 2 } else { 1 } {
        if i > 0 {
            std::thread::sleep(CLICK_GAP);
        }
        // Down and up in separate commands: in one command both are lost on PS/2 and USB tablets.
        q.send_input(&[button_event(button, true)])?;
        std::thread::sleep(MOUSE_PACE);
        q.send_input(&[button_event(button, false)])?;
    }
    Ok(())
}

/// Presses (or releases) the `hold` modifiers around a click, paced like the buttons.
fn press_keys(q: &mut Qmp, hold: &[&str], down: bool) -> Result<(), QmpError> {
    if hold.is_empty() {
        return Ok(());
    }
    let events: Vec<InputEvent> = hold
        .iter()
        .map(|k| crate::qemu::keys::key_event(k, down))
        .collect();
    std::thread::sleep(MOUSE_PACE);
    q.send_input(&events)?;
    std::thread::sleep(MOUSE_PACE);
    Ok(())
}

/// vm_mouse_move: relative motion (in pixels of a screenshot at `scale`), after an optional
/// trip to a corner, in steps of at most `step`, then an optional click.
#[derive(Debug, Clone)]
pub struct MoveRequest {
    /// The VM.
    pub name: String,
    /// Horizontal motion, in pixels of the screenshot at `scale`.
    pub dx: i64,
    /// Vertical motion, likewise.
    pub dy: i64,
    /// The scale of the screenshot the distances were read from.
    pub scale: f64,
    /// Most pixels per command on each axis (clamped to 1-120).
    pub step: i64,
    /// A corner to move to first: top-left, top-right, bottom-left, bottom-right.
    pub home: Option<String>,
    /// A button to click after the move.
    pub click: Option<String>,
    /// Double-click it.
    pub double: bool,
}

crate::described! {
    /// What a relative move sent.
    #[derive(Debug, Clone, Serialize)]
    pub struct Moved {
        /// The VM.
        pub name: String,
        /// The motion as given.
        pub dx: i64,
        /// The motion as given.
        pub dy: i64,
        /// The motion in screen pixels.
        pub screen_dx: i64,
        /// The motion in screen pixels.
        pub screen_dy: i64,
        /// Relative motion commands sent.
        pub commands: usize,
        /// The corner moved to first.
        pub home: Option<String>,
        /// The button clicked after.
        pub click: Option<String>,
    }
}

/// Moves the relative mouse; refused when the VM has none (the virt boards' tablet only).
pub fn mouse_move(req: &MoveRequest, work: &dyn Work) -> Result<Moved, OpError> {
    let name = &req.name;
    crate::ops::vm::hold::check_agent(name, "vm_mouse_move")?;
    let (sdx, sdy) = screen_delta(req.dx, req.dy, req.scale)?;
    // Relative motion needs a relative mouse (a PC's PS/2 one); the virt boards have only the
    // absolute tablet, where this motion would go nowhere.
    let rec = records::lookup_live(name, "launch it first")?;
    if records::input(&rec, records::InputKind::RelativePointer).is_none() {
        return Err(OpError::invalid(format!(
            "VM {name:?} has no relative mouse (machine {}), so the motion would go nowhere; \
             use vm_click with x and y (the absolute tablet) instead",
            rec.machine_kind().unwrap_or_else(|| "?".into())
        )));
    }
    let segments = move_segments(req.home.as_deref(), sdx, sdy, req.step.clamp(1, 120));
    let moves = segments.iter().map(Vec::len).sum();
    let click = req
        .click
        .as_deref()
        .map(|b| (b, if req.double { 2 } else { 1 }));
    let plan = relative_plan(&segments, click);
    session::monitor(name, &rec, |q| {
        let sent = input::run(q, &plan, rec.pid, work)?;
        if !sent.complete {
            return Err(OpError::cancelled("cancelled (nothing left pressed)").into());
        }
        Ok(())
    })?;
    Ok(Moved {
        name: name.clone(),
        dx: req.dx,
        dy: req.dy,
        screen_dx: sdx,
        screen_dy: sdy,
        commands: moves,
        home: req.home.clone(),
        click: req.click.clone(),
    })
}

/// (dx, dy) of a screenshot at `scale` in screen pixels; either past [`MAX_DELTA`] is refused.
pub fn screen_delta(dx: i64, dy: i64, scale: f64) -> Result<(i64, i64), OpError> {
    if dx.abs() > MAX_DELTA || dy.abs() > MAX_DELTA {
        return Err(OpError::invalid(format!(
            "|dx| and |dy| must be at most {MAX_DELTA}; nothing was sent"
        )));
    }
    let (sdx, sdy) = (
        (dx as f64 / scale).round() as i64,
        (dy as f64 / scale).round() as i64,
    );
    if sdx.abs() > MAX_DELTA || sdy.abs() > MAX_DELTA {
        return Err(OpError::invalid(format!(
            "({dx}, {dy}) at scale {scale} is ({sdx}, {sdy}) screen pixels, past {MAX_DELTA}; \
             nothing was sent"
        )));
    }
    Ok((sdx, sdy))
}

/// Splits a relative move into per-command steps of at most `step` on each axis.
pub fn rel_steps(dx: i64, dy: i64, step: i64) -> Vec<(i64, i64)> {
    let step = step.clamp(1, 127);
    let n = ((dx.abs().max(dy.abs()) + step - 1) / step).max(0);
    let mut out = Vec::with_capacity(n as usize);
    let (mut sx, mut sy) = (0i64, 0i64);
    for i in 1..=n {
        let tx = dx * i / n;
        let ty = dy * i / n;
        out.push((tx - sx, ty - sy));
        sx = tx;
        sy = ty;
    }
    out
}

/// The relative steps to send: far towards the `home` corner first (if asked), then the move.
/// The trip goes in the largest steps whatever `step` is: overshooting into a corner is
/// harmless, and each three steps cost a paced pause.
fn move_segments(home: Option<&str>, sdx: i64, sdy: i64, step: i64) -> [Vec<(i64, i64)>; 2] {
    let trip = home.map_or_else(Vec::new, |h| {
        let far = 4000;
        let (hx, hy) = match h {
            "top-left" => (-far, -far),
            "top-right" => (far, -far),
            "bottom-left" => (-far, far),
            _ => (far, far),
        };
        rel_steps(hx, hy, 120)
    });
    [trip, rel_steps(sdx, sdy, step)]
}

/// What a planned gesture sent, and where.
pub struct Gesture {
    /// The screen's size when the points were resolved.
    pub screen: (u32, u32),
    /// The points in screen pixels.
    pub points: Vec<Point>,
    /// QMP commands sent.
    pub commands: usize,
}

/// vm_drag and vm_scroll: resolves the points (of a screenshot at `scale`) against the
/// current screen size and sends the plan `make` builds from them. `tool` names the call for
/// a person's hold.
pub fn gesture(
    work: &dyn Work,
    (name, tool): (&str, &str),
    points: &[(i64, i64)],
    scale: f64,
    make: impl FnOnce(&[Point], (u32, u32)) -> Vec<Step>,
) -> Result<Gesture, OpError> {
    crate::ops::vm::hold::check_agent(name, tool)?;
    let rec = records::lookup_live(name, "launch it first")?;
    session::monitor(name, &rec, |q| {
        let (w, h) = screen_size(q, name)?;
        let mut pts = Vec::new();
        for &(x, y) in points {
            match screen_point(x, y, scale, w, h) {
                Some(p) => pts.push(p),
                None => return Err(outside(x, y, scale, w, h).into()),
            }
        }
        let plan = make(&pts, (w, h));
        let sent = input::run(q, &plan, rec.pid, work)?;
        if !sent.complete {
            return Err(OpError::cancelled("cancelled (buttons and keys released)").into());
        }
        Ok(Gesture {
            screen: (w, h),
            points: pts,
            commands: sent.commands,
        })
    })
}

/// vm_drag's request: the points as given (of a screenshot at `scale`), checked against the
/// screen when the gesture starts.
#[derive(Debug, Clone)]
pub struct DragRequest {
    /// The VM.
    pub name: String,
    /// Where the button goes down.
    pub from: (i64, i64),
    /// Where it comes up.
    pub to: (i64, i64),
    /// The screenshot's scale the points were read at.
    pub scale: f64,
    /// `left`, `right` or `middle`.
    pub button: String,
    /// Modifier keys held throughout.
    pub hold: Vec<&'static str>,
    /// Moves between press and release.
    pub steps: u32,
    /// The pause after each move.
    pub step_pause: Duration,
}

crate::described! {
    /// What vm_drag did.
    #[derive(Debug, Clone, Serialize)]
    pub struct Dragged {
        /// The VM.
        pub name: String,
        /// The screen pixel pressed on.
        pub from: [u32; 2],
        /// The screen pixel released on.
        pub to: [u32; 2],
        /// The button.
        pub button: String,
        /// The modifier keys held.
        pub hold: Vec<&'static str>,
        /// QMP commands sent.
        pub commands: usize,
        /// The screen's width then.
        pub screen_width: u32,
        /// The screen's height then.
        pub screen_height: u32,
    }
}

/// vm_drag: press at `from`, move in steps to `to`, release.
pub fn drag(work: &dyn Work, req: &DragRequest) -> Result<Dragged, OpError> {
    let sent = gesture(
        work,
        (&req.name, "vm_drag"),
        &[req.from, req.to],
        req.scale,
        |p, s| {
            super::pointer::drag_plan(
                p[0],
                p[1],
                s,
                &req.button,
                &req.hold,
                req.steps,
                req.step_pause,
            )
        },
    )?;
    Ok(Dragged {
        name: req.name.clone(),
        from: [sent.points[0].x, sent.points[0].y],
        to: [sent.points[1].x, sent.points[1].y],
        button: req.button.clone(),
        hold: req.hold.clone(),
        commands: sent.commands,
        screen_width: sent.screen.0,
        screen_height: sent.screen.1,
    })
}

/// vm_scroll's request.
#[derive(Debug, Clone)]
pub struct ScrollRequest {
    /// The VM.
    pub name: String,
    /// Where the wheel turns (of a screenshot at `scale`).
    pub at: (i64, i64),
    /// The screenshot's scale the point was read at.
    pub scale: f64,
    /// Which way.
    pub direction: super::pointer::Wheel,
    /// Notches.
    pub clicks: u32,
    /// Modifier keys held throughout.
    pub hold: Vec<&'static str>,
}

crate::described! {
    /// What vm_scroll did.
    #[derive(Debug, Clone, Serialize)]
    pub struct Scrolled {
        /// The VM.
        pub name: String,
        /// The screen pixel scrolled at.
        pub at: [u32; 2],
        /// `up` or `down`.
        pub direction: &'static str,
        /// Notches turned.
        pub clicks: u32,
        /// The modifier keys held.
        pub hold: Vec<&'static str>,
        /// The screen's width then.
        pub screen_width: u32,
        /// The screen's height then.
        pub screen_height: u32,
    }
}

/// vm_scroll: `clicks` wheel notches at `at`.
pub fn scroll(work: &dyn Work, req: &ScrollRequest) -> Result<Scrolled, OpError> {
    let sent = gesture(
        work,
        (&req.name, "vm_scroll"),
        &[req.at],
        req.scale,
        |p, s| super::pointer::scroll_plan(p[0], s, req.direction, req.clicks, &req.hold),
    )?;
    Ok(Scrolled {
        name: req.name.clone(),
        at: [sent.points[0].x, sent.points[0].y],
        direction: match req.direction {
            super::pointer::Wheel::Up => "up",
            super::pointer::Wheel::Down => "down",
        },
        clicks: req.clicks,
        hold: req.hold.clone(),
        screen_width: sent.screen.0,
        screen_height: sent.screen.1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_steps_sum_and_stay_small() {
        for (dx, dy, step) in [
            (1000, -333, 32),
            (-5, 7, 120),
            (0, 0, 10),
            (20000, 20000, 1),
        ] {
            let s = rel_steps(dx, dy, step);
            assert_eq!(s.iter().map(|p| p.0).sum::<i64>(), dx);
            assert_eq!(s.iter().map(|p| p.1).sum::<i64>(), dy);
            assert!(s.iter().all(|p| p.0.abs() <= step && p.1.abs() <= step));
        }
    }

    #[test]
    fn a_point_outside_a_scaled_screenshot_is_refused_in_its_terms() {
        let s = 1568.0 / 1920.0;
        assert!(outside(1568, 0, s, 1920, 1080)
            .to_string()
            .contains("screenshot (scale"));
        assert!(outside(5000, 0, 1.0, 1920, 1080)
            .to_string()
            .contains("outside the 1920x1080 screen"));
    }

    #[test]
    fn screenshot_pixels_map_back_to_the_screen_pixels_under_them() {
        use super::super::pointer::to_screen;
        // 1920 screen pixels shown as 1568 (scale 0.8166): the edges map to the edges, and
        // every image pixel to the screen pixel under its centre.
        let (iw, _) = scaled_size(1920, 1080, 0.8166);
        assert_eq!(iw, 1568);
        assert_eq!(to_screen(0, iw, 1920), 0);
        assert_eq!(to_screen(1567, iw, 1920), 1919);
        assert_eq!(to_screen(784, iw, 1920), 960);
        for x in 0..1568 {
            let sx = to_screen(x, iw, 1920);
            let centre = (x as f64 + 0.5) * 1920.0 / 1568.0;
            assert!(
                sx as f64 <= centre && centre < (sx + 1) as f64,
                "{x} -> {sx}"
            );
        }
        // Full size: unchanged.
        assert_eq!(to_screen(719, 720, 720), 719);
    }

    #[test]
    fn screenshot_points_map_to_screen_pixels() {
        // A 1920x1080 screen shown at 1568 px wide.
        let s = 1568.0 / 1920.0;
        assert_eq!(
            screen_point(0, 0, s, 1920, 1080),
            Some(Point { x: 0, y: 0 })
        );
        assert_eq!(
            screen_point(784, 441, s, 1920, 1080),
            Some(Point { x: 960, y: 540 })
        );
        assert_eq!(screen_point(1568, 0, s, 1920, 1080), None);
        assert_eq!(screen_point(-1, 0, 1.0, 1280, 800), None);
        assert_eq!(
            screen_point(1279, 799, 1.0, 1280, 800),
            Some(Point { x: 1279, y: 799 })
        );
    }

    #[test]
    fn scales_to_qemu_range() {
        assert_eq!(abs_axis(0, 1024), 0);
        assert_eq!(abs_axis(1023, 1024), 32767);
        assert_eq!(abs_axis(512, 1025), 16383);
    }

    #[test]
    fn a_delta_past_the_bound_is_refused_before_and_after_scaling() {
        assert!(screen_delta(MAX_DELTA + 1, 0, 1.0).is_err());
        assert!(screen_delta(MAX_DELTA, 0, 0.5).is_err());
        assert_eq!(screen_delta(100, -50, 0.5).unwrap(), (200, -100));
    }
}
