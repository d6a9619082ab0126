//! Progress notifications for one call: rate-limited, with a heartbeat while the call runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::protocol::notification;
use super::transport::Output;

/// Sends `notifications/progress` for a request that asked for it: at most twice in any second
/// as the client reads them ([`MIN_GAP`]; an update inside that gap waits, and the latest one goes out when it ends while the call
/// still runs), and at least every [`HEARTBEAT`] while the call runs, repeating what it last
/// said it waits for: hosts kill calls that stay silent, and no wait has to remember to
/// speak. A call that ends within its first gap says nothing, and no response ever
/// waits for a gap: Claude Code puts a token on every call. Progress values strictly
/// increase. The heartbeat thread ends with the call ([`Progress::finish`]), before its
/// response, so no notification follows the result.
pub struct Progress {
    inner: Arc<ProgressInner>,
    ticker: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

struct ProgressInner {
    token: Value,
    out: Arc<Output>,
    started: Instant,
    done: AtomicBool,
    /// Wakes the heartbeat thread at once when the call ends (its response must not wait).
    bell: (std::sync::Mutex<()>, std::sync::Condvar),
    state: std::sync::Mutex<ProgressState>,
}

#[derive(Default)]
struct ProgressState {
    /// The last value sent.
    value: Option<f64>,
    /// When the last notification went out.
    sent_at: Option<Instant>,
    /// What the call last said (repeated by the heartbeat).
    message: String,
    total: Option<f64>,
    /// An update that came inside the rate gap: (value, total, message).
    pending: Option<(f64, Option<f64>, String)>,
}

/// Least time between two progress notifications of one call. Above half a second: three
/// sent 500 ms apart arrive within one second once the pipe's jitter bunches them (a 25 s
/// stop_vm showed it), and at 600 ms a third is 1.2 s after the first.
pub const MIN_GAP: Duration = Duration::from_millis(600);
/// Longest silence while a call runs.
pub const HEARTBEAT: Duration = Duration::from_secs(5);

impl ProgressInner {
    /// Sends one notification; `said` is the call's own message (kept for the heartbeat to
    /// repeat), `shown` what this notification says (the heartbeat adds the time).
    fn emit(
        &self,
        st: &mut ProgressState,
        value: f64,
        total: Option<f64>,
        said: &str,
        shown: &str,
    ) {
        st.value = Some(value);
        st.sent_at = Some(Instant::now());
        st.total = total;
        if !said.is_empty() {
            st.message = said.to_string();
        }
        let mut params = json!({ "progressToken": self.token, "progress": value });
        if let Some(t) = total {
            params["total"] = json!(t);
        }
        let text = if shown.is_empty() { &st.message } else { shown };
        if !text.is_empty() {
            params["message"] = json!(text);
        }
        self.out
            .send(&notification("notifications/progress", params));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ProgressState> {
        match self.state.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        }
    }

    /// One tick: a pending update whose gap has passed, or a heartbeat after a silence.
    fn tick(&self) {
        let mut st = self.lock();
        let since = st.sent_at.unwrap_or(self.started).elapsed();
        if since < MIN_GAP {
            return;
        }
        if let Some((v, t, m)) = st.pending.take() {
            self.emit(&mut st, v, t, &m, "");
        } else if since >= HEARTBEAT {
            // Strictly above the last value, and well below the next whole step a wait reports.
            let v = st.value.map_or(0.0, |v| v + 1e-3);
            let what = if st.message.is_empty() {
                "working"
            } else {
                st.message.as_str()
            };
            let shown = format!(
                "{what} (still running after {} s)",
                self.started.elapsed().as_secs()
            );
            let total = st.total;
            self.emit(&mut st, v, total, "", &shown);
        }
    }
}

impl Progress {
    /// A reporter for the given progress token, with its heartbeat running.
    pub fn new(token: Value, out: Arc<Output>) -> Self {
        let inner = Arc::new(ProgressInner {
            token,
            out,
            started: Instant::now(),
            done: AtomicBool::new(false),
            bell: (std::sync::Mutex::new(()), std::sync::Condvar::new()),
            state: std::sync::Mutex::new(ProgressState::default()),
        });
        let beat = Arc::clone(&inner);
        let ticker = std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || {
                while !beat.done.load(Ordering::SeqCst) {
                    {
                        let guard = beat.bell.0.lock().unwrap_or_else(|p| p.into_inner());
                        if !beat.done.load(Ordering::SeqCst) {
                            let _ = beat.bell.1.wait_timeout(guard, Duration::from_millis(100));
                        }
                    }
                    if !beat.done.load(Ordering::SeqCst) {
                        beat.tick();
                    }
                }
            })
            .ok();
        Progress {
            inner,
            ticker: std::sync::Mutex::new(ticker),
        }
    }

