//! `mcqemu doctor`: checks the host for what mcqemu needs, as a readable table.

#![allow(clippy::print_stdout)] // this subcommand's results are its stdout; `serve` prints nothing

use std::path::Path;

use crate::host::binaries::{self, Qemu, Version};
use crate::host::{decide, seabios, Host};
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
    let host = crate::host::get();
    let mut out = emulator_checks(host);
    out.push(host_check(host));
    out.push(qemu_img_check());
    out.push(kvm_check(host));
    out.extend(dir_checks());
    out.push(seccomp_check(host));
    out.push(egress_check());
    out.extend(agent_checks(host));
    out.extend(kernel_checks(host));
    out.push(roots_check());
    out.push(registry_check());
    out
}

fn row(name: impl Into<String>, status: &'static str, detail: String, essential: bool) -> Check {
    Check {
        name: name.into(),
        status,
        detail,
        essential,
    }
}

/// One row per QEMU system emulator (a warning for a missing x86_64 or host one), the
/// x86_64 one followed by the SeaBIOS it loads; a FAIL when there is none at all.
fn emulator_checks(host: &Host) -> Vec<Check> {
    let mut out = Vec::new();
    let mut any_system = false;
    for arch in ARCHES {
        let Ok(qemu) = binaries::find(arch) else {
            if *arch == "x86_64" || *arch == host.arch {
                let detail = format!(
                    "not installed (Debian: apt-get install {})",
                    binaries::debian_package(arch)
                );
                out.push(row(format!("qemu-system-{arch}"), "warn", detail, false));
            }
            continue;
        };
        any_system = true;
        out.push(emulator_check(host, arch, &qemu));
        if *arch == "x86_64" {
            out.push(seabios_check(
                qemu.version,
                seabios::probe(&qemu.path).as_ref(),
            ));
        }
    }
    if !any_system {
        let detail = "no QEMU system emulator found; VMs cannot be launched (Debian: apt-get \
                      install qemu-system-x86; or set MCQEMU_QEMU_DIR)";
        out.push(row("qemu-system-*", "FAIL", detail.into(), true));
    }
    out
}

