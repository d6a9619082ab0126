//! Which screens of a VM are one screen blinking, learned from the frames the live view's polls
//! grab, so that vm_view_frame sends no new image when only a cursor blinked (QEMU's VGA text
//! cursor alternates every ~270 ms, a desktop's text cursor at its own rate).
//!
//! Digests alone, as [`crate::ops::screen::watch`] decides for vm_screen_wait, but stricter,
//! since a pair taken for a blink hides a change from the person: two frames are a blink once
//! the screen went A B A B, the two inner phases each lasting a cursor's phase (100 ms to
//! 1.1 s). And a blink phase never lasts long: a frame shown for longer than [`LONGEST_PHASE`]
//! is a change even of a learned pair (a toggle taken for a blink heals within that time).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// How far back the alternation is looked for.
const SPAN_MS: u64 = 4000;
/// Bounds of one inner phase of a blink.
const PHASE_MS: (u64, u64) = (100, 1100);
/// A frame showing longer than this is no blink phase.
pub const LONGEST_PHASE: u64 = 1500;
/// Pairs kept per VM (the newest).
const MAX_PAIRS: usize = 8;
/// VMs whose pairs are kept (the least recently seen is forgotten).
const MAX_VMS: usize = 32;

/// One VM's screen history and the blink pairs learned from it.
#[derive(Debug, Default)]
pub struct Blinks {
    /// Runs of one frame: (when it was first seen, in ms, its digest), oldest first.
    runs: VecDeque<(u64, u64)>,
    /// Pairs of digests known to alternate, newest last.
    pairs: Vec<(u64, u64)>,
    /// When this VM was last observed (for forgetting the oldest VM).
    last_ms: u64,
}

impl Blinks {
    /// Takes the frame `digest` seen at `at_ms` (not before the previous one).
    pub fn observe(&mut self, at_ms: u64, digest: u64) {
        self.last_ms = at_ms;
        if self.runs.back().map(|r| r.1) != Some(digest) {
            self.runs.push_back((at_ms, digest));
        }
        while self.runs.len() > 5 || self.runs.front().is_some_and(|r| r.0 + SPAN_MS < at_ms) {
            self.runs.pop_front();
        }
        let n = self.runs.len();
        if n < 4 {
            return;
        }
        let r = |i: usize| self.runs[n - 4 + i];
        let (a, b) = (r(0).1, r(1).1);
        let alternates = r(2).1 == a && r(3).1 == b && a != b;
        let phases_ok = [r(2).0 - r(1).0, r(3).0 - r(2).0]
            .iter()
            .all(|d| (PHASE_MS.0..=PHASE_MS.1).contains(d));
        if alternates && phases_ok && !self.is_pair(a, b) {
            self.pairs.push((a, b));
            if self.pairs.len() > MAX_PAIRS {
                self.pairs.remove(0);
            }
        }
    }

    fn is_pair(&self, a: u64, b: u64) -> bool {
        self.pairs.iter().any(|p| *p == (a, b) || *p == (b, a))
    }

    /// Whether a view showing `shown` may keep it while the screen shows `now` (seen at
    /// `at_ms`): the same frame, or its blink partner within one phase's time.
    pub fn same_screen(&self, shown: u64, now: u64, at_ms: u64) -> bool {
        if shown == now {
            return true;
        }
        let showing_since = self
            .runs
            .back()
            .filter(|r| r.1 == now)
            .map_or(at_ms, |r| r.0);
        self.is_pair(shown, now) && at_ms.saturating_sub(showing_since) <= LONGEST_PHASE
    }
}

fn all() -> &'static Mutex<HashMap<String, Blinks>> {
    static ALL: std::sync::OnceLock<Mutex<HashMap<String, Blinks>>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Milliseconds on this process's monotonic clock.
fn now_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

/// Records VM `name`'s screen `digest` as seen now, and tells whether a view showing `shown`
/// may keep it (see [`Blinks::same_screen`]).
pub fn observe(name: &str, digest: u64, shown: Option<u64>) -> bool {
    let at = now_ms();
    let mut m = all().lock().unwrap_or_else(|p| p.into_inner());
    let b = m.entry(name.to_string()).or_default();
    b.observe(at, digest);
    let same = shown.is_some_and(|s| b.same_screen(s, digest, at));
    while m.len() > MAX_VMS {
        let oldest = m
            .iter()
            .min_by_key(|(_, b)| b.last_ms)
            .map(|(k, _)| k.clone());
        match oldest {
            Some(k) => m.remove(&k),
            None => break,
        };
    }
    same
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `digest` every 60 ms (the view's poll) from `from` to `to` ms.
    fn show(b: &mut Blinks, from: u64, to: u64, digest: u64) {
        let mut t = from;
        while t < to {
            b.observe(t, digest);
            t += 60;
        }
    }

    #[test]
    fn a_cursor_blinking_is_learned_after_two_returns_and_then_sends_nothing() {
        let mut b = Blinks::default();
        // A (cursor on) and B (off), 270 ms each.
        show(&mut b, 0, 270, 1);
        show(&mut b, 270, 540, 2);
        assert!(!b.same_screen(1, 2, 540), "one phase is no blink yet");
        show(&mut b, 540, 810, 1);
        show(&mut b, 810, 1080, 2);
        assert!(b.same_screen(1, 2, 1080) && b.same_screen(2, 1, 1080));
        // From then on, whichever phase the view shows, the other is the same screen.
        for i in 0..20 {
            let t = 1080 + i * 270;
            show(&mut b, t, t + 270, [1, 2][i as usize % 2]);
            assert!(b.same_screen(1, 2, t + 210) && b.same_screen(2, 1, t + 210));
        }
        // A new screen is a change at once.
        b.observe(6500, 3);
        assert!(!b.same_screen(1, 3, 6500) && !b.same_screen(2, 3, 6500));
    }

    #[test]
    fn a_toggle_taken_for_a_blink_shows_once_it_holds() {
        let mut b = Blinks::default();
        for (i, d) in [1, 2, 1, 2].iter().enumerate() {
            let t = i as u64 * 400;
            show(&mut b, t, t + 400, *d);
        }
        assert!(b.same_screen(1, 2, 1600));
        // The screen now stays on 2: past one phase's time it is a change for a view on 1.
        show(&mut b, 1600, 3400, 2);
        assert!(!b.same_screen(1, 2, 3400));
    }

    #[test]
    fn typing_then_undoing_is_no_blink() {
        // x typed (2), removed (1), typed again (2) quickly: three runs, not learned; and a
        // slow toggle (phases of 3 s) is never a blink.
        let mut b = Blinks::default();
        show(&mut b, 0, 500, 1);
        show(&mut b, 500, 560, 2);
        show(&mut b, 560, 620, 1);
        show(&mut b, 620, 700, 2);
        assert!(!b.same_screen(1, 2, 700));
        let mut slow = Blinks::default();
        for (i, d) in [1, 2, 1, 2].iter().enumerate() {
            let t = i as u64 * 3000;
            show(&mut slow, t, t + 3000, *d);
        }
        assert!(!slow.same_screen(1, 2, 12000));
    }
}
