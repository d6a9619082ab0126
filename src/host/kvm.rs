//! Whether KVM can really run guests here. /dev/kvm existing is not enough: some x86 hosts
//! expose a software KVM layer without hardware virtualization, where `-cpu host` aborts QEMU
//! and Linux guests hang. On x86 the CPU's vmx/svm flag tells; on aarch64 hosts (no such flag)
//! a /dev/kvm that answers `KVM_GET_API_VERSION` does.

use std::path::Path;

/// Why KVM cannot run real guests here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvmUnusable {
    /// There is no /dev/kvm.
    NoDevice,
    /// /dev/kvm cannot be opened for reading and writing.
    NoAccess,
    /// /dev/kvm exists but the CPU has no vmx/svm flag: a software KVM layer.
    NoHardwareVirt,
    /// /dev/kvm opened but did not answer as KVM (API version 12) does.
    NotAnswering,
    /// KVM on this host architecture is not something mcqemu knows how to judge.
    UnknownArch,
}

impl std::fmt::Display for KvmUnusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvmUnusable::NoDevice => "/dev/kvm does not exist",
            KvmUnusable::NoAccess => {
                "/dev/kvm is not readable and writable by this user (add the user to the kvm \
                 group)"
            }
            KvmUnusable::NoHardwareVirt => {
                "/dev/kvm exists but the CPU shows no hardware virtualization (no vmx/svm flag): \
                 a software KVM layer, under which guests hang; TCG is used instead"
            }
            KvmUnusable::NotAnswering => "/dev/kvm did not answer KVM_GET_API_VERSION",
            KvmUnusable::UnknownArch => "KVM is only judged on x86_64, i686 and aarch64 hosts",
        })
    }
}

impl std::error::Error for KvmUnusable {}

/// What the probe saw of /dev/kvm, for [`judge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// No /dev/kvm.
    Missing,
    /// There, but not openable read-write.
    Denied,
    /// Opened; the API version it answered (None: the ioctl failed).
    Open(Option<i32>),
}

/// KVM's stable API version.
const KVM_API_VERSION: i32 = 12;

/// Probes /dev/kvm.
pub fn probe_device() -> Device {
    use std::os::unix::io::AsRawFd;
    let dev = Path::new("/dev/kvm");
    if !dev.exists() {
        return Device::Missing;
    }
    match std::fs::OpenOptions::new().read(true).write(true).open(dev) {
        Err(_) => Device::Denied,
        Ok(f) => {
            // KVM_GET_API_VERSION is _IO(0xAE, 0x00).
            // SAFETY: the fd is open for the whole call, and this ioctl takes no argument.
            let v = unsafe { libc::ioctl(f.as_raw_fd(), 0xAE00) };
            Device::Open((v >= 0).then_some(v))
        }
    }
}

/// Judges KVM from what was seen: the device, the host architecture, /proc/cpuinfo.
pub fn judge(device: Device, host_arch: &str, cpuinfo: &str) -> Result<(), KvmUnusable> {
    match device {
        Device::Missing => return Err(KvmUnusable::NoDevice),
        Device::Denied => return Err(KvmUnusable::NoAccess),
        Device::Open(v) if v != Some(KVM_API_VERSION) => return Err(KvmUnusable::NotAnswering),
        Device::Open(_) => {}
    }
    match host_arch {
        "x86_64" | "i386" if has_hw_virt(cpuinfo) => Ok(()),
        "x86_64" | "i386" => Err(KvmUnusable::NoHardwareVirt),
        "aarch64" => Ok(()),
        _ => Err(KvmUnusable::UnknownArch),
    }
}

/// True when a `flags` line of /proc/cpuinfo names vmx or svm.
pub fn has_hw_virt(cpuinfo: &str) -> bool {
    cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_flags() {
        assert!(has_hw_virt("flags\t\t: fpu vme vmx sse\n"));
        assert!(!has_hw_virt("flags\t\t: fpu vme sse hypervisor\n"));
        assert!(!has_hw_virt("model name: vmx\n"));
    }

    #[test]
    fn judges_x86_by_its_flags_and_aarch64_by_the_device() {
        let vmx = "flags\t\t: fpu vmx\n";
        let soft = "flags\t\t: fpu hypervisor\n";
        // aarch64 /proc/cpuinfo has "Features", never vmx/svm.
        let arm = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes\nCPU implementer\t: 0x41\n";
        let ok = Device::Open(Some(12));
        assert_eq!(judge(ok, "x86_64", vmx), Ok(()));
        assert_eq!(judge(ok, "x86_64", soft), Err(KvmUnusable::NoHardwareVirt));
        assert_eq!(judge(ok, "aarch64", arm), Ok(()));
        assert_eq!(
            judge(Device::Missing, "aarch64", arm),
            Err(KvmUnusable::NoDevice)
        );
        assert_eq!(
            judge(Device::Denied, "x86_64", vmx),
            Err(KvmUnusable::NoAccess)
        );
        assert_eq!(
            judge(Device::Open(None), "aarch64", arm),
            Err(KvmUnusable::NotAnswering)
        );
        assert_eq!(judge(ok, "riscv64", ""), Err(KvmUnusable::UnknownArch));
    }
}
