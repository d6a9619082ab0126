//! How much of the host a server may hand out: CPUs (the affinity mask, then a cgroup's
//! `cpu.max`), memory (MemTotal, then a cgroup's `memory.max`: the VMs mcqemu starts stay in
//! its cgroup, so they must fit in its limit), and which host ports a non-root user may bind.

use std::path::Path;

/// CPUs this process may run on: its affinity mask, narrowed by a cgroup v2 `cpu.max` quota.
pub fn cpus() -> u64 {
    let online = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let quota = cgroup_file("cpu.max").and_then(|t| cpu_max_cpus(&t));
    quota.map_or(online, |q| q.min(online)).max(1)
}

/// MemTotal in MiB, from /proc/meminfo.
pub fn mem_total_mb() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024)
}

/// This process's cgroup v2 `memory.max` in MiB (None: no limit or no cgroup v2).
pub fn cgroup_memory_max_mb() -> Option<u64> {
    cgroup_file("memory.max").and_then(|t| memory_max_mb(&t))
}

/// The lowest port an unprivileged process may bind
/// (`net.ipv4.ip_unprivileged_port_start`, 1024 unless lowered).
pub fn unprivileged_port_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(1024)
}

/// Reads a file of this process's own cgroup v2 folder.
fn cgroup_file(name: &str) -> Option<String> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = cgroup_v2_path(&own)?;
    let path = Path::new("/sys/fs/cgroup")
        .join(rel.trim_start_matches('/'))
        .join(name);
    std::fs::read_to_string(path).ok()
}

/// The cgroup v2 path in /proc/self/cgroup (its `0::/path` line).
pub fn cgroup_v2_path(text: &str) -> Option<&str> {
    text.lines().find_map(|l| l.strip_prefix("0::"))
}

/// `memory.max` ("max" or bytes) in MiB.
pub fn memory_max_mb(text: &str) -> Option<u64> {
    text.trim().parse::<u64>().ok().map(|b| b >> 20)
}

/// `cpu.max` ("max 100000" or "QUOTA PERIOD") as whole CPUs, at least one.
pub fn cpu_max_cpus(text: &str) -> Option<u64> {
    let mut it = text.split_whitespace();
    let quota: u64 = it.next()?.parse().ok()?;
    let period: u64 = it.next()?.parse().ok()?;
    (period > 0).then(|| (quota / period).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cgroup_v2_limits() {
        assert_eq!(
            cgroup_v2_path("0::/user.slice/user-1000.slice/session-3.scope\n"),
            Some("/user.slice/user-1000.slice/session-3.scope")
        );
        assert_eq!(cgroup_v2_path("12:memory:/x\n"), None);
        assert_eq!(memory_max_mb("max\n"), None);
        assert_eq!(memory_max_mb("4294967296\n"), Some(4096));
        assert_eq!(cpu_max_cpus("max 100000\n"), None);
        assert_eq!(cpu_max_cpus("200000 100000\n"), Some(2));
        assert_eq!(cpu_max_cpus("50000 100000\n"), Some(1));
    }
}
