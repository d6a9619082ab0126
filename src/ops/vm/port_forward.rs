//! Host forwards added to and removed from a running VM (QEMU's user network takes them live
//! through `hostfwd_add` / `hostfwd_remove`), with launch's specs, collision checks and `auto`
//! ports; the VM's record keeps the current set, so vm_info and a restarted server see it.
//! Typed request and result; no MCP here.

use crate::ops::error::OpError;
use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use serde_json::json;

use crate::host::{self, decide};
use crate::net::egress::forwards::{ask, CONTROL_SOCKET};
use crate::ops::session;
use crate::qemu::forwards::{parse_forward, Forward};
use crate::qemu::vm;

/// The user network's id on every command line mcqemu builds.
const NETDEV: &str = "mcq-net0";

/// vm_port_forward.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// The VM.
    pub name: String,
    /// Forwards to add, in launch's forms ("HOST:GUEST", "auto:GUEST", "GUEST", "ADDR:HOST:GUEST").
    pub add: Vec<String>,
    /// Forwards to remove: a host port ("8080", "ADDR:8080") or a spec as added.
    pub remove: Vec<String>,
}

crate::described! {
    /// One forward as reported.
    #[derive(Debug, Clone, Serialize, PartialEq)]
    pub struct Shown {
        /// Host address.
        pub addr: String,
        /// Host port.
        pub host: u16,
        /// Guest port.
        pub guest: u16,
        /// True when mcqemu chose the host port.
        pub auto: bool,
    }
}

crate::described! {
    /// What vm_port_forward did.
    #[derive(Debug, Clone, Serialize)]
    pub struct Outcome {
        /// The VM.
        pub name: String,
        /// The forwards added (with their host ports).
        pub added: Vec<Shown>,
        /// The forwards removed.
        pub removed: Vec<Shown>,
        /// The VM's forwards now.
        pub port_forwards: Vec<Shown>,
    }
}

fn shown(f: &Forward) -> Shown {
    Shown {
        addr: f.addr.to_string(),
        host: f.host,
        guest: f.guest,
        auto: f.auto,
    }
}

/// Which recorded forward `spec` names for removal.
fn to_remove(spec: &str, current: &[Forward]) -> Result<Forward, OpError> {
    let (addr, host) = match spec.rsplit_once(':') {
        Some((a, h)) if a.parse::<Ipv4Addr>().is_ok() && h.parse::<u16>().is_ok() => {
            (a.parse::<Ipv4Addr>().ok(), h.parse::<u16>().ok())
        }
        _ => match spec.parse::<u16>() {
            Ok(p) => (None, Some(p)),
            Err(_) => {
                let p =
                    parse_forward(spec).map_err(|e| OpError::invalid(format!("remove: {e}")))?;
                (Some(p.addr), p.host)
            }
        },
    };
    let host = host.ok_or_else(|| {
        OpError::invalid(format!("remove {spec:?}: name the host port to remove"))
    })?;
    current
        .iter()
        .find(|f| f.host == host && addr.is_none_or(|a| a == f.addr))
        .cloned()
        .ok_or_else(|| {
            OpError::not_found(format!(
                "remove {spec:?}: the VM has no forward from host port {host}; vm_info lists its \
                 forwards"
            ))
        })
}

/// The forwards to add, checked against the current ones and resolved (auto ports picked).
fn to_add(specs: &[String], current: &[Forward]) -> Result<Vec<Forward>, OpError> {
    let mut taken: HashSet<u16> = current.iter().map(|f| f.host).collect();
    let mut out = Vec::new();
    for spec in specs {
        let p = parse_forward(spec).map_err(|e| OpError::invalid(format!("add: {e}")))?;
        let (port, auto) = match p.host {
            Some(h) if taken.contains(&h) => {
                return Err(OpError::invalid(format!(
                    "add {spec:?}: host port {h} is already forwarded for this VM; remove it \
                     first or pick another"
                )))
            }
            Some(h) => {
                decide::host_port(host::get(), h)
                    .map_err(|e| OpError::from(e).context(format!("add {spec:?}")))?;
                (h, false)
            }
            None => {
                let mut picked = None;
                for _ in 0..16 {
                    let f = crate::qemu::forwards::resolve_forwards(&[
                        crate::qemu::forwards::PortSpec::auto_on(p.addr, p.guest),
                    ])
                    .map_err(|e| OpError::from(e).context(format!("add {spec:?}")))?;
                    if let Some(f) = f.first().filter(|f| !taken.contains(&f.host)) {
                        picked = Some(f.host);
                        break;
                    }
                }
                let h = picked
                    .ok_or_else(|| OpError::host(format!("add {spec:?}: no free host port")))?;
                (h, true)
            }
        };
        taken.insert(port);
        out.push(Forward {
            addr: p.addr,
            host: port,
            guest: p.guest,
            auto,
            other: Default::default(),
        });
    }
    Ok(out)
}

