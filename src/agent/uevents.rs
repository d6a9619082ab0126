//! The kernel's device events (its uevent netlink broadcast, what udev listens to), so the
//! agent learns at once that a port was plugged in or named instead of looking every half
//! second: a mount hot-plugged into a running sandbox is served as soon as the kernel has it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

const NETLINK_KOBJECT_UEVENT: i32 = 15;
/// The kernel's broadcast group for uevents.
const KERNEL_GROUP: u32 = 1;

/// A subscription to the kernel's device events.
pub struct Uevents {
    sock: OwnedFd,
}

impl Uevents {
    /// Subscribes; None where the kernel or the sandbox offers no uevent socket.
    pub fn open() -> Option<Uevents> {
        // SAFETY: socket(2) with constant arguments.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                NETLINK_KOBJECT_UEVENT,
            )
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: fd was just opened here and is owned by nothing else.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero sockaddr_nl is valid; its fields are set below.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as u16;
        addr.nl_groups = KERNEL_GROUP;
        // SAFETY: bind(2) with a sockaddr_nl that lives across the call.
        let bound = unsafe {
            libc::bind(
                sock.as_raw_fd(),
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        (bound == 0).then_some(Uevents { sock })
    }

    /// Waits up to `within` for events; the devices (their `DEVNAME`, else the last part of
    /// their path) of those of subsystem `subsystem` that came, all queued ones read; None
    /// when none of it came in time.
    pub fn wait(&self, within: Duration, subsystem: &str) -> Option<Vec<String>> {
        let want = format!("SUBSYSTEM={subsystem}");
        let deadline = std::time::Instant::now() + within;
        let mut devices: Option<Vec<String>> = None;
        let mut buf = vec![0u8; 8192];
        loop {
            // Once one of the subsystem's came, only what is already queued is read; other
            // subsystems' events (a mount's bdi device) are read past until the deadline.
            let timeout = match devices {
                Some(_) => Duration::ZERO,
                None => deadline.saturating_duration_since(std::time::Instant::now()),
            };
            let mut pfd = libc::pollfd {
                fd: self.sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
            // SAFETY: poll(2) on one pollfd that lives across the call.
            if unsafe { libc::poll(&mut pfd, 1, ms) } <= 0 {
                return devices;
            }
            // SAFETY: recv(2) into a buffer of the given length.
            let n = unsafe {
                libc::recv(
                    self.sock.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n <= 0 {
                return devices;
            }
            let msg = &buf[..n as usize];
            if is_of(msg, &want) {
                devices.get_or_insert_with(Vec::new).extend(device(msg));
            }
        }
    }
}

/// The device a uevent is about: its `DEVNAME`, else the last part of its `DEVPATH`.
fn device(msg: &[u8]) -> Option<String> {
    let field = |key: &str| {
        msg.split(|&b| b == 0)
            .find_map(|f| f.strip_prefix(key.as_bytes()))
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    field("DEVNAME=")
        .or_else(|| field("DEVPATH=").and_then(|p| p.rsplit('/').next().map(str::to_string)))
        .map(|d| d.trim_start_matches("/dev/").to_string())
        .filter(|d| !d.is_empty() && !d.contains('/') && d != "..")
}

/// Whether one uevent datagram (`ACTION@DEVPATH`, then NUL-separated `KEY=VALUE`s) carries
/// `want` (`SUBSYSTEM=...`) as one of its fields.
fn is_of(msg: &[u8], want: &str) -> bool {
    msg.split(|&b| b == 0).any(|f| f == want.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_event_is_told_from_others() {
        let port = b"change@/devices/pci0000:00/0000:00:03.0/virtio1/virtio-ports/vport1p2\0\
            ACTION=change\0DEVPATH=/devices/pci0000:00/0000:00:03.0/virtio1/virtio-ports/vport1p2\0\
            SUBSYSTEM=virtio-ports\0MAJOR=251\0MINOR=2\0DEVNAME=vport1p2\0SEQNUM=1700\0";
        assert!(is_of(port, "SUBSYSTEM=virtio-ports"));
        assert_eq!(device(port).as_deref(), Some("vport1p2"));
        assert_eq!(
            device(b"add@/x\0DEVPATH=/devices/virtio1/virtio-ports/vport1p3\0").as_deref(),
            Some("vport1p3")
        );
        assert_eq!(device(b"add@/x\0DEVNAME=../etc\0"), None);
        let block = b"add@/devices/virtual/block/loop0\0ACTION=add\0SUBSYSTEM=block\0";
        assert!(!is_of(block, "SUBSYSTEM=virtio-ports"));
        assert!(!is_of(
            b"SUBSYSTEM=virtio-ports-x\0",
            "SUBSYSTEM=virtio-ports"
        ));
    }
}
