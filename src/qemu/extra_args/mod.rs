//! The `extra_args` policy: what an operator may add to a QEMU command line, checked for
//! every spelling QEMU accepts.

mod options;

use super::cmdline::{qopt, split_opts};
use crate::state::roots::Access;
use options::{
    CHARDEV_SPEC_OPTS, DENIED, DRIVE_OPTS, FILE_KEYS, FLAG_OPTS, HOST_PROGRAM_KEYS, READ_FILE_OPTS,
    TEXT_KEYS, TEXT_OPTS, WRITE_FILE_OPTS,
};

/// True for a value QEMU might open as a host path: with a `/`, or `.`/`..`/`~` forms (a
/// relative name resolves against QEMU's working folder).
fn looks_like_path(v: &str) -> bool {
    let v = v.trim();
    v.contains('/') || v == "." || v == ".." || v.starts_with('~')
}

/// True when an option's value names a file through a key this policy knows.
fn has_file_key(value: &str) -> bool {
    split_opts(value).iter().any(|p| {
        p.split_once('=')
            .is_some_and(|(k, _)| FILE_KEYS.contains(&k.trim().to_ascii_lowercase().as_str()))
    })
}

/// True when `opt`'s `key` names a file QEMU only reads.
fn reads_only(opt: &str, key: &str, value: &str) -> bool {
    matches!(
        key,
        "romfile" | "dtb" | "data" | "dir" | "x509-dir" | "tftp"
    ) || matches!(opt, "fw_cfg" | "acpitable" | "smbios")
        || (opt == "object" && implied(value, "qom-type").iter().any(|t| t == "secret"))
        || (opt == "device" && implied(value, "driver").iter().any(|d| d == "loader"))
        || ((opt == "drive" || opt == "blockdev")
            && (has_key_value(value, "readonly", |v| matches!(v, "on" | "true" | "yes"))
                || has_key_value(value, "read-only", |v| matches!(v, "on" | "true" | "yes"))))
}

/// A host file an `extra_args` option names: the caller checks it against the roots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFile {
    /// The option, without dashes.
    pub opt: String,
    /// The path as written (QEMU resolves a relative one against its working folder).
    pub path: String,
    /// Whether QEMU reads or writes it.
    pub access: Access,
    /// For a `-drive` image: the format it is opened as (always given: never probed).
    pub image_format: Option<String>,
}

/// Why `extra_args` were refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgsError {
    /// A bare argument, which QEMU opens as a hard disk image.
    Bare(String),
    /// A value with a `/` that the policy cannot read as a host file or as text.
    UnknownPath {
        /// The option, without dashes.
        opt: String,
        /// The `key=value` (or bare value) in question.
        part: String,
    },
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
            ArgsError::UnknownPath { opt, part } => write!(
                f,
                "extra_args: -{opt} {part:?} may name a host file, and this policy cannot tell \
                 which; name host files with a key it knows (file=, path=, filename=, \
                 mem-path=, ...) so they can be checked against the roots"
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
/// Returns every host file the options name, for the caller to check against the roots.
pub fn check_extra_args(args: &[String]) -> Result<Vec<HostFile>, ArgsError> {
    let mut files = Vec::new();
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
                    check_option_value(vopt, vvalue, &mut files)?;
                }
                v
            }
        };
        check_option_value(opt, &value, &mut files)?;
    }
    Ok(files)
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

