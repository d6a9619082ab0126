//! The guest's side of host folders mounted into it: for each virtio port named
//! [`PORT_PREFIX`]N, a relay says hello to the host's file server (`mcqemu fs-serve`), mounts
//! FUSE where the host says, and passes requests from `/dev/fuse` to the port and replies back
//! unchanged. The host answers them all, so the guest needs only fuse.ko.
//!
//! mcqemu-agent runs a relay for every such port it finds (at start and at each of the
//! kernel's port events); with qemu-ga in the guest the host starts `mcqemu-agent fs-relay
//! PORT` itself. A host that goes away (the mount removed, its server ended) unmounts the
//! folder (lazily: programs inside it get errors, never a hang), and the relay waits for the
//! host to come back.

use std::collections::HashSet;
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::Duration;

/// The ports' names: the host's `qemu::cmdline::MOUNT_PORT_PREFIX`.
pub const PORT_PREFIX: &str = "org.mcqemu.fs.";
/// The host's `fuse::helper::HELLO`.
const HELLO: &str = "MCQFS relay 1";
/// The largest reply (a 1 MiB read and its header) and request buffer.
const MAX_MESSAGE: usize = (1 << 20) + 8192;
/// How often the agent looks for ports plugged in when the kernel's device events cannot be
/// followed; with them, a look is made at each port event and this often besides.
const SCAN_EVERY: Duration = Duration::from_millis(500);
/// The look made besides the events: a safety net, should one ever be lost.
const SCAN_ANYWAY: Duration = Duration::from_secs(10);

fn log(msg: &str) {
    eprintln!("mcqemu-agent: mount: {msg}");
}

/// Starts a thread that relays every mount port, now and as they are plugged in: a port's
/// own events (it is added, then named) say which port to look at, so a mount hot-plugged
/// into a running guest costs no poll and no look at the other ports (each read of sysfs is
/// code a clone's TCG translates afresh: a full look took 23 ms in a fresh clone, one port's
/// name 1 ms). Every port is looked at when the agent starts, and again when no event came
/// for a while.
pub fn watch() {
    let _ = std::thread::Builder::new()
        .name("mount-scan".into())
        .spawn(|| {
            // Subscribed before the first look: a port plugged in between is not missed.
            let events = super::uevents::Uevents::open();
            let _ = SPARE.get_or_init(|| Mutex::new(Some(spare_relay())));
            scan();
            loop {
                match &events {
                    Some(e) => match e.wait(SCAN_ANYWAY, "virtio-ports") {
                        Some(ports) => ports.iter().for_each(|p| consider(p)),
                        None => scan(),
                    },
                    None => {
                        std::thread::sleep(SCAN_EVERY);
                        scan();
                    }
                }
            }
        });
}

/// Starts a relay for every mount port without one.
fn scan() {
    let Ok(entries) = std::fs::read_dir("/sys/class/virtio-ports") else {
        return;
    };
    for e in entries.flatten() {
        consider(&e.file_name().to_string_lossy());
    }
}

/// Starts a relay for port `dev` (`vport1p3`) when it is a mount port without one (a port not
/// named yet is looked at again when its name comes).
fn consider(dev: &str) {
    static RELAYED: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    let name = std::fs::read_to_string(Path::new("/sys/class/virtio-ports").join(dev).join("name"))
        .unwrap_or_default();
    if !name.trim().starts_with(PORT_PREFIX) {
        return;
    }
    let dev = PathBuf::from("/dev").join(dev);
    let mut set = RELAYED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if !set.insert(dev.clone()) {
        return;
    }
    drop(set);
    let name = name.trim().to_string();
    let job = move || {
        if let Err(e) = relay(&dev) {
            log(&format!("{name}: {e}"));
        }
        if let Some(s) = RELAYED.get() {
            s.lock().unwrap_or_else(|p| p.into_inner()).remove(&dev);
        }
    };
    // The relay thread started with the agent takes the first port (in a clone it was
    // started in the template, so the clone's first mount spends nothing on starting one);
    // later ports get a thread of their own.
    let spare = SPARE
        .get()
        .and_then(|s| s.lock().unwrap_or_else(|p| p.into_inner()).take());
    let job: Job = Box::new(job);
    let job = match spare {
        Some(tx) => match tx.send(job) {
            Ok(()) => return,
            Err(mpsc::SendError(job)) => job,
        },
        None => job,
    };
    let _ = std::thread::Builder::new()
        .name("mount-relay".into())
        .spawn(job);
}

