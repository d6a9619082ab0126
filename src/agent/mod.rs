//! `mcqemu-agent`: mcqemu's own guest agent, a static program (std and libc only) that any
//! Linux root can carry. It speaks qemu-guest-agent's protocol on the same virtio-serial port,
//! so every host path works with it unchanged, and adds what qemu-ga cannot do (see
//! [`commands`]): output while a program runs, a working folder, an environment added to its
//! own. With no init in the root it is PID 1 too ([`init`]).
//!
//! - [`json`]: the JSON it reads and writes; [`reader`]: requests cut from the byte stream.
//! - [`commands`]: the commands; [`exec`] (with [`output`]), [`files`], [`system`]: what
//!   they act on.
//! - [`port`]: the virtio port and the serving loop; [`init`]: PID 1's set-up.
//! - [`copy`]: the guest's side of the data channel's copies (`mcqemu-agent copy-*`).
//! - [`mounts`]: the guest's side of host folders mounted into it (FUSE relays).
//! - [`modules`]: the kernel's modules in an image root, and `modprobe` for its autoloader.

pub mod commands;
pub mod copy;
pub mod exec;
pub mod files;
pub mod init;
pub mod json;
pub mod modules;
pub mod mounts;
pub mod output;
pub mod port;
pub mod reader;
pub mod root;
pub mod system;
pub mod uevents;

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

const USAGE: &str = "usage: mcqemu-agent [--port DEVICE] [--init]
  Serves the host's guest-agent channel (the virtio port org.qemu.guest_agent.0, found in
  /sys/class/virtio-ports unless --port names it). As PID 1 (or with --init) it also sets the
  guest up: file systems, modules, hostname, network, the power button.
       mcqemu-agent copy-out|copy-in|copy-free ARGS...
  The guest's side of one copy over mcqemu's data channel (started by the host).
       mcqemu-agent fs-relay PORT-NAME
  The guest's side of one host folder mounted into it (started by the host where the guest's
  agent is qemu-ga; mcqemu-agent relays every mount port itself).
       mcqemu-agent modprobe [-q] MODULE...   (also as a program named modprobe)
  Loads kernel modules and what they need from /lib/modules/RELEASE/modules.dep.";

/// The agent's entry point; its exit status (PID 1 never returns).
pub fn main(args: Vec<String>) -> i32 {
    let argv0 = std::env::args().next().unwrap_or_default();
    if let Some(code) = modules::main(&argv0, &args) {
        return code;
    }
    if let Some(code) = args.first().and_then(|c| copy::main(c, &args[1..])) {
        return code;
    }
    if let Some(code) = args.first().and_then(|c| mounts::main(c, &args[1..])) {
        return code;
    }
    let mut port: Option<PathBuf> = None;
    let mut force_init = false;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--port" => match it.next() {
                Some(p) => port = Some(PathBuf::from(p)),
                None => {
                    eprintln!("mcqemu-agent: --port needs a device path\n{USAGE}");
                    return 2;
                }
            },
            "--init" => force_init = true,
            "--version" => {
                eprintln!("{}", commands::VERSION);
                return 0;
            }
            "-h" | "--help" => {
                eprintln!("{USAGE}");
                return 0;
            }
            other => {
                eprintln!("mcqemu-agent: unknown argument {other:?}\n{USAGE}");
                return 2;
            }
        }
    }
    let is_init = std::process::id() == 1 || force_init;
    let (tx, rx) = mpsc::channel();
    if is_init {
        if std::env::var_os("PATH").is_none() {
            // Before any thread starts: the programs the host runs find their tools.
            std::env::set_var("PATH", init::PATH);
        }
        init::setup(tx);
    }
    mounts::watch();
    let mut agent = commands::Agent::new(is_init);
    eprintln!("mcqemu-agent: {} starting", commands::VERSION);
    let mut said = false;
    let mode = loop {
        if let Ok(m) = rx.try_recv() {
            break m;
        }
        let found = match &port {
            Some(p) => Some(p.clone()).filter(|p| p.exists()),
            None => port::find(port::PORT_NAME),
        };
        match found {
            Some(path) => {
                eprintln!("mcqemu-agent: serving {}", path.display());
                break port::serve(&path, &mut agent, &rx);
            }
            None => {
                if !said {
                    eprintln!(
                        "mcqemu-agent: waiting for the virtio port {} (is the VM's agent channel \
                         wired, and virtio_console loaded?)",
                        port::PORT_NAME
                    );
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    };
    eprintln!("mcqemu-agent: {mode:?} asked");
    if is_init {
        let why = system::end_as_init(mode, Duration::from_secs(3));
        eprintln!("mcqemu-agent: {why}");
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    shutdown_with_init(mode)
}

/// Asks the guest's own init to end the machine, as qemu-ga does; a root without a
/// shutdown program gets the kernel's reboot(2) directly.
fn shutdown_with_init(mode: system::Mode) -> i32 {
    let flag = match mode {
        system::Mode::Powerdown => "-P",
        system::Mode::Halt => "-H",
        system::Mode::Reboot => "-r",
    };
    for prog in ["/sbin/shutdown", "/usr/sbin/shutdown", "/bin/shutdown"] {
        if std::path::Path::new(prog).exists() {
            match std::process::Command::new(prog)
                .args([flag, "+0", "hypervisor initiated shutdown"])
                .status()
            {
                Ok(s) if s.success() => return 0,
                Ok(s) => eprintln!("mcqemu-agent: {prog} failed ({s})"),
                Err(e) => eprintln!("mcqemu-agent: cannot run {prog}: {e}"),
            }
        }
    }
    let why = system::halt(mode);
    eprintln!("mcqemu-agent: {why}");
    1
}
