//! UEFI firmware discovery: QEMU's firmware descriptors (`/etc/qemu/firmware`,
//! `/usr/share/qemu/firmware`, in the order of their file names, as libvirt reads them), then
//! a table of the paths Debian/Ubuntu, Fedora, Arch and openSUSE install per architecture.
//! A descriptor is skipped only when mcqemu cannot run it as it is: it needs SMM (secure boot
//! builds), has keys enrolled (a guest's unsigned bootloader would be refused), or has no
//! variable-store template to copy. Its `format` (Fedora ships qcow2 firmware) goes to `-drive`.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// A UEFI firmware: the code image, the template for the per-VM variable store, their format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uefi {
    /// Read-only code.
    pub code: PathBuf,
    /// Variable store template, copied per VM.
    pub vars: PathBuf,
    /// `raw` or `qcow2`, for both files.
    pub format: String,
    /// Where it was found: a descriptor's path, or "distribution path".
    pub source: String,
}

/// (code, vars, format) triples at the paths distributions install them, most common first.
type Known = &'static [(&'static str, &'static str, &'static str)];

/// x86_64 UEFI builds.
const X86_64: Known = &[
    // Debian, Ubuntu
    (
        "/usr/share/OVMF/OVMF_CODE_4M.fd",
        "/usr/share/OVMF/OVMF_VARS_4M.fd",
        "raw",
    ),
    (
        "/usr/share/OVMF/OVMF_CODE.fd",
        "/usr/share/OVMF/OVMF_VARS.fd",
        "raw",
    ),
    // Fedora, RHEL
    (
        "/usr/share/edk2/ovmf/OVMF_CODE_4M.qcow2",
        "/usr/share/edk2/ovmf/OVMF_VARS_4M.qcow2",
        "qcow2",
    ),
    (
        "/usr/share/edk2/ovmf/OVMF_CODE.fd",
        "/usr/share/edk2/ovmf/OVMF_VARS.fd",
        "raw",
    ),
    // Arch
    (
        "/usr/share/edk2/x64/OVMF_CODE.4m.fd",
        "/usr/share/edk2/x64/OVMF_VARS.4m.fd",
        "raw",
    ),
    (
        "/usr/share/edk2-ovmf/x64/OVMF_CODE.fd",
        "/usr/share/edk2-ovmf/x64/OVMF_VARS.fd",
        "raw",
    ),
    // openSUSE
    (
        "/usr/share/qemu/ovmf-x86_64-code.bin",
        "/usr/share/qemu/ovmf-x86_64-vars.bin",
        "raw",
    ),
];

/// A 32-bit guest CPU cannot run x64 firmware: the ia32 builds.
const I386: Known = &[
    (
        "/usr/share/OVMF/OVMF32_CODE_4M.fd",
        "/usr/share/OVMF/OVMF32_VARS_4M.fd",
        "raw",
    ),
    (
        "/usr/share/edk2/ovmf-ia32/OVMF_CODE.fd",
        "/usr/share/edk2/ovmf-ia32/OVMF_VARS.fd",
        "raw",
    ),
    (
        "/usr/share/edk2/ia32/OVMF_CODE.fd",
        "/usr/share/edk2/ia32/OVMF_VARS.fd",
        "raw",
    ),
    (
        "/usr/share/qemu/ovmf-ia32-code.bin",
        "/usr/share/qemu/ovmf-ia32-vars.bin",
        "raw",
    ),
];

/// aarch64 UEFI builds.
const AARCH64: Known = &[
    (
        "/usr/share/AAVMF/AAVMF_CODE.fd",
        "/usr/share/AAVMF/AAVMF_VARS.fd",
        "raw",
    ),
    (
        "/usr/share/edk2/aarch64/QEMU_EFI-pflash.qcow2",
        "/usr/share/edk2/aarch64/vars-template-pflash.qcow2",
        "qcow2",
    ),
    (
        "/usr/share/edk2/aarch64/QEMU_EFI-pflash.raw",
        "/usr/share/edk2/aarch64/vars-template-pflash.raw",
        "raw",
    ),
    (
        "/usr/share/edk2/aarch64/QEMU_CODE.fd",
        "/usr/share/edk2/aarch64/QEMU_VARS.fd",
        "raw",
    ),
    (
        "/usr/share/qemu/aavmf-aarch64-code.bin",
        "/usr/share/qemu/aavmf-aarch64-vars.bin",
        "raw",
    ),
];