/// A relay's work, handed to a thread that waits for it.
type Job = Box<dyn FnOnce() + Send>;

/// The thread waiting for the first port's relay.
static SPARE: OnceLock<Mutex<Option<mpsc::Sender<Job>>>> = OnceLock::new();

/// A thread that runs the one job it is sent (a dropped sender ends it).
fn spare_relay() -> mpsc::Sender<Job> {
    let (tx, rx) = mpsc::channel::<Job>();
    let _ = std::thread::Builder::new()
        .name("mount-relay".into())
        .spawn(move || {
            if let Ok(job) = rx.recv() {
                job();
            }
        });
    tx
}

/// `mcqemu-agent fs-relay PORT`: one port's relay, for guests whose agent is qemu-ga.
pub fn main(cmd: &str, args: &[String]) -> Option<i32> {
    if cmd != "fs-relay" {
        return None;
    }
    let Some(name) = args.first() else {
        eprintln!("usage: mcqemu-agent fs-relay PORT-NAME");
        return Some(2);
    };
    let Some(dev) = super::port::find(name) else {
        eprintln!("mcqemu-agent: no virtio port named {name}");
        return Some(3);
    };
    Some(match relay(&dev) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("mcqemu-agent: {name}: {e}");
            1
        }
    })
}

/// Relays port `dev` for as long as it exists: hello, mount, pass messages, and again after
/// the host comes back. Ends when the port is unplugged (or held by another relay).
fn relay(dev: &Path) -> io::Result<()> {
    let port = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(dev)?;
    relay_on(port)
}