/// vm_port_forward: removes, then adds, live; the record follows what QEMU took.
pub fn apply(req: &Request) -> Result<Outcome, OpError> {
    let rec = forwardable(&req.name)?;
    let current = vm::forwards(&rec);
    let removing: Vec<Forward> = req
        .remove
        .iter()
        .map(|s| to_remove(s, &current))
        .collect::<Result<_, _>>()?;
    let left: Vec<Forward> = current
        .iter()
        .filter(|f| !removing.contains(f))
        .cloned()
        .collect();
    let adding = to_add(&req.add, &left)?;
    // A VM with allow_network rules: QEMU's forwards listen inside its proxy's network, the
    // proxy listens on the host.
    let proxy = crate::ops::vm::egress::rules_of(&rec)
        .is_some()
        .then(|| vm::runtime_dir(&req.name).join(CONTROL_SOCKET));
    let (removed, added, failure) = session::monitor(&req.name, &rec, |q| {
        Ok(change_live(q, proxy.as_deref(), &removing, &adding)?)
    })?;
    // Whatever QEMU took is recorded, even when a later step failed.
    let mut now: Vec<Forward> = current
        .iter()
        .filter(|f| !removed.contains(f))
        .cloned()
        .collect();
    now.extend(added.iter().cloned());
    record(&req.name, &now)?;
    if let Some(why) = failure {
        return Err(OpError::host(format!(
            "{why}. The VM's forwards are now: {}",
            json!(now.iter().map(shown).collect::<Vec<_>>())
        )));
    }
    Ok(Outcome {
        name: req.name.clone(),
        added: added.iter().map(shown).collect(),
        removed: removed.iter().map(shown).collect(),
        port_forwards: now.iter().map(shown).collect(),
    })
}

/// The record of running VM `name`, when it has a network mcqemu made.
fn forwardable(name: &str) -> Result<crate::state::registry::Record, OpError> {
    let rec = crate::ops::vm::records::lookup_live(name, "start it first")?;
    if rec.no_net() {
        return Err(OpError::invalid(format!(
            "VM {name:?} was launched with no_net=true: it has no network to forward into"
        )));
    }
    if !vm::spawned(&rec) {
        return Err(OpError::invalid(format!(
            "VM {name:?} was adopted with attach_vm: its network is not one mcqemu made; forward \
             with its own QEMU monitor"
        )));
    }
    Ok(rec)
}

/// What QEMU removed and added, in order, and why it stopped early (if it did).
type Changed = (Vec<Forward>, Vec<Forward>, Option<String>);

/// Removes, then adds, forwards through the monitor, stopping at the first QEMU refuses.
fn change_live(
    q: &mut crate::qemu::qmp::Qmp,
    proxy: Option<&Path>,
    removing: &[Forward],
    adding: &[Forward],
) -> Result<Changed, crate::qemu::qmp::QmpError> {
    let (mut removed, mut added) = (Vec::new(), Vec::new());
    let inside = |f: &Forward| match proxy {
        Some(_) => Ipv4Addr::LOCALHOST,
        None => f.addr,
    };
    let ask = |verb: &str, f: &Forward| match proxy {
        Some(sock) => ask(sock, &format!("{verb} {}:{}", f.addr, f.host)),
        None => Ok(()),
    };
    for f in removing {
        let out = q.hmp(
            &format!("hostfwd_remove {NETDEV} tcp:{}:{}", inside(f), f.host),
            Duration::from_secs(10),
        )?;
        if !out.contains("removed") {
            let why = format!(
                "QEMU did not remove the forward from {}:{}: {}",
                f.addr,
                f.host,
                out.trim()
            );
            return Ok((removed, added, Some(why)));
        }
        removed.push(f.clone());
        if let Err(e) = ask("remove", f) {
            let why = format!("the egress proxy kept {}:{}: {e}", f.addr, f.host);
            return Ok((removed, added, Some(why)));
        }
    }
    for f in adding {
        if let Err(e) = ask("add", f) {
            return Ok((removed, added, Some(e.msg)));
        }
        let cmd = format!(
            "hostfwd_add {NETDEV} tcp:{}:{}-:{}",
            inside(f),
            f.host,
            f.guest
        );
        let out = q.hmp(&cmd, Duration::from_secs(10))?;
        if !out.trim().is_empty() {
            let _ = ask("remove", f);
            let why = format!(
                "QEMU could not forward host port {}:{} (in use by another program?): {}",
                f.addr,
                f.host,
                out.trim()
            );
            return Ok((removed, added, Some(why)));
        }
        added.push(f.clone());
    }
    Ok((removed, added, None))
}

/// The VM's forwards now, in its record and in its launch spec (a resume, fork or relaunch
/// starts the same forwards).
fn record(name: &str, now: &[Forward]) -> Result<(), OpError> {
    let list = now.to_vec();
    let name = name.to_string();
    crate::state::registry::shared()
        .update(move |vms| {
            if let Some(r) = vms.get_mut(&name) {
                r.set_forwards(list.clone());
            }
            Ok::<_, crate::state::registry::RegistryError>(())
        })
        .map_err(OpError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fw(host: u16, guest: u16) -> Forward {
        Forward {
            addr: Ipv4Addr::LOCALHOST,
            host,
            guest,
            auto: false,
            other: Default::default(),
        }
    }

    #[test]
    fn removal_names_a_recorded_forward_by_its_host_port() {
        let cur = vec![fw(8080, 80), fw(2222, 22)];
        assert_eq!(to_remove("8080", &cur).unwrap(), fw(8080, 80));
        assert_eq!(to_remove("127.0.0.1:2222", &cur).unwrap(), fw(2222, 22));
        assert_eq!(to_remove("2222:22", &cur).unwrap(), fw(2222, 22));
        let e = to_remove("9999", &cur).unwrap_err();
        assert_eq!(e.kind, crate::ops::error::ErrorKind::NotFound);
        assert!(e.msg.contains("no forward"));
        assert!(to_remove("auto:22", &cur).is_err());
    }

    #[test]
    fn additions_never_collide_with_the_current_forwards_or_each_other() {
        let cur = vec![fw(40000, 80)];
        assert!(to_add(&["40000:81".into()], &cur)
            .unwrap_err()
            .msg
            .contains("already forwarded"));
        let added = to_add(&["auto:80".into(), "auto:81".into()], &cur).unwrap();
        assert_eq!(added.len(), 2);
        assert!(added.iter().all(|f| f.auto && f.host != 40000));
        assert_ne!(added[0].host, added[1].host);
        assert!(to_add(&["nonsense:x".into()], &cur).is_err());
    }
}