/// Checks one option (`opt` as spelled: QEMU's options are case-sensitive, `-D` is not `-d`)
/// and collects the host files it names.
fn check_option_value(opt: &str, value: &str, files: &mut Vec<HostFile>) -> Result<(), ArgsError> {
    let spelled = opt;
    let opt_lower = opt.to_ascii_lowercase();
    let opt = opt_lower.as_str();
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
        "audiodev" if has_key_value(value, "id", |v| v.starts_with("mcq-")) => {
            return Err(denied("the mcq- audiodev ids belong to mcqemu", opt));
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
    // Last, so an option the policy denies outright says why, not merely that it names a path.
    collect_files(spelled, value, files)
}

/// Finds the host files an option's value names; a `/` anywhere this policy cannot read as a
/// file or as text is refused, since QEMU might open it.
fn collect_files(opt: &str, value: &str, files: &mut Vec<HostFile>) -> Result<(), ArgsError> {
    let drive_format = (opt == "drive").then(|| {
        split_opts(value).into_iter().find_map(|p| {
            p.split_once('=')
                .filter(|(k, _)| k.trim().eq_ignore_ascii_case("format"))
                .map(|(_, f)| f.trim().to_string())
        })
    });
    if opt == "drive" && has_file_key(value) && drive_format.as_ref().is_some_and(Option::is_none) {
        return Err(denied(
            "a -drive image needs an explicit format= (a probed format lets a guest choose \
             how its own disk is read)",
            opt,
        ));
    }
    if opt == "blockdev" && has_file_key(value) {
        return Err(denied(
            "-blockdev file nodes cannot be checked as images here; attach images with the \
             disks parameter or -drive file=...,format=...",
            opt,
        ));
    }
    let mut add = |path: &str, access| {
        if !path.trim().starts_with('/') {
            return Err(denied(
                "host paths in extra_args must be absolute (a relative one would resolve \
                 against the server's working folder)",
                opt,
            ));
        }
        files.push(HostFile {
            opt: opt.to_string(),
            path: path.to_string(),
            access,
            image_format: drive_format.clone().flatten(),
        });
        Ok(())
    };
    if READ_FILE_OPTS.contains(&opt) {
        return add(value, Access::Read);
    }
    if WRITE_FILE_OPTS.contains(&opt) {
        return add(value, Access::Write);
    }
    if TEXT_OPTS.contains(&opt) {
        return Ok(());
    }
    if opt == "incoming" && value.contains('/') {
        return Err(denied("migration streams from host files or sockets", opt));
    }
    for part in split_opts(value) {
        let Some((key, v)) = part.split_once('=') else {
            if part.contains('/') {
                return Err(ArgsError::UnknownPath {
                    opt: opt.to_string(),
                    part: part.clone(),
                });
            }
            continue;
        };
        let key = key.trim().to_ascii_lowercase();
        if FILE_KEYS.contains(&key.as_str()) {
            let access = if reads_only(opt, &key, value) {
                Access::Read
            } else {
                Access::Write
            };
            add(v, access)?;
        } else if HOST_PROGRAM_KEYS.contains(&key.as_str()) {
            return Err(denied("runs a host program (smbd)", opt));
        } else if looks_like_path(v) && !TEXT_KEYS.contains(&key.as_str()) {
            return Err(ArgsError::UnknownPath {
                opt: opt.to_string(),
                part: part.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
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
            v(&["-audiodev", "none,id=mcq-audio"]),
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
            "file=/tmp/disk.img,format=raw,if=none,id=d",
            "-audiodev",
            "none,id=snd",
        ]);
        assert!(check_extra_args(&ok).is_ok());
    }

    #[test]
    fn drives_need_a_format_and_relative_host_paths_are_refused() {
        for bad in [
            v(&["-drive", "file=/tmp/disk.img,if=virtio"]),
            v(&["-blockdev", "driver=file,filename=/tmp/x,node-name=f"]),
            v(&["-netdev", "user,id=n9,tftp=."]),
            v(&["-netdev", "user,id=n9,smb=/tmp"]),
            v(&["-device", "virtio-net-pci,romfile=..,netdev=n"]),
            v(&["-object", "secret,id=s,keyid=~"]),
        ] {
            assert!(check_extra_args(&bad).is_err(), "{bad:?}");
        }
        let files = check_extra_args(&v(&["-drive", "file=/tmp/d.qcow2,format=qcow2,if=virtio"]));
        let format = files
            .ok()
            .and_then(|f| f.first().and_then(|h| h.image_format.clone()));
        assert_eq!(format.as_deref(), Some("qcow2"));
    }
}
