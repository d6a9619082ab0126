//! When a watched screen has changed and settled, decided from frame digests alone (no clock,
//! no QEMU: the unit tests feed it sequences).
//!
//! A screen that "holds still" may still blink: QEMU draws VGA text mode's cursor in its
//! screendumps (a phase every ~270 ms), and Linux's framebuffer console blinks its own. So
//! a screen is settled when, over the stable time, it showed one frame, or alternated
//! between two (at least one return: A B A), and the baseline is the set of frames the last
//! returned screen cycled through. A settled set that still holds a baseline frame is the
//! baseline blinking, not a change: it joins the baseline and the wait goes on.

use std::collections::VecDeque;

/// Least time over which an alternation of two frames is looked for: a VGA cursor phase
/// is ~270 ms, so this sees at least two returns whatever the stable time.
pub const BLINK_SPAN_MS: u64 = 1200;

/// What one more frame tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No frame unlike the baseline since the last settled state.
    Same,
    /// The screen differs from the baseline and has not held still yet.
    Moving,
    /// The screen changed and has held still: the digests it now shows (one, or the two it
    /// alternates between), the latest first.
    Settled(Vec<u64>),
}

/// The watch over one wait.
#[derive(Debug)]
pub struct Watch {
    baseline: Vec<u64>,
    stable_ms: u64,
    /// (time in ms, digest), oldest first: the frames of the last span, and the one before.
    seen: VecDeque<(u64, u64)>,
    moved: bool,
}

impl Watch {
    /// A watch for a change from `baseline` (empty: the first frame observed is the baseline)
    /// that must then hold still for `stable_ms`.
    pub fn new(baseline: Vec<u64>, stable_ms: u64) -> Watch {
        Watch {
            baseline,
            stable_ms,
            seen: VecDeque::new(),
            moved: false,
        }
    }

    /// Whether a frame unlike the baseline was seen since the last settled state.
    pub fn moved(&self) -> bool {
        self.moved
    }

    /// The baseline digests (grown by any blink of the baseline seen).
    pub fn baseline(&self) -> &[u64] {
        &self.baseline
    }

    /// Takes the frame with digest `digest` seen at `at_ms` (not before the previous one).
    pub fn observe(&mut self, at_ms: u64, digest: u64) -> Verdict {
        if self.baseline.is_empty() {
            self.baseline.push(digest);
        }
        self.seen.push_back((at_ms, digest));
        self.trim(at_ms);
        if !self.moved && self.baseline.contains(&digest) {
            return Verdict::Same;
        }
        self.moved = true;
        let Some(set) = self.settled(at_ms) else {
            return Verdict::Moving;
        };
        if set.iter().any(|d| self.baseline.contains(d)) {
            // The baseline's own blink (or a change undone): part of the baseline from now on.
            for d in set {
                if !self.baseline.contains(&d) {
                    self.baseline.push(d);
                }
            }
            self.moved = false;
            return Verdict::Same;
        }
        Verdict::Settled(set)
    }

    /// Drops frames older than the span looked at, keeping the one before it (the screen
    /// as the span began).
    fn trim(&mut self, now: u64) {
        let from = now.saturating_sub(self.stable_ms.max(BLINK_SPAN_MS));
        while self.seen.len() > 1 && self.seen[1].0 <= from {
            self.seen.pop_front();
        }
    }

    /// The digests the screen settled on at `now`: one frame since `now - stable_ms`, or two
    /// alternating (a return included) since then or longer.
    fn settled(&self, now: u64) -> Option<Vec<u64>> {
        let latest = self.seen.back()?.1;
        if self
            .since(now.checked_sub(self.stable_ms)?)?
            .iter()
            .all(|d| *d == latest)
        {
            return Some(vec![latest]);
        }
        // Two alternating: the newest frames that are all `latest` or the one before it,
        // covering the stable time, with a return (A B A).
        let other = self
            .seen
            .iter()
            .rev()
            .map(|(_, d)| *d)
            .find(|d| *d != latest)?;
        let tail = self
            .seen
            .iter()
            .rev()
            .take_while(|(_, d)| *d == latest || *d == other);
        let (mut runs, mut last, mut start) = (0, None, u64::MAX);
        for (t, d) in tail {
            if last != Some(*d) {
                runs += 1;
                last = Some(*d);
            }
            start = *t;
        }
        let covered = now
            .checked_sub(self.stable_ms)
            .is_some_and(|from| start <= from);
        (covered && runs >= 3).then(|| vec![latest, other])
    }

