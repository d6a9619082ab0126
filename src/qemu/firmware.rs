//! UEFI firmware discovery: QEMU's firmware descriptors first, then known distribution paths.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// A UEFI firmware: the code image and the template for the per-VM variable store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uefi {
    /// Read-only code.
    pub code: PathBuf,
    /// Variable store template, copied per VM.
    pub vars: PathBuf,
}

/// Known (code, vars) pairs for x86_64: Debian/Ubuntu, Fedora, Arch.
const X86_PATHS: &[(&str, &str)] = &[
    (
        "/usr/share/OVMF/OVMF_CODE_4M.fd",
        "/usr/share/OVMF/OVMF_VARS_4M.fd",
    ),
    (
        "/usr/share/OVMF/OVMF_CODE.fd",
        "/usr/share/OVMF/OVMF_VARS.fd",
    ),
    (
        "/usr/share/edk2/ovmf/OVMF_CODE.fd",
        "/usr/share/edk2/ovmf/OVMF_VARS.fd",
    ),
    (
        "/usr/share/edk2/x64/OVMF_CODE.4m.fd",
        "/usr/share/edk2/x64/OVMF_VARS.4m.fd",
    ),
    (
        "/usr/share/edk2-ovmf/x64/OVMF_CODE.fd",
        "/usr/share/edk2-ovmf/x64/OVMF_VARS.fd",
    ),
];

const AARCH64_PATHS: &[(&str, &str)] = &[
    (
        "/usr/share/AAVMF/AAVMF_CODE.fd",
        "/usr/share/AAVMF/AAVMF_VARS.fd",
    ),
    (
        "/usr/share/edk2/aarch64/QEMU_EFI-pflash.raw",
        "/usr/share/edk2/aarch64/vars-template-pflash.raw",
    ),
];

/// Picks a firmware for `arch` from one descriptor, if it suits: flash-mapped, no secure boot
/// requirement, for this architecture.
pub fn from_descriptor(desc: &Value, arch: &str) -> Option<Uefi> {
    let mapping = desc.get("mapping")?;
    if mapping.get("device")?.as_str()? != "flash" {
        return None;
    }
    let targets = desc.get("targets")?.as_array()?;
    if !targets
        .iter()
        .any(|t| t.get("architecture").and_then(Value::as_str) == Some(arch))
    {
        return None;
    }
    let features: Vec<&str> = desc
        .get("features")
        .and_then(Value::as_array)
        .map(|f| f.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if features.contains(&"requires-smm")
        || features.contains(&"enrolled-keys")
        || features.contains(&"amd-sev")
    {
        return None;
    }
    let code = mapping.get("executable")?.get("filename")?.as_str()?;
    let vars = mapping.get("nvram-template")?.get("filename")?.as_str()?;
    Some(Uefi {
        code: PathBuf::from(code),
        vars: PathBuf::from(vars),
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
        write!(
            f,
            "no UEFI firmware for {arch} found (looked in /usr/share/qemu/firmware descriptors \
             and the Debian, Fedora and Arch paths); install it (Debian: apt-get install ovmf) \
             or use firmware=\"bios\""
        )
    }
}

impl std::error::Error for FirmwareError {}

/// Finds UEFI firmware for `arch`, or says where it looked.
pub fn find_uefi(arch: &str) -> Result<Uefi, FirmwareError> {
    for dir in descriptor_dirs() {
        let mut entries: Vec<PathBuf> = match std::fs::read_dir(&dir) {
            Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
            Err(_) => continue,
        };
        entries.sort();
        for p in entries
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
        {
            let text = match std::fs::read(p) {
                Ok(t) if t.len() < 1 << 20 => t,
                _ => continue,
            };
            if let Some(fw) = serde_json::from_slice::<Value>(&text)
                .ok()
                .and_then(|d| from_descriptor(&d, arch))
            {
                if fw.code.is_file() && fw.vars.is_file() {
                    return Ok(fw);
                }
            }
        }
    }
    let known = if arch == "aarch64" {
        AARCH64_PATHS
    } else {
        X86_PATHS
    };
    for (code, vars) in known {
        if Path::new(code).is_file() && Path::new(vars).is_file() {
            return Ok(Uefi {
                code: PathBuf::from(code),
                vars: PathBuf::from(vars),
            });
        }
    }
    Err(FirmwareError {
        arch: arch.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_descriptors() {
        let d = json!({
            "mapping": {"device": "flash",
                "executable": {"filename": "/c.fd", "format": "raw"},
                "nvram-template": {"filename": "/v.fd", "format": "raw"}},
            "targets": [{"architecture": "x86_64", "machines": ["pc-q35-*"]}],
            "features": ["acpi-s3"]
        });
        assert_eq!(
            from_descriptor(&d, "x86_64").unwrap().code,
            PathBuf::from("/c.fd")
        );
        assert!(from_descriptor(&d, "aarch64").is_none());
        let mut secure = d.clone();
        secure["features"] = json!(["requires-smm"]);
        assert!(from_descriptor(&secure, "x86_64").is_none());
    }
}