/// The emulator for `arch`: its path and version, the accelerator, machine and firmware a
/// launch would take.
fn emulator_check(host: &Host, arch: &str, qemu: &Qemu) -> Check {
    // Why not KVM is the kvm row's to say.
    let accel = decide::accel(host, arch, "auto").map_or("?", |(a, _)| a.name());
    let default_machine = crate::ops::vm::launch::ARCHES
        .iter()
        .find(|a| a.0 == arch)
        .map(|a| a.1);
    let machine = default_machine
        .map(|m| match decide::concrete_machine(qemu, m) {
            Ok(c) => format!("{m} = {c}"),
            Err(e) => e.msg,
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
    let detail = format!(
        "{} {}; accel auto = {accel}; {machine}; {firmware}",
        qemu.path.display(),
        qemu.version_string()
    );
    row(format!("qemu-system-{arch}"), "ok", detail, false)
}

/// The SeaBIOS an x86 QEMU of version `qemu` loads (`found`: the first `bios-256k.bin` on its
/// data path): a warning, with the fix, when the pair stalls q35 boots.
fn seabios_check(qemu: Version, found: Option<&seabios::Found>) -> Check {
    let (a, b, c) = qemu;
    let fix = "install seabios >= 1.16.3 (Debian bookworm: apt-get install -t bookworm-backports \
               seabios), or put a folder with a newer bios-256k.bin first on QEMU's data path \
               (-L DIR, e.g. in a wrapper in MCQEMU_QEMU_DIR as .ci/fetch-qemu10 writes)";
    let Some(found) = found else {
        let detail = format!(
            "QEMU {a}.{b}.{c} finds no {} on its data path (qemu-system-x86_64 -L help): x86 \
             guests cannot boot with firmware=bios; {fix}",
            seabios::BIOS_FILE
        );
        return row("seabios", "warn", detail, false);
    };
    let path = found.path.display();
    let text = found.version.as_ref().map_or("?", |v| v.1.as_str());
    let (status, detail) = match seabios::pairing(qemu, found.version.as_ref().map(|v| v.0)) {
        seabios::Pairing::Fine => ("ok", format!("{path} (SeaBIOS {text})")),
        seabios::Pairing::Stalls => (
            "warn",
            format!(
                "{path} is SeaBIOS {text}, older than 1.16.3, and QEMU {a}.{b}.{c} is 8.2 or \
                 later: every q35 boot waits about 32 s in the firmware; {fix}"
            ),
        ),
        seabios::Pairing::Unknown => (
            "warn",
            format!(
                "no SeaBIOS version found in {path}; QEMU {a}.{b}.{c} needs SeaBIOS >= 1.16.3 \
                 or every q35 boot waits about 32 s in the firmware; if it is older, {fix}"
            ),
        ),
    };
    row("seabios", status, detail, false)
}

/// The host's CPUs and memory quota (with the cgroup limit it comes from) and who runs.
fn host_check(host: &Host) -> Check {
    let detail = format!(
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
    );
    row("host", "ok", detail, false)
}

fn qemu_img_check() -> Check {
    match img::version() {
        Ok(v) => row("qemu-img", "ok", v, true),
        Err(e) => row("qemu-img", "FAIL", e.to_string(), true),
    }
}

fn kvm_check(host: &Host) -> Check {
    match &host.kvm {
        Ok(()) => row(
            "kvm",
            "ok",
            "usable for real guests (hardware virtualization present)".into(),
            false,
        ),
        Err(why) => row(
            "kvm",
            "warn",
            format!("{why}; guests run under TCG (slower)"),
            false,
        ),
    }
}

/// The state and runtime folders, each created if missing and written to.
fn dir_checks() -> Vec<Check> {
    let (runtime, why) = paths::runtime_choice();
    let mut out = Vec::new();
    for (name, dir, why) in [
        ("state dir", paths::state_dir(), "writable"),
        ("runtime dir", runtime, why),
    ] {
        let ready = if name == "runtime dir" {
            paths::ensure_runtime_dir()
                .map_err(|e| e.msg)
                .and_then(|d| writable(&d))
        } else {
            writable(&dir)
        };
        out.push(match ready {
            Ok(()) => row(name, "ok", format!("{} ({why})", dir.display()), true),
            Err(e) => row(name, "FAIL", e, true),
        });
    }
    out
}

fn seccomp_check(host: &Host) -> Check {
    let own = binaries::find(&host.arch)
        .map(|q| q.path.display().to_string())
        .unwrap_or_else(|_| "qemu-system-x86_64".into());
    let (status, detail) = seccomp_support(&own);
    row("seccomp", status, detail, status == "FAIL")
}

/// allow_network rules need an unprivileged user namespace with a network namespace in it.
fn egress_check() -> Check {
    let out = std::env::current_exe().and_then(|exe| {
        std::process::Command::new(exe)
            .args(["egress-proxy", "--probe"])
            .stdin(std::process::Stdio::null())
            .output()
    });
    match out {
        Ok(o) if o.status.success() => row(
            "egress",
            "ok",
            "allow_network rules work (an unprivileged user and network namespace)".into(),
            false,
        ),
        Ok(o) => row(
            "egress",
            "warn",
            format!(
                "allow_network rules will be refused: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            false,
        ),
        Err(e) => row("egress", "warn", format!("cannot probe: {e}"), false),
    }
}

/// mcqemu-agent for the host's architecture and for aarch64 (a warning when missing: only
/// roots and images that need mcqemu's own agent use it; the detail says how to build it), and
/// whether this binary carries them.
fn agent_checks(host: &Host) -> Vec<Check> {
    let inside = crate::host::agent::embedded_arches();
    guest_arches(host)
        .into_iter()
        .map(|arch| {
            let carried = inside.contains(&arch);
            match crate::host::agent::find(arch) {
                Ok(p) if carried && p.starts_with(paths::state_dir()) => row(
                    format!("agent {arch}"),
                    "ok",
                    format!(
                        "mcqemu-agent inside this binary, written out to {}",
                        p.display()
                    ),
                    false,
                ),
                Ok(p) => row(
                    format!("agent {arch}"),
                    "ok",
                    format!(
                        "mcqemu-agent at {} ({})",
                        p.display(),
                        match carried {
                            true => "used before the one inside this binary",
                            false =>
                                "this binary carries none: .ci/build-agents, then build mcqemu",
                        }
                    ),
                    false,
                ),
                Err(e) => row(format!("agent {arch}"), "warn", e.msg, false),
            }
        })
        .collect()
}

/// The guest architectures mcqemu brings agents and image kernels for: the host's, and aarch64.
fn guest_arches(host: &Host) -> Vec<&str> {
    let mut arches = vec![host.arch.as_str()];
    if host.arch != "aarch64" {
        arches.push("aarch64");
    }
    arches
}

/// Where container images' kernels come from: cached (no network, no program), or the
/// package the first container sandbox fetches.
fn kernel_checks(host: &Host) -> Vec<Check> {
    use crate::ops::container::kernel;
    guest_arches(host)
        .into_iter()
        .map(|arch| {
            let name = format!("image kernel {arch}");
            match kernel::source(arch) {
                Err(e) => row(name, "warn", e.msg, false),
                Ok(src) => match kernel::cached(&src) {
                    Some(k) => row(
                        name,
                        "ok",
                        format!("cached in {}: {}", k.home.display(), k.source),
                        false,
                    ),
                    None => row(
                        name,
                        "ok",
                        format!(
                            "not fetched yet: the first container sandbox fetches {} (sha256 {}) \
                             from {}",
                            src.label,
                            src.sha256,
                            src.places.join(" or ")
                        ),
                        false,
                    ),
                },
            }
        })
        .collect()
}

fn roots_check() -> Check {
    match crate::state::roots::set_operator_roots(&crate::state::roots::env_roots()) {
        Ok(()) => row("roots", "ok", crate::state::roots::summary(), false),
        Err(e) => row("roots", "FAIL", format!("MCQEMU_ROOTS: {e}"), true),
    }
}

fn registry_check() -> Check {
    let (status, detail) = registry_health(&paths::registry_file());
    row("registry", status, detail, false)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn found(version: &str) -> seabios::Found {
        let mut image = b"\x55\xaa\0".to_vec();
        image.extend_from_slice(version.as_bytes());
        image.push(0);
        seabios::Found {
            path: "/usr/share/seabios/bios-256k.bin".into(),
            version: seabios::parse_version(&image),
        }
    }

    #[test]
    fn warns_of_qemu_10_with_bookworms_seabios_and_says_the_fix() {
        let c = seabios_check((10, 0, 2), Some(&found("1.16.2-debian-1.16.2-1")));
        assert_eq!(c.status, "warn");
        assert!(c.detail.contains("1.16.2-debian-1.16.2-1"), "{}", c.detail);
        assert!(c.detail.contains("32 s"), "{}", c.detail);
        assert!(c.detail.contains("bookworm-backports"), "{}", c.detail);
        assert!(c.detail.contains("-L"), "{}", c.detail);
        assert!(!c.essential);
    }

    #[test]
    fn a_fixed_seabios_or_an_older_qemu_is_fine() {
        let newer = seabios_check((10, 0, 2), Some(&found("1.16.3-debian-1.16.3-2~bpo12+1")));
        assert_eq!(newer.status, "ok", "{}", newer.detail);
        let older_qemu = seabios_check((7, 2, 22), Some(&found("1.16.2-debian-1.16.2-1")));
        assert_eq!(older_qemu.status, "ok", "{}", older_qemu.detail);
        let unreadable = seabios_check((9, 2, 0), Some(&found("?-20240101_000000-builder")));
        assert_eq!(unreadable.status, "warn");
        assert_eq!(seabios_check((7, 2, 22), None).status, "warn");
    }
}
