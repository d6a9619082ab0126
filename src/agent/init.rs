//! The agent as a guest's PID 1, for a root with no init of its own: the kernel's file
//! systems mounted, the modules a root lists loaded, a hostname, the network QEMU's user
//! networking expects, the ACPI power button watched (stop_vm's graceful path, with no
//! acpid), and a start script run if the root has one. Orphans are reaped by the exec table
//! (it reaps every child when the agent is PID 1). Everything it does is logged to the console.

use std::ffi::CString;
use std::io::Read;
use std::path::Path;
use std::sync::mpsc::Sender;
use std::time::Duration;

use super::system::Mode;

/// Modules to load, one path of a `.ko` per line, in order.
pub const MODULES_LIST: &str = "/etc/mcqemu-agent/modules";
/// A program run once the guest is set up (in the background; a shell script needs a shell).
pub const START: &str = "/etc/mcqemu-agent/start";

fn log(msg: &str) {
    eprintln!("mcqemu-agent (init): {msg}");
}

/// Sets the guest up; `power` receives a message when the power button is pressed.
pub fn setup(power: Sender<Mode>) {
    mount_all(&[
        ("proc", "/proc", "proc", ""),
        ("sysfs", "/sys", "sysfs", ""),
        ("devtmpfs", "/dev", "devtmpfs", "mode=0755"),
    ]);
    load_modules();
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    if let Some(dev) = super::root::device(&cmdline) {
        match super::root::switch(dev) {
            Ok(()) => {
                log(&format!("root {dev} mounted and made /"));
                match super::root::grow(dev) {
                    Ok(Some(blocks)) => log(&format!("root grown to {blocks} blocks")),
                    Ok(None) => {}
                    Err(e) => log(&format!("cannot grow the root: {e}")),
                }
            }
            Err(e) => log(&format!("cannot make {dev} the root: {e}")),
        }
    }
    mount_all(&[
        (
            "devpts",
            "/dev/pts",
            "devpts",
            "gid=5,mode=620,ptmxmode=666",
        ),
        ("tmpfs", "/dev/shm", "tmpfs", "mode=1777"),
        ("tmpfs", "/tmp", "tmpfs", "mode=1777"),
        ("tmpfs", "/run", "tmpfs", "mode=0755"),
    ]);
    super::modules::setup(&cmdline);
    if let Err(e) = super::root::apply() {
        log(&format!("the image's config: {e}"));
    }
    set_hostname();
    network();
    watch_power_button(power);
    if Path::new(START).exists() {
        run_start();
    }
}

fn mount_all(list: &[(&str, &str, &str, &str)]) {
    for (what, target, fstype, data) in list {
        if let Err(e) = mount(what, target, fstype, data) {
            log(&format!("mount {target} ({fstype}): {e}"));
        }
    }
}

/// The PATH a program started by PID 1 gets (the kernel hands init none).
pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Runs the root's start script to its end (it starts its services in the background), at
/// most [`START_BOUND`]: the host is served once the guest is set up.
fn run_start() {
    let mut child = match std::process::Command::new(START).env("PATH", PATH).spawn() {
        Ok(c) => c,
        Err(e) => return log(&format!("cannot start {START}: {e}")),
    };
    let deadline = std::time::Instant::now() + START_BOUND;
    loop {
        match child.try_wait() {
            Ok(Some(st)) if st.success() => return,
            Ok(Some(st)) => return log(&format!("{START} failed ({st})")),
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Ok(None) => {
                return log(&format!(
                    "{START} still runs after {START_BOUND:?}; serving"
                ))
            }
            Err(e) => return log(&format!("{START}: {e}")),
        }
    }
}

/// Longest wait for the start script.
const START_BOUND: Duration = Duration::from_secs(30);

fn mount(what: &str, target: &str, fstype: &str, data: &str) -> Result<(), String> {
    let _ = std::fs::create_dir_all(target);
    let c = |s: &str| CString::new(s).map_err(|e| e.to_string());
    let (w, t, f, d) = (c(what)?, c(target)?, c(fstype)?, c(data)?);
    // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
    let r = unsafe {
        libc::mount(
            w.as_ptr(),
            t.as_ptr(),
            f.as_ptr(),
            libc::MS_NOSUID,
            d.as_ptr().cast(),
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    // Already mounted (the kernel mounts devtmpfs itself with CONFIG_DEVTMPFS_MOUNT).
    if e.raw_os_error() == Some(libc::EBUSY) {
        Ok(())
    } else {
        Err(e.to_string())
    }
}

fn load_modules() {
    let Ok(list) = std::fs::read_to_string(MODULES_LIST) else {
        return;
    };
    for path in list
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let Ok(f) = std::fs::File::open(path) else {
            log(&format!("module {path} is missing"));
            continue;
        };
        use std::os::unix::io::AsRawFd;
        let params = c"";
        // SAFETY: finit_module with an open module file and an empty parameter string.
        let r = unsafe { libc::syscall(libc::SYS_finit_module, f.as_raw_fd(), params.as_ptr(), 0) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                log(&format!("module {path}: {e}"));
            }
        }
    }
}

/// The hostname: `mcqemu.hostname=` on the kernel command line, else /etc/hostname, else
/// "mcqemu".
fn set_hostname() {
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let name = cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix("mcqemu.hostname="))
        .map(str::to_string)
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .filter(|n| !n.is_empty() && n.len() <= 64)
        .unwrap_or_else(|| "mcqemu".into());
    // SAFETY: sethostname with a valid buffer and its length.
    if unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) } != 0 {
        log(&format!(
            "hostname {name}: {}",
            std::io::Error::last_os_error()
        ));
    }
}

