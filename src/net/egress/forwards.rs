//! The host side of a VM's port forwards, which the proxy holds for a VM in an empty network:
//! a listener on the host's address per forward, each connection relayed to QEMU's forward
//! listening on the same port inside the VM's network. vm_port_forward adds and removes them
//! live through the proxy's control socket (`egress.sock` in the VM's runtime folder, which
//! only the user can reach): one line, `add ADDR:PORT` or `remove ADDR:PORT`, answered `ok` or
//! `error: why`.

use crate::kind::Failed;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use super::relay::{relay, Limits};

/// The control socket's name in the VM's runtime folder.
pub const CONTROL_SOCKET: &str = "egress.sock";
/// Connections one forward relays at once.
const MAX_CONNECTIONS: usize = 64;

/// A request to the thread inside the VM's network: connect to 127.0.0.1:port there.
pub type Dial = (u16, mpsc::Sender<std::io::Result<TcpStream>>);

type Open = HashMap<(Ipv4Addr, u16), (TcpListener, Arc<AtomicBool>)>;

/// The forwards the proxy holds.
pub struct Forwards {
    dial: mpsc::Sender<Dial>,
    open: Mutex<Open>,
}

impl Forwards {
    /// None yet; `dial` reaches the thread inside the VM's network.
    pub fn new(dial: mpsc::Sender<Dial>) -> Arc<Forwards> {
        Arc::new(Forwards {
            dial,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// Listens on `addr:port` and relays it into the VM's network, to the same port.
    pub fn add(&self, addr: Ipv4Addr, port: u16) -> Result<(), Failed> {
        self.add_within(addr, port, Duration::ZERO)
    }

    /// [`Forwards::add`], waiting up to `wait` for a port in use to be let go: at a resume,
    /// the proxy of the VM's previous run may still be closing its listeners.
    pub fn add_within(&self, addr: Ipv4Addr, port: u16, wait: Duration) -> Result<(), Failed> {
        let mut open = self.open.lock().map_err(|_| Failed::host("poisoned"))?;
        if open.contains_key(&(addr, port)) {
            return Err(Failed::invalid(format!(
                "{addr}:{port} is already forwarded"
            )));
        }
        let deadline = std::time::Instant::now() + wait;
        let l = loop {
            match TcpListener::bind((addr, port)) {
                Ok(l) => break l,
                Err(e)
                    if e.kind() == std::io::ErrorKind::AddrInUse
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    return Err(Failed::host(format!(
                        "cannot listen on {addr}:{port} for a port forward: {e}"
                    )))
                }
            }
        };
        let keep = l.try_clone().map_err(|e| Failed::host(e.to_string()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (dial, stop2) = (self.dial.clone(), stop.clone());
        std::thread::Builder::new()
            .name("egress-forward".into())
            .spawn(move || forward_loop(l, port, dial, stop2))
            .map_err(|e| Failed::host(format!("cannot start a thread: {e}")))?;
        open.insert((addr, port), (keep, stop));
        Ok(())
    }

    /// Stops listening on `addr:port` (connections being relayed go on).
    pub fn remove(&self, addr: Ipv4Addr, port: u16) -> Result<(), Failed> {
        let mut open = self.open.lock().map_err(|_| Failed::host("poisoned"))?;
        let (l, stop) = open
            .remove(&(addr, port))
            .ok_or_else(|| Failed::not_found(format!("{addr}:{port} is not forwarded")))?;
        stop.store(true, Ordering::SeqCst);
        // SAFETY: shutdown(2) on the listener's own fd wakes its blocked accept.
        unsafe { libc::shutdown(l.as_raw_fd(), libc::SHUT_RDWR) };
        Ok(())
    }
}

fn forward_loop(listener: TcpListener, port: u16, dial: mpsc::Sender<Dial>, stop: Arc<AtomicBool>) {
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(conn) = conn else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let (tx, rx) = mpsc::channel();
        if dial.send((port, tx)).is_err() {
            return;
        }
        let Ok(Ok(inner)) = rx.recv_timeout(Duration::from_secs(10)) else {
            continue;
        };
        let active = active.clone();
        let _ = std::thread::Builder::new()
            .name("egress-fwd".into())
            .spawn(move || {
                if active.fetch_add(1, Ordering::SeqCst) < MAX_CONNECTIONS {
                    let limits = Limits {
                        idle: None,
                        max_bytes: u64::MAX,
                    };
                    relay(conn, inner, limits);
                }
                active.fetch_sub(1, Ordering::SeqCst);
            });
    }
}

/// Serves the control socket: one command per connection.
pub fn control_loop(listener: UnixListener, fw: Arc<Forwards>) {
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
        let mut line = String::new();
        let read = BufReader::new((&conn).take(256)).read_line(&mut line);
        let reply = match read {
            Ok(_) => match command(&fw, line.trim()) {
                Ok(()) => "ok\n".to_string(),
                Err(e) => format!("error: {e}\n"),
            },
            Err(e) => format!("error: {e}\n"),
        };
        let _ = conn.write_all(reply.as_bytes());
    }
}

fn command(fw: &Forwards, line: &str) -> Result<(), Failed> {
    let (verb, target) = line
        .split_once(' ')
        .ok_or(Failed::host("expected add|remove ADDR:PORT"))?;
    let (a, p) = target
        .rsplit_once(':')
        .ok_or(Failed::host("expected ADDR:PORT"))?;
    let addr: Ipv4Addr = a
        .parse()
        .map_err(|_| Failed::host(format!("bad address {a:?}")))?;
    let port: u16 = p
        .parse()
        .map_err(|_| Failed::host(format!("bad port {p:?}")))?;
    match verb {
        "add" => fw.add(addr, port),
        "remove" => fw.remove(addr, port),
        other => Err(Failed::host(format!("unknown command {other:?}"))),
    }
}

/// Sends one command to the proxy whose control socket is `sock`; its error says why not.
pub fn ask(sock: &Path, line: &str) -> Result<(), Failed> {
    let mut c = UnixStream::connect(sock).map_err(|e| {
        Failed::host(format!(
            "the VM's egress proxy does not answer at {}: {e}",
            sock.display()
        ))
    })?;
    let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
    c.write_all(format!("{line}\n").as_bytes())
        .map_err(|e| Failed::host(format!("cannot talk to the egress proxy: {e}")))?;
    let mut reply = String::new();
    let _ = (&c).take(512).read_to_string(&mut reply);
    match reply.trim() {
        "ok" => Ok(()),
        r => Err(Failed::host(r.strip_prefix("error: ").unwrap_or(r))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwards_are_added_and_removed_through_the_control_socket() {
        let dir = std::env::temp_dir().join(format!("mcq-egress-fw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join(CONTROL_SOCKET);
        let (tx, _rx) = mpsc::channel();
        let fw = Forwards::new(tx);
        let l = UnixListener::bind(&sock).unwrap();
        let f2 = fw.clone();
        std::thread::spawn(move || control_loop(l, f2));
        let free = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        ask(&sock, &format!("add 127.0.0.1:{port}")).unwrap();
        assert!(TcpStream::connect(("127.0.0.1", port)).is_ok());
        assert!(ask(&sock, &format!("add 127.0.0.1:{port}"))
            .unwrap_err()
            .msg
            .contains("already"));
        ask(&sock, &format!("remove 127.0.0.1:{port}")).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            TcpListener::bind(("127.0.0.1", port)).is_ok(),
            "the port was not freed"
        );
        assert!(ask(&sock, "remove 127.0.0.1:1")
            .unwrap_err()
            .msg
            .contains("not forwarded"));
        assert!(ask(&sock, "bogus").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
