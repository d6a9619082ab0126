//! Which accelerator can really run guests here. /dev/kvm existing is not enough: some hosts
//! expose a software KVM layer without hardware virtualization, where `-cpu host` aborts QEMU
//! and Linux guests hang.

/// Ok when KVM can run real guests; Err says why not.
pub fn kvm_usable() -> Result<(), String> {
    let dev = std::path::Path::new("/dev/kvm");
    if !dev.exists() {
        return Err("/dev/kvm does not exist".into());
    }
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dev)
        .is_err()
    {
        return Err("/dev/kvm is not readable and writable by this user".into());
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    if !has_hw_virt(&cpuinfo) {
        return Err("/dev/kvm exists but the CPU shows no hardware virtualization (no vmx/svm flag): a software KVM layer, under which guests hang; TCG is used instead".into());
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
