//! The decisions taken from the host probe, as plain functions of a [`Host`] and a [`Qemu`],
//! so that every host mcqemu meets can be written down in a unit test: which accelerator and
//! CPU model a guest gets, which concrete machine type an alias means, default vCPUs, the
//! memory quota, the host ports a non-root server may forward, and whether a saved guest
//! state (a template) can load here.

use super::binaries::{parse_version, Qemu};
use super::Host;

use crate::kind::Failed;
pub use crate::state::config::Accel;

/// True when KVM on a host of `host_arch` can run a guest of `guest_arch`.
fn kvm_runs(host_arch: &str, guest_arch: &str) -> bool {
    host_arch == guest_arch || (host_arch == "x86_64" && guest_arch == "i386")
}

/// Ok when KVM can run a guest of `guest_arch` here; Err says why not (a reason, for the
/// callers' own messages).
pub fn kvm_for(host: &Host, guest_arch: &str) -> Result<(), String> {
    host.kvm.map_err(|e| e.to_string())?;
    if !kvm_runs(&host.arch, guest_arch) {
        return Err(format!(
            "KVM on this {} host runs only {} guests; a {guest_arch} guest is emulated (TCG)",
            host.arch, host.arch
        ));
    }
    Ok(())
}

/// The accelerator for a guest of `guest_arch`: `auto` takes KVM only where it can really run
/// that guest, with a note when it falls back. Err for `kvm` where it cannot, or an unknown name.
pub fn accel(
    host: &Host,
    guest_arch: &str,
    requested: &str,
) -> Result<(Accel, Option<String>), Failed> {
    match requested {
        "tcg" => Ok((Accel::Tcg, None)),
        "kvm" => kvm_for(host, guest_arch)
            .map(|()| (Accel::Kvm, None))
            .map_err(|why| {
                Failed::invalid(format!(
                    "accel=\"kvm\" is not usable here: {why}. Use accel=\"auto\" or \"tcg\""
                ))
            }),
        "auto" => Ok(match kvm_for(host, guest_arch) {
            Ok(()) => (Accel::Kvm, None),
            Err(why) => (
                Accel::Tcg,
                Some(format!("runs under TCG (emulated, slower): {why}")),
            ),
        }),
        other => Err(Failed::invalid(format!(
            "unknown accel {other:?}; use auto, kvm or tcg"
        ))),
    }
}

/// The CPU model: the host's own under KVM; under TCG `max`, every feature TCG emulates
/// (x86-64-v2 distributions such as RHEL 9 refuse the default `qemu64`). On aarch64 with
/// QEMU's own pointer-authentication algorithm instead of the architected QARMA, which TCG
/// computes slowly: measured, the test guest's boot to its agent takes 1.9 s instead of 5.6 s.
pub fn cpu_model(accel: Accel, guest_arch: &str) -> &'static str {
    match (accel, guest_arch) {
        (Accel::Kvm, _) => "host",
        (_, "aarch64") => "max,pauth-impdef=on",
        _ => "max",
    }
}

/// The CPU model of a template's guest: as [`cpu_model`], except that an x86_64 template under
/// KVM gets a named model in place of the host's own, so that its saved state loads on other
/// KVM hosts (template_push, template_pull): Nehalem's features (SSE4.2, POPCNT: the
/// x86-64-v2 level RHEL 9 needs) are on every x86_64 server CPU of the last fifteen years,
/// Intel's and AMD's; versioned, so no QEMU release changes what it means. Arm under KVM has
/// no named models (only `host`): its templates stay on hosts like their own.
pub const TRAVELLING_X86_CPU: &str = "Nehalem-v1";

/// See [`TRAVELLING_X86_CPU`].
pub fn template_cpu_model(accel: Accel, guest_arch: &str) -> &'static str {
    match (accel, guest_arch) {
        (Accel::Kvm, "x86_64") => TRAVELLING_X86_CPU,
        _ => cpu_model(accel, guest_arch),
    }
}

