//! What the kernel says of a process and of the host, read from /proc: CPU time, memory
//! (RSS, Pss), start time, and the OOM killer's count. Each read is one small file; none
//! follows a path from a caller.

use std::time::Duration;

/// A process's CPU time and start, from `/proc/PID/stat`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuTimes {
    /// User and system time together.
    pub cpu: Duration,
    /// How long it has run.
    pub uptime: Duration,
    /// When it started, in clock ticks since boot (with the PID, names the process).
    pub started_ticks: u64,
}

/// Clock ticks per second (`_SC_CLK_TCK`).
fn ticks_per_s() -> f64 {
    // SAFETY: sysconf reads a constant.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// Seconds since boot (`/proc/uptime`).
fn host_uptime() -> Option<f64> {
    let t = std::fs::read_to_string("/proc/uptime").ok()?;
    t.split_whitespace().next()?.parse().ok()
}

/// The fields of `/proc/PID/stat` after the command (whose name may hold spaces and
/// parentheses): field 3 (state) is index 0.
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Process `pid`'s CPU time and how long it has run; None when it is gone.
pub fn cpu_times(pid: i32) -> Option<CpuTimes> {
    let f = stat_fields(pid)?;
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    // utime 14, stime 15, starttime 22 (1-based) are 11, 12, 19 here.
    let tps = ticks_per_s();
    let cpu = (n(11)? + n(12)?) / tps;
    let started = n(19)? / tps;
    let uptime = (host_uptime()? - started).max(0.0);
    Some(CpuTimes {
        cpu: Duration::from_secs_f64(cpu),
        uptime: Duration::from_secs_f64(uptime),
        started_ticks: f.get(19).and_then(|v| v.parse().ok()).unwrap_or(0),
    })
}

/// Process `pid`'s resident memory in bytes (`/proc/PID/statm`).
pub fn rss_bytes(pid: i32) -> Option<u64> {
    let t = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = t.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * page_size())
}

fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// Process `pid`'s proportional set size in bytes (`Pss:` of `/proc/PID/smaps_rollup`): its
/// own memory, with pages shared with other processes divided among them.
pub fn pss_bytes(pid: i32) -> Option<u64> {
    let t = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    kib_field(&t, "Pss:").map(|k| k * 1024)
}

/// A `Name:   N kB` line's N.
pub fn kib_field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(name))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// How many processes the kernel's OOM killer has killed since boot (`oom_kill` in
/// /proc/vmstat, Linux 4.13+).
pub fn oom_kills() -> Option<u64> {
    let t = std::fs::read_to_string("/proc/vmstat").ok()?;
    t.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_process() {
        let me = std::process::id() as i32;
        let t0 = cpu_times(me).unwrap();
        let mut x = 0u64;
        let until = std::time::Instant::now() + Duration::from_millis(60);
        while std::time::Instant::now() < until {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        let t1 = cpu_times(me).unwrap();
        assert!(t1.cpu > t0.cpu, "{t0:?} {t1:?}");
        assert!(rss_bytes(me).unwrap() > 1 << 20);
        let pss = pss_bytes(me).unwrap();
        assert!(pss > 0 && pss <= rss_bytes(me).unwrap() * 2);
        assert!(oom_kills().is_some());
        assert!(cpu_times(i32::MAX).is_none());
    }

    #[test]
    fn reads_kib_fields() {
        let t = "Rss:     100 kB\nPss:      42 kB\n";
        assert_eq!(kib_field(t, "Pss:"), Some(42));
        assert_eq!(kib_field(t, "Swap:"), None);
    }
}