    /// The digests shown from `from` on: the frame showing at `from` and every later one;
    /// `None` when nothing was observed at or before `from` (too early to tell).
    fn since(&self, from: u64) -> Option<Vec<u64>> {
        let first = self.seen.iter().rposition(|(t, _)| *t <= from)?;
        Some(self.seen.iter().skip(first).map(|(_, d)| *d).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `frames` (digests) one every `step` ms from 0; returns the first `Settled`
    /// verdict with its time, or the last verdict.
    fn feed(w: &mut Watch, step: u64, frames: &[u64]) -> (u64, Verdict) {
        feed_from(w, 0, step, frames)
    }

    /// [`feed`] from `start` ms.
    fn feed_from(w: &mut Watch, start: u64, step: u64, frames: &[u64]) -> (u64, Verdict) {
        let mut last = (0, Verdict::Same);
        for (i, d) in frames.iter().enumerate() {
            let t = start + i as u64 * step;
            let v = w.observe(t, *d);
            if matches!(v, Verdict::Settled(_)) {
                return (t, v);
            }
            last = (t, v);
        }
        last
    }

    #[test]
    fn an_unchanged_screen_never_settles_and_a_change_settles_after_the_stable_time() {
        let mut w = Watch::new(vec![1], 500);
        assert_eq!(feed(&mut w, 100, &[1; 30]).1, Verdict::Same);
        assert!(!w.moved());
        // Changed at 1000 ms: settled once it has shown 2 for 500 ms.
        let mut w = Watch::new(vec![1], 500);
        let frames: Vec<u64> = (0..40).map(|i| if i < 10 { 1 } else { 2 }).collect();
        assert_eq!(
            feed(&mut w, 100, &frames),
            (1500, Verdict::Settled(vec![2]))
        );
    }

    #[test]
    fn a_screen_still_drawing_is_moving_until_it_holds_still() {
        // A progress bar: a new frame every 300 ms for 3 s, then still.
        let frames: Vec<u64> = (0..60).map(|i| 10 + (i / 3).min(10)).collect();
        let mut w = Watch::new(vec![1], 500);
        let (t, v) = feed(&mut w, 100, &frames);
        assert_eq!(v, Verdict::Settled(vec![20]));
        assert_eq!(t, 3500, "settles 500 ms after the last change (3000 ms)");
    }

    #[test]
    fn a_blinking_cursor_is_still_and_the_baselines_blink_is_no_change() {
        // The baseline blinks between 1 and 2 (a cursor phase every 300 ms); only 1 was known.
        let blink: Vec<u64> = (0..40)
            .map(|i| if (i / 3) % 2 == 0 { 1 } else { 2 })
            .collect();
        let mut w = Watch::new(vec![1], 500);
        assert_ne!(
            feed(&mut w, 100, &blink).1,
            Verdict::Settled(vec![2, 1]),
            "the baseline's blink is not a change"
        );
        assert!(w.baseline().contains(&2), "{:?}", w.baseline());
        // Then a new screen that blinks too (5/6): settled on both of its phases.
        let next: Vec<u64> = (0..40)
            .map(|i| if (i / 3) % 2 == 0 { 5 } else { 6 })
            .collect();
        match feed_from(&mut w, 4000, 100, &next).1 {
            Verdict::Settled(mut set) => {
                set.sort();
                assert_eq!(set, vec![5, 6]);
            }
            v => panic!("a blinking new screen must settle: {v:?}"),
        }
    }

    #[test]
    fn a_change_undone_is_no_change_and_one_step_between_two_frames_is_not_a_blink() {
        // 1 -> 7 for 200 ms -> 1: a flash that went away.
        let mut frames = vec![1; 10];
        frames.extend([7, 7]);
        frames.extend([1; 30]);
        let mut w = Watch::new(vec![1], 500);
        assert_eq!(feed(&mut w, 100, &frames).1, Verdict::Same);
        // 3 -> 4 once (A B, no return) within the span: not settled until 3 is out of it.
        let mut w = Watch::new(vec![1], 1000);
        let frames: Vec<u64> = (0..40).map(|i| if i < 5 { 3 } else { 4 }).collect();
        let (t, v) = feed(&mut w, 100, &frames);
        assert_eq!(v, Verdict::Settled(vec![4]));
        assert_eq!(t, 1500);
    }

    #[test]
    fn without_a_baseline_the_first_frame_is_the_baseline() {
        let mut w = Watch::new(Vec::new(), 300);
        let frames: Vec<u64> = (0..20).map(|i| if i < 5 { 8 } else { 9 }).collect();
        assert_eq!(feed(&mut w, 100, &frames), (800, Verdict::Settled(vec![9])));
        assert_eq!(w.baseline(), &[8]);
    }

    #[test]
    fn slow_polls_still_settle_once_a_frame_spans_the_stable_time() {
        // A capture every 700 ms (a loaded host), stable time 500 ms.
        let mut w = Watch::new(vec![1], 500);
        assert_eq!(w.observe(0, 1), Verdict::Same);
        assert_eq!(w.observe(700, 2), Verdict::Moving);
        assert_eq!(w.observe(1400, 2), Verdict::Settled(vec![2]));
    }
}
