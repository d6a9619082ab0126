//! Quotas on what agents may start: how many VMs run at once (`MCQEMU_MAX_VMS`, default 32),
//! how much memory they may claim together (`MCQEMU_MAX_MEMORY_MB`, default 75 % of the host's
//! MemTotal or of the server's cgroup memory limit, whichever is smaller), and at most as many vCPUs per VM as the host has CPUs. Checked while the name is
//! reserved under the registry lock, so concurrent launches cannot overshoot together.

use crate::ops::error::OpError;
use crate::qemu::sock;
use crate::qemu::vm::{self, Status};
use crate::state::registry::{Record, Vms};

/// Default most running VMs.
pub const DEFAULT_MAX_VMS: u64 = 32;

/// The limits in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most VMs running at once.
    pub max_vms: u64,
    /// Most memory (MiB) summed over running VMs.
    pub max_memory_mb: u64,
    /// Most vCPUs per VM.
    pub max_cpus: u64,
}

fn env_u64(key: &str) -> Option<u64> {
    std::env::var(key).ok().and_then(|v| v.trim().parse().ok())
}

impl Limits {
    /// The limits from the environment and the host probe.
    pub fn current() -> Limits {
        let host = crate::host::get();
        Limits {
            max_vms: env_u64("MCQEMU_MAX_VMS").unwrap_or(DEFAULT_MAX_VMS),
            max_memory_mb: env_u64("MCQEMU_MAX_MEMORY_MB")
                .unwrap_or_else(|| crate::host::decide::memory_limit_mb(host)),
            max_cpus: host.cpus,
        }
    }
}

/// True for a record whose QEMU is running or being launched (judged without QMP: a process
/// that is there counts, whatever its monitor says).
fn counts(rec: &Record) -> bool {
    match vm::measure_process(rec) {
        // No PID (attached without one): only a socket that answers tells.
        None if vm::pid(rec).is_none() => sock::is_listening(&vm::qmp_socket(rec)),
        None => true,
        Some(m) => m.status == Status::Starting,
    }
}

/// Checks that one more VM with `memory_mb` and `cpus` fits beside the running ones in `vms`
/// (the record named `name`, if any, is not counted: it is being replaced).
pub fn admit(
    vms: &Vms,
    name: &str,
    memory_mb: u64,
    cpus: u64,
    limits: Limits,
) -> Result<(), OpError> {
    admit_many(vms, name, 1, memory_mb, cpus, limits)
}

/// [`admit`] for `count` VMs alike at once (a fork's copies, checked before any starts).
pub fn admit_many(
    vms: &Vms,
    name: &str,
    count: u64,
    memory_mb: u64,
    cpus: u64,
    limits: Limits,
) -> Result<(), OpError> {
    if cpus > limits.max_cpus {
        return Err(OpError::refused(format!(
            "cpus={cpus} is more than this host's {} CPUs; ask for at most {}",
            limits.max_cpus, limits.max_cpus
        )));
    }
    let running: Vec<_> = vms
        .iter()
        .filter(|(n, r)| n.as_str() != name && counts(r))
        .collect();
    if running.len() as u64 + count > limits.max_vms {
        return Err(OpError::refused(format!(
            "{} VMs are running and {count} more would pass the most allowed \
             (MCQEMU_MAX_VMS={}); stop one with stop_vm or sandbox_destroy first, or ask the \
             operator to raise MCQEMU_MAX_VMS",
            running.len(),
            limits.max_vms
        )));
    }
    let used: u64 = running.iter().filter_map(|(_, r)| r.memory_mb()).sum();
    if used.saturating_add(memory_mb.saturating_mul(count)) > limits.max_memory_mb {
        let what = match count {
            1 => format!("memory_mb={memory_mb}"),
            n => format!("{n} VMs of memory_mb={memory_mb}"),
        };
        return Err(OpError::refused(format!(
            "{what} does not fit: running VMs already use {used} MiB of the \
             {} MiB allowed (MCQEMU_MAX_MEMORY_MB); ask for less, stop a VM, or ask the \
             operator to raise MCQEMU_MAX_MEMORY_MB",
            limits.max_memory_mb
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn live_record(memory_mb: u64) -> Record {
        // This process is alive; `source: attached` skips the QEMU identity check.
        serde_json::from_value(
            json!({"pid": std::process::id(), "source": "attached", "qmp_socket": "/nonexistent",
               "memory_mb": memory_mb}),
        )
        .unwrap_or_default()
    }

    #[test]
    fn counts_running_vms_and_their_memory() {
        let limits = Limits {
            max_vms: 2,
            max_memory_mb: 1000,
            max_cpus: 2,
        };
        let mut vms = Vms::new();
        vms.insert("a".into(), live_record(400));
        vms.insert(
            "dead".into(),
            serde_json::from_value(json!({"pid": null, "qmp_socket": "/x", "memory_mb": 5000}))
                .unwrap_or_default(),
        );
        assert!(admit(&vms, "new", 600, 2, limits).is_ok());
        let e = admit(&vms, "new", 601, 1, limits)
            .err()
            .map(|e| e.msg)
            .unwrap_or_default();
        assert!(e.contains("MCQEMU_MAX_MEMORY_MB"), "{e}");
        let e = admit(&vms, "new", 1, 3, limits)
            .err()
            .map(|e| e.msg)
            .unwrap_or_default();
        assert!(e.contains("CPUs"), "{e}");
        vms.insert("b".into(), live_record(1));
        let e = admit(&vms, "new", 1, 1, limits)
            .err()
            .map(|e| e.msg)
            .unwrap_or_default();
        assert!(e.contains("MCQEMU_MAX_VMS"), "{e}");
        // Relaunching a name does not count its old record.
        assert!(admit(&vms, "b", 1, 1, limits).is_ok());
    }

    #[test]
    fn a_forks_copies_are_admitted_together_or_not_at_all() {
        let limits = Limits {
            max_vms: 3,
            max_memory_mb: 1000,
            max_cpus: 2,
        };
        let mut vms = Vms::new();
        vms.insert("p".into(), live_record(200));
        assert!(admit_many(&vms, "c1", 2, 200, 1, limits).is_ok());
        let e = admit_many(&vms, "c1", 3, 200, 1, limits).unwrap_err();
        assert!(
            e.msg.contains("3 more") && e.msg.contains("MCQEMU_MAX_VMS"),
            "{e}"
        );
        let e = admit_many(&vms, "c1", 2, 500, 1, limits).unwrap_err();
        assert!(e.msg.contains("2 VMs of memory_mb=500"), "{e}");
    }
}
