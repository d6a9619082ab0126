//! `mcqemu doctor`: checks the host for what mcqemu needs, as a readable table.

#![allow(clippy::print_stdout)] // this subcommand's results are its stdout; `serve` prints nothing

use std::path::Path;

use crate::host::{binaries, decide};
use crate::qemu::{firmware, img};
use crate::state::paths;

/// One row of the report.
pub struct Check {
    /// What was checked.
    pub name: String,
    /// ok, warn or FAIL.
    pub status: &'static str,
    /// What was found, or what to do.
    pub detail: String,
    /// A FAIL here makes doctor exit non-zero.
    pub essential: bool,
}

/// Architectures whose qemu-system binaries doctor looks for.
pub const ARCHES: &[&str] = &[
    "x86_64", "aarch64", "riscv64", "i386", "arm", "ppc64", "s390x",
];

fn writable(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let probe = dir.join(format!(".doctor-{}", std::process::id()));
    std::fs::write(&probe, b"ok").map_err(|e| format!("cannot write in {}: {e}", dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Runs every check.
pub fn checks() -> Vec<Check> {
    let mut out = Vec::new();
    let host = crate::host::get();
    let mut any_system = false;
    for arch in ARCHES {
        let Ok(qemu) = binaries::find(arch) else {
            if *arch == "x86_64" || *arch == host.arch {
                out.push(Check {
                    name: format!("qemu-system-{arch}"),
                    status: "warn",
                    detail: format!(
                        "not installed (Debian: apt-get install {})",
                        binaries::debian_package(arch)
                    ),
                    essential: false,
                });
            }
            continue;
        };
        any_system = true;
        // Why not KVM is the kvm row's to say.
        let accel = decide::accel(host, arch, "auto").map_or("?", |(a, _)| a);
        let default_machine = crate::ops::launch::ARCHES
            .iter()
            .find(|a| a.0 == *arch)
            .map(|a| a.1);
        let machine = default_machine
            .map(|m| match decide::concrete_machine(&qemu, m) {
                Ok(c) => format!("{m} = {c}"),
                Err(e) => e,
            })
            .unwrap_or_else(|| format!("{} machine types", qemu.machines.len()));
        let firmware = match default_machine.map(|m| firmware::find_uefi(arch, m)) {
            Some(Ok(fw)) => format!(
                "UEFI {} ({}, from {})",
                fw.code.display(),
                fw.format,
                fw.source
            ),
            Some(Err(_)) => "no UEFI firmware (firmware=bios only)".into(),
            None => "firmware not looked up".into(),
        };
        out.push(Check {
            name: format!("qemu-system-{arch}"),
            status: "ok",
            detail: format!(
                "{} {}; accel auto = {accel}; {machine}; {firmware}",
                qemu.path.display(),
                qemu.version_string()
            ),
            essential: false,
        });
    }
    if !any_system {
        out.push(Check {
            name: "qemu-system-*".into(),
            status: "FAIL",
            detail: "no QEMU system emulator found; VMs cannot be launched (Debian: apt-get \
                     install qemu-system-x86; or set MCQEMU_QEMU_DIR)"
                .into(),
            essential: true,
        });
    }
    out.push(Check {
        name: "host".into(),
        status: "ok",
        detail: format!(
            "{}, {} CPUs, memory quota {} MiB (MemTotal {}{}), {}",
            host.arch,
            host.cpus,
            decide::memory_limit_mb(host),
            host.mem_total_mb.map_or("?".into(), |m| format!("{m} MiB")),
            host.cgroup_memory_max_mb
                .map_or(String::new(), |m| format!(", cgroup limit {m} MiB")),
            if host.root {
                "running as root".to_string()
            } else {
                format!(
                    "unprivileged (host ports from {} up)",
                    host.unprivileged_port_start
                )
            }
        ),
        essential: false,
    });
    match img::version() {
        Ok(v) => out.push(Check {
            name: "qemu-img".into(),
            status: "ok",
            detail: v,
            essential: true,
        }),
        Err(e) => out.push(Check {
            name: "qemu-img".into(),
            status: "FAIL",
            detail: e.to_string(),
            essential: true,
        }),
    }
    match crate::host::get().kvm {
        Ok(()) => out.push(Check {
            name: "kvm".into(),
            status: "ok",
            detail: "usable for real guests (hardware virtualization present)".into(),
            essential: false,
        }),
        Err(why) => out.push(Check {
            name: "kvm".into(),
            status: "warn",
            detail: format!("{why}; guests run under TCG (slower)"),
            essential: false,
        }),
    }
    let (runtime, why) = paths::runtime_choice();
    for (name, dir, why) in [
        ("state dir", paths::state_dir(), "writable"),
        ("runtime dir", runtime, why),
    ] {
        let ready = if name == "runtime dir" {
            paths::ensure_runtime_dir().and_then(|d| writable(&d))
        } else {
            writable(&dir)
        };
        match ready {
            Ok(()) => out.push(Check {
                name: name.into(),
                status: "ok",
                detail: format!("{} ({why})", dir.display()),
                essential: true,
            }),
            Err(e) => out.push(Check {
                name: name.into(),
                status: "FAIL",
                detail: e,
                essential: true,
            }),
        }
    }
    let own = binaries::find(&host.arch)
        .map(|q| q.path.display().to_string())
        .unwrap_or_else(|_| "qemu-system-x86_64".into());
    let (status, detail) = seccomp_support(&own);
    out.push(Check {
        name: "seccomp".into(),
        status,
        detail,
        essential: status == "FAIL",
    });
    match crate::state::roots::set_operator_roots(&crate::state::roots::env_roots()) {
        Ok(()) => out.push(Check {
            name: "roots".into(),
            status: "ok",
            detail: crate::state::roots::summary(),
            essential: false,
        }),
        Err(e) => out.push(Check {
            name: "roots".into(),
            status: "FAIL",
            detail: format!("MCQEMU_ROOTS: {e}"),
            essential: true,
        }),
    }
    let reg = paths::registry_file();
    let (status, detail) = registry_health(&reg);
    out.push(Check {
        name: "registry".into(),
        status,
        detail,
        essential: false,
    });
    out
}

/// Whether `binary` accepts the seccomp sandbox every VM runs in: a QEMU without seccomp
/// support exits at once with an error; one with it is still running (paused, no machine)
/// after half a second, and is killed.
fn seccomp_support(binary: &str) -> (&'static str, String) {
    let mut cmd = std::process::Command::new(binary);
    cmd.args(["-sandbox", crate::qemu::cmdline::SECCOMP_POLICY])
        .args(["-machine", "none", "-nodefaults", "-display", "none", "-S"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return ("warn", format!("cannot run {binary}: {e}")),
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut err);
                }
                return (
                    "FAIL",
                    format!(
                        "{binary} refuses -sandbox ({status}): {}; every VM runs in QEMU's \
                         seccomp sandbox, so install a QEMU built with seccomp",
                        err.trim()
                    ),
                );
            }
            Ok(None) if std::time::Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return (
                    "ok",
                    format!(
                        "{binary} runs under -sandbox {}",
                        crate::qemu::cmdline::SECCOMP_POLICY
                    ),
                );
            }
            Ok(None) => std::thread::sleep(std::time::Duration::from_millis(10)),
            Err(e) => return ("warn", format!("cannot wait for {binary}: {e}")),
        }
    }
}

