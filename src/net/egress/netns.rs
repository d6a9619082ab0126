//! The empty network a VM with egress rules runs in: the proxy process makes a user namespace
//! of its own (no privilege needed), one thread of it a network namespace holding only `lo`,
//! and QEMU joins both before it executes. QEMU's user networking can then reach nothing but
//! that loopback, where the proxy listens; the proxy's other threads stay in the host's network
//! and connect to what the rules allow.

use crate::kind::Failed;
use std::fs::File;
use std::os::fd::AsRawFd;

/// Enters a new user namespace, the whole process (it must still be single-threaded), mapping
/// this user and group to themselves: files keep their owners, and a program executed inside
/// as a non-root user keeps no capabilities.
pub fn enter_user_namespace() -> Result<(), Failed> {
    // SAFETY: plain syscalls without pointers.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    // SAFETY: unshare takes flags only.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER) } != 0 {
        return Err(Failed::host(format!(
            "cannot make a user namespace ({}); unprivileged user namespaces must be allowed \
             (sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 also \
             kernel.apparmor_restrict_unprivileged_userns=0)",
            std::io::Error::last_os_error()
        )));
    }
    let write = |file: &str, text: String| {
        std::fs::write(format!("/proc/self/{file}"), text)
            .map_err(|e| Failed::host(format!("cannot write /proc/self/{file}: {e}")))
    };
    write("setgroups", "deny".into())?;
    write("uid_map", format!("{uid} {uid} 1"))?;
    write("gid_map", format!("{gid} {gid} 1"))
}

/// Moves the calling thread into a new network namespace and brings its loopback up.
pub fn enter_net_namespace() -> Result<(), Failed> {
    // SAFETY: unshare takes flags only; it moves this thread alone.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(Failed::host(format!(
            "cannot make a network namespace: {}",
            std::io::Error::last_os_error()
        )));
    }
    loopback_up()
}

/// The `struct ifreq` SIOCSIFFLAGS takes: a name and the flags (40 bytes on Linux).
#[repr(C)]
struct IfFlags {
    name: [u8; 16],
    flags: libc::c_short,
    pad: [u8; 22],
}

fn loopback_up() -> Result<(), Failed> {
    // SAFETY: socket(2) with constant arguments; the fd is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Failed::host(format!(
            "socket: {}",
            std::io::Error::last_os_error()
        )));
    }
    let mut req = IfFlags {
        name: [0; 16],
        flags: (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short,
        pad: [0; 22],
    };
    req.name[..2].copy_from_slice(b"lo");
    // The request's type is c_ulong in glibc and c_int in musl: `as _` fits either.
    // SAFETY: SIOCSIFFLAGS reads a struct ifreq, which `req` lays out; fd is ours.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCSIFFLAGS as _, &mut req as *mut IfFlags) };
    let err = std::io::Error::last_os_error();
    // SAFETY: closing the fd opened above.
    unsafe { libc::close(fd) };
    if rc != 0 {
        return Err(Failed::host(format!(
            "cannot bring lo up in the VM's network: {err}"
        )));
    }
    Ok(())
}

/// Drops every capability of the calling thread (those its user namespace gave it) and sets
/// no_new_privs: what the proxy keeps afterwards is an ordinary user's rights.
pub fn drop_privileges() -> Result<(), Failed> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let hdr = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset(2) reads the header and two data structs, laid out as the kernel's v3.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &hdr as *const Header, data.as_ptr()) };
    // SAFETY: prctl with integer arguments.
    let nnp = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if rc != 0 || nnp != 0 {
        return Err(Failed::host(format!(
            "cannot drop privileges: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// The namespaces a QEMU joins: opened before it forks, used between fork and exec.
pub struct Join {
    user: File,
    net: File,
}

impl Join {
    /// The user namespace of process `pid` and the network namespace of its thread `tid`.
    pub fn open(pid: i32, tid: i32) -> Result<Join, Failed> {
        let open =
            |p: String| File::open(&p).map_err(|e| Failed::host(format!("cannot open {p}: {e}")));
        Ok(Join {
            user: open(format!("/proc/{pid}/ns/user"))?,
            net: open(format!("/proc/{pid}/task/{tid}/ns/net"))?,
        })
    }

    /// Joins them, then empties the capability bounding set, so that the program executed
    /// next has no capability even when it runs as root (a root QEMU would otherwise hold
    /// them all inside the namespace, and its proxy, holding none, could not watch it). For
    /// a forked child before exec: syscalls only, async-signal-safe.
    pub fn enter(&self) -> std::io::Result<()> {
        for (f, kind) in [
            (&self.user, libc::CLONE_NEWUSER),
            (&self.net, libc::CLONE_NEWNET),
        ] {
            // SAFETY: setns(2) on an fd this struct owns.
            if unsafe { libc::setns(f.as_raw_fd(), kind) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        for cap in 0..64 {
            // SAFETY: prctl with integer arguments; capabilities past the last are EINVAL.
            unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        }
        Ok(())
    }
}

/// The identity (device, inode) of the network namespace of `/proc/PID[/task/TID]`.
pub fn net_ns_id(proc_path: &str) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(format!("{proc_path}/ns/net")).ok()?;
    Some((m.dev(), m.ino()))
}
