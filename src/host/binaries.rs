//! The QEMU system emulators this host has, each asked once per process for its version and
//! its machine types (`-machine help`): what turns the alias `q35` into the concrete
//! `pc-q35-7.2` a saved state needs, and what says whether this QEMU can load a state saved by
//! another. Looked for in `$MCQEMU_QEMU_DIR` (another QEMU build), then on PATH, then, for the
//! host's own architecture, where RHEL-family hosts keep their only emulator
//! (`/usr/libexec/qemu-kvm`).

use crate::kind::Failed;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::run;

/// A QEMU version, comparable.
pub type Version = (u32, u32, u32);

/// One machine type a QEMU offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    /// Its concrete name (`pc-q35-7.2`, `virt-10.0`).
    pub name: String,
    /// The alias that points at it (`q35`, `virt`), when one does.
    pub alias: Option<String>,
}

/// A QEMU system emulator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qemu {
    /// Its path (or a bare name found on PATH).
    pub path: PathBuf,
    /// Its version.
    pub version: Version,
    /// Its version as it prints it (first line of `--version`).
    pub version_text: String,
    /// Its machine types (empty when `-machine help` could not be read).
    pub machines: Vec<Machine>,
}

impl Qemu {
    /// The version as `X.Y.Z`.
    pub fn version_string(&self) -> String {
        let (a, b, c) = self.version;
        format!("{a}.{b}.{c}")
    }
}

/// Parses `X.Y.Z` (or `X.Y`) out of a version string such as
/// `QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)`.
pub fn parse_version(text: &str) -> Option<Version> {
    let word = text
        .split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))?;
    let mut parts = word
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u32>().ok());
    Some((
        parts.next()??,
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
    ))
}

/// Parses `qemu-system-* -machine help`: one type a line, `name  description (alias of x)`
/// or `alias  description (alias of name)`.
pub fn parse_machines(text: &str) -> Vec<Machine> {
    let mut out: Vec<Machine> = Vec::new();
    let mut aliases: Vec<(String, String)> = Vec::new();
    for line in text.lines().skip_while(|l| l.starts_with("Supported")) {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        if name == "none" || line.starts_with(' ') {
            continue;
        }
        if let Some(target) = line
            .rsplit_once("(alias of ")
            .and_then(|(_, t)| t.split(')').next())
        {
            aliases.push((name.to_string(), target.trim().to_string()));
        }
        out.push(Machine {
            name: name.to_string(),
            alias: None,
        });
    }
    // `q35 ... (alias of pc-q35-7.2)`: the alias is not a machine of its own.
    out.retain(|m| !aliases.iter().any(|(a, _)| *a == m.name));
    for (alias, target) in aliases {
        if let Some(m) = out.iter_mut().find(|m| m.name == target) {
            m.alias = Some(alias);
        }
    }
    out
}

/// Where the emulator for `arch` is looked for, in order.
pub fn candidates(arch: &str, host_arch: &str, qemu_dir: Option<&Path>) -> Vec<PathBuf> {
    let name = format!("qemu-system-{arch}");
    let mut out = Vec::new();
    if let Some(d) = qemu_dir {
        out.push(d.join(&name));
    }
    out.push(PathBuf::from(&name));
    let same = arch == host_arch || (arch == "i386" && host_arch == "x86_64");
    if same {
        out.push(PathBuf::from("/usr/libexec/qemu-kvm"));
        out.push(PathBuf::from("/usr/bin/qemu-kvm"));
    }
    out
}

