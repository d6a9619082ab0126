//! A proxy request's head as the guest sent it: `CONNECT host:port` or a plain HTTP request
//! by absolute URL (`GET http://host[:port]/path`), the head rewritten for the origin, and the
//! proxy's own answers (403 with the reason, 400, 502).

use crate::kind::Failed;
use std::io::Read;

/// The longest request head the proxy reads.
pub const MAX_HEAD: usize = 16 * 1024;

/// What the guest asked the proxy for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The method (`CONNECT`, `GET`, ...).
    pub method: String,
    /// The host as written (a name, an IPv4 literal, or `[v6]`).
    pub host: String,
    /// The port (given, or 80 for an http URL).
    pub port: u16,
    /// For plain HTTP: the head to send to the origin (origin-form target, hop-by-hop and
    /// proxy headers dropped, `Connection: close`).
    pub origin_head: Vec<u8>,
}

/// Reads until the end of the head (`\r\n\r\n`), at most [`MAX_HEAD`] bytes; returns the head
/// and any bytes read past it (the start of a body or of a tunnel).
pub fn read_head(r: &mut impl Read) -> Result<(Vec<u8>, Vec<u8>), Failed> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = find_end(&buf) {
            let rest = buf.split_off(end);
            return Ok((buf, rest));
        }
        if buf.len() >= MAX_HEAD {
            return Err(Failed::invalid(format!(
                "request head longer than {MAX_HEAD} bytes"
            )));
        }
        match r.read(&mut chunk) {
            Ok(0) => {
                return Err(Failed::invalid(
                    "connection closed before the request head ended",
                ))
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(Failed::invalid(format!("reading the request: {e}"))),
        }
    }
}

fn find_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Parses a head; the error is the reason for a 400.
pub fn parse(head: &[u8]) -> Result<Request, Failed> {
    let text =
        std::str::from_utf8(head).map_err(|_| Failed::invalid("request head is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let first = lines.next().unwrap_or_default();
    // HTTP has no control characters in a head but CRLF and a header value's tabs: a bare LF
    // or a NUL passed on would be a header of the guest's making at the origin.
    if first.chars().any(|c| c.is_control())
        || text
            .split("\r\n")
            .skip(1)
            .any(|l| l.chars().any(|c| c.is_control() && c != '\t'))
    {
        return Err(Failed::invalid("control characters in the request head"));
    }
    let mut parts = first.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Failed::invalid(format!("malformed request line {first:?}")));
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() {
        return Err(Failed::invalid(format!("malformed request line {first:?}")));
    }
    if method == "CONNECT" {
        let (host, port) = host_port(target, None)?;
        return Ok(Request {
            method: method.into(),
            host,
            port,
            origin_head: Vec::new(),
        });
    }
    let rest = match target.get(..7) {
        Some(s) if s.eq_ignore_ascii_case("http://") => &target[7..],
        _ if target
            .get(..8)
            .is_some_and(|s| s.eq_ignore_ascii_case("https://")) =>
        {
            return Err(Failed::invalid(
                "https:// URLs go through CONNECT (set https_proxy)",
            ))
        }
        _ => {
            return Err(Failed::invalid(format!(
                "{target:?} is not an absolute http:// URL"
            )))
        }
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = host_port(authority, Some(80))?;
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    let origin_head = origin_head(method, &path, version, authority, lines);
    Ok(Request {
        method: method.into(),
        host,
        port,
        origin_head,
    })
}

/// `host:port` (or `host` with a default port) with no user info.
fn host_port(auth: &str, default: Option<u16>) -> Result<(String, u16), Failed> {
    if auth.is_empty() || auth.contains('@') {
        return Err(Failed::invalid(format!("{auth:?} is not host:port")));
    }
    let (host, port) = match auth.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') || h.ends_with(']') => (h, Some(p)),
        _ => (auth, None),
    };
    let port = match (port, default) {
        (Some(p), _) => p
            .parse::<u16>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| Failed::invalid(format!("port {p:?} is not 1-65535")))?,
        (None, Some(d)) => d,
        (None, None) => return Err(Failed::invalid(format!("{auth:?} has no port"))),
    };
    if host.is_empty() {
        return Err(Failed::invalid(format!("{auth:?} has no host")));
    }
    Ok((host.to_string(), port))
}

