//! How much CPU some threads of a process have had, and whether they all sleep, read from
//! `/proc`. Input pacing uses it to wait until a guest's vCPUs have really run after keys
//! were sent, not only until wall time has passed: on a loaded host a vCPU thread can wait
//! tens of milliseconds for a core, and keys sent meanwhile overflow the guest's 16-byte PS/2
//! queue and are lost (seen in CI: a batch of four characters vanished under a 10 ms pause).

use std::time::Duration;

/// Some threads of one process, such as QEMU's vCPU threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Threads {
    pid: u32,
    tids: Vec<u32>,
}

/// What [`Threads::sample`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// CPU time the threads have had in all, since they started.
    pub ran: Duration,
    /// Whether every thread sleeps now (none runs or waits for a core).
    pub asleep: bool,
}

impl Threads {
    /// Threads `tids` of process `pid` (duplicates dropped: a single-threaded TCG runs every
    /// vCPU on one thread).
    pub fn new(pid: u32, mut tids: Vec<u32>) -> Threads {
        tids.sort_unstable();
        tids.dedup();
        Threads { pid, tids }
    }

    /// Their run time and state now; None when there are no threads or one cannot be read
    /// (it ended, or `/proc` hides it): the caller then paces by wall time alone.
    pub fn sample(&self) -> Option<Sample> {
        if self.tids.is_empty() {
            return None;
        }
        let mut s = Sample {
            ran: Duration::ZERO,
            asleep: true,
        };
        for tid in &self.tids {
            let dir = format!("/proc/{}/task/{tid}", self.pid);
            let sched = std::fs::read_to_string(format!("{dir}/schedstat")).ok()?;
            let stat = std::fs::read_to_string(format!("{dir}/stat")).ok()?;
            s.ran += Duration::from_nanos(run_ns(&sched)?);
            s.asleep &= matches!(state(&stat)?, 'S' | 'D' | 'I');
        }
        Some(s)
    }
}

/// The first field of `schedstat`: nanoseconds spent on a CPU.
fn run_ns(schedstat: &str) -> Option<u64> {
    schedstat.split_whitespace().next()?.parse().ok()
}

/// The state letter of a `stat` line, which follows the command name in parentheses (a name
/// may hold spaces and parentheses itself, hence the last one).
fn state(stat: &str) -> Option<char> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().next()?.chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_run_time_and_state() {
        assert_eq!(run_ns("580888 0 1\n"), Some(580_888));
        assert_eq!(run_ns(""), None);
        assert_eq!(state("42 (CPU 0/TCG) S 1 2 3"), Some('S'));
        assert_eq!(state("42 (a) b) R 1"), Some('R'));
        assert_eq!(state("42 (x"), None);
    }

    #[test]
    fn this_thread_runs_and_a_missing_one_gives_nothing() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        let me = Threads::new(std::process::id(), vec![tid, tid]);
        assert_eq!(me.tids.len(), 1);
        let a = me.sample().expect("this thread is readable");
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_millis(30) {
            std::hint::black_box(0u64);
        }
        let b = me.sample().expect("this thread is readable");
        assert!(b.ran > a.ran, "{a:?} then {b:?}");
        assert!(!b.asleep, "a thread reading its own state runs");
        assert_eq!(Threads::new(std::process::id(), vec![]).sample(), None);
        assert_eq!(Threads::new(u32::MAX - 1, vec![1]).sample(), None);
    }
}
