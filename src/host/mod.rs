//! What this host can run, probed once per process: its architecture, whether KVM really runs
//! guests (and for which guest architectures), its CPUs and memory with cgroup limits, who the
//! server runs as; the QEMU emulators with their versions and machine types ([`binaries`],
//! asked through [`run`], the bounded run of any external program) and the SeaBIOS they load
//! ([`seabios`]). Launch, templates, clones, doctor and the quotas take their decisions from
//! here ([`decide`]), as functions of a [`Host`] that tests write by hand for hosts this
//! machine is not (x86 with KVM, aarch64, RHEL paths, QEMU 7.2 and 10.0).

pub mod agent;
pub mod alloc;
pub mod binaries;
pub mod cpio;
pub mod deb;
pub mod decide;
pub mod kmod;
pub mod kmod_index;
pub mod kvm;
pub mod limits;
pub mod procstat;
pub mod run;
pub mod seabios;
pub mod tcp_diag;
pub mod threads;
pub mod vmlinux;

use std::sync::OnceLock;

/// The host as the probe saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Its architecture, as QEMU names guest architectures (`x86_64`, `aarch64`, `i386`).
    pub arch: String,
    /// Whether KVM can run guests of the host's architecture.
    pub kvm: Result<(), kvm::KvmUnusable>,
    /// CPUs this server may use.
    pub cpus: u64,
    /// MemTotal in MiB.
    pub mem_total_mb: Option<u64>,
    /// The smallest cgroup memory limit on the server's cgroup path (v2 or v1), in MiB.
    pub cgroup_memory_max_mb: Option<u64>,
    /// Whether the server runs as root.
    pub root: bool,
    /// The lowest port a non-root process may bind.
    pub unprivileged_port_start: u16,
}

/// The host's architecture in QEMU's words.
pub fn arch_name(rust_arch: &str) -> &str {
    match rust_arch {
        "x86" => "i386",
        "powerpc64" => "ppc64",
        other => other,
    }
}

impl Host {
    /// Probes this host (about a millisecond: files in /proc and /sys, one ioctl).
    pub fn probe() -> Host {
        let arch = arch_name(std::env::consts::ARCH).to_string();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        Host {
            kvm: kvm::judge(kvm::probe_device(), &arch, &cpuinfo),
            arch,
            cpus: limits::cpus(),
            mem_total_mb: limits::mem_total_mb(),
            cgroup_memory_max_mb: limits::cgroup_memory_max_mb(),
            // SAFETY: geteuid has no preconditions and cannot fail.
            root: unsafe { libc::geteuid() } == 0,
            unprivileged_port_start: limits::unprivileged_port_start(),
        }
    }
}

/// This host, probed at the first call.
pub fn get() -> &'static Host {
    static HOST: OnceLock<Host> = OnceLock::new();
    HOST.get_or_init(Host::probe)
}
