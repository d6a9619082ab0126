//! The `extra_args` policy: `check_extra_args` never panics, and whatever it accepts passes a
//! deliberately simple reference check written here (a subset of the real policy: denied
//! option names in any spelling, and drives naming a host device). Ok must imply the reference
//! finds nothing; the reverse is not required, the real policy denies more.
#![no_main]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use mcqemu::qemu::extra_args::check_extra_args;

/// Options the reference refuses outright.
const DENIED: &[&str] = &[
    "virtfs",
    "fsdev",
    "runas",
    "run-with",
    "chroot",
    "monitor",
    "qmp",
    "qmp-pretty",
    "mon",
    "pidfile",
    "daemonize",
    "serial",
    "readconfig",
    "plugin",
    "hda",
    "hdb",
    "hdc",
    "hdd",
    "cdrom",
    "fda",
    "fdb",
    "pflash",
    "mtdblock",
    "sd",
];

/// The reference: every argument starting with '-' is read as an option (`-opt`, `--opt`,
/// `-opt=value`), whatever came before it. Returns why it would refuse `args`.
fn reference_denies(args: &[String]) -> Option<String> {
    for (i, arg) in args.iter().enumerate() {
        let Some(rest) = arg.strip_prefix('-') else {
            continue;
        };
        let rest = rest.strip_prefix('-').unwrap_or(rest);
        let (name, inline) = match rest.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (rest, None),
        };
        // ASCII only, like QEMU's option table: a Unicode lowercase would map the Kelvin sign
        // to 'k' and call "-mtdbloc\u{212a}" an option QEMU has never heard of.
        let name = name.to_ascii_lowercase();
        if DENIED.contains(&name.as_str()) {
            return Some(format!("argument {i} ({arg:?}) is a denied option"));
        }
        if name == "drive" || name == "blockdev" {
            let value = inline.or(args.get(i + 1).map(String::as_str)).unwrap_or("");
            if value.to_ascii_lowercase().contains("/dev/") {
                return Some(format!(
                    "argument {i} ({arg:?}) reaches a host device through {value:?}"
                ));
            }
        }
    }
    None
}

/// Option names the structured generator draws from besides [`DENIED`]: drives, options that take a
/// value, options that take none (some of them missing from the policy's own flag list).
const EXTRA_OPTIONS: &[&str] = &[
    "drive",
    "blockdev",
    "device",
    "chardev",
    "netdev",
    "net",
    "nic",
    "incoming",
    "name",
    "append",
    "m",
    "rtc",
    "S",
    "s",
    "snapshot",
    "nographic",
    "enable-kvm",
    "usb",
    "no-fd-bootchk",
    "preconfig",
    "singlestep",
    "",
];

/// Values for the structured generator.
const VALUES: &[&str] = &[
    "/dev/sda",
    "file=/dev/sda,format=raw",
    "file=/DEV/sdb,if=none,id=d",
    "driver=host_device,filename=/dev/sda,node-name=x",
    "driver=file,filename=/tmp/x.img,node-name=f",
    "file=/tmp/disk.img,if=none,id=d",
    "stdio",
    "none",
    "user,id=n2",
    "e1000,netdev=n2",
    "socket,id=c,path=/tmp/c",
    "root=/dev/vda1 console=ttyS0",
    "1024",
    "-hda",
    "--drive",
    "-drive=file=/dev/sda",
    "",
];

fn value(u: &mut Unstructured) -> Result<String> {
    Ok(if u.ratio(3, 4)? {
        (*u.choose(VALUES)?).to_string()
    } else {
        u.arbitrary::<&str>()?.to_string()
    })
}

/// Builds an argv from choices: options in every spelling (`-opt`, `--opt`, `-opt=value`,
/// `-opt value`, upper or lower case), values, and bare words.
fn structured(u: &mut Unstructured) -> Result<Vec<String>> {
    let mut args = Vec::new();
    while !u.is_empty() && args.len() < 64 {
        if u.ratio(1, 6)? {
            args.push(value(u)?);
            continue;
        }
        let mut name = if u.ratio(7, 8)? {
            {
                let i = u.choose_index(DENIED.len() + EXTRA_OPTIONS.len())?;
                DENIED
                    .get(i)
                    .or_else(|| EXTRA_OPTIONS.get(i - DENIED.len()))
                    .copied()
                    .unwrap_or("")
                    .to_string()
            }
        } else {
            u.arbitrary::<&str>()?.to_string()
        };
        if u.ratio(1, 8)? {
            name = name.to_ascii_uppercase();
        }
        let dashes = if u.ratio(1, 4)? { "--" } else { "-" };
        match u.int_in_range(0..=2)? {
            0 => args.push(format!("{dashes}{name}")),
            1 => args.push(format!("{dashes}{name}={}", value(u)?)),
            _ => {
                args.push(format!("{dashes}{name}"));
                args.push(value(u)?);
            }
        }
    }
    Ok(args)
}

/// Splits raw text into arguments at NUL or newline.
fn raw(bytes: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(bytes)
        .split(['\0', '\n'])
        .map(str::to_string)
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let args = if mode & 1 == 0 {
        raw(rest)
    } else {
        match structured(&mut Unstructured::new(rest)) {
            Ok(a) => a,
            Err(_) => return,
        }
    };
    if check_extra_args(&args).is_ok() {
        if let Some(why) = reference_denies(&args) {
            panic!("check_extra_args accepted {args:?}, but {why}");
        }
    }
});