/// The concrete machine type `requested` means on this QEMU (`q35` → `pc-q35-7.2`), so that
/// what is recorded stays the same machine after the next QEMU upgrade.
pub fn concrete_machine(qemu: &Qemu, requested: &str) -> Result<String, Failed> {
    if qemu.machines.is_empty() {
        return Ok(requested.to_string());
    }
    if let Some(m) = qemu
        .machines
        .iter()
        .find(|m| m.name == requested || m.alias.as_deref() == Some(requested))
    {
        return Ok(m.name.clone());
    }
    let mut names: Vec<&str> = qemu
        .machines
        .iter()
        .flat_map(|m| m.alias.as_deref().into_iter().chain([m.name.as_str()]))
        .collect();
    names.truncate(24);
    Err(Failed::invalid(format!(
        "{} (QEMU {}) has no machine type {requested:?}; it has: {}",
        qemu.path.display(),
        qemu.version_string(),
        names.join(", ")
    )))
}

/// Default vCPUs: two, or one on a one-CPU host.
pub fn default_cpus(host: &Host) -> u64 {
    host.cpus.clamp(1, 2)
}

/// The memory all running VMs may claim together, in MiB: three quarters of the smaller of
/// MemTotal and the server's cgroup limit (its VMs run in its cgroup).
pub fn memory_limit_mb(host: &Host) -> u64 {
    let total = match (host.mem_total_mb, host.cgroup_memory_max_mb) {
        (Some(t), Some(c)) => t.min(c),
        (Some(t), None) => t,
        (None, Some(c)) => c,
        (None, None) => return u64::MAX,
    };
    total / 4 * 3
}

/// Ok when this server may have QEMU listen on host `port`.
pub fn host_port(host: &Host, port: u16) -> Result<(), Failed> {
    if host.root || port >= host.unprivileged_port_start {
        return Ok(());
    }
    Err(Failed::refused(format!(
        "host port {port} is privileged: this server does not run as root and ports below {} \
         need root (net.ipv4.ip_unprivileged_port_start); forward from a port of {} or more, or \
         \"auto\"",
        host.unprivileged_port_start, host.unprivileged_port_start
    )))
}

/// What a saved guest state was made with: a clone must start with exactly this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved<'a> {
    /// Guest architecture.
    pub arch: &'a str,
    /// Concrete machine type (an alias, for templates from before machine types were pinned).
    pub machine: &'a str,
    /// The accelerator it ran under.
    pub accel: Accel,
    /// The QEMU version that saved it (empty: not recorded).
    pub qemu_version: &'a str,
}

