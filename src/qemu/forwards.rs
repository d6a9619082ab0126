//! Port forwards: parsed from their text forms, and resolved to free host ports.

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};

/// One requested port forward, parsed from its text form as a call gives it (`"2222:22"`,
/// `"auto:22"`, `"22"`, `"0.0.0.0:auto:22"`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "String")]
pub struct PortSpec {
    /// Host address to listen on.
    pub addr: Ipv4Addr,
    /// Host port; None means pick a free one.
    pub host: Option<u16>,
    /// Guest port.
    pub guest: u16,
}

impl PortSpec {
    /// Guest port `guest` from a free host port on `addr`.
    pub fn auto_on(addr: Ipv4Addr, guest: u16) -> PortSpec {
        PortSpec {
            addr,
            host: None,
            guest,
        }
    }

    /// Guest port `guest` from a free host port on 127.0.0.1 (a sandbox's `auto:22`).
    pub fn auto(guest: u16) -> PortSpec {
        PortSpec::auto_on(Ipv4Addr::LOCALHOST, guest)
    }
}

impl TryFrom<String> for PortSpec {
    type Error = ForwardError;
    fn try_from(spec: String) -> Result<PortSpec, ForwardError> {
        parse_forward(&spec)
    }
}

/// A forward is given as text.
impl crate::schema::Param for PortSpec {
    fn param() -> serde_json::Value {
        <String as crate::schema::Param>::param()
    }
}

pub use crate::state::config::Forward;

/// Why port forwards could not be set up.
#[derive(Debug)]
pub enum ForwardError {
    /// A spec in none of the accepted forms.
    Form(String),
    /// A host or guest port that is not 1-65535.
    NotAPort {
        /// The whole spec.
        spec: String,
        /// The part that should be a port.
        value: String,
    },
    /// An address that is not IPv4.
    NotAnAddress {
        /// The whole spec.
        spec: String,
        /// The part that should be an address.
        value: String,
    },
    /// The same host port twice.
    Duplicate(u16),
    /// No free port could be bound on the address (with the error, when binding failed).
    NoFreePort(Ipv4Addr, Option<std::io::Error>),
    /// A bound port's address could not be read.
    LocalAddr(std::io::Error),
}

impl std::fmt::Display for ForwardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ForwardError::Form(spec) => write!(
                f,
                "port forward {spec:?}: use \"HOST:GUEST\", \"auto:GUEST\", \"GUEST\" or \
                 \"ADDR:HOST:GUEST\""
            ),
            ForwardError::NotAPort { spec, value } => write!(
                f,
                "port forward {spec:?}: {value:?} is not a port (1-65535)"
            ),
            ForwardError::NotAnAddress { spec, value } => {
                write!(f, "port forward {spec:?}: {value:?} is not an IPv4 address")
            }
            ForwardError::Duplicate(h) => write!(
                f,
                "host port {h} appears twice in port_forwards; each host port can forward to one \
                 guest port"
            ),
            ForwardError::NoFreePort(addr, Some(e)) => {
                write!(f, "cannot find a free port on {addr}: {e}")
            }
            ForwardError::NoFreePort(addr, None) => write!(f, "cannot find a free port on {addr}"),
            ForwardError::LocalAddr(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ForwardError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ForwardError::NoFreePort(_, Some(e)) | ForwardError::LocalAddr(e) => Some(e),
            _ => None,
        }
    }
}

fn port(s: &str, spec: &str) -> Result<u16, ForwardError> {
    s.trim()
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| ForwardError::NotAPort {
            spec: spec.to_string(),
            value: s.to_string(),
        })
}

/// Parses `"H:G"`, `"auto:G"`, `"G"`, or `"ADDR:H:G"` / `"ADDR:auto:G"`.
pub fn parse_forward(spec: &str) -> Result<PortSpec, ForwardError> {
    let parts: Vec<&str> = spec.split(':').collect();
    let (addr, host, guest) = match parts.as_slice() {
        [g] => (Ipv4Addr::LOCALHOST, "auto", *g),
        [h, g] => (Ipv4Addr::LOCALHOST, *h, *g),
        [a, h, g] => {
            let addr = a
                .trim()
                .parse::<Ipv4Addr>()
                .map_err(|_| ForwardError::NotAnAddress {
                    spec: spec.to_string(),
                    value: a.to_string(),
                })?;
            (addr, *h, *g)
        }
        _ => return Err(ForwardError::Form(spec.to_string())),
    };
    let host = if host.trim().eq_ignore_ascii_case("auto") {
        None
    } else {
        Some(port(host, spec)?)
    };
    Ok(PortSpec {
        addr,
        host,
        guest: port(guest, spec)?,
    })
}

/// Resolves forwards: duplicate host ports are an error, auto ports are picked free on the
/// host and never collide with each other or with explicit ones.
pub fn resolve_forwards(parsed: &[PortSpec]) -> Result<Vec<Forward>, ForwardError> {
    let mut taken: HashSet<u16> = HashSet::new();
    for p in parsed {
        if let Some(h) = p.host {
            if !taken.insert(h) {
                return Err(ForwardError::Duplicate(h));
            }
        }
    }
    let mut out = Vec::new();
    for p in parsed {
        let (host, auto) = match p.host {
            Some(h) => (h, false),
            None => (free_port(p.addr, &taken)?, true),
        };
        taken.insert(host);
        out.push(Forward {
            addr: p.addr,
            host,
            guest: p.guest,
            auto,
            other: Default::default(),
        });
    }
    Ok(out)
}

fn free_port(addr: Ipv4Addr, taken: &HashSet<u16>) -> Result<u16, ForwardError> {
    for _ in 0..64 {
        let l =
            TcpListener::bind((addr, 0)).map_err(|e| ForwardError::NoFreePort(addr, Some(e)))?;
        let p = l.local_addr().map_err(ForwardError::LocalAddr)?.port();
        if !taken.contains(&p) {
            return Ok(p);
        }
    }
    Err(ForwardError::NoFreePort(addr, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(args: &[&str]) -> Vec<PortSpec> {
        args.iter().map(|s| parse_forward(s).unwrap()).collect()
    }

    #[test]
    fn forwards_parse_and_resolve() {
        assert_eq!(
            parse_forward("2222:22").unwrap(),
            PortSpec {
                addr: Ipv4Addr::LOCALHOST,
                host: Some(2222),
                guest: 22
            }
        );
        assert_eq!(parse_forward("22").unwrap().host, None);
        assert_eq!(parse_forward("auto:22").unwrap().host, None);
        assert_eq!(
            parse_forward("0.0.0.0:8080:80").unwrap().addr,
            Ipv4Addr::UNSPECIFIED
        );
        for bad in ["", "a:b", "0:22", "70000:22", "1:2:3:4", "host:1:2"] {
            assert!(parse_forward(bad).is_err(), "{bad}");
        }
        assert!(resolve_forwards(&v(&["2222:22", "2222:80"]))
            .unwrap_err()
            .to_string()
            .contains("twice"));
        let r = resolve_forwards(&v(&["auto:22", "auto:80", "22"])).unwrap();
        let hosts: HashSet<u16> = r.iter().map(|f| f.host).collect();
        assert_eq!(hosts.len(), 3);
        assert!(r.iter().all(|f| f.auto && f.addr == Ipv4Addr::LOCALHOST));
    }
}