fn probe(path: &Path) -> Option<Qemu> {
    let bound = Duration::from_secs(10);
    let v = run::run(Command::new(path).arg("--version"), bound, &|| false).ok()?;
    if !v.status.success() {
        return None;
    }
    let version_text = String::from_utf8_lossy(&v.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    let version = parse_version(&version_text)?;
    let machines = run::run(
        Command::new(path).args(["-machine", "help"]),
        bound,
        &|| false,
    )
    .ok()
    .filter(|o| o.status.success())
    .map(|o| parse_machines(&String::from_utf8_lossy(&o.stdout)))
    .unwrap_or_default();
    Some(Qemu {
        path: path.to_path_buf(),
        version,
        version_text,
        machines,
    })
}

/// The emulator for guests of `arch`, probed once per process (a failure is asked again).
pub fn find(arch: &str) -> Result<Arc<Qemu>, Failed> {
    static CACHE: Mutex<Option<HashMap<String, Arc<Qemu>>>> = Mutex::new(None);
    if let Some(q) = CACHE
        .lock()
        .ok()
        .and_then(|c| c.as_ref().and_then(|m| m.get(arch).cloned()))
    {
        return Ok(q);
    }
    let dir = std::env::var_os("MCQEMU_QEMU_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from);
    let tried = candidates(arch, &super::get().arch, dir.as_deref());
    for path in &tried {
        let Some(path) = which(path) else {
            continue;
        };
        if let Some(q) = probe(&path) {
            let q = Arc::new(q);
            if let Ok(mut c) = CACHE.lock() {
                c.get_or_insert_with(HashMap::new)
                    .insert(arch.to_string(), q.clone());
            }
            return Ok(q);
        }
    }
    Err(Failed::host(format!(
        "no QEMU for {arch} guests: tried {} (install it, e.g. Debian: apt-get install {}; or \
         set MCQEMU_QEMU_DIR to the folder of another QEMU build)",
        tried
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        debian_package(arch)
    )))
}

/// A path as it is (made absolute) if it is a file; a bare name looked up on PATH.
fn which(path: &Path) -> Option<PathBuf> {
    if path.components().count() > 1 {
        return path
            .is_file()
            .then(|| std::path::absolute(path).ok())
            .flatten();
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(path))
        .find(|p| p.is_file())
}

/// The Debian package with the emulator for `arch`.
pub fn debian_package(arch: &str) -> &'static str {
    match arch {
        "x86_64" | "i386" => "qemu-system-x86",
        "aarch64" | "arm" => "qemu-system-arm",
        "riscv64" => "qemu-system-misc",
        "ppc64" => "qemu-system-ppc",
        _ => "qemu-system",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The head of QEMU 7.2's and 10.0's `-machine help` on x86_64.
    const HELP_72: &str = "Supported machines are:\n\
        microvm              microvm (i386)\n\
        pc                   Standard PC (i440FX + PIIX, 1996) (alias of pc-i440fx-7.2)\n\
        pc-i440fx-7.2        Standard PC (i440FX + PIIX, 1996) (default)\n\
        pc-i440fx-7.1        Standard PC (i440FX + PIIX, 1996)\n\
        q35                  Standard PC (Q35 + ICH9, 2009) (alias of pc-q35-7.2)\n\
        pc-q35-7.2           Standard PC (Q35 + ICH9, 2009)\n\
        pc-q35-7.1           Standard PC (Q35 + ICH9, 2009)\n\
        isapc                ISA-only PC\n\
        none                 empty machine\n";
    const HELP_RHEL: &str = "Supported machines are:\n\
        pc                   RHEL 7.6.0 PC (i440FX + PIIX, 1996) (alias of pc-i440fx-rhel7.6.0)\n\
        pc-i440fx-rhel7.6.0  RHEL 7.6.0 PC (i440FX + PIIX, 1996) (default)\n\
        q35                  RHEL-9.4.0 PC (Q35 + ICH9, 2009) (alias of pc-q35-rhel9.4.0)\n\
        pc-q35-rhel9.4.0     RHEL-9.4.0 PC (Q35 + ICH9, 2009)\n\
        pc-q35-rhel9.2.0     RHEL-9.2.0 PC (Q35 + ICH9, 2009)\n";

    #[test]
    fn reads_versions_and_machine_aliases() {
        assert_eq!(
            parse_version("QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)"),
            Some((7, 2, 22))
        );
        assert_eq!(
            parse_version("QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-1~bpo12+1)"),
            Some((10, 0, 2))
        );
        assert_eq!(parse_version("QEMU emulator version 9.1"), Some((9, 1, 0)));
        assert_eq!(parse_version("no version here"), None);
        let m = parse_machines(HELP_72);
        let q35 = m
            .iter()
            .find(|m| m.alias.as_deref() == Some("q35"))
            .unwrap();
        assert_eq!(q35.name, "pc-q35-7.2");
        assert!(m
            .iter()
            .any(|m| m.name == "pc-q35-7.1" && m.alias.is_none()));
        assert!(!m.iter().any(|m| m.name == "q35" || m.name == "none"));
        let r = parse_machines(HELP_RHEL);
        assert_eq!(
            r.iter()
                .find(|m| m.alias.as_deref() == Some("q35"))
                .unwrap()
                .name,
            "pc-q35-rhel9.4.0"
        );
    }

    #[test]
    fn looks_in_the_chosen_dir_then_path_then_rhel_paths() {
        let c = candidates("x86_64", "x86_64", Some(Path::new("/opt/qemu/bin")));
        assert_eq!(c[0], PathBuf::from("/opt/qemu/bin/qemu-system-x86_64"));
        assert_eq!(c[1], PathBuf::from("qemu-system-x86_64"));
        assert!(c.contains(&PathBuf::from("/usr/libexec/qemu-kvm")));
        let arm = candidates("aarch64", "x86_64", None);
        assert_eq!(arm, vec![PathBuf::from("qemu-system-aarch64")]);
        assert!(
            candidates("i386", "x86_64", None).contains(&PathBuf::from("/usr/libexec/qemu-kvm"))
        );
    }
}