/// Ok when a state saved as `saved` can load into `qemu` on `host`; Err names what differs and
/// what to do.
pub fn can_restore(saved: &Saved, host: &Host, qemu: &Qemu) -> Result<(), Failed> {
    if saved.accel == Accel::Kvm {
        kvm_for(host, saved.arch).map_err(|why| {
            Failed::host(format!(
                "it was saved under KVM, which this host cannot use now ({why}); a KVM state does \
                 not load under TCG. Start it on a host with KVM, or make a new template here"
            ))
        })?;
    }
    if let Some(v) = parse_version(saved.qemu_version) {
        if v > qemu.version {
            return Err(Failed::host(format!(
                "it was saved by QEMU {}, and this host runs the older QEMU {} ({}); a saved state \
                 loads only into the same or a newer QEMU. Upgrade QEMU here, or make a new \
                 template with this one",
                saved.qemu_version,
                qemu.version_string(),
                qemu.path.display()
            )));
        }
    }
    // An alias (a template from before machine types were pinned) is taken as it is: on the
    // QEMU that saved it, it is the same machine.
    let offered = qemu
        .machines
        .iter()
        .any(|m| m.name == saved.machine || m.alias.as_deref() == Some(saved.machine));
    if !qemu.machines.is_empty() && !offered {
        return Err(Failed::host(format!(
            "it was saved with machine type {:?}, which QEMU {} ({}) does not offer; use the \
             QEMU that saved it, or make a new template here",
            saved.machine,
            qemu.version_string(),
            qemu.path.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::binaries::Machine;
    use super::super::kvm::KvmUnusable;
    use super::*;
    use std::path::PathBuf;

    fn x86_kvm() -> Host {
        Host {
            arch: "x86_64".into(),
            kvm: Ok(()),
            cpus: 8,
            mem_total_mb: Some(32768),
            cgroup_memory_max_mb: None,
            root: false,
            unprivileged_port_start: 1024,
        }
    }
    fn x86_tcg() -> Host {
        Host {
            kvm: Err(KvmUnusable::NoHardwareVirt),
            cpus: 2,
            root: true,
            ..x86_kvm()
        }
    }
    fn arm_kvm() -> Host {
        Host {
            arch: "aarch64".into(),
            ..x86_kvm()
        }
    }
    fn qemu(version: (u32, u32, u32), q35: &str, others: &[&str]) -> Qemu {
        let mut machines = vec![Machine {
            name: q35.into(),
            alias: Some("q35".into()),
        }];
        machines.extend(others.iter().map(|n| Machine {
            name: n.to_string(),
            alias: None,
        }));
        Qemu {
            path: PathBuf::from("/usr/bin/qemu-system-x86_64"),
            version,
            version_text: String::new(),
            machines,
        }
    }
    fn qemu72() -> Qemu {
        qemu((7, 2, 22), "pc-q35-7.2", &["pc-q35-7.1", "pc-q35-7.0"])
    }
    fn qemu100() -> Qemu {
        qemu(
            (10, 0, 2),
            "pc-q35-10.0",
            &["pc-q35-9.2", "pc-q35-7.2", "pc-q35-7.1"],
        )
    }
    fn rhel() -> Qemu {
        Qemu {
            path: PathBuf::from("/usr/libexec/qemu-kvm"),
            ..qemu((9, 0, 0), "pc-q35-rhel9.4.0", &["pc-q35-rhel9.2.0"])
        }
    }

    #[test]
    fn auto_takes_kvm_only_for_guests_of_the_hosts_architecture() {
        assert_eq!(
            accel(&x86_kvm(), "x86_64", "auto").unwrap(),
            (Accel::Kvm, None)
        );
        assert_eq!(
            accel(&x86_kvm(), "i386", "auto").unwrap(),
            (Accel::Kvm, None)
        );
        let (a, note) = accel(&x86_kvm(), "aarch64", "auto").unwrap();
        assert_eq!(a, Accel::Tcg);
        assert!(note.unwrap().contains("only x86_64 guests"));
        assert_eq!(
            accel(&arm_kvm(), "aarch64", "auto").unwrap(),
            (Accel::Kvm, None)
        );
        assert_eq!(accel(&arm_kvm(), "x86_64", "auto").unwrap().0, Accel::Tcg);
        let (a, note) = accel(&x86_tcg(), "x86_64", "auto").unwrap();
        assert_eq!(a, Accel::Tcg);
        assert!(note.unwrap().contains("vmx/svm"));
        assert!(accel(&x86_tcg(), "x86_64", "kvm")
            .unwrap_err()
            .msg
            .contains("not usable"));
        assert!(accel(&x86_kvm(), "aarch64", "kvm").is_err());
        assert!(accel(&x86_kvm(), "x86_64", "hvf").is_err());
        assert_eq!(cpu_model(Accel::Kvm, "x86_64"), "host");
        assert_eq!(cpu_model(Accel::Kvm, "aarch64"), "host");
        assert_eq!(template_cpu_model(Accel::Kvm, "x86_64"), "Nehalem-v1");
        assert_eq!(template_cpu_model(Accel::Kvm, "aarch64"), "host");
        assert_eq!(template_cpu_model(Accel::Tcg, "x86_64"), "max");
        assert_eq!(cpu_model(Accel::Tcg, "x86_64"), "max");
        assert_eq!(cpu_model(Accel::Tcg, "aarch64"), "max,pauth-impdef=on");
    }

    #[test]
    fn aliases_become_the_concrete_machine_of_each_qemu() {
        assert_eq!(concrete_machine(&qemu72(), "q35").unwrap(), "pc-q35-7.2");
        assert_eq!(concrete_machine(&qemu100(), "q35").unwrap(), "pc-q35-10.0");
        assert_eq!(
            concrete_machine(&qemu100(), "pc-q35-7.2").unwrap(),
            "pc-q35-7.2"
        );
        assert_eq!(
            concrete_machine(&rhel(), "q35").unwrap(),
            "pc-q35-rhel9.4.0"
        );
        let e = concrete_machine(&qemu72(), "pc-q35-10.0").unwrap_err();
        assert_eq!(e.kind, crate::kind::ErrorKind::InvalidArgument);
        assert!(
            e.msg.contains("no machine type") && e.msg.contains("pc-q35-7.2"),
            "{e}"
        );
    }

    #[test]
    fn cpus_memory_and_ports_follow_the_host() {
        assert_eq!(default_cpus(&x86_kvm()), 2);
        assert_eq!(
            default_cpus(&Host {
                cpus: 1,
                ..x86_kvm()
            }),
            1
        );
        assert_eq!(memory_limit_mb(&x86_kvm()), 24576);
        let limited = Host {
            cgroup_memory_max_mb: Some(4096),
            ..x86_kvm()
        };
        assert_eq!(memory_limit_mb(&limited), 3072);
        assert_eq!(
            host_port(&x86_kvm(), 80).unwrap_err().kind,
            crate::kind::ErrorKind::Refused
        );
        assert!(host_port(&x86_kvm(), 80)
            .unwrap_err()
            .msg
            .contains("privileged"));
        assert!(host_port(&x86_kvm(), 2222).is_ok());
        assert!(host_port(&x86_tcg(), 80).is_ok(), "root binds any port");
        let lowered = Host {
            unprivileged_port_start: 0,
            ..x86_kvm()
        };
        assert!(host_port(&lowered, 80).is_ok());
    }

    #[test]
    fn saved_states_load_forward_never_backward_and_never_kvm_into_tcg() {
        let from72 = Saved {
            arch: "x86_64",
            machine: "pc-q35-7.2",
            accel: Accel::Tcg,
            qemu_version: "7.2.22",
        };
        assert_eq!(can_restore(&from72, &x86_tcg(), &qemu72()), Ok(()));
        assert_eq!(can_restore(&from72, &x86_tcg(), &qemu100()), Ok(()));
        let from100 = Saved {
            machine: "pc-q35-10.0",
            qemu_version: "10.0.2",
            ..from72.clone()
        };
        let e = can_restore(&from100, &x86_tcg(), &qemu72()).unwrap_err();
        assert!(
            e.msg.contains("10.0.2") && e.msg.contains("older QEMU 7.2.22"),
            "{e}"
        );
        let kvm = Saved {
            accel: Accel::Kvm,
            ..from72.clone()
        };
        assert_eq!(can_restore(&kvm, &x86_kvm(), &qemu72()), Ok(()));
        let e = can_restore(&kvm, &x86_tcg(), &qemu72()).unwrap_err();
        assert!(e.msg.contains("saved under KVM"), "{e}");
        let legacy = Saved {
            machine: "q35",
            qemu_version: "",
            ..from72.clone()
        };
        assert_eq!(can_restore(&legacy, &x86_tcg(), &qemu72()), Ok(()));
        let rhel_saved = Saved {
            machine: "pc-q35-rhel9.4.0",
            qemu_version: "9.0.0",
            ..from72
        };
        assert!(can_restore(&rhel_saved, &x86_tcg(), &qemu100())
            .unwrap_err()
            .msg
            .contains("does not offer"));
    }
}
