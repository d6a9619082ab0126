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
//! - 2: the first line is a host, the rest a request head as the guest sent it, rewritten
//!   for two secrets (one replaced where its placeholder stands, one set as a header): the
//!   result is one well-formed head; a secret's value appears only when the host is one of
//!   its own (or the guest wrote it itself); with `close`, it ends in one `Connection: close`.
#![no_main]

use libfuzzer_sys::{fuzz_target, Corpus};
use mcqemu::net::egress::request::{parse, read_head, MAX_HEAD};
use mcqemu::net::egress::rewrite::rewrite;
use mcqemu::net::egress::secrets::ProxySecret;
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

fn secrets(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Some((host, head)) = text.split_once('\n') else {
        return;
    };
    let close = host.len() % 2 == 0;
    let list = [
        ProxySecret {
            name: "a".into(),
            placeholder: "mcqemu-secret-a-0".into(),
            value: "VALUE-OF-A".into(),
            hosts: vec!["api.example.com".into()],
            header: None,
        },
        ProxySecret {
            name: "b".into(),
            placeholder: "mcqemu-secret-b-0".into(),
            value: "VALUE-OF-B".into(),
            hosts: vec!["*.example.org:8443".into()],
            header: Some("Authorization: Bearer {value}".into()),
        },
    ];
    for port in [443u16, 8443] {
        let Ok(r) = rewrite(head.as_bytes(), host, port, &list, close) else {
            continue;
        };
        let out = String::from_utf8(r.head.clone()).expect("a rewritten head is UTF-8");
        assert!(out.ends_with("\r\n\r\n"), "{out:?}");
        assert_eq!(out.matches("\r\n\r\n").count(), 1, "two heads in one: {out:?}");
        assert!(
            !out.trim_end().split("\r\n").any(|l| l.chars().any(|c| c.is_control() && c != '\t')),
            "a control character in {out:?}"
        );
        for s in &list {
            if out.contains(&s.value) && !head.contains(&s.value) {
                assert!(s.goes_to(host, port), "{}'s value went to {host}:{port}", s.name);
            }
        }
        if close {
            assert!(out.ends_with("\r\nConnection: close\r\n\r\n"), "{out:?}");
            assert_eq!(out.to_ascii_lowercase().matches("\r\nconnection:").count(), 1);
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
    match mode % 3 {
        0 => request(rest),
        1 => rules(rest),
        _ => secrets(rest),
    }
    Corpus::Keep
});
