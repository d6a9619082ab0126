//! How long ago data last moved on the host's TCP connections to a port: the kernel's own
//! per-socket clocks (`tcpi_last_data_recv`, `tcpi_last_data_sent` of `tcp_info`) for open
//! ones, and for closed ones the TIME_WAIT that one end keeps for 60 s after the close (its
//! timer says when the close was), asked over a sock_diag netlink socket (what `ss -tia` asks;
//! no privilege needed). A VM's forwards are busy while a connection to one of their host ports
//! moves data, and a short connection that came and went between two looks still counts.

use crate::kind::Failed;
use std::collections::HashMap;
use std::time::Duration;

const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const INET_DIAG_INFO: u16 = 2;
const TCP_ESTABLISHED: u32 = 1;
const TCP_FIN_WAIT1: u32 = 4;
const TCP_FIN_WAIT2: u32 = 5;
const TCP_TIME_WAIT: u32 = 6;
const TCP_CLOSE_WAIT: u32 = 8;
const TCP_LAST_ACK: u32 = 9;
const TCP_CLOSING: u32 = 11;
/// How long Linux keeps a closed connection in TIME_WAIT (TCP_TIMEWAIT_LEN; tcp_fin_timeout's
/// default for a FIN_WAIT2 one): its timer's time left, taken from this, is how long ago it
/// closed.
const CLOSED_KEPT_MS: u32 = 60_000;
const NLMSG_DONE: u16 = 3;
const NLMSG_ERROR: u16 = 2;
/// Largest answer read in all: a host with this many connections is asked no further.
const MAX_ANSWER: usize = 16 << 20;

/// For each of `ports` with a connection to it (the port is its local end, or its far end on
/// this host's loopback), open or closed within the last minute: how long ago data last moved
/// on any of them (the shortest; a closed one's close). Ports with none are absent. An error
/// (no netlink, a kernel without sock_diag, an answer cut short or too large) says the map
/// would not be the whole truth.
pub fn last_data_by_port(ports: &[u16]) -> Result<HashMap<u16, Duration>, Failed> {
    let mut out = HashMap::new();
    if ports.is_empty() {
        return Ok(out);
    }
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        dump(family, &mut |conn| {
            let port = if ports.contains(&conn.local) {
                conn.local
            } else if conn.remote_loopback && ports.contains(&conn.remote) {
                conn.remote
            } else {
                return;
            };
            let d = Duration::from_millis(u64::from(conn.idle_ms));
            let e = out.entry(port).or_insert(d);
            if d < *e {
                *e = d;
            }
        })?;
    }
    Ok(out)
}

/// One connection as the kernel told it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Conn {
    /// Its local port.
    local: u16,
    /// The port at its far end.
    remote: u16,
    /// Whether the far end is this host's loopback.
    remote_loopback: bool,
    /// How many ms ago data last moved on it (closed: since the close).
    idle_ms: u32,
}