/// The head for the origin: origin-form target, proxy and hop-by-hop headers dropped, a Host
/// header (the URL's authority) when the request had none, one request per connection.
fn origin_head<'a>(
    method: &str,
    path: &str,
    version: &str,
    authority: &str,
    headers: impl Iterator<Item = &'a str>,
) -> Vec<u8> {
    const DROP: [&str; 5] = [
        "proxy-connection",
        "proxy-authorization",
        "connection",
        "keep-alive",
        "upgrade",
    ];
    let mut out = format!("{method} {path} {version}\r\n");
    let mut has_host = false;
    for line in headers.filter(|l| !l.is_empty()) {
        let name = line.split(':').next().unwrap_or_default().trim();
        has_host |= name.eq_ignore_ascii_case("host");
        if !DROP.iter().any(|d| name.eq_ignore_ascii_case(d)) {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    if !has_host {
        out.push_str(&format!("Host: {authority}\r\n"));
    }
    out.push_str("Connection: close\r\n\r\n");
    out.into_bytes()
}

/// The proxy's own answer: `status` with `reason` as a one-line text body.
pub fn answer(status: u16, reason: &str) -> Vec<u8> {
    let title = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let body = format!("mcqemu egress proxy: {reason}\n");
    format!(
        "HTTP/1.1 {status} {title}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_in_a_head_are_refused() {
        // Found by the egress fuzz target: NULs in the host of an absolute URL.
        let nul = parse(b"GET http://Examp\0\0\0\x12OM./ HTTP/1.1\r\n\r\n");
        assert!(nul.unwrap_err().msg.contains("control characters"));
        let lf = parse(b"GET http://a\nX-Evil:1/ HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(lf.is_err());
        let header = parse(b"GET http://a/ HTTP/1.1\r\nX: a\nb\r\n\r\n");
        assert!(header.is_err());
        // Found by the egress fuzz target: a multi-byte character across the 8th byte of the
        // target panicked the https:// check.
        let split = parse("GET hp://Ex\u{fffd}le.COM./h HTTP/1.1\r\n\r\n".as_bytes());
        assert!(split
            .unwrap_err()
            .msg
            .contains("not an absolute http:// URL"));
        let tab = parse(b"GET http://a/ HTTP/1.1\r\nX:\tvalue\r\n\r\n");
        assert!(tab.is_ok(), "{tab:?}");
    }

    #[test]
    fn connect_and_absolute_urls_parse() {
        let c = parse(b"CONNECT localhost:8443 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!((c.host.as_str(), c.port), ("localhost", 8443));
        let g = parse(
            b"GET http://Example.org:8080/a?b HTTP/1.1\r\nHost: example.org\r\n\
              Proxy-Connection: keep-alive\r\nConnection: keep-alive\r\nUser-Agent: t\r\n\r\n",
        )
        .unwrap();
        assert_eq!((g.host.as_str(), g.port), ("Example.org", 8080));
        let head = String::from_utf8(g.origin_head).unwrap();
        assert!(head.starts_with("GET /a?b HTTP/1.1\r\nHost: example.org\r\nUser-Agent: t\r\n"));
        assert!(head.ends_with("Connection: close\r\n\r\n") && !head.contains("keep-alive"));
        let d = parse(b"GET http://[::1]?q HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!((d.host.as_str(), d.port), ("[::1]", 80));
        let head = String::from_utf8(d.origin_head).unwrap();
        assert!(
            head.starts_with("GET /?q HTTP/1.0\r\nHost: [::1]\r\n"),
            "{head}"
        );
    }

    #[test]
    fn bad_heads_are_refused() {
        for bad in [
            &b"GET /local HTTP/1.1\r\n\r\n"[..],
            b"GET https://x.org/ HTTP/1.1\r\n\r\n",
            b"CONNECT x.org HTTP/1.1\r\n\r\n",
            b"CONNECT u@x.org:443 HTTP/1.1\r\n\r\n",
            b"GET http://x.org:0/ HTTP/1.1\r\n\r\n",
            b"GET http://x.org/ SPDY\r\n\r\n",
            b"GET  http://x.org/ HTTP/1.1\r\n\r\n",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn heads_are_read_to_their_end_and_bounded() {
        let mut r: &[u8] = b"CONNECT a:1 HTTP/1.1\r\n\r\nTLS";
        let (head, rest) = read_head(&mut r).unwrap();
        assert!(head.ends_with(b"\r\n\r\n") && rest == b"TLS");
        let long = vec![b'a'; MAX_HEAD + 10];
        assert!(read_head(&mut &long[..])
            .unwrap_err()
            .msg
            .contains("longer"));
        assert!(String::from_utf8(answer(403, "no"))
            .unwrap()
            .contains("Content-Length: 24\r\n"));
    }
}