/// The relay on an open port (or, in tests, one end of a socket pair).
pub fn relay_on(mut port: File) -> io::Result<()> {
    loop {
        // Blocks until the host's server is connected. A hello the host did not answer
        // within ANSWER_WAIT (lost in a stream that had lost its place) is said again.
        writeln!(port, "{HELLO}")?;
        let Some(line) = wait_mount_line(&mut port)? else {
            continue;
        };
        let Some((writable, path)) = parse_mount(&line) else {
            writeln!(port, "MCQFS error cannot read {line:?}")?;
            continue;
        };
        let fuse = match mount(&path, writable) {
            Ok(f) => f,
            Err(e) => {
                writeln!(port, "MCQFS error {}", e.to_string().replace('\n', " "))?;
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        // Files show as the image's user where the root names one (so that user can write a
        // writable mount), else as root.
        let (uid, gid) = super::root::user().unwrap_or((0, 0));
        writeln!(port, "MCQFS ok {uid} {gid}")?;
        log(&format!(
            "{} mounted ({})",
            path,
            if writable { "rw" } else { "ro" }
        ));
        let r = pass(&mut port, fuse, &path);
        log(&format!(
            "{path} unmounted ({})",
            r.as_ref()
                .err()
                .map_or("the host left".to_string(), |e| e.to_string())
        ));
        if let Err(e) = r {
            if e.raw_os_error() == Some(libc::ENODEV) {
                return Ok(());
            }
        }
    }
}

/// How long the relay waits for the host to answer its hello before saying it again.
const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// Waits (up to [`ANSWER_WAIT`]) for the host's `MCQFS mount` line, skipping any other; None
/// when none came or the host left.
fn wait_mount_line(port: &mut File) -> io::Result<Option<String>> {
    let deadline = std::time::Instant::now() + ANSWER_WAIT;
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || !readable(port, left.as_millis().min(200) as i32 + 1) {
            if left.is_zero() {
                return Ok(None);
            }
            continue;
        }
        if port.read(&mut b)? == 0 {
            // The host is not connected.
            std::thread::sleep(Duration::from_millis(100));
            return Ok(None);
        }
        if b[0] != b'\n' {
            if line.len() < 4200 {
                line.push(b[0]);
            }
            continue;
        }
        let text = String::from_utf8_lossy(&line).trim_end().to_string();
        line.clear();
        if text.starts_with("MCQFS mount ") {
            return Ok(Some(text));
        }
    }
}

/// Polls `f` for input (or a hang-up) for up to `ms` milliseconds.
fn readable(f: &File, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd: f.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

/// `MCQFS mount ro|rw PATH`: (writable, path).
fn parse_mount(line: &str) -> Option<(bool, String)> {
    let rest = line.strip_prefix("MCQFS mount ")?;
    let (mode, path) = rest.split_once(' ')?;
    let writable = match mode {
        "rw" => true,
        "ro" => false,
        _ => return None,
    };
    (path.starts_with('/') && path.len() > 1).then(|| (writable, path.to_string()))
}

/// Loads fuse.ko if the kernel has no `/dev/fuse` yet: the test guest's flat module folder,
/// the running kernel's tree, then modprobe.
fn load_fuse() {
    if Path::new("/sys/module/fuse").exists() || Path::new("/dev/fuse").exists() {
        return;
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let tree = format!("/lib/modules/{}/kernel/fs/fuse/fuse.ko", release.trim());
    for p in ["/lib/modules/fuse.ko", tree.as_str()] {
        if let Ok(f) = File::open(p) {
            // SAFETY: finit_module with an open module file and an empty parameter string.
            unsafe { libc::syscall(libc::SYS_finit_module, f.as_raw_fd(), c"".as_ptr(), 0) };
        }
    }
    if !Path::new("/sys/module/fuse").exists() {
        let _ = std::process::Command::new("modprobe")
            .arg("fuse")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// `/dev/fuse`, made from sysfs's numbers where no devtmpfs or udev made it.
fn open_fuse() -> io::Result<File> {
    load_fuse();
    if !Path::new("/dev/fuse").exists() {
        // SAFETY: a NUL-terminated path; makedev(10, 229) is the fuse device's fixed number.
        unsafe {
            libc::mknod(
                c"/dev/fuse".as_ptr(),
                libc::S_IFCHR | 0o666,
                libc::makedev(10, 229),
            )
        };
    }
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/fuse")
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot open /dev/fuse ({e}): the guest's kernel needs fuse.ko"),
            )
        })
}

/// Mounts FUSE at `path` (made if missing); the device's descriptor serves it.
fn mount(path: &str, writable: bool) -> io::Result<File> {
    std::fs::create_dir_all(path)?;
    let fuse = open_fuse()?;
    let opts = format!(
        "fd={},rootmode=40000,user_id=0,group_id=0,default_permissions,allow_other,max_read={}",
        fuse.as_raw_fd(),
        1 << 20
    );
    let cstr = |s: &str| CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL));
    let (src, target, kind, data) = (
        cstr("mcqemu")?,
        cstr(path)?,
        cstr("fuse.mcqemu")?,
        cstr(&opts)?,
    );
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
    if !writable {
        flags |= libc::MS_RDONLY;
    }
    // SAFETY: NUL-terminated strings alive for the call.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            kind.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("mount {path}: {e}")));
    }
    Ok(fuse)
}

