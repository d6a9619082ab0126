//! The agent's side of the host channel: the virtio-serial port named
//! `org.qemu.guest_agent.0`, found in /sys, read and answered one request at a time.
//!
//! A port whose host side is not connected reads as an end of file at once (and polls as
//! hung up), so between host connections the agent naps [`IDLE_NAP`] and reads again: a host
//! that connects is answered within that time, not qemu-ga's ~100 ms.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use super::commands::{Agent, Outcome};
use super::json::Json;
use super::reader::{Incoming, Reader};
use super::system::Mode;

/// The agent port's name.
pub const PORT_NAME: &str = "org.qemu.guest_agent.0";
/// Nap between reads while no host is connected.
const IDLE_NAP: Duration = Duration::from_millis(10);

/// The device of the virtio port named `name`, if the guest has one.
pub fn find(name: &str) -> Option<PathBuf> {
    let entries = std::fs::read_dir("/sys/class/virtio-ports").ok()?;
    for e in entries.flatten() {
        let n = std::fs::read_to_string(e.path().join("name")).unwrap_or_default();
        if n.trim() == name {
            return Some(PathBuf::from("/dev").join(e.file_name()));
        }
    }
    None
}

/// Serves the host on `path` until a shutdown is asked (by the host, or on `stop`: the power
/// button); returns the mode to end with.
pub fn serve(path: &std::path::Path, agent: &mut Agent, stop: &Receiver<Mode>) -> Mode {
    loop {
        if let Ok(mode) = stop.try_recv() {
            return mode;
        }
        let mut port = match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY)
            .open(path)
        {
            Ok(f) => f,
            Err(e) => {
                eprintln!(
                    "mcqemu-agent: cannot open {}: {e}; retrying",
                    path.display()
                );
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        let mut reader = Reader::new();
        let mut buf = vec![0u8; 256 * 1024];
        let mut connected = false;
        loop {
            if let Ok(mode) = stop.try_recv() {
                return mode;
            }
            agent.programs.reap();
            let n = match read_within(&mut port, &mut buf, Duration::from_millis(500)) {
                Ok(Some(n)) => n,
                Ok(None) => continue,
                Err(e) => {
                    eprintln!("mcqemu-agent: reading {} failed: {e}", path.display());
                    break;
                }
            };
            if n == 0 {
                // No host connected: anything half read belonged to the one that left.
                if connected {
                    reader = Reader::new();
                    connected = false;
                }
                std::thread::sleep(IDLE_NAP);
                continue;
            }
            connected = true;
            for inc in reader.push(&buf[..n]) {
                let outcome = match inc {
                    Incoming::Request(req) => agent.handle(&req),
                    Incoming::Bad(why) => Outcome::Reply {
                        json: super::commands::error("GenericError", why),
                        delimited: false,
                    },
                };
                match outcome {
                    Outcome::Reply { json, delimited } => {
                        if let Err(e) = send(&mut port, &json, delimited) {
                            eprintln!("mcqemu-agent: a reply was not sent: {e}");
                        }
                    }
                    Outcome::Shutdown(mode) => return mode,
                }
            }
        }
    }
}

/// One read, waiting at most `within` for data; None when nothing came.
fn read_within(
    port: &mut std::fs::File,
    buf: &mut [u8],
    within: Duration,
) -> std::io::Result<Option<usize>> {
    let mut pfd = libc::pollfd {
        fd: port.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one valid pollfd.
    let r = unsafe { libc::poll(&mut pfd, 1, within.as_millis() as libc::c_int) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        return if e.kind() == std::io::ErrorKind::Interrupted {
            Ok(None)
        } else {
            Err(e)
        };
    }
    if r == 0 {
        return Ok(None);
    }
    match port.read(buf) {
        Ok(n) => Ok(Some(n)),
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(None),
        Err(e) => Err(e),
    }
}

fn send(port: &mut std::fs::File, json: &Json, delimited: bool) -> std::io::Result<()> {
    let mut out = Vec::new();
    if delimited {
        out.push(0xFF);
    }
    out.extend_from_slice(json.to_text().as_bytes());
    out.push(b'\n');
    port.write_all(&out)
}
