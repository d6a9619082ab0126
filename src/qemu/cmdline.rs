//! The QEMU command line: one escaper for every interpolated value, the `extra_args` policy,
//! port forwards, and the argv `launch_vm` runs.

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;

/// Escapes a value for QEMU's option syntax (`key=value,key=value`): commas are doubled, so a
/// file named `data,readonly=on.qcow2` stays one value.
pub fn qopt(value: &str) -> String {
    value.replace(',', ",,")
}

/// Splits a QEMU option string the way QEMU does: `,` separates, `,,` is a literal comma.
/// The reference the fuzzers check [`qopt`] against.
pub fn split_opts(s: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ',' {
            if chars.peek() == Some(&',') {
                chars.next();
                if let Some(last) = out.last_mut() {
                    last.push(',');
                }
            } else {
                out.push(String::new());
            }
        } else if let Some(last) = out.last_mut() {
            last.push(c);
        }
    }
    out
}

/// Options that are refused outright in `extra_args`, with the reason.
const DENIED: &[(&str, &str)] = &[
    ("virtfs", "host filesystem passthrough"),
    ("fsdev", "host filesystem passthrough"),
    ("runas", "changes the user QEMU runs as"),
    ("run-with", "changes QEMU's user or root"),
    ("chroot", "changes QEMU's root"),
    ("monitor", "mcqemu owns the monitor"),
    ("qmp", "mcqemu owns the QMP channel"),
    ("qmp-pretty", "mcqemu owns the QMP channel"),
    ("mon", "mcqemu owns the monitor"),
    ("pidfile", "mcqemu owns the pidfile"),
    ("daemonize", "mcqemu daemonizes QEMU itself"),
    ("serial", "mcqemu owns the serial console"),
    (
        "readconfig",
        "a config file can carry any option past this policy",
    ),
    (
        "set",
        "rewrites options after this policy checked them, mcqemu's own channels included",
    ),
    ("plugin", "loads host code into QEMU"),
    ("hda", "host block devices"),
    ("hdb", "host block devices"),
    ("hdc", "host block devices"),
    ("hdd", "host block devices"),
    ("cdrom", "host block devices"),
    ("fda", "host block devices"),
    ("fdb", "host block devices"),
    ("pflash", "host block devices"),
    ("mtdblock", "host block devices"),
    ("sd", "host block devices"),
];

/// Options whose value names a drive; refused when it reaches a host device.
const DRIVE_OPTS: &[&str] = &["drive", "blockdev"];

/// Options taking no value (the rest take one): every such option of QEMU 7.2's system
/// emulators (`qemu-system-* -help`), so that what follows one is read as QEMU reads it.
const FLAG_OPTS: &[&str] = &[
    "daemonize",
    "S",
    "snapshot",
    "no-reboot",
    "no-shutdown",
    "nographic",
    "enable-kvm",
    "no-user-config",
    "nodefaults",
    "full-screen",
    "no-hpet",
    "no-acpi",
    "s",
    "h",
    "help",
    "version",
    "audio-help",
    "mem-prealloc",
    "usb",
    "portrait",
    "win2k-hack",
    "no-fd-bootchk",
    "singlestep",
    "xen-attach",
    "xen-domid-restrict",
    "only-migratable",
    "enable-sync-profile",
    "async-teardown",
    "preconfig",
    "semihosting",
    "old-param",
];

/// Options whose value is a character-device spec, where `pipe:` talks to host FIFOs.
const CHARDEV_SPEC_OPTS: &[&str] = &["parallel", "debugcon", "gdb"];

/// Why `extra_args` were refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgsError {
    /// A bare argument, which QEMU opens as a hard disk image.
    Bare(String),
    /// An option, or an option value, the isolation policy refuses.
    Denied {
        /// The option as spelled, without its dashes.
        opt: String,
        /// What it would reach.
        reason: &'static str,
    },
}

