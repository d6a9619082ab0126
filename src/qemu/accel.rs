//! Which accelerator can really run guests here. /dev/kvm existing is not enough: some hosts
//! expose a software KVM layer without hardware virtualization, where `-cpu host` aborts QEMU
//! and Linux guests hang.

/// Why KVM cannot run real guests here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvmUnusable {
    /// There is no /dev/kvm.
    NoDevice,
    /// /dev/kvm cannot be opened for reading and writing.
    NoAccess,
    /// /dev/kvm exists but the CPU has no vmx/svm flag: a software KVM layer.
    NoHardwareVirt,
}

impl std::fmt::Display for KvmUnusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvmUnusable::NoDevice => "/dev/kvm does not exist",
            KvmUnusable::NoAccess => "/dev/kvm is not readable and writable by this user",
            KvmUnusable::NoHardwareVirt => {
                "/dev/kvm exists but the CPU shows no hardware virtualization (no vmx/svm flag): \
                 a software KVM layer, under which guests hang; TCG is used instead"
            }
        })
    }
}

impl std::error::Error for KvmUnusable {}

/// Ok when KVM can run real guests; Err says why not.
pub fn kvm_usable() -> Result<(), KvmUnusable> {
    let dev = std::path::Path::new("/dev/kvm");
    if !dev.exists() {
        return Err(KvmUnusable::NoDevice);
    }
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dev)
        .is_err()
    {
        return Err(KvmUnusable::NoAccess);
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    if !has_hw_virt(&cpuinfo) {
        return Err(KvmUnusable::NoHardwareVirt);
    }
    Ok(())
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
}
