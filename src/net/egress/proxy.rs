//! One guest connection to the proxy: its request read and checked against the rules by the
//! name the guest asked for, the allowed name resolved here on the host and connected, and the
//! bytes relayed; anything else answered with a refusal that says why.

use crate::kind::Failed;
use std::io::Write;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::relay::{relay, Limits};
use super::request::{self, answer};
use super::rewrite::rewrite;
use super::rules::{allowed, normal_host, Host, Rule};
use super::secrets::ProxySecret;
use super::stats::Counters;
use super::tls::{Authority, Tunnel};

/// Guest connections served at once; more are answered 503.
pub const MAX_CONNECTIONS: usize = 64;
/// How long the guest may take to send its request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting to an allowed host may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A relayed connection idle this long in one direction is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Bytes per direction of one connection at most (8 GiB).
pub const MAX_BYTES: u64 = 8 << 30;

/// What every connection handler shares.
#[derive(Clone)]
pub struct Shared {
    /// The VM's rules.
    pub rules: Arc<Vec<Rule>>,
    /// The counters.
    pub counters: Counters,
    /// Connections being served.
    pub active: Arc<AtomicUsize>,
    /// The VM's secrets (none: nothing is rewritten or intercepted).
    pub secrets: Arc<Vec<ProxySecret>>,
    /// The CA that intercepts tunnels to the secrets' hosts.
    pub authority: Option<Arc<Authority>>,
}

/// Serves one guest connection, counting it in `shared.active` while it lasts.
pub fn serve(guest: TcpStream, shared: Shared) {
    if shared.active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
        shared
            .counters
            .refused("(connection)", "too many connections");
        let mut g = guest;
        let reason = format!("more than {MAX_CONNECTIONS} connections at once");
        let _ = g.write_all(&answer(503, &reason));
    } else {
        handle(guest, &shared);
    }
    shared.active.fetch_sub(1, Ordering::SeqCst);
}

fn handle(mut guest: TcpStream, shared: &Shared) {
    let _ = guest.set_read_timeout(Some(HEAD_TIMEOUT));
    let _ = guest.set_write_timeout(Some(HEAD_TIMEOUT));
    let (head, rest) = match request::read_head(&mut guest) {
        Ok(x) => x,
        Err(e) => {
            shared.counters.refused("(no request)", &e.msg);
            let _ = guest.write_all(&answer(400, &e.msg));
            return;
        }
    };
    let req = match request::parse(&head) {
        Ok(r) => r,
        Err(e) => {
            let first = String::from_utf8_lossy(&head[..head.len().min(120)]);
            let what = first.lines().next().unwrap_or_default().to_string();
            shared.counters.refused(&what, &e.msg);
            let _ = guest.write_all(&answer(400, &e.msg));
            return;
        }
    };
    let what = format!("{}:{}", req.host, req.port);
    let host = match check(&shared.rules, &req.host, req.port) {
        Ok(h) => h,
        Err(why) => {
            shared.counters.refused(&what, &why.msg);
            let _ = guest.write_all(&answer(403, &format!("{what} refused: {why}")));
            return;
        }
    };
    let mut upstream = match connect(&host, req.port) {
        Ok(s) => s,
        Err(e) => {
            shared.counters.refused(&what, &e.msg);
            let _ = guest.write_all(&answer(502, &format!("{what}: {e}")));
            return;
        }
    };
    shared.counters.allowed();
    let intercepted = req.method == "CONNECT"
        && shared
            .secrets
            .iter()
            .any(|s| s.goes_to(&req.host, req.port));
    if let (true, Some(a)) = (intercepted, &shared.authority) {
        intercept(a, guest, &rest, upstream, &req, shared);
        return;
    }
    let head = match origin_head(&req, &shared.secrets) {
        Ok(h) => h,
        Err(e) => {
            let _ = guest.write_all(&answer(400, &e.msg));
            return;
        }
    };
    let sent = if req.method == "CONNECT" {
        guest.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
    } else {
        upstream.write_all(&head)
    };
    if sent.and_then(|()| upstream.write_all(&rest)).is_err() {
        return;
    }
    let limits = Limits {
        idle: Some(IDLE_TIMEOUT),
        max_bytes: MAX_BYTES,
    };
    let n = relay(guest, upstream, limits);
    shared.counters.bytes(n);
}

