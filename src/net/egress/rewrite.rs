//! A request head as it leaves the proxy for a VM with secrets: in requests to a secret's
//! hosts its placeholder becomes its value wherever it stands in a header (or its header is
//! set); elsewhere placeholders go out as they are, and are reported. Only headers change: a
//! body is never read or rewritten.

use crate::kind::Failed;

use super::secrets::ProxySecret;

/// A head rewritten, and what was done.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Rewritten {
    /// The head to send.
    pub head: Vec<u8>,
    /// Names of the secrets added.
    pub added: Vec<String>,
    /// Names of secrets whose placeholder this request carried to a host not theirs.
    pub stray: Vec<String>,
}

/// Rewrites `head` (a request line, headers, the blank line) of a request to `host`:`port`.
/// With `close`, the request asks the origin to close after answering (an intercepted tunnel
/// serves one request, so no later one on it goes out unrewritten).
pub fn rewrite(
    head: &[u8],
    host: &str,
    port: u16,
    secrets: &[ProxySecret],
    close: bool,
) -> Result<Rewritten, Failed> {
    let text =
        std::str::from_utf8(head).map_err(|_| Failed::invalid("request head is not UTF-8"))?;
    let body = text
        .strip_suffix("\r\n\r\n")
        .ok_or_else(|| Failed::invalid("request head does not end with a blank line"))?;
    let mut lines = body.split("\r\n");
    let first = lines.next().unwrap_or_default();
    if first.is_empty() || first.chars().any(|c| c.is_control()) {
        return Err(Failed::invalid("malformed request line"));
    }
    let ours: Vec<&ProxySecret> = secrets.iter().filter(|s| s.goes_to(host, port)).collect();
    let set: Vec<(String, String, &ProxySecret)> = ours
        .iter()
        .filter_map(|s| {
            let (n, v) = s.header.as_deref()?.split_once(':')?;
            Some((
                n.trim().to_string(),
                v.trim().replace("{value}", &s.value),
                *s,
            ))
        })
        .collect();
    let mut out = Rewritten::default();
    let mut kept = vec![first.to_string()];
    for line in lines {
        if line.chars().any(|c| c.is_control() && c != '\t') {
            return Err(Failed::invalid("control characters in the request head"));
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(Failed::invalid("a header line without a colon"));
        };
        let lname = name.trim().to_ascii_lowercase();
        if set.iter().any(|(n, _, _)| n.eq_ignore_ascii_case(&lname)) {
            continue;
        }
        if close && ["connection", "keep-alive", "proxy-connection"].contains(&lname.as_str()) {
            continue;
        }
        let mut value = value.to_string();
        for s in secrets {
            if !value.contains(&s.placeholder) {
                continue;
            }
            if ours.iter().any(|o| o.placeholder == s.placeholder) && s.header.is_none() {
                value = value.replace(&s.placeholder, &s.value);
                push_once(&mut out.added, &s.name);
            } else if !ours.iter().any(|o| o.placeholder == s.placeholder) {
                push_once(&mut out.stray, &s.name);
            }
        }
        kept.push(format!("{name}:{value}"));
    }
    for (n, v, s) in &set {
        kept.push(format!("{n}: {v}"));
        push_once(&mut out.added, &s.name);
    }
    if close {
        kept.push("Connection: close".to_string());
    }
    let mut head = kept.join("\r\n");
    head.push_str("\r\n\r\n");
    out.head = head.into_bytes();
    Ok(out)
}

fn push_once(list: &mut Vec<String>, name: &str) {
    if !list.iter().any(|n| n == name) {
        list.push(name.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(name: &str, host: &str, header: Option<&str>) -> ProxySecret {
        ProxySecret {
            name: name.into(),
            placeholder: format!("mcqemu-secret-{name}-0123"),
            value: format!("VALUE-{name}"),
            hosts: vec![host.into()],
            header: header.map(str::to_string),
        }
    }

    fn text(r: &Rewritten) -> String {
        String::from_utf8(r.head.clone()).unwrap()
    }

    #[test]
    fn placeholders_become_values_only_for_their_hosts() {
        let s = [
            secret("gh", "api.github.com", None),
            secret(
                "ai",
                "api.example.com",
                Some("Authorization: Bearer {value}"),
            ),
        ];
        let head = b"GET /x HTTP/1.1\r\nHost: api.github.com\r\n\
            Authorization: token mcqemu-secret-gh-0123\r\nConnection: keep-alive\r\n\r\n";
        let r = rewrite(head, "api.github.com", 443, &s, true).unwrap();
        let t = text(&r);
        assert!(t.contains("Authorization: token VALUE-gh\r\n"), "{t}");
        assert!(t.ends_with("Connection: close\r\n\r\n"), "{t}");
        assert!(!t.contains("keep-alive"));
        assert_eq!(r.added, ["gh"]);
        assert!(r.stray.is_empty());

        // Elsewhere the placeholder goes out as it is, and is reported.
        let r = rewrite(head, "evil.example.net", 443, &s, false).unwrap();
        assert!(text(&r).contains("mcqemu-secret-gh-0123"));
        assert!(!text(&r).contains("VALUE"));
        assert_eq!(r.stray, ["gh"]);

        // A header secret replaces the guest's header of that name.
        let head = b"POST /v1 HTTP/1.1\r\nHost: api.example.com\r\nauthorization: x\r\n\r\n";
        let r = rewrite(head, "api.example.com", 443, &s, false).unwrap();
        let t = text(&r);
        assert!(t.contains("Authorization: Bearer VALUE-ai\r\n"), "{t}");
        assert!(!t.contains("authorization: x"), "{t}");
        assert_eq!(r.added, ["ai"]);
    }

    #[test]
    fn bad_heads_are_refused() {
        let s = [secret("gh", "h", None)];
        assert!(rewrite(b"GET / HTTP/1.1\r\nX: a", "h", 80, &s, false).is_err());
        assert!(rewrite(b"GET / HTTP/1.1\r\nno colon\r\n\r\n", "h", 80, &s, false).is_err());
        assert!(rewrite(b"GET / HTTP/1.1\r\nX: a\nY: b\r\n\r\n", "h", 80, &s, false).is_err());
        assert!(rewrite(b"\xff\r\n\r\n", "h", 80, &s, false).is_err());
    }
}
