//! What a VM uses, read where the facts already are: its QEMU process (/proc: CPU, RSS, Pss,
//! uptime), its disk files (allocated bytes), QEMU's block counters (bytes read and written,
//! when its monitor answers), its egress proxy's counter, and the guest's own /proc/meminfo
//! through its agent (vm_info only). Cheap enough for list_vms over 100 VMs: no QMP or agent
//! round trip of its own there.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::host::procstat;
use crate::qemu::vm;
use crate::state::record::Record;

crate::described! {
    /// A VM's use of the host (in this order; `null` where it cannot be known now).
    #[derive(Debug, Clone, Default, Serialize, PartialEq)]
    pub struct Metrics {
        /// QEMU's CPU use over the last interval, in % of one core (200 = two cores busy).
        pub cpu_pct: Option<f64>,
        /// The interval `cpu_pct` is over, in seconds (since the previous read, or since start).
        pub cpu_interval_s: Option<f64>,
        /// QEMU's resident memory.
        pub rss_bytes: Option<u64>,
        /// QEMU's proportional share of memory (shared pages divided among their users); vm_info
        /// and the metrics resource (a page-table walk, ~1 ms a GiB: list_vms leaves it out).
        pub pss_bytes: Option<u64>,
        /// The guest's own memory, as its /proc/meminfo says (vm_info, when its agent answers).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub guest_memory: Option<GuestMemory>,
        /// Bytes the VM's own disk files take on the host (an overlay: only what it wrote).
        pub disk_allocated_bytes: Option<u64>,
        /// Bytes the guest read from its disks (QEMU's counters).
        pub disk_read_bytes: Option<u64>,
        /// Bytes the guest wrote to its disks.
        pub disk_written_bytes: Option<u64>,
        /// Bytes through its egress proxy (only VMs with egress rules have one).
        pub net_bytes: Option<u64>,
        /// How long its QEMU has run, in seconds.
        pub uptime_s: Option<u64>,
    }
}

crate::described! {
    /// The guest's memory.
    #[derive(Debug, Clone, Serialize, PartialEq)]
    pub struct GuestMemory {
        /// MemTotal.
        pub total_bytes: u64,
        /// MemAvailable.
        pub available_bytes: u64,
        /// Total less available.
        pub used_bytes: u64,
    }
}

/// A CPU sample: when, and the process's CPU time then.
#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    cpu: Duration,
    pct: Option<(f64, f64)>,
}

/// The last CPU sample per QEMU PID, in this process.
fn samples() -> &'static Mutex<HashMap<(i32, u64), Sample>> {
    static S: OnceLock<Mutex<HashMap<(i32, u64), Sample>>> = OnceLock::new();
    S.get_or_init(Default::default)
}

/// Shortest interval a CPU % is measured over: a read sooner repeats the last one.
const MIN_INTERVAL: Duration = Duration::from_millis(250);

/// QEMU `pid`'s CPU % and the interval it is over: since this process's previous read of it,
/// or (the first read) since QEMU started.
pub fn cpu_pct(pid: i32) -> Option<(f64, f64)> {
    let t = procstat::cpu_times(pid)?;
    let now = Instant::now();
    let mut map = samples().lock().unwrap_or_else(|p| p.into_inner());
    if map.len() > 4096 {
        map.clear();
    }
    // Keyed by the process's start too: a PID used again is another process.
    let key = (pid, t.started_ticks);
    let prev = map.get(&key).copied();
    let pct = match prev {
        Some(p) if now.duration_since(p.at) < MIN_INTERVAL => return p.pct,
        Some(p) if t.cpu >= p.cpu => {
            let dt = now.duration_since(p.at).as_secs_f64();
            Some(((t.cpu - p.cpu).as_secs_f64() / dt * 100.0, dt))
        }
        _ => {
            let up = t.uptime.as_secs_f64();
            (up > 0.0).then(|| (t.cpu.as_secs_f64() / up * 100.0, up))
        }
    };
    let pct = pct.map(|(p, dt)| ((p * 10.0).round() / 10.0, (dt * 100.0).round() / 100.0));
    map.insert(
        key,
        Sample {
            at: now,
            cpu: t.cpu,
            pct,
        },
    );
    pct
}

/// Bytes the VM's own disk files take: its disks that live in its own state folder (an
/// overlay, a clone's disk), or all its disks when none does (a launched VM's image).
pub fn allocated(name: &str, rec: &Record) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let own = vm::state_dir(name);
    let disks = rec.disk_paths();
    let mine: Vec<_> = disks.iter().filter(|d| d.starts_with(&own)).collect();
    let pick = if mine.is_empty() {
        disks.iter().collect()
    } else {
        mine
    };
    let sizes: Vec<u64> = pick
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.blocks() * 512)
        .collect();
    (!sizes.is_empty()).then(|| sizes.iter().sum())
}

/// A VM's metrics from the host alone (no QMP, no agent): what list_vms shows (Pss aside,
/// [`with_pss`]). `io` is the block counters when a monitor session already asked them.
pub fn of(name: &str, rec: &Record, running: bool, io: Option<(u64, u64)>) -> Metrics {
    let pid = vm::pid(rec).filter(|_| running);
    let times = pid.and_then(procstat::cpu_times);
    let cpu = pid.and_then(cpu_pct);
    let net =
        crate::net::egress::stats::read(&vm::state_dir(name).join(crate::net::egress::stats::FILE))
            .map(|s| s.bytes);
    Metrics {
        cpu_pct: cpu.map(|c| c.0),
        cpu_interval_s: cpu.map(|c| c.1),
        rss_bytes: pid.and_then(procstat::rss_bytes),
        pss_bytes: None,
        guest_memory: None,
        disk_allocated_bytes: allocated(name, rec),
        disk_read_bytes: io.map(|i| i.0),
        disk_written_bytes: io.map(|i| i.1),
        net_bytes: net.filter(|_| rec.egress.is_some()),
        uptime_s: times.map(|t| t.uptime.as_secs()),
    }
}

/// `m` with QEMU's Pss read too.
pub fn with_pss(mut m: Metrics, rec: &Record, running: bool) -> Metrics {
    m.pss_bytes = vm::pid(rec)
        .filter(|_| running)
        .and_then(procstat::pss_bytes);
    m
}

/// The guest's memory from the text of its /proc/meminfo.
pub fn guest_memory(meminfo: &str) -> Option<GuestMemory> {
    let total = procstat::kib_field(meminfo, "MemTotal:")? * 1024;
    let available = procstat::kib_field(meminfo, "MemAvailable:")? * 1024;
    Some(GuestMemory {
        total_bytes: total,
        available_bytes: available,
        used_bytes: total.saturating_sub(available),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_pct_follows_the_process() {
        let me = std::process::id() as i32;
        let first = cpu_pct(me).unwrap();
        assert!(first.1 > 0.0);
        // A read sooner than the shortest interval repeats the last.
        assert_eq!(cpu_pct(me), Some(first));
        let until = Instant::now() + Duration::from_millis(400);
        let mut x = 1u64;
        while Instant::now() < until {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let (pct, dt) = cpu_pct(me).unwrap();
        assert!(pct > 20.0, "a busy thread shows: {pct} over {dt}");
    }

    #[test]
    fn guest_memory_from_meminfo() {
        let m =
            guest_memory("MemTotal:  1000 kB\nMemFree: 10 kB\nMemAvailable:  250 kB\n").unwrap();
        assert_eq!((m.total_bytes, m.used_bytes), (1_024_000, 768_000));
        assert!(guest_memory("MemTotal: 1 kB\n").is_none());
    }
}
