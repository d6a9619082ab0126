//! Egress rules: which names (and ports) a VM's guest may reach through its proxy. A rule is
//! `"host"`, `"host:port"` or `"*.domain"` (`"*.domain:port"`); without a port it allows 80
//! and 443. A name rule never matches an IP literal: only a rule that is that literal does.

use crate::kind::Failed;
use std::net::{IpAddr, Ipv6Addr};

/// The most rules one VM takes (Modal's limit for allowed domains).
pub const MAX_RULES: usize = 100;

/// Ports a rule without one allows.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// What a rule names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// One DNS name, lower case, no trailing dot.
    Name(String),
    /// Every name below this domain (not the domain itself).
    Suffix(String),
    /// One IP address, written as a literal.
    Ip(IpAddr),
}

/// One parsed rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The host part.
    pub host: Host,
    /// The one port allowed, or None for [`DEFAULT_PORTS`].
    pub port: Option<u16>,
}

impl Rule {
    /// Parses one rule; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Rule, Failed> {
        let t = text.trim();
        if t.is_empty() || t.len() > 260 {
            return Err(Failed::invalid(format!(
                "{text:?}: a rule is 1-260 characters"
            )));
        }
        if t.contains("://") || t.contains('/') || t.contains('@') {
            return Err(Failed::invalid(format!(
                "{text:?}: give a host name (\"example.com\", \"example.com:8080\" or \
                 \"*.example.com\"), not a URL"
            )));
        }
        let (host, port) = split_port(t).map_err(|e| Failed::invalid(format!("{text:?}: {e}")))?;
        let host = parse_host(host).map_err(|e| Failed::invalid(format!("{text:?}: {e}")))?;
        Ok(Rule { host, port })
    }

    /// Does this rule allow `host` (as the guest wrote it, normalised by [`normal_host`]) on
    /// `port`?
    pub fn allows(&self, host: &Host, port: u16) -> bool {
        let port_ok = match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        };
        port_ok
            && match (&self.host, host) {
                (Host::Name(r), Host::Name(h)) => r == h,
                (Host::Suffix(r), Host::Name(h)) => {
                    h.len() > r.len() + 1
                        && h.ends_with(r.as_str())
                        && h.as_bytes()[h.len() - r.len() - 1] == b'.'
                }
                (Host::Ip(r), Host::Ip(h)) => r == h,
                _ => false,
            }
    }

    /// The rule written back in its canonical form.
    pub fn text(&self) -> String {
        let host = match &self.host {
            Host::Name(n) => n.clone(),
            Host::Suffix(d) => format!("*.{d}"),
            Host::Ip(IpAddr::V6(a)) => format!("[{a}]"),
            Host::Ip(a) => a.to_string(),
        };
        match self.port {
            Some(p) => format!("{host}:{p}"),
            None => host,
        }
    }
}

/// Parses a list of rules: at most [`MAX_RULES`], each valid; the error names the bad one.
pub fn parse_rules(list: &[String]) -> Result<Vec<Rule>, Failed> {
    if list.len() > MAX_RULES {
        return Err(Failed::invalid(format!(
            "{} rules given; at most {MAX_RULES} are allowed",
            list.len()
        )));
    }
    list.iter().map(|r| Rule::parse(r)).collect()
}

/// Is `host`:`port` allowed by any rule?
pub fn allowed(rules: &[Rule], host: &Host, port: u16) -> bool {
    rules.iter().any(|r| r.allows(host, port))
}

/// A host as a guest asked for it (`example.com`, `EXAMPLE.com.`, `10.0.0.1`, `[::1]`),
/// normalised: names lower case without a trailing dot, IP literals parsed (so `127.1` or
/// `0x7f.0.0.1`, which resolvers read as addresses, are refused rather than taken as names).
pub fn normal_host(raw: &str) -> Result<Host, Failed> {
    match parse_host(raw)? {
        Host::Suffix(_) => Err(Failed::invalid(format!("{raw:?} is not a host name"))),
        h => Ok(h),
    }
}

fn split_port(t: &str) -> Result<(&str, Option<u16>), Failed> {
    if let Some(rest) = t.strip_prefix('[') {
        let (inside, after) = rest
            .split_once(']')
            .ok_or(Failed::invalid("an unclosed ["))?;
        return match after {
            "" => Ok((&t[..inside.len() + 2], None)),
            p => Ok((
                &t[..inside.len() + 2],
                Some(port(
                    p.strip_prefix(':').ok_or(Failed::invalid("junk after ]"))?,
                )?),
            )),
        };
    }
    match t.rsplit_once(':') {
        Some((h, _)) if h.contains(':') => Ok((t, None)),
        Some((h, p)) => Ok((h, Some(port(p)?))),
        None => Ok((t, None)),
    }
}

fn port(p: &str) -> Result<u16, Failed> {
    match p.parse::<u16>() {
        Ok(n) if n > 0 && !p.starts_with('+') => Ok(n),
        _ => Err(Failed::invalid(format!("port {p:?} is not 1-65535"))),
    }
}