fn unmount(path: &str) {
    if let Ok(p) = CString::new(path) {
        // SAFETY: a NUL-terminated path.
        unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Passes messages both ways until the host goes away (Ok), the port fails, or the share is
/// unmounted in the guest; then unmounts it (lazily: programs inside get errors, never a hang).
/// Either direction ending stops the other.
fn pass(port: &mut File, fuse: File, path: &str) -> io::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let up = {
        let (mut to_host, fuse, stop) = (port.try_clone()?, fuse.try_clone()?, stop.clone());
        std::thread::Builder::new()
            .name("mount-up".into())
            .spawn(move || {
                requests(&fuse, &mut to_host, &stop);
                stop.store(true, Ordering::Relaxed);
            })?
    };
    let r = replies(port, &fuse, &stop);
    stop.store(true, Ordering::Relaxed);
    unmount(path);
    let _ = up.join();
    drop(fuse); // the last descriptor: the kernel ends the connection
    r
}

/// The kernel's requests to the host, until `stop` or the share is unmounted.
fn requests(fuse: &File, to_host: &mut File, stop: &AtomicBool) {
    let mut buf = vec![0u8; MAX_MESSAGE];
    while !stop.load(Ordering::Relaxed) {
        if !readable(fuse, 200) {
            continue;
        }
        // SAFETY: reads into our buffer, at most its length.
        let n = unsafe { libc::read(fuse.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::ENOENT) => continue,
                _ => return, // ENODEV: unmounted
            }
        }
        if n == 0 || write_all_until(to_host, &buf[..n as usize], stop).is_err() {
            return;
        }
    }
}

/// Writes all of `data` to the port, giving up once `stop` is set (a port whose host left
/// blocks writers).
fn write_all_until(f: &mut File, mut data: &[u8], stop: &AtomicBool) -> io::Result<()> {
    while !data.is_empty() {
        if stop.load(Ordering::Relaxed) {
            return Err(io::ErrorKind::Interrupted.into());
        }
        let mut p = libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, 200) } <= 0 || p.revents & libc::POLLOUT == 0 {
            continue;
        }
        match f.write(data) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The host's replies to the kernel, each written whole; Ok at the host's end of file or
/// once `stop` is set.
fn replies(port: &mut File, fuse: &File, stop: &AtomicBool) -> io::Result<()> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        if !fill(port, &mut buf[..16], stop)? {
            return Ok(());
        }
        let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if !(16..=MAX_MESSAGE).contains(&len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a reply of {len} bytes"),
            ));
        }
        if !fill(port, &mut buf[16..len], stop)? {
            return Ok(());
        }
        // SAFETY: writes one whole reply from our buffer.
        let n = unsafe { libc::write(fuse.as_raw_fd(), buf.as_ptr().cast(), len) };
        if n < 0 {
            let e = io::Error::last_os_error();
            // ENOENT: the request was interrupted and is gone; the others end the mount.
            if e.raw_os_error() != Some(libc::ENOENT) {
                return Err(e);
            }
        }
    }
}

/// Fills `buf` from the port; false at an end of file (the host left) or once `stop` is set.
fn fill(port: &mut File, buf: &mut [u8], stop: &AtomicBool) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        if stop.load(Ordering::Relaxed) {
            return Ok(false);
        }
        if !readable(port, 200) {
            continue;
        }
        match port.read(&mut buf[got..]) {
            Ok(0) => return Ok(false),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_and_words_are_the_hosts() {
        assert_eq!(PORT_PREFIX, crate::qemu::cmdline::MOUNT_PORT_PREFIX);
        assert_eq!(HELLO, crate::fuse::helper::HELLO);
    }

    #[test]
    fn mount_lines_are_read_strictly() {
        assert_eq!(
            parse_mount("MCQFS mount ro /src dir"),
            Some((false, "/src dir".into()))
        );
        assert_eq!(parse_mount("MCQFS mount rw /w"), Some((true, "/w".into())));
        for bad in [
            "MCQFS mount xx /a",
            "MCQFS mount ro rel",
            "MCQFS mount ro /",
            "junk",
        ] {
            assert_eq!(parse_mount(bad), None, "{bad}");
        }
    }
}