impl std::fmt::Display for ArgsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArgsError::Bare(arg) => write!(
                f,
                "extra_args: the bare argument {arg:?} is not allowed (QEMU opens a bare argument \
                 as a hard disk image, like -hda); attach disks with the disks parameter"
            ),
            ArgsError::Denied { opt, reason } => write!(
                f,
                "extra_args: -{opt} is not allowed ({reason}); extra_args is for operators adding \
                 devices or tuning, and cannot reach host files, devices or processes"
            ),
        }
    }
}

impl std::error::Error for ArgsError {}

fn denied(reason: &'static str, opt: &str) -> ArgsError {
    ArgsError::Denied {
        opt: opt.to_string(),
        reason,
    }
}

fn has_key_value(value: &str, key: &str, pred: impl Fn(&str) -> bool) -> bool {
    split_opts(value).iter().any(|part| {
        part.split_once('=')
            .is_some_and(|(k, v)| k.trim().eq_ignore_ascii_case(key) && pred(v))
    })
}

/// Checks `extra_args` against the isolation policy, for every spelling QEMU accepts
/// (`-opt`, `--opt`, `-opt=value`, `-opt value`).
pub fn check_extra_args(args: &[String]) -> Result<(), ArgsError> {
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        let Some((opt, inline)) = as_option(arg) else {
            // QEMU opens a bare argument as its first hard disk, like -hda.
            return Err(ArgsError::Bare(arg.clone()));
        };
        let opt_l = opt.to_ascii_lowercase();
        if let Some((_, reason)) = DENIED.iter().find(|(d, _)| *d == opt_l) {
            return Err(denied(reason, opt));
        }
        let value = match inline {
            Some(v) => v.to_string(),
            None if FLAG_OPTS.contains(&opt) => continue,
            None => {
                // QEMU takes the next argument as the value, whatever it looks like (so what
                // follows it is read afresh, and a bare word there is refused above). In case
                // `opt` takes no value after all (FLAG_OPTS missed it: `-usb -hda x` opens x),
                // a value that looks like an option is also checked as one, with the argument
                // after it as its value.
                let v = args.get(i).cloned().unwrap_or_default();
                i += 1;
                if let Some((vopt, vinline)) = as_option(&v) {
                    let vopt_l = vopt.to_ascii_lowercase();
                    if let Some((_, reason)) = DENIED.iter().find(|(d, _)| *d == vopt_l) {
                        return Err(denied(reason, vopt));
                    }
                    let vvalue = vinline.or(args.get(i).map(String::as_str)).unwrap_or("");
                    check_option_value(&vopt_l, vvalue)?;
                }
                v
            }
        };
        check_option_value(&opt_l, &value)?;
    }
    Ok(())
}

/// Reads an argument as QEMU's option parser does: `-opt`, `--opt`, `-opt=value`. None for a
/// bare argument.
fn as_option(arg: &str) -> Option<(&str, Option<&str>)> {
    let stripped = arg.strip_prefix('-')?;
    let stripped = stripped.strip_prefix('-').unwrap_or(stripped);
    Some(match stripped.split_once('=') {
        Some((o, v)) => (o, Some(v)),
        None => (stripped, None),
    })
}

/// Rewrites a JSON option value (`-device {"driver":...}`, accepted by QEMU for several
/// options) as `key=value,...`, so the key checks below see its keys; other values unchanged.
fn flatten_json(value: &str) -> String {
    if !value.trim_start().starts_with('{') {
        return value.to_string();
    }
    match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(value) {
        Ok(m) => m
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                format!("{}={}", qopt(k), qopt(&v))
            })
            .collect::<Vec<_>>()
            .join(","),
        Err(_) => value.to_string(),
    }
}