    pub(super) fn send(&self, progress: f64, total: Option<f64>, message: &str) {
        self.send_with(progress, total, message, false);
    }

    /// As [`Progress::send`] for output the caller asked to see as it comes (a program's
    /// live lines): the first goes out at once instead of after the call's first gap;
    /// later ones keep the gap.
    pub(super) fn send_output(&self, progress: f64, total: Option<f64>, message: &str) {
        self.send_with(progress, total, message, true);
    }

    fn send_with(&self, progress: f64, total: Option<f64>, message: &str, first_at_once: bool) {
        let inner = &self.inner;
        let mut st = inner.lock();
        let floor = st
            .pending
            .as_ref()
            .map(|p| p.0)
            .or(st.value)
            .unwrap_or(f64::MIN);
        if progress <= floor {
            return;
        }
        // The gap runs from the call's start too: a call done within the gap says
        // nothing, and a long one speaks first after the gap.
        let recent = match st.sent_at {
            Some(at) => at.elapsed() < MIN_GAP,
            None => !first_at_once && inner.started.elapsed() < MIN_GAP,
        };
        if recent || inner.done.load(Ordering::SeqCst) {
            if !inner.done.load(Ordering::SeqCst) {
                st.pending = Some((progress, total, message.to_string()));
            }
            return;
        }
        st.pending = None;
        inner.emit(&mut st, progress, total, message, "");
    }

    /// The last value reported (pending included).
    pub(super) fn last(&self) -> f64 {
        let st = self.inner.lock();
        st.pending.as_ref().map(|p| p.0).or(st.value).unwrap_or(0.0)
    }