/// lo up; eth0, when there is one, up with QEMU user networking's guest address (10.0.2.15/24,
/// gateway 10.0.2.2, DNS 10.0.2.3).
fn network() {
    let Some(sock) = Sock::new() else {
        log("no socket for network set-up");
        return;
    };
    if let Err(e) = sock.up("lo") {
        log(&format!("lo: {e}"));
    }
    if !Path::new("/sys/class/net/eth0").exists() {
        return;
    }
    let steps = sock
        .up("eth0")
        .and_then(|_| sock.address("eth0", [10, 0, 2, 15], [255, 255, 255, 0]))
        .and_then(|_| sock.default_route([10, 0, 2, 2]));
    match steps {
        Ok(()) => log("eth0 up: 10.0.2.15/24 via 10.0.2.2"),
        Err(e) => log(&format!("eth0: {e}")),
    }
    if !Path::new("/etc/resolv.conf").exists() {
        let _ = std::fs::write("/etc/resolv.conf", "nameserver 10.0.2.3\n");
    }
}

struct Sock(libc::c_int);

impl Drop for Sock {
    fn drop(&mut self) {
        // SAFETY: closing the socket this struct owns.
        unsafe { libc::close(self.0) };
    }
}

fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain data; all zeroes is a valid value.
    let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in r
        .ifr_name
        .iter_mut()
        .zip(name.bytes().take(libc::IFNAMSIZ - 1))
    {
        *d = s as libc::c_char;
    }
    r
}

fn sockaddr_in(ip: [u8; 4]) -> libc::sockaddr {
    let a = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size; the bytes are a valid sockaddr.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(a) }
}

impl Sock {
    fn new() -> Option<Sock> {
        // SAFETY: socket(2) with constant arguments.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        (fd >= 0).then_some(Sock(fd))
    }

    fn ioctl(&self, req: libc::c_ulong, arg: *mut libc::c_void, what: &str) -> Result<(), String> {
        // SAFETY: the caller passes a pointer to the struct this request takes.
        if unsafe { libc::ioctl(self.0, req as _, arg) } == 0 {
            Ok(())
        } else {
            Err(format!("{what}: {}", std::io::Error::last_os_error()))
        }
    }

    fn up(&self, name: &str) -> Result<(), String> {
        let mut r = ifreq(name);
        self.ioctl(
            libc::SIOCGIFFLAGS,
            (&mut r as *mut libc::ifreq).cast(),
            "get flags",
        )?;
        // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
        unsafe { r.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
        self.ioctl(
            libc::SIOCSIFFLAGS,
            (&mut r as *mut libc::ifreq).cast(),
            "set up",
        )
    }

    fn address(&self, name: &str, ip: [u8; 4], mask: [u8; 4]) -> Result<(), String> {
        let mut r = ifreq(name);
        r.ifr_ifru.ifru_addr = sockaddr_in(ip);
        self.ioctl(
            libc::SIOCSIFADDR,
            (&mut r as *mut libc::ifreq).cast(),
            "set address",
        )?;
        let mut r = ifreq(name);
        r.ifr_ifru.ifru_netmask = sockaddr_in(mask);
        self.ioctl(
            libc::SIOCSIFNETMASK,
            (&mut r as *mut libc::ifreq).cast(),
            "set netmask",
        )
    }

    fn default_route(&self, gw: [u8; 4]) -> Result<(), String> {
        // SAFETY: rtentry is plain data; all zeroes is a valid value.
        let mut rt: libc::rtentry = unsafe { std::mem::zeroed() };
        rt.rt_dst = sockaddr_in([0, 0, 0, 0]);
        rt.rt_genmask = sockaddr_in([0, 0, 0, 0]);
        rt.rt_gateway = sockaddr_in(gw);
        rt.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
        self.ioctl(
            libc::SIOCADDRT,
            (&mut rt as *mut libc::rtentry).cast(),
            "add route",
        )
    }
}

/// Watches every input device named like a power button (ACPI's "Power Button", the virt
/// board's gpio-keys) for KEY_POWER and sends a power-off on the press.
fn watch_power_button(power: Sender<Mode>) {
    std::thread::spawn(move || {
        // The button's driver may come up after init starts: look for a while.
        for _ in 0..50 {
            let nodes = power_nodes();
            if !nodes.is_empty() {
                for node in nodes {
                    let tx = power.clone();
                    std::thread::spawn(move || read_power(&node, tx));
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        log("no power button found: stop_vm will need force");
    });
}

fn power_nodes() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/sys/class/input") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("event"))
        .filter(|e| {
            let name = std::fs::read_to_string(e.path().join("device/name")).unwrap_or_default();
            let n = name.to_ascii_lowercase();
            n.contains("power button") || n.contains("gpio-keys") || n.contains("gpio_keys")
        })
        .map(|e| format!("/dev/input/{}", e.file_name().to_string_lossy()))
        .collect()
}

/// input_event records of 64-bit guests: 16 bytes of time, then type, code and value.
fn read_power(node: &str, power: Sender<Mode>) {
    const EV_KEY: u16 = 1;
    const KEY_POWER: u16 = 116;
    let Ok(mut f) = std::fs::File::open(node) else {
        log(&format!("cannot open {node}"));
        return;
    };
    log(&format!("watching {node} for the power button"));
    let mut rec = [0u8; 24];
    while f.read_exact(&mut rec).is_ok() {
        let ty = u16::from_ne_bytes([rec[16], rec[17]]);
        let code = u16::from_ne_bytes([rec[18], rec[19]]);
        let value = i32::from_ne_bytes([rec[20], rec[21], rec[22], rec[23]]);
        if ty == EV_KEY && code == KEY_POWER && value == 1 {
            log("power button pressed: powering off");
            let _ = power.send(Mode::Powerdown);
        }
    }
}