/// riscv64 UEFI builds.
const RISCV64: Known = &[
    (
        "/usr/share/qemu-efi-riscv64/RISCV_VIRT_CODE.fd",
        "/usr/share/qemu-efi-riscv64/RISCV_VIRT_VARS.fd",
        "raw",
    ),
    (
        "/usr/share/edk2/riscv/RISCV_VIRT_CODE.fd",
        "/usr/share/edk2/riscv/RISCV_VIRT_VARS.fd",
        "raw",
    ),
];

/// Known (code, vars, format) triples per architecture, most common first.
fn known_paths(arch: &str) -> Known {
    match arch {
        "x86_64" => X86_64,
        "i386" => I386,
        "aarch64" => AARCH64,
        "riscv64" => RISCV64,
        _ => &[],
    }
}

/// Matches a descriptor's machine glob (`pc-q35-*`) against a machine type.
fn glob(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            name.len() >= head.len() + tail.len() && name.starts_with(head) && name.ends_with(tail)
        }
    }
}

/// Picks a firmware for `arch` and `machine` from one descriptor, if mcqemu can run it as it
/// is: flash-mapped with a variable-store template, for this architecture and machine, needing
/// neither SMM nor enrolled keys. `machine` may be an alias (`q35`), which matches the
/// descriptor's `pc-q35-*`.
pub fn from_descriptor(desc: &Value, arch: &str, machine: &str) -> Option<Uefi> {
    let mapping = desc.get("mapping")?;
    if mapping.get("device")?.as_str()? != "flash" {
        return None;
    }
    let targets = desc.get("targets")?.as_array()?;
    let fits = targets.iter().any(|t| {
        t.get("architecture").and_then(Value::as_str) == Some(arch)
            && t.get("machines")
                .and_then(Value::as_array)
                .is_none_or(|ms| {
                    ms.iter().filter_map(Value::as_str).any(|g| {
                        // An alias stands for its versioned names: q35 is pc-q35-X.Y.
                        [
                            machine.to_string(),
                            format!("pc-{machine}-0"),
                            format!("{machine}-0"),
                        ]
                        .iter()
                        .any(|m| glob(g, m))
                    })
                })
    });
    if !fits {
        return None;
    }
    let features: Vec<&str> = desc
        .get("features")
        .and_then(Value::as_array)
        .map(|f| f.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if features.contains(&"requires-smm") || features.contains(&"enrolled-keys") {
        return None;
    }
    let exec = mapping.get("executable")?;
    let code = exec.get("filename")?.as_str()?;
    let vars = mapping.get("nvram-template")?.get("filename")?.as_str()?;
    let format = exec.get("format").and_then(Value::as_str).unwrap_or("raw");
    if format != "raw" && format != "qcow2" {
        return None;
    }
    Some(Uefi {
        code: PathBuf::from(code),
        vars: PathBuf::from(vars),
        format: format.to_string(),
        source: String::new(),
    })
}

fn descriptor_dirs() -> Vec<PathBuf> {
    ["/etc/qemu/firmware", "/usr/share/qemu/firmware"]
        .iter()
        .map(PathBuf::from)
        .collect()
}

/// No UEFI firmware was found for an architecture; says where it looked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirmwareError {
    /// The architecture firmware was looked for.
    pub arch: String,
}

impl std::fmt::Display for FirmwareError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let arch = &self.arch;
        let package = match arch.as_str() {
            "aarch64" => "qemu-efi-aarch64",
            "i386" => "ovmf-ia32",
            "riscv64" => "qemu-efi-riscv64",
            _ => "ovmf",
        };
        write!(
            f,
            "no UEFI firmware for {arch} found (looked in the /etc/qemu/firmware and \
             /usr/share/qemu/firmware descriptors and the Debian, Fedora, Arch and openSUSE \
             paths); install it (Debian: apt-get install {package}) or use firmware=\"bios\""
        )
    }
}

impl std::error::Error for FirmwareError {}