/// The values of an option's implied first key (`-chardev BACKEND,...`, `-device DRIVER,...`),
/// whether given bare first or by name anywhere (`backend=pipe` in any position), lowercased.
fn implied(value: &str, key: &str) -> Vec<String> {
    let parts = split_opts(value);
    let mut out = Vec::new();
    if let Some(first) = parts.first().filter(|f| !f.contains('=')) {
        out.push(first.trim().to_ascii_lowercase());
    }
    for part in &parts {
        if let Some((k, v)) = part.split_once('=') {
            if k.trim().eq_ignore_ascii_case(key) {
                out.push(v.trim().to_ascii_lowercase());
            }
        }
    }
    out
}

fn check_option_value(opt: &str, value: &str) -> Result<(), ArgsError> {
    let value = &flatten_json(value);
    let lower = value.to_ascii_lowercase();
    if DRIVE_OPTS.contains(&opt) {
        if lower.contains("/dev/") || lower.contains("host_device") || lower.contains("host_cdrom")
        {
            return Err(denied("host block devices", opt));
        }
        if lower.contains("json:") {
            return Err(denied("json: filenames can reach host devices", opt));
        }
    }
    match opt {
        "chardev" => {
            if implied(value, "backend")
                .iter()
                .any(|b| matches!(b.as_str(), "pipe" | "spawn" | "exec"))
            {
                return Err(denied("chardevs that run or talk to host programs", opt));
            }
            if has_key_value(value, "id", |v| v.starts_with("mcq-")) {
                return Err(denied("the mcq- chardev ids belong to mcqemu", opt));
            }
        }
        "netdev" | "net" | "nic" => {
            if lower.contains("cmd:") {
                return Err(denied("guestfwd to a host command", opt));
            }
            for key in ["script", "downscript"] {
                if has_key_value(value, key, |v| !v.eq_ignore_ascii_case("no")) {
                    return Err(denied("tap scripts run host programs", opt));
                }
            }
            if has_key_value(value, "id", |v| v.starts_with("mcq-")) {
                return Err(denied("the mcq- netdev ids belong to mcqemu", opt));
            }
        }
        "incoming" if lower.starts_with("exec:") => {
            return Err(denied("exec: migration runs a host command", opt))
        }
        o if CHARDEV_SPEC_OPTS.contains(&o) && lower.trim_start().starts_with("pipe:") => {
            return Err(denied("chardevs that run or talk to host programs", opt));
        }
        "device" => {
            if implied(value, "driver").iter().any(|driver| {
                driver.contains("9p")
                    || driver.contains("vhost-user")
                    || driver.contains("virtio-fs")
            }) {
                return Err(denied("host filesystem passthrough", opt));
            }
            if has_key_value(value, "chardev", |v| v.starts_with("mcq-")) {
                return Err(denied("the mcq- chardevs belong to mcqemu", opt));
            }
        }
        _ => {}
    }
    Ok(())
}

/// One requested port forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    /// Host address to listen on.
    pub addr: Ipv4Addr,
    /// Host port; None means pick a free one.
    pub host: Option<u16>,
    /// Guest port.
    pub guest: u16,
}

/// A resolved forward, as stored and reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    /// Host address.
    pub addr: Ipv4Addr,
    /// Host port.
    pub host: u16,
    /// Guest port.
    pub guest: u16,
    /// True when the host port was chosen by mcqemu.
    pub auto: bool,
}

/// Why port forwards could not be set up.
#[derive(Debug)]
pub enum ForwardError {
    /// A spec in none of the accepted forms.
    Form(String),
    /// A host or guest port that is not 1-65535.
    NotAPort {
        /// The whole spec.
        spec: String,
        /// The part that should be a port.
        value: String,
    },
    /// An address that is not IPv4.
    NotAnAddress {
        /// The whole spec.
        spec: String,
        /// The part that should be an address.
        value: String,
    },
    /// The same host port twice.
    Duplicate(u16),
    /// No free port could be bound on the address (with the error, when binding failed).
    NoFreePort(Ipv4Addr, Option<std::io::Error>),
    /// A bound port's address could not be read.
    LocalAddr(std::io::Error),
}

