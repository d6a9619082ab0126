//! The egress proxy's parsers, which read what a hostile guest (the request) or the agent (the
//! rules) wrote. The first byte picks the mode (`% 2`):
//!
//! - 0: the bytes are a connection's data: `read_head` (bounded by `MAX_HEAD`, the head and
//!   the rest adding up to what was read), then `parse`; a parsed request has a host without
//!   spaces or line breaks, a port in 1-65535, and an origin head (plain HTTP) that is one
//!   well-formed head with `Connection: close` and no proxy headers; the host normalises or is
//!   refused, and no rule parsed from it allows anything it did not name.
//! - 1: the bytes are lines of rules: each parses or is refused with a reason; a parsed rule
//!   written back (`text`) parses to the same rule, and allows exactly what it allowed.
#![no_main]

use libfuzzer_sys::{fuzz_target, Corpus};
use mcqemu::net::egress::request::{parse, read_head, MAX_HEAD};
use mcqemu::net::egress::rules::{allowed, normal_host, parse_rules, Host, Rule};

fn request(data: &[u8]) {
    let mut r = data;
    let Ok((head, rest)) = read_head(&mut r) else {
        return;
    };
    assert!(head.ends_with(b"\r\n\r\n"), "a head ends with a blank line");
    assert!(
        head.len() <= MAX_HEAD + 4096,
        "head past its bound: {}",
        head.len()
    );
    assert_eq!(
        head.len() + rest.len() + r.len(),
        data.len(),
        "bytes lost between the head and the rest"
    );
    let Ok(req) = parse(&head) else {
        return;
    };
    assert!(req.port >= 1, "port 0");
    assert!(
        !req.host.is_empty() && !req.host.contains([' ', '\r', '\n', '\0']),
        "host {:?}",
        req.host
    );
    if !req.origin_head.is_empty() {
        let text = String::from_utf8_lossy(&req.origin_head).to_ascii_lowercase();
        assert!(
            text.ends_with("\r\n\r\n"),
            "origin head unterminated: {text:?}"
        );
        assert_eq!(
            text.matches("\r\n\r\n").count(),
            1,
            "two heads in one: {text:?}"
        );
        assert!(text.ends_with("\r\nconnection: close\r\n\r\n"), "{text:?}");
        // Hop-by-hop and proxy headers are dropped, whatever their spelling's case or spaces;
        // the one `Connection: close` is the proxy's own, last.
        let headers: Vec<&str> = text.trim_end().split("\r\n").skip(1).collect();
        let (own, passed) = headers.split_last().expect("at least Connection: close");
        assert_eq!(*own, "connection: close");
        for h in passed {
            let name = h.split(':').next().unwrap_or_default().trim();
            assert!(
                ![
                    "proxy-connection",
                    "proxy-authorization",
                    "connection",
                    "keep-alive",
                    "upgrade"
                ]
                .contains(&name),
                "header {name:?} passed on: {text:?}"
            );
        }
        let first = text.split("\r\n").next().unwrap_or_default();
        assert!(
            first.split(' ').nth(1).is_some_and(|t| t.starts_with('/')),
            "origin-form target expected: {first:?}"
        );
    }
    if let Ok(host) = normal_host(&req.host) {
        let literal = match &host {
            Host::Name(n) => n.clone(),
            Host::Ip(std::net::IpAddr::V6(a)) => format!("[{a}]"),
            Host::Ip(a) => a.to_string(),
            Host::Suffix(_) => panic!("normal_host gave a suffix"),
        };
        let rule = Rule::parse(&format!("{literal}:{}", req.port));
        if let Ok(rule) = rule {
            assert!(
                rule.allows(&host, req.port),
                "{literal}:{} denies itself",
                req.port
            );
            let other = req.port.wrapping_add(1).max(1);
            if other != req.port {
                assert!(
                    !rule.allows(&host, other),
                    "a port rule allowed port {other}"
                );
            }
        }
    }
}

fn rules(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let list: Vec<String> = text.lines().map(str::to_string).collect();
    let Ok(parsed) = parse_rules(&list) else {
        for l in &list {
            let _ = Rule::parse(l);
        }
        return;
    };
    for (raw, rule) in list.iter().zip(&parsed) {
        let again = Rule::parse(&rule.text())
            .unwrap_or_else(|e| panic!("{raw:?} -> {:?} does not parse again: {e}", rule.text()));
        assert_eq!(&again, rule, "{raw:?} written back as {:?}", rule.text());
        // What each rule's own host allows is what the rule allows.
        for host in [&rule.host] {
            if matches!(host, Host::Suffix(_)) {
                continue;
            }
            for port in [80, 443, rule.port.unwrap_or(8080)] {
                assert_eq!(
                    rule.allows(host, port),
                    allowed(std::slice::from_ref(rule), host, port)
                );
            }
        }
        if let Host::Suffix(d) = &rule.host {
            assert!(
                !rule.allows(&Host::Name(d.clone()), 443),
                "*.{d} allows {d} itself"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| -> Corpus {
    let Some((&mode, rest)) = data.split_first() else {
        return Corpus::Reject;
    };
    if rest.len() > 64 * 1024 {
        return Corpus::Reject;
    }
    match mode % 2 {
        0 => request(rest),
        _ => rules(rest),
    }
    Corpus::Keep
});
