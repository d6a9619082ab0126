//! How much of the host a server may hand out: CPUs (the affinity mask, then a cgroup's
//! `cpu.max`), memory (MemTotal, then the smallest cgroup memory limit on its path: the VMs
//! mcqemu starts stay in its cgroup, so they must fit in its limit), and which host ports a non-root user may bind.

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

/// The memory limit this process's cgroups put on it, in MiB (None: no limit found).
pub fn cgroup_memory_max_mb() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_memory_limit_mb(Path::new("/sys/fs/cgroup"), &own)
}

/// The memory limit of the cgroups in `proc_cgroup` (the text of /proc/self/cgroup), with the
/// cgroup file systems mounted under `sysfs` (`/sys/fs/cgroup`), in MiB.
/// A limit anywhere on the path up to the root applies (a parent slice's included), so the
/// smallest is taken: cgroup v2's `memory.max` (under `sysfs`, or `sysfs/unified` on a hybrid
/// host) and cgroup v1's `memory.limit_in_bytes` (under `sysfs/memory`).
pub fn cgroup_memory_limit_mb(sysfs: &Path, proc_cgroup: &str) -> Option<u64> {
    let mut limits = Vec::new();
    if let Some(rel) = cgroup_v2_path(proc_cgroup) {
        for root in [sysfs.to_path_buf(), sysfs.join("unified")] {
            limits.extend(along_path(&root, rel, "memory.max"));
        }
    }
    if let Some(rel) = cgroup_v1_memory_path(proc_cgroup) {
        limits.extend(along_path(
            &sysfs.join("memory"),
            rel,
            "memory.limit_in_bytes",
        ));
    }
    limits.into_iter().min()
}

/// The limits (MiB) in `file` of the cgroup at `rel` under `root` and of each ancestor up to
/// `root` itself; a folder that is not there (a container sees only its own part of the tree)
/// or a file that says "max" counts as no limit.
fn along_path(root: &Path, rel: &str, file: &str) -> Vec<u64> {
    let mut dir = root.join(rel.trim_start_matches('/'));
    let mut out = Vec::new();
    loop {
        if let Some(mb) = std::fs::read_to_string(dir.join(file))
            .ok()
            .and_then(|t| memory_max_mb(&t))
        {
            out.push(mb);
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            return out;
        }
    }
}

/// The cgroup v1 memory controller's path in /proc/self/cgroup (its `N:...memory...:/path` line).
pub fn cgroup_v1_memory_path(text: &str) -> Option<&str> {
    text.lines().find_map(|l| {
        let mut it = l.splitn(3, ':');
        let (_, controllers, path) = (it.next()?, it.next()?, it.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path)
    })
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

/// Bytes at or above this are cgroup v1's "unlimited" (`PAGE_COUNTER_MAX` pages:
/// 9223372036854771712 with 4 KiB pages), never a real limit.
const V1_UNLIMITED: u64 = 1 << 62;

/// `memory.max` ("max" or bytes) or `memory.limit_in_bytes` in MiB.
pub fn memory_max_mb(text: &str) -> Option<u64> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|b| *b < V1_UNLIMITED)
        .map(|b| b >> 20)
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

    /// A fake `/sys/fs/cgroup` with `files` (path, content) written under it.
    fn fake_sysfs(name: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
        let root = std::env::temp_dir().join(format!("mcqemu-cg-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (path, text) in files {
            let p = root.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        root
    }

    #[test]
    fn a_parent_slice_limit_below_the_own_one_wins_on_cgroup_v2() {
        let root = fake_sysfs(
            "v2-nested",
            &[
                ("cgroup.controllers", "cpu memory\n"),
                ("user.slice/memory.max", "2147483648\n"),
                ("user.slice/app.scope/memory.max", "8589934592\n"),
            ],
        );
        let own = "0::/user.slice/app.scope\n";
        assert_eq!(cgroup_memory_limit_mb(&root, own), Some(2048));
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn max_all_the_way_up_is_no_limit_on_cgroup_v2() {
        let root = fake_sysfs(
            "v2-max",
            &[
                ("cgroup.controllers", "cpu memory\n"),
                ("user.slice/memory.max", "max\n"),
                ("user.slice/app.scope/memory.max", "max\n"),
            ],
        );
        let own = "0::/user.slice/app.scope\n";
        assert_eq!(cgroup_memory_limit_mb(&root, own), None);
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn reads_memory_limit_in_bytes_on_cgroup_v1() {
        let root = fake_sysfs(
            "v1-limit",
            &[
                ("memory/memory.limit_in_bytes", "9223372036854771712\n"),
                (
                    "memory/docker/memory.limit_in_bytes",
                    "9223372036854771712\n",
                ),
                ("memory/docker/abc/memory.limit_in_bytes", "1073741824\n"),
            ],
        );
        let own = "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n";
        assert_eq!(cgroup_memory_limit_mb(&root, own), Some(1024));
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn the_huge_v1_unlimited_value_is_no_limit() {
        // The path of the own cgroup is not visible in a container's mount: only its root is.
        let root = fake_sysfs(
            "v1-unlimited",
            &[("memory/memory.limit_in_bytes", "9223372036854771712\n")],
        );
        let own = "4:memory:/process_api/f80297c4\n0::/\n";
        assert_eq!(cgroup_memory_limit_mb(&root, own), None);
        std::fs::remove_dir_all(root).unwrap();
    }
}
