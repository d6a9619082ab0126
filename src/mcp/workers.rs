//! Tool calls run on worker threads: at most [`MAX_WORKERS`] at once, and calls beyond that
//! wait their turn in a bounded FIFO queue instead of being refused. A worker that finishes a
//! call takes the next queued one, so a burst of calls is served in order with no spurious
//! errors; a queued call that is cancelled is taken out and never runs.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Most tool calls running at once.
pub const MAX_WORKERS: usize = 16;
/// Most tool calls waiting for a worker; past that a call is refused with a tool error.
pub const MAX_QUEUED: usize = 1024;

/// One call to run: `key` identifies it for cancellation, `run` does all of it (the tool,
/// the reply, the bookkeeping).
pub struct Job {
    /// The request id as text (the server's in-flight key).
    pub key: String,
    /// The tool's name, for the thread's name.
    pub name: String,
    /// The call itself.
    pub run: Box<dyn FnOnce() + Send>,
}

/// Why a call was not taken.
#[derive(Debug)]
pub enum Refused {
    /// The queue is full.
    QueueFull,
    /// No worker thread could be started (the process is out of threads).
    Spawn(std::io::Error),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::QueueFull => write!(
                f,
                "{MAX_WORKERS} tool calls are running and {MAX_QUEUED} more are waiting; wait \
                 for some to finish and retry"
            ),
            Refused::Spawn(e) => write!(f, "could not start a worker thread ({e}); retry shortly"),
        }
    }
}

impl std::error::Error for Refused {}

#[derive(Default)]
struct State {
    running: usize,
    queue: VecDeque<Job>,
}

/// The worker pool: threads are started on demand, up to [`MAX_WORKERS`].
#[derive(Default)]
pub struct Workers {
    state: Mutex<State>,
}

impl Workers {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `job` now on a new worker, or queues it when all workers are busy.
    pub fn submit(self: &Arc<Self>, job: Job) -> Result<(), Refused> {
        let mut st = self.lock();
        if st.running >= MAX_WORKERS {
            if st.queue.len() >= MAX_QUEUED {
                return Err(Refused::QueueFull);
            }
            st.queue.push_back(job);
            return Ok(());
        }
        st.running += 1;
        drop(st);
        let pool = Arc::clone(self);
        let name = format!("tool-{}", job.name);
        std::thread::Builder::new()
            .name(name)
            .spawn(move || pool.work(job))
            .map(|_| ())
            .map_err(|e| {
                self.lock().running -= 1;
                Refused::Spawn(e)
            })
    }

    /// Runs `job`, then every queued job in turn until the queue is empty.
    fn work(&self, first: Job) {
        let mut job = first;
        loop {
            (job.run)();
            let mut st = self.lock();
            match st.queue.pop_front() {
                Some(next) => job = next,
                None => {
                    st.running -= 1;
                    return;
                }
            }
        }
    }

    /// Takes a queued job out before it starts (it is dropped, never run): true when it was
    /// still waiting, false when it is running or unknown.
    pub fn cancel_queued(&self, key: &str) -> bool {
        let mut st = self.lock();
        let before = st.queue.len();
        st.queue.retain(|j| j.key != key);
        st.queue.len() != before
    }

    /// Calls running or waiting.
    pub fn busy(&self) -> usize {
        let st = self.lock();
        st.running + st.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    fn wait_idle(w: &Workers) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while w.busy() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(w.busy(), 0, "workers did not drain within 10 s");
    }

    #[test]
    fn calls_beyond_the_workers_queue_and_all_run_in_order() {
        let w = Arc::new(Workers::default());
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Arc::new(Mutex::new(release_rx));
        let order = Arc::new(Mutex::new(Vec::new()));
        // Fill every worker with a call that blocks until released.
        for i in 0..MAX_WORKERS {
            let rx = Arc::clone(&release_rx);
            let run = Box::new(move || {
                let _ = rx.lock().map(|r| r.recv_timeout(Duration::from_secs(10)));
            });
            assert!(w
                .submit(Job {
                    key: format!("b{i}"),
                    name: "block".into(),
                    run
                })
                .is_ok());
        }
        for i in 0..40 {
            let order = Arc::clone(&order);
            let run = Box::new(move || {
                if let Ok(mut o) = order.lock() {
                    o.push(i);
                }
            });
            assert!(w
                .submit(Job {
                    key: format!("q{i}"),
                    name: "q".into(),
                    run
                })
                .is_ok());
        }
        assert_eq!(w.busy(), MAX_WORKERS + 40);
        // A queued call cancelled before it starts never runs.
        assert!(w.cancel_queued("q7"));
        assert!(!w.cancel_queued("q7"));
        for _ in 0..MAX_WORKERS {
            let _ = release_tx.send(());
        }
        wait_idle(&w);
        let order = order.lock().map(|o| o.clone()).unwrap_or_default();
        assert_eq!(order.len(), 39, "{order:?}");
        assert!(!order.contains(&7));
    }

    #[test]
    fn a_full_queue_refuses_with_a_clear_error() {
        let w = Arc::new(Workers::default());
        let gate = Arc::new(Mutex::new(()));
        let held = gate.lock();
        let ran = Arc::new(AtomicUsize::new(0));
        let mut refused = 0;
        for i in 0..(MAX_WORKERS + MAX_QUEUED + 3) {
            let gate = Arc::clone(&gate);
            let ran = Arc::clone(&ran);
            let run = Box::new(move || {
                let _g = gate.lock();
                ran.fetch_add(1, Ordering::SeqCst);
            });
            match w.submit(Job {
                key: i.to_string(),
                name: "g".into(),
                run,
            }) {
                Ok(()) => {}
                Err(e) => {
                    assert!(e.to_string().contains("waiting"), "{e}");
                    refused += 1;
                }
            }
        }
        assert_eq!(refused, 3);
        drop(held);
        wait_idle(&w);
        assert_eq!(ran.load(Ordering::SeqCst), MAX_WORKERS + MAX_QUEUED);
    }
}