impl std::fmt::Display for ForwardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ForwardError::Form(spec) => write!(
                f,
                "port forward {spec:?}: use \"HOST:GUEST\", \"auto:GUEST\", \"GUEST\" or \
                 \"ADDR:HOST:GUEST\""
            ),
            ForwardError::NotAPort { spec, value } => write!(
                f,
                "port forward {spec:?}: {value:?} is not a port (1-65535)"
            ),
            ForwardError::NotAnAddress { spec, value } => {
                write!(f, "port forward {spec:?}: {value:?} is not an IPv4 address")
            }
            ForwardError::Duplicate(h) => write!(
                f,
                "host port {h} appears twice in port_forwards; each host port can forward to one \
                 guest port"
            ),
            ForwardError::NoFreePort(addr, Some(e)) => {
                write!(f, "cannot find a free port on {addr}: {e}")
            }
            ForwardError::NoFreePort(addr, None) => write!(f, "cannot find a free port on {addr}"),
            ForwardError::LocalAddr(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ForwardError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ForwardError::NoFreePort(_, Some(e)) | ForwardError::LocalAddr(e) => Some(e),
            _ => None,
        }
    }
}

fn port(s: &str, spec: &str) -> Result<u16, ForwardError> {
    s.trim()
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| ForwardError::NotAPort {
            spec: spec.to_string(),
            value: s.to_string(),
        })
}

/// Parses `"H:G"`, `"auto:G"`, `"G"`, or `"ADDR:H:G"` / `"ADDR:auto:G"`.
pub fn parse_forward(spec: &str) -> Result<PortSpec, ForwardError> {
    let parts: Vec<&str> = spec.split(':').collect();
    let (addr, host, guest) = match parts.as_slice() {
        [g] => (Ipv4Addr::LOCALHOST, "auto", *g),
        [h, g] => (Ipv4Addr::LOCALHOST, *h, *g),
        [a, h, g] => {
            let addr = a
                .trim()
                .parse::<Ipv4Addr>()
                .map_err(|_| ForwardError::NotAnAddress {
                    spec: spec.to_string(),
                    value: a.to_string(),
                })?;
            (addr, *h, *g)
        }
        _ => return Err(ForwardError::Form(spec.to_string())),
    };
    let host = if host.trim().eq_ignore_ascii_case("auto") {
        None
    } else {
        Some(port(host, spec)?)
    };
    Ok(PortSpec {
        addr,
        host,
        guest: port(guest, spec)?,
    })
}

/// Resolves forwards: duplicate host ports are an error, auto ports are picked free on the
/// host and never collide with each other or with explicit ones.
pub fn resolve_forwards(specs: &[String]) -> Result<Vec<Forward>, ForwardError> {
    let parsed: Vec<PortSpec> = specs
        .iter()
        .map(|s| parse_forward(s))
        .collect::<Result<_, _>>()?;
    let mut taken: HashSet<u16> = HashSet::new();
    for p in &parsed {
        if let Some(h) = p.host {
            if !taken.insert(h) {
                return Err(ForwardError::Duplicate(h));
            }
        }
    }
    let mut out = Vec::new();
    for p in parsed {
        let (host, auto) = match p.host {
            Some(h) => (h, false),
            None => (free_port(p.addr, &taken)?, true),
        };
        taken.insert(host);
        out.push(Forward {
            addr: p.addr,
            host,
            guest: p.guest,
            auto,
        });
    }
    Ok(out)
}

fn free_port(addr: Ipv4Addr, taken: &HashSet<u16>) -> Result<u16, ForwardError> {
    for _ in 0..64 {
        let l =
            TcpListener::bind((addr, 0)).map_err(|e| ForwardError::NoFreePort(addr, Some(e)))?;
        let p = l.local_addr().map_err(ForwardError::LocalAddr)?.port();
        if !taken.contains(&p) {
            return Ok(p);
        }
    }
    Err(ForwardError::NoFreePort(addr, None))
}

