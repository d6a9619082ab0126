//! Copies bytes both ways between two TCP streams until both sides are done, bounded in bytes
//! and (optionally) in idle time; a side's end is passed on as a half-close.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

/// Limits of one relayed connection.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A direction idle this long ends the connection (None: no limit).
    pub idle: Option<Duration>,
    /// Bytes per direction at most.
    pub max_bytes: u64,
}

/// Relays `a` ⇄ `b`; returns the bytes copied (both directions).
pub fn relay(a: TcpStream, b: TcpStream, limits: Limits) -> u64 {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return 0;
    };
    let back = std::thread::Builder::new()
        .name("egress-relay".into())
        .spawn(move || copy(b2, a2, limits));
    let there = copy(a, b, limits);
    there + back.ok().and_then(|h| h.join().ok()).unwrap_or(0)
}

fn copy(mut from: TcpStream, mut to: TcpStream, limits: Limits) -> u64 {
    let _ = from.set_read_timeout(limits.idle);
    let _ = to.set_write_timeout(Some(limits.idle.unwrap_or(Duration::from_secs(600))));
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    let ended_well = loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break false,
        };
        if to.write_all(&buf[..n]).is_err() {
            break false;
        }
        total += n as u64;
        if total >= limits.max_bytes {
            break false;
        }
    };
    if ended_well {
        let _ = to.shutdown(Shutdown::Write);
    } else {
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    }
    total
}