fn parse_host(h: &str) -> Result<Host, Failed> {
    if let Some(inner) = h.strip_prefix('[').and_then(|x| x.strip_suffix(']')) {
        return inner
            .parse::<Ipv6Addr>()
            .map(|a| Host::Ip(IpAddr::V6(a)))
            .map_err(|_| Failed::invalid(format!("[{inner}] is not an IPv6 address")));
    }
    if let Ok(a) = h.parse::<IpAddr>() {
        return Ok(Host::Ip(a));
    }
    let lower = h.trim_end_matches('.').to_ascii_lowercase();
    let (wild, name) = match lower.strip_prefix("*.") {
        Some(rest) => (true, rest.to_string()),
        None => (false, lower),
    };
    check_name(&name)?;
    if name.rsplit('.').next().is_some_and(numeric) {
        return Err(Failed::invalid(format!(
            "{h:?} reads as a number or an address in another notation; write IP addresses \
             in dotted decimal"
        )));
    }
    Ok(if wild {
        Host::Suffix(name)
    } else {
        Host::Name(name)
    })
}

/// A label inet_aton would read as a number (decimal, octal or 0x hex): a name ending in one
/// is an address in disguise, and no top-level domain is numeric.
fn numeric(label: &str) -> bool {
    match label.strip_prefix("0x") {
        Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
        None => label.bytes().all(|b| b.is_ascii_digit()),
    }
}

fn check_name(name: &str) -> Result<(), Failed> {
    if name.is_empty() || name.len() > 253 {
        return Err(Failed::invalid("a host name is 1-253 characters"));
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !ok {
            return Err(Failed::invalid(format!(
                "{label:?} is not a DNS label (letters, digits, - and _, 1-63 characters; \
                 a wildcard only as a leading \"*.\")"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> Host {
        normal_host(s).unwrap()
    }

    #[test]
    fn rules_parse_in_their_three_forms_and_write_back() {
        let r = Rule::parse("Example.COM").unwrap();
        assert_eq!(
            (r.host.clone(), r.port),
            (Host::Name("example.com".into()), None)
        );
        assert_eq!(Rule::parse("localhost:8080").unwrap().port, Some(8080));
        assert_eq!(
            Rule::parse("*.pypi.org").unwrap().host,
            Host::Suffix("pypi.org".into())
        );
        assert_eq!(Rule::parse("[::1]:80").unwrap().text(), "[::1]:80");
        assert_eq!(Rule::parse("10.0.0.1").unwrap().text(), "10.0.0.1");
        assert_eq!(Rule::parse("*.a.b:99").unwrap().text(), "*.a.b:99");
    }

    #[test]
    fn malformed_rules_are_refused_with_the_reason() {
        for bad in [
            "",
            "http://x.org",
            "x.org/path",
            "x.org:0",
            "x.org:70000",
            "x.org:",
            "a..b",
            "*",
            "*.",
            "a.*.b",
            "-a.org",
            "user@x.org",
            "x.org:+80",
            "127.1",
            "0x7f.1",
            "[::1",
            "[zz]",
            "a b",
        ] {
            assert!(Rule::parse(bad).is_err(), "{bad:?} accepted");
        }
        let many: Vec<String> = (0..=MAX_RULES).map(|i| format!("h{i}.org")).collect();
        assert!(parse_rules(&many).unwrap_err().msg.contains("at most"));
    }

    #[test]
    fn matching_by_name_port_and_suffix() {
        let rules = parse_rules(&["localhost:8080".into(), "*.pypi.org".into()]).unwrap();
        assert!(allowed(&rules, &h("localhost"), 8080));
        assert!(allowed(&rules, &h("LOCALHOST."), 8080));
        assert!(!allowed(&rules, &h("localhost"), 8081));
        assert!(!allowed(&rules, &h("localhost"), 80));
        assert!(allowed(&rules, &h("files.pypi.org"), 443));
        assert!(allowed(&rules, &h("a.files.pypi.org"), 80));
        assert!(!allowed(&rules, &h("pypi.org"), 443));
        assert!(!allowed(&rules, &h("evilpypi.org"), 443));
        assert!(!allowed(&rules, &h("files.pypi.org"), 8443));
    }

    #[test]
    fn a_name_never_matches_an_ip_literal() {
        let rules = parse_rules(&["localhost".into(), "127.0.0.1:81".into()]).unwrap();
        assert!(!allowed(&rules, &h("127.0.0.1"), 80));
        assert!(allowed(&rules, &h("127.0.0.1"), 81));
        assert!(!allowed(&rules, &h("[::1]"), 80));
        assert!(normal_host("2130706433").is_err());
        assert!(normal_host("*.x.org").is_err());
        assert_eq!(h("cafe.be"), Host::Name("cafe.be".into()));
    }
}