/// Everything `launch_vm` decided, ready to become an argv.
#[derive(Debug, Clone, Default)]
pub struct LaunchSpec {
    /// VM name.
    pub name: String,
    /// QEMU binary.
    pub binary: String,
    /// Machine type.
    pub machine: String,
    /// "kvm" or "tcg".
    pub accel: String,
    /// Architecture.
    pub arch: String,
    /// RAM in MiB.
    pub memory_mb: u64,
    /// vCPUs.
    pub cpus: u64,
    /// Disks with their probed formats.
    pub disks: Vec<(PathBuf, String)>,
    /// Installer ISO.
    pub iso: Option<PathBuf>,
    /// UEFI code and the VM's own variable store.
    pub uefi: Option<(PathBuf, PathBuf)>,
    /// Networking off.
    pub no_net: bool,
    /// Block guest-initiated traffic (slirp restrict=on).
    pub restrict_net: bool,
    /// Resolved port forwards.
    pub forwards: Vec<Forward>,
    /// Direct kernel boot.
    pub kernel: Option<PathBuf>,
    /// Initial ramdisk.
    pub initrd: Option<PathBuf>,
    /// Kernel command line.
    pub append: Option<String>,
    /// QMP socket.
    pub qmp_socket: PathBuf,
    /// Guest-agent socket.
    pub qga_socket: PathBuf,
    /// Serial console socket.
    pub serial_socket: PathBuf,
    /// Serial console log.
    pub serial_log: PathBuf,
    /// Pidfile.
    pub pidfile: PathBuf,
    /// Operator-supplied extra arguments (already checked).
    pub extra_args: Vec<String>,
}

fn p(path: &std::path::Path) -> String {
    qopt(&path.to_string_lossy())
}