    /// Ends the heartbeat and sends a pending update: call before the call's response.
    pub fn finish(&self) {
        if self.inner.done.swap(true, Ordering::SeqCst) {
            return;
        }
        {
            let _guard = self.inner.bell.0.lock().unwrap_or_else(|p| p.into_inner());
            self.inner.bell.1.notify_all();
        }
        let handle = match self.ticker.lock() {
            Ok(mut t) => t.take(),
            Err(p) => p.into_inner().take(),
        };
        if let Some(h) = handle {
            let _ = h.join();
        }
        let mut st = self.inner.lock();
        if let Some((v, t, m)) = st.pending.take() {
            // The response never waits for the gap: an update whose gap has passed goes out
            // now, one still inside it (or inside a call's first gap) is dropped, since
            // the response that follows says more than it would.
            let at = st.sent_at.unwrap_or(self.inner.started);
            if at.elapsed() >= MIN_GAP {
                self.inner.emit(&mut st, v, t, &m, "");
            }
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A sink the test reads back: every line with the time it was written.
    #[derive(Clone, Default)]
    struct Lines(Arc<std::sync::Mutex<Vec<(Instant, Value)>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            for line in buf.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                if let Ok(v) = serde_json::from_slice(line) {
                    self.0.lock().unwrap().push((Instant::now(), v));
                }
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_silent_call_gets_a_heartbeat_and_a_chatty_one_at_most_two_a_second() {
        let lines = Lines::default();
        let out = Arc::new(Output::new(Box::new(lines.clone())));
        let start = Instant::now();
        let p = Progress::new(json!("t"), out);
        // 2 s of updates every 10 ms, then silence past the heartbeat.
        for i in 0..200 {
            p.send(i as f64, None, "copying");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(HEARTBEAT + Duration::from_millis(700));
        p.send(1000.0, Some(1000.0), "done");
        // Past any gap: the ticker sends it while the call still runs.
        std::thread::sleep(MIN_GAP + Duration::from_millis(200));
        p.finish();
        let seen = lines.0.lock().unwrap().clone();
        let times: Vec<Duration> = seen.iter().map(|(t, _)| *t - start).collect();
        assert!(seen.len() >= 5 && seen.len() <= 8, "{seen:?}");
        for w in times.windows(2) {
            assert!(
                w[1] - w[0] >= MIN_GAP - Duration::from_millis(20),
                "{times:?}"
            );
            assert!(
                w[1] - w[0] <= HEARTBEAT + Duration::from_millis(300),
                "{times:?}"
            );
        }
        let beat = seen
            .iter()
            .find(|(_, v)| {
                v["params"]["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("copying (still running after"))
            })
            .unwrap_or_else(|| panic!("no heartbeat: {seen:?}"));
        assert!(beat.1["params"]["progress"].as_f64().unwrap() > 199.0 - 1.0);
        let last = &seen.last().unwrap().1["params"];
        assert_eq!(last["progress"], json!(1000.0));
        assert_eq!(last["message"], json!("done"));
        let values: Vec<f64> = seen
            .iter()
            .map(|(_, v)| v["params"]["progress"].as_f64().unwrap())
            .collect();
        assert!(values.windows(2).all(|w| w[1] > w[0]), "{values:?}");
    }

    /// A reporter writing into a sink the test reads back.
    fn recorded() -> (Lines, Progress) {
        let lines = Lines::default();
        let out = Arc::new(Output::new(Box::new(lines.clone())));
        (lines, Progress::new(json!("t"), out))
    }

    #[test]
    fn followed_output_goes_out_at_once_then_keeps_the_gap() {
        let (lines, p) = recorded();
        let t0 = Instant::now();
        p.send_output(0.1, Some(30.0), "printed: line-1");
        p.send_output(0.2, Some(30.0), "printed: line-2");
        let first = lines.0.lock().unwrap().clone();
        assert_eq!(first.len(), 1, "{first:?}");
        assert!(first[0].0 - t0 < Duration::from_millis(50));
        assert_eq!(first[0].1["params"]["message"], json!("printed: line-1"));
        // The second waits for the gap (the ticker sends it), and nothing is lost.
        std::thread::sleep(MIN_GAP + Duration::from_millis(200));
        p.finish();
        let seen = lines.0.lock().unwrap().clone();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(seen[1].0 - seen[0].0 >= MIN_GAP - Duration::from_millis(20));
    }

    #[test]
    fn a_quick_call_says_nothing_and_no_response_waits_for_the_gap() {
        let (lines, p) = recorded();
        p.send(0.01, Some(30.0), "running");
        let t0 = Instant::now();
        p.finish();
        assert!(
            t0.elapsed() < Duration::from_millis(50),
            "{:?}",
            t0.elapsed()
        );
        assert!(
            lines.0.lock().unwrap().is_empty(),
            "a quick call sent progress"
        );

        // A long call whose last update comes inside the gap: dropped, not waited for.
        let (lines, p) = recorded();
        std::thread::sleep(MIN_GAP + Duration::from_millis(50));
        p.send(1.0, None, "first");
        p.send(2.0, None, "second");
        let t0 = Instant::now();
        p.finish();
        assert!(
            t0.elapsed() < Duration::from_millis(50),
            "{:?}",
            t0.elapsed()
        );
        let seen = lines.0.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].1["params"]["message"], json!("first"));
    }
}
