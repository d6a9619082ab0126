//! Copies bytes both ways between two TCP streams until both sides are done, bounded in bytes
//! and (optionally) in idle time: a connection is idle when neither direction has moved a byte
//! for that long (a long download with a silent client is not idle). A side's end is passed on
//! as a half-close.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Limits of one relayed connection.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The connection idle this long in both directions ends (None: no limit).
    pub idle: Option<Duration>,
    /// Bytes per direction at most.
    pub max_bytes: u64,
}

/// When either direction last moved bytes, in ms since the relay began.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let now = self.start.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// Relays `a` ⇄ `b`; returns the bytes copied (both directions).
pub fn relay(a: TcpStream, b: TcpStream, limits: Limits) -> u64 {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return 0;
    };
    let activity = Arc::new(Activity {
        start: Instant::now(),
        last_ms: AtomicU64::new(0),
    });
    let act = activity.clone();
    let back = std::thread::Builder::new()
        .name("egress-relay".into())
        .spawn(move || copy(b2, a2, limits, &act));
    let there = copy(a, b, limits, &activity);
    there + back.ok().and_then(|h| h.join().ok()).unwrap_or(0)
}

fn copy(mut from: TcpStream, mut to: TcpStream, limits: Limits, activity: &Activity) -> u64 {
    // Reads wake at least this often to see whether the whole connection is idle.
    let tick = limits.idle.map(|i| i.min(Duration::from_secs(5)));
    let _ = from.set_read_timeout(tick);
    let _ = to.set_write_timeout(Some(limits.idle.unwrap_or(Duration::from_secs(600))));
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    let ended_well = loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if timed_out(&e) => match limits.idle {
                Some(idle) if activity.idle_for() < idle => continue,
                _ => break false,
            },
            Err(_) => break false,
        };
        activity.touch();
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

fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (c, l.accept().unwrap().0)
    }

    #[test]
    fn bytes_flow_both_ways_a_close_is_passed_on_and_a_one_way_stream_is_not_idle() {
        let (mut client, proxy_side) = pair();
        let (upstream_side, mut server) = pair();
        let limits = Limits {
            idle: Some(Duration::from_millis(300)),
            max_bytes: 1 << 20,
        };
        let t = std::thread::spawn(move || relay(proxy_side, upstream_side, limits));
        client.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        server.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
        // The server streams for longer than the idle limit while the client says nothing.
        for _ in 0..8 {
            server.write_all(b"x").unwrap();
            std::thread::sleep(Duration::from_millis(100));
        }
        drop(server);
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, b"xxxxxxxx");
        drop(client);
        assert_eq!(t.join().unwrap(), 12);
    }

    #[test]
    fn an_idle_connection_ends() {
        let (client, proxy_side) = pair();
        let (upstream_side, _server) = pair();
        let limits = Limits {
            idle: Some(Duration::from_millis(200)),
            max_bytes: 1 << 20,
        };
        let t0 = Instant::now();
        relay(proxy_side, upstream_side, limits);
        assert!(t0.elapsed() < Duration::from_secs(3));
        drop(client);
    }
}