fn registry_health(reg: &Path) -> (&'static str, String) {
    match std::fs::read(reg) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            ("ok", format!("{} (not created yet)", reg.display()))
        }
        Err(e) => ("warn", format!("{} unreadable: {e}", reg.display())),
        // The server's own parser, so doctor judges the file exactly as the server will.
        Ok(bytes) => match crate::state::registry::parse(&bytes) {
            Ok(p) if p.version > crate::state::registry::SCHEMA_VERSION => (
                "warn",
                format!(
                    "{} was written by a newer mcqemu (schema {}); this version will not change it",
                    reg.display(),
                    p.version
                ),
            ),
            Ok(p) if !p.warnings.is_empty() => (
                "warn",
                format!(
                    "{} ({} VMs recorded; skipped: {})",
                    reg.display(),
                    p.vms.len(),
                    p.warnings.join("; ")
                ),
            ),
            Ok(p) => (
                "ok",
                format!("{} ({} VMs recorded)", reg.display(), p.vms.len()),
            ),
            Err(e) => (
                "warn",
                format!(
                    "{} does not parse ({e}); the server will quarantine it and start empty",
                    reg.display()
                ),
            ),
        },
    }
}

/// Prints the table; returns the exit code (1 when an essential check failed).
pub fn run_doctor() -> i32 {
    let rows = checks();
    let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(10).max(5);
    println!("{:<width$}  {:<6}  DETAIL", "CHECK", "STATUS");
    let mut failed = false;
    for r in &rows {
        println!("{:<width$}  {:<6}  {}", r.name, r.status, r.detail);
        failed |= r.essential && r.status == "FAIL";
    }
    if failed {
        println!("\nSomething essential is missing: see the FAIL rows above.");
        1
    } else {
        0
    }
}