/// Serves a tunnel to a secret's host through the VM's CA ([`Authority::intercept`]), and
/// logs what it did.
fn intercept(
    a: &Authority,
    mut guest: TcpStream,
    early: &[u8],
    upstream: TcpStream,
    req: &request::Request,
    shared: &Shared,
) {
    let what = format!("{}:{}", req.host, req.port);
    if guest
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .is_err()
    {
        return;
    }
    // The guest's handshake and head keep HEAD_TIMEOUT; the rest goes at IDLE_TIMEOUT.
    let _ = guest.set_write_timeout(Some(IDLE_TIMEOUT));
    let _ = upstream.set_read_timeout(Some(IDLE_TIMEOUT));
    let _ = upstream.set_write_timeout(Some(IDLE_TIMEOUT));
    let tunnel = Tunnel {
        host: &req.host,
        port: req.port,
        idle: IDLE_TIMEOUT,
    };
    match a.intercept(guest, early, upstream, &tunnel, &shared.secrets) {
        Ok(x) => {
            said(&what, &x.added, &x.stray);
            shared.counters.bytes(x.bytes);
        }
        Err(e) => crate::log::stderr(
            "warn",
            &format!(
                "egress proxy: {what}: the intercepted request failed: {}",
                e.msg
            ),
        ),
    }
}

/// The head a plain HTTP request goes to its origin with: its secrets added for their hosts
/// (a CONNECT's is empty and unused).
fn origin_head(req: &request::Request, secrets: &[ProxySecret]) -> Result<Vec<u8>, Failed> {
    if req.method == "CONNECT" || secrets.is_empty() {
        return Ok(req.origin_head.clone());
    }
    let r = rewrite(&req.origin_head, &req.host, req.port, secrets, false)?;
    said(&format!("{}:{}", req.host, req.port), &r.added, &r.stray);
    Ok(r.head)
}

/// Tells the operator's log (the proxy's stderr) which secrets a request to `what` carried:
/// added, or a placeholder that went to a host not its own (sent as it was). Never a value.
fn said(what: &str, added: &[String], stray: &[String]) {
    if !added.is_empty() {
        crate::log::stderr(
            "info",
            &format!(
                "egress proxy: {what}: added the secrets {}",
                added.join(", ")
            ),
        );
    }
    if !stray.is_empty() {
        crate::log::stderr(
            "notice",
            &format!(
                "egress proxy: {what}: the request carried the placeholder of {}, whose hosts do \
                 not include {what}: sent as it was (the placeholder is worthless there)",
                stray.join(", ")
            ),
        );
    }
}

/// The host, normalised, if a rule allows it on `port`; else why not.
pub fn check(rules: &[Rule], raw: &str, port: u16) -> Result<Host, Failed> {
    let host = normal_host(raw)?;
    if allowed(rules, &host, port) {
        return Ok(host);
    }
    Err(Failed::refused(match host {
        Host::Ip(_) => "an IP address is allowed only by a rule that is that address",
        _ => "not in this VM's allow_network rules",
    }))
}

/// Resolves `host` on the host and connects to the first address that answers.
fn connect(host: &Host, port: u16) -> Result<TcpStream, Failed> {
    let addrs: Vec<SocketAddr> = match host {
        Host::Ip(ip) => vec![SocketAddr::new(*ip, port)],
        Host::Name(n) => (n.as_str(), port)
            .to_socket_addrs()
            .map_err(|e| Failed::host(format!("cannot resolve {n}: {e}")))?
            .collect(),
        Host::Suffix(_) => return Err(Failed::host("not a host")),
    };
    let mut last = String::from("no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => last = format!("cannot connect to {a}: {e}"),
        }
    }
    Err(Failed::host(last))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::egress::rules::parse_rules;

    #[test]
    fn refusals_say_why() {
        let rules = parse_rules(&["localhost:8080".into()]).unwrap();
        assert!(check(&rules, "localhost", 8080).is_ok());
        assert!(check(&rules, "localhost", 8081)
            .unwrap_err()
            .msg
            .contains("rules"));
        assert!(check(&rules, "127.0.0.1", 8080)
            .unwrap_err()
            .msg
            .contains("IP address"));
        assert!(check(&rules, "bad name", 8080).is_err());
    }
}