/// Finds UEFI firmware for `arch` on `machine`, or says where it looked.
pub fn find_uefi(arch: &str, machine: &str) -> Result<Uefi, FirmwareError> {
    for dir in descriptor_dirs() {
        let mut entries: Vec<PathBuf> = match std::fs::read_dir(&dir) {
            Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
            Err(_) => continue,
        };
        entries.sort_by_key(|p| p.file_name().map(|n| n.to_os_string()));
        for p in entries
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
        {
            let text = match std::fs::read(p) {
                Ok(t) if t.len() < 1 << 20 => t,
                _ => continue,
            };
            if let Some(mut fw) = serde_json::from_slice::<Value>(&text)
                .ok()
                .and_then(|d| from_descriptor(&d, arch, machine))
            {
                if fw.code.is_file() && fw.vars.is_file() {
                    fw.source = p.display().to_string();
                    return Ok(fw);
                }
            }
        }
    }
    known_paths(arch)
        .iter()
        .find(|(code, vars, _)| Path::new(code).is_file() && Path::new(vars).is_file())
        .map(|(code, vars, format)| Uefi {
            code: PathBuf::from(code),
            vars: PathBuf::from(vars),
            format: format.to_string(),
            source: "distribution path".into(),
        })
        .ok_or_else(|| FirmwareError {
            arch: arch.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Debian 12's 60-edk2-x86_64.json, as shipped: the ordinary OVMF lists amd-sev.
    fn debian() -> Value {
        json!({
            "interface-types": ["uefi"],
            "mapping": {"device": "flash",
                "executable": {"filename": "/usr/share/OVMF/OVMF_CODE_4M.fd", "format": "raw"},
                "nvram-template": {"filename": "/usr/share/OVMF/OVMF_VARS_4M.fd", "format": "raw"}},
            "targets": [{"architecture": "x86_64", "machines": ["pc-i440fx-*", "pc-q35-*"]}],
            "features": ["acpi-s3", "amd-sev", "verbose-dynamic"]
        })
    }

    #[test]
    fn takes_the_ordinary_ovmf_that_lists_amd_sev() {
        let fw = from_descriptor(&debian(), "x86_64", "pc-q35-7.2").unwrap();
        assert_eq!(fw.code, PathBuf::from("/usr/share/OVMF/OVMF_CODE_4M.fd"));
        assert_eq!(fw.format, "raw");
        assert!(
            from_descriptor(&debian(), "x86_64", "q35").is_some(),
            "an alias matches"
        );
        assert!(from_descriptor(&debian(), "aarch64", "virt").is_none());
        assert!(from_descriptor(&debian(), "x86_64", "microvm").is_none());
    }

    #[test]
    fn skips_smm_enrolled_keys_and_stateless_builds_and_keeps_qcow2() {
        let mut smm = debian();
        smm["features"] = json!(["requires-smm", "secure-boot"]);
        assert!(from_descriptor(&smm, "x86_64", "pc-q35-7.2").is_none());
        let mut enrolled = debian();
        enrolled["features"] = json!(["enrolled-keys"]);
        assert!(from_descriptor(&enrolled, "x86_64", "pc-q35-7.2").is_none());
        let mut stateless = debian();
        stateless["mapping"] = json!({"device": "flash", "mode": "stateless",
            "executable": {"filename": "/c.fd", "format": "raw"}});
        assert!(from_descriptor(&stateless, "x86_64", "pc-q35-7.2").is_none());
        // Fedora's qcow2 build.
        let fedora = json!({
            "mapping": {"device": "flash",
                "executable": {"filename": "/usr/share/edk2/ovmf/OVMF_CODE_4M.qcow2", "format": "qcow2"},
                "nvram-template": {"filename": "/usr/share/edk2/ovmf/OVMF_VARS_4M.qcow2", "format": "qcow2"}},
            "targets": [{"architecture": "x86_64", "machines": ["pc-q35-*"]}],
            "features": ["acpi-s3", "amd-sev", "amd-sev-es", "verbose-dynamic"]
        });
        assert_eq!(
            from_descriptor(&fedora, "x86_64", "q35").unwrap().format,
            "qcow2"
        );
        let arm = json!({
            "mapping": {"device": "flash",
                "executable": {"filename": "/usr/share/AAVMF/AAVMF_CODE.fd", "format": "raw"},
                "nvram-template": {"filename": "/usr/share/AAVMF/AAVMF_VARS.fd", "format": "raw"}},
            "targets": [{"architecture": "aarch64", "machines": ["virt-*"]}],
            "features": []
        });
        assert!(from_descriptor(&arm, "aarch64", "virt-7.2").is_some());
    }

    #[test]
    fn every_architecture_has_its_own_fallback_table() {
        assert!(known_paths("i386")
            .iter()
            .all(|(c, _, _)| !c.contains("x64")));
        assert!(known_paths("aarch64")[0].0.contains("AAVMF"));
        assert!(!known_paths("riscv64").is_empty());
        assert!(known_paths("s390x").is_empty());
    }
}