/// Builds QEMU's argv (without the binary) for a spec.
pub fn build_argv(s: &LaunchSpec) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    let mut push = |parts: &[&str]| a.extend(parts.iter().map(|x| x.to_string()));
    push(&[
        "-name",
        &format!("guest={},process=mcqemu-{}", qopt(&s.name), qopt(&s.name)),
    ]);
    push(&["-machine", &qopt(&s.machine)]);
    push(&["-accel", &s.accel]);
    if s.accel == "kvm" {
        push(&["-cpu", "host"]);
    } else if s.arch != "x86_64" && s.arch != "i386" {
        push(&["-cpu", "max"]);
    }
    push(&["-m", &s.memory_mb.to_string(), "-smp", &s.cpus.to_string()]);
    push(&[
        "-display",
        "none",
        "-daemonize",
        "-pidfile",
        &s.pidfile.to_string_lossy(),
    ]);
    push(&[
        "-qmp",
        &format!("unix:{},server=on,wait=off", p(&s.qmp_socket)),
    ]);
    push(&[
        "-chardev",
        &format!(
            "socket,id=mcq-qga,path={},server=on,wait=off",
            p(&s.qga_socket)
        ),
    ]);
    push(&["-device", "virtio-serial-pci,id=mcq-vser"]);
    push(&[
        "-device",
        "virtserialport,bus=mcq-vser.0,chardev=mcq-qga,name=org.qemu.guest_agent.0",
    ]);
    push(&[
        "-chardev",
        &format!(
            "socket,id=mcq-serial,path={},server=on,wait=off,logfile={},logappend=on",
            p(&s.serial_socket),
            p(&s.serial_log)
        ),
    ]);
    push(&["-serial", "chardev:mcq-serial"]);
    push(&["-device", "virtio-tablet-pci,id=mcq-tablet"]);
    if let Some((code, vars)) = &s.uefi {
        push(&[
            "-drive",
            &format!("if=pflash,format=raw,unit=0,readonly=on,file={}", p(code)),
        ]);
        push(&[
            "-drive",
            &format!("if=pflash,format=raw,unit=1,file={}", p(vars)),
        ]);
    }
    for (i, (disk, fmt)) in s.disks.iter().enumerate() {
        push(&[
            "-drive",
            &format!(
                "file={},format={},if=virtio,id=mcq-disk{i}",
                p(disk),
                qopt(fmt)
            ),
        ]);
    }
    if let Some(iso) = &s.iso {
        push(&[
            "-drive",
            &format!(
                "file={},format=raw,media=cdrom,readonly=on,id=mcq-cdrom",
                p(iso)
            ),
        ]);
        push(&["-boot", "order=dc"]);
    }
    if !s.no_net {
        let mut netdev = String::from("user,id=mcq-net0");
        if s.restrict_net {
            netdev.push_str(",restrict=on");
        }
        for f in &s.forwards {
            netdev.push_str(&format!(",hostfwd=tcp:{}:{}-:{}", f.addr, f.host, f.guest));
        }
        push(&[
            "-netdev",
            &netdev,
            "-device",
            "virtio-net-pci,netdev=mcq-net0",
        ]);
    } else {
        push(&["-nic", "none"]);
    }
    if let Some(k) = &s.kernel {
        push(&["-kernel", &k.to_string_lossy()]);
    }
    if let Some(i) = &s.initrd {
        push(&["-initrd", &i.to_string_lossy()]);
    }
    if let Some(ap) = &s.append {
        push(&["-append", ap]);
    }
    a.extend(s.extra_args.iter().cloned());
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn escaped_value_splits_back_to_itself() {
        for s in ["data,readonly=on.qcow2", ",,", "a,", ",a", "plain", ""] {
            let opt = format!("file={}", qopt(s));
            assert_eq!(split_opts(&opt), vec![format!("file={s}")]);
        }
    }

    #[test]
    fn denies_every_spelling() {
        for bad in [
            v(&["-virtfs", "local,path=/"]),
            v(&["--virtfs", "local,path=/"]),
            v(&["-virtfs=local,path=/"]),
            v(&["-fsdev", "local,id=x,path=/"]),
            v(&["-device", "virtio-9p-pci,fsdev=x"]),
            v(&["-device", "vhost-user-fs-pci,chardev=c"]),
            v(&["-drive", "file=/dev/sda"]),
            v(&["--drive=file=/dev/sda,format=raw"]),
            v(&[
                "-blockdev",
                "driver=host_device,filename=/dev/sda,node-name=x",
            ]),
            v(&["-hda", "x.img"]),
            v(&["-cdrom", "/dev/sr0"]),
            v(&["-pflash", "x"]),
            v(&["-chardev", "pipe,id=p,path=/tmp/p"]),
            v(&[
                "-netdev",
                "user,id=n,guestfwd=tcp:10.0.2.100:80-cmd:nc x 80",
            ]),
            v(&["-netdev", "tap,id=t,script=/bin/evil"]),
            v(&["-incoming", "exec:cat /etc/shadow"]),
            v(&["-runas", "nobody"]),
            v(&["-run-with", "user=nobody"]),
            v(&["-chroot", "/"]),
            v(&["-monitor", "stdio"]),
            v(&["-qmp", "tcp:0:4444"]),
            v(&["-mon", "chardev=x"]),
            v(&["-pidfile", "/tmp/x"]),
            v(&["-daemonize"]),
            v(&["-serial", "stdio"]),
            v(&["-chardev", "socket,id=mcq-qga,path=/tmp/x"]),
            v(&["-plugin", "/tmp/evil.so"]),
            v(&["-readconfig", "/tmp/x.cfg"]),
        ] {
            assert!(check_extra_args(&bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn an_option_is_not_hidden_as_the_value_of_one_that_takes_none() {
        // -usb takes no value in QEMU, so this opens the host device as hda; found by the
        // extra_args fuzz target.
        for bad in [
            v(&["-usb", "-hda", "/dev/sda"]),
            v(&["-preconfig", "--drive", "file=/dev/sda"]),
            v(&["-drive", "--daemonize"]),
        ] {
            assert!(check_extra_args(&bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn bare_words_named_keys_and_json_do_not_slip_through() {
        for bad in [
            v(&["/dev/sda"]),
            v(&["-name", "-x", "/dev/sda"]),
            v(&["-no-fd-bootchk", "-virtfs", "local,path=/"]),
            v(&["-win2k-hack", "-hda", "/dev/sda"]),
            v(&["-chardev", "backend=pipe,id=p,path=/tmp/p"]),
            v(&["-chardev", "id=p,backend=pipe,path=/tmp/p"]),
            v(&["-device", "id=f,driver=virtio-9p-pci,fsdev=f"]),
            v(&["-device", r#"{"id":"f","driver":"virtio-9p-pci"}"#]),
            v(&["-netdev", r#"{"type":"tap","id":"t","script":"/bin/evil"}"#]),
            v(&["-parallel", "pipe:/tmp/p"]),
            v(&["-gdb", "pipe:/tmp/p"]),
            v(&["-set", "chardev.mcq-serial.logfile=/etc/passwd"]),
            v(&["-set", "drive.d.file=/dev/sda"]),
        ] {
            assert!(check_extra_args(&bad).is_err(), "{bad:?} accepted");
        }
        let ok = v(&[
            "-usb",
            "-rtc",
            "base=utc",
            "-netdev",
            r#"{"type":"user","id":"n"}"#,
        ]);
        assert!(check_extra_args(&ok).is_ok());
    }

    #[test]
    fn allows_harmless_options() {
        let ok = v(&[
            "-device",
            "e1000,netdev=n2",
            "-netdev",
            "user,id=n2",
            "-S",
            "-rtc",
            "base=utc",
            "-drive",
            "file=/tmp/disk.img,if=none,id=d",
        ]);
        assert!(check_extra_args(&ok).is_ok());
    }

    #[test]
    fn forwards_parse_and_resolve() {
        assert_eq!(
            parse_forward("2222:22").unwrap(),
            PortSpec {
                addr: Ipv4Addr::LOCALHOST,
                host: Some(2222),
                guest: 22
            }
        );
        assert_eq!(parse_forward("22").unwrap().host, None);
        assert_eq!(parse_forward("auto:22").unwrap().host, None);
        assert_eq!(
            parse_forward("0.0.0.0:8080:80").unwrap().addr,
            Ipv4Addr::UNSPECIFIED
        );
        for bad in ["", "a:b", "0:22", "70000:22", "1:2:3:4", "host:1:2"] {
            assert!(parse_forward(bad).is_err(), "{bad}");
        }
        assert!(resolve_forwards(&v(&["2222:22", "2222:80"]))
            .unwrap_err()
            .to_string()
            .contains("twice"));
        let r = resolve_forwards(&v(&["auto:22", "auto:80", "22"])).unwrap();
        let hosts: HashSet<u16> = r.iter().map(|f| f.host).collect();
        assert_eq!(hosts.len(), 3);
        assert!(r.iter().all(|f| f.auto && f.addr == Ipv4Addr::LOCALHOST));
    }

    #[test]
    fn argv_keeps_commas_inside_one_value() {
        let spec = LaunchSpec {
            name: "vm".into(),
            machine: "q35".into(),
            accel: "tcg".into(),
            arch: "x86_64".into(),
            memory_mb: 128,
            cpus: 1,
            disks: vec![(PathBuf::from("/d/data,readonly=on.qcow2"), "qcow2".into())],
            ..Default::default()
        };
        let argv = build_argv(&spec);
        let drive = argv.iter().find(|a| a.starts_with("file=/d/")).unwrap();
        let parts = split_opts(drive);
        assert_eq!(parts[0], "file=/d/data,readonly=on.qcow2");
        assert!(!parts.iter().any(|p| p == "readonly=on"));
    }
}