/// Asks the kernel for every TCP socket of `family` that is or was connected (all but
/// listeners and half-open ones); calls `seen` with each.
fn dump(family: u8, seen: &mut dyn FnMut(Conn)) -> Result<(), Failed> {
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(Failed::host(format!(
            "no sock_diag netlink socket: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: fd was just opened here and is owned by nothing else.
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
    let tv = libc::timeval {
        tv_sec: 1,
        tv_usec: 0,
    };
    // SAFETY: setsockopt with a timeval that lives across the call.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        )
    };
    let req = request(family);
    // SAFETY: send(2) of a buffer that lives across the call.
    if unsafe { libc::send(fd, req.as_ptr().cast(), req.len(), 0) } != req.len() as isize {
        return Err(Failed::host(format!(
            "the sock_diag request was not sent: {}",
            std::io::Error::last_os_error()
        )));
    }
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0usize;
    loop {
        // SAFETY: recv(2) into a buffer of the given length.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n <= 0 {
            return Err(Failed::host(format!(
                "the sock_diag answer stopped: {}",
                std::io::Error::last_os_error()
            )));
        }
        total += n as usize;
        if parse(&buf[..n as usize], seen)
            .map_err(|()| Failed::host("a malformed sock_diag answer"))?
        {
            return Ok(());
        }
        if total > MAX_ANSWER {
            return Err(Failed::host(format!(
                "more than {MAX_ANSWER} bytes of connections"
            )));
        }
    }
}

/// A dump request for the connected and closing TCP sockets of `family`, with their tcp_info.
fn request(family: u8) -> Vec<u8> {
    let mut r = Vec::with_capacity(72);
    let len: u32 = 16 + 56;
    r.extend_from_slice(&len.to_ne_bytes());
    r.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    r.extend_from_slice(&flags.to_ne_bytes());
    r.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    r.extend_from_slice(&0u32.to_ne_bytes()); // port id
                                              // inet_diag_req_v2: family, protocol, ext, pad, states, then a zeroed inet_diag_sockid.
    r.push(family);
    r.push(libc::IPPROTO_TCP as u8);
    r.push(1 << (INET_DIAG_INFO - 1));
    r.push(0);
    let states = [
        TCP_ESTABLISHED,
        TCP_FIN_WAIT1,
        TCP_FIN_WAIT2,
        TCP_TIME_WAIT,
        TCP_CLOSE_WAIT,
        TCP_LAST_ACK,
        TCP_CLOSING,
    ]
    .iter()
    .fold(0u32, |m, s| m | (1 << s));
    r.extend_from_slice(&states.to_ne_bytes());
    r.extend_from_slice(&[0u8; 48]);
    r
}

/// Whether the 16 address bytes `a` of `family` are loopback (127/8, ::1, ::ffff:127/104).
fn loopback(family: u8, a: &[u8]) -> bool {
    if family == libc::AF_INET as u8 {
        return a.first() == Some(&127);
    }
    let Ok(a) = <[u8; 16]>::try_from(a) else {
        return false;
    };
    let v6 = std::net::Ipv6Addr::from(a);
    v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
}

/// Reads one datagram of answers; true once the dump is done.
fn parse(mut b: &[u8], seen: &mut dyn FnMut(Conn)) -> Result<bool, ()> {
    let u16_at = |b: &[u8], i: usize| b.get(i..i + 2).map(|s| u16::from_ne_bytes([s[0], s[1]]));
    let u32_at = |b: &[u8], i: usize| {
        b.get(i..i + 4)
            .map(|s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
    };
    while b.len() >= 16 {
        let len = u32_at(b, 0).ok_or(())? as usize;
        let kind = u16_at(b, 4).ok_or(())?;
        if len < 16 || len > b.len() {
            return Err(());
        }
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => return Err(()),
            _ => {}
        }
        let msg = &b[16..len];
        // inet_diag_msg: family, state, timer, retrans, then the sockid (sport, dport in
        // network order, src and dst 16 bytes each, interface, cookie), then expires (ms);
        // 72 bytes before the attributes.
        if msg.len() >= 72 {
            let port = |i: usize| u16::from_be_bytes([msg[i], msg[i + 1]]);
            let mut conn = Conn {
                local: port(4),
                remote: port(6),
                remote_loopback: loopback(msg[0], &msg[24..40]),
                idle_ms: 0,
            };
            if u32::from(msg[1]) == TCP_TIME_WAIT || u32::from(msg[1]) == TCP_FIN_WAIT2 {
                // A closed connection the kernel keeps as a timer (no tcp_info): it closed
                // as long ago as its timer has run.
                let expires = u32_at(msg, 52).ok_or(())?;
                conn.idle_ms = CLOSED_KEPT_MS.saturating_sub(expires);
                if msg.len() == 72 || u32::from(msg[1]) == TCP_TIME_WAIT {
                    seen(conn);
                }
            }
            let mut attrs = &msg[72..];
            while attrs.len() >= 4 {
                let alen = u16_at(attrs, 0).ok_or(())? as usize;
                let akind = u16_at(attrs, 2).ok_or(())?;
                if alen < 4 || alen > attrs.len() {
                    break;
                }
                if akind == INET_DIAG_INFO {
                    let info = &attrs[4..alen];
                    // tcp_info: last_data_sent at 44, last_data_recv at 52 (ms ago).
                    if let (Some(sent), Some(recv)) = (u32_at(info, 44), u32_at(info, 52)) {
                        conn.idle_ms = sent.min(recv);
                        seen(conn);
                    }
                }
                attrs = &attrs[((alen + 3) & !3).min(attrs.len())..];
            }
        }
        b = &b[((len + 3) & !3).min(b.len())..];
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn sees_data_move_on_a_local_connection() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (mut s, _) = l.accept().unwrap();
        assert!(
            last_data_by_port(&[port]).unwrap().contains_key(&port),
            "an idle connection is seen"
        );
        std::thread::sleep(Duration::from_millis(600));
        let quiet = last_data_by_port(&[port]).unwrap()[&port];
        assert!(quiet >= Duration::from_millis(500), "{quiet:?}");
        c.write_all(b"hello").unwrap();
        let mut got = [0u8; 5];
        s.read_exact(&mut got).unwrap();
        let busy = last_data_by_port(&[port]).unwrap()[&port];
        assert!(busy < Duration::from_millis(300), "{busy:?}");
        assert!(last_data_by_port(&[1]).unwrap().is_empty());
    }

    /// A connection that came and went (a short HTTP request through a forward) still says
    /// when data last moved, from whichever end keeps its TIME_WAIT; the client's end names
    /// the port as its far end.
    #[test]
    fn a_closed_connection_says_when_it_closed() {
        for server_closes_first in [true, false] {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            let (mut s, _) = l.accept().unwrap();
            c.write_all(b"GET").unwrap();
            let mut got = [0u8; 3];
            s.read_exact(&mut got).unwrap();
            let mut rest = Vec::new();
            if server_closes_first {
                drop(s);
                c.read_to_end(&mut rest).unwrap();
                drop(c);
            } else {
                drop(c);
                s.read_to_end(&mut rest).unwrap();
                drop(s);
            }
            std::thread::sleep(Duration::from_millis(300));
            let seen = last_data_by_port(&[port]).unwrap();
            let ago = seen.get(&port).copied();
            assert!(
                ago.is_some_and(|d| d >= Duration::from_millis(200) && d < Duration::from_secs(5)),
                "server closes first: {server_closes_first}: {ago:?}"
            );
        }
    }
}
