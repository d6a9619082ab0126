//! How long ago data last moved on the host's established TCP connections, by local port: the
//! kernel's own per-socket clocks (`tcpi_last_data_recv`, `tcpi_last_data_sent` of
//! `tcp_info`), asked over a sock_diag netlink socket (what `ss -ti` asks; no privilege
//! needed). A VM's forwards are busy while a connection to one of their host ports moves data.

use std::collections::HashMap;
use std::time::Duration;

const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const INET_DIAG_INFO: u16 = 2;
const TCP_ESTABLISHED: u32 = 1;
const NLMSG_DONE: u16 = 3;
const NLMSG_ERROR: u16 = 2;
/// Largest answer read in all: a host with this many connections is asked no further.
const MAX_ANSWER: usize = 16 << 20;

/// For each of `ports` with an established connection whose local port it is: how long ago
/// data last moved on any of them (the shortest). Ports with none are absent. An error (no
/// netlink, a kernel without sock_diag, an answer cut short or too large) says the map would
/// not be the whole truth.
pub fn last_data_by_port(ports: &[u16]) -> Result<HashMap<u16, Duration>, String> {
    let mut out = HashMap::new();
    if ports.is_empty() {
        return Ok(out);
    }
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        dump(family, &mut |port, idle_ms| {
            if ports.contains(&port) {
                let d = Duration::from_millis(u64::from(idle_ms));
                let e = out.entry(port).or_insert(d);
                if d < *e {
                    *e = d;
                }
            }
        })?;
    }
    Ok(out)
}

/// Asks the kernel for every established TCP socket of `family`; calls `seen` with each one's
/// local port and how many ms ago data last moved on it.
fn dump(family: u8, seen: &mut dyn FnMut(u16, u32)) -> Result<(), String> {
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(format!(
            "no sock_diag netlink socket: {}",
            std::io::Error::last_os_error()
        ));
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
        return Err(format!(
            "the sock_diag request was not sent: {}",
            std::io::Error::last_os_error()
        ));
    }
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0usize;
    loop {
        // SAFETY: recv(2) into a buffer of the given length.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n <= 0 {
            return Err(format!(
                "the sock_diag answer stopped: {}",
                std::io::Error::last_os_error()
            ));
        }
        total += n as usize;
        if parse(&buf[..n as usize], seen)
            .map_err(|()| "a malformed sock_diag answer".to_string())?
        {
            return Ok(());
        }
        if total > MAX_ANSWER {
            return Err(format!("more than {MAX_ANSWER} bytes of connections"));
        }
    }
}

/// A dump request for established TCP sockets of `family`, with their tcp_info.
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
    r.extend_from_slice(&(1u32 << TCP_ESTABLISHED).to_ne_bytes());
    r.extend_from_slice(&[0u8; 48]);
    r
}

/// Reads one datagram of answers; true once the dump is done.
fn parse(mut b: &[u8], seen: &mut dyn FnMut(u16, u32)) -> Result<bool, ()> {
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
        // inet_diag_msg: family, state, timer, retrans, then the sockid (sport first, in
        // network order); 72 bytes before the attributes.
        if msg.len() >= 72 {
            let sport = b.get(20..22).map(|s| u16::from_be_bytes([s[0], s[1]]));
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
                    if let (Some(port), Some(sent), Some(recv)) =
                        (sport, u32_at(info, 44), u32_at(info, 52))
                    {
                        seen(port, sent.min(recv));
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
}
