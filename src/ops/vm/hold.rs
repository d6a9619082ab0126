//! A person's hold on a VM's screen, keyboard and mouse (vm_takeover): while it stands, the
//! agent's input tools refuse and only the live view (which has the hold's secret) types and
//! clicks. The hold lives in the VM's registry record, so a second server and a restarted one
//! see it; the record keeps only the secret's SHA-256, never the secret (the registry is a file
//! an agent's copy tools could reach).

use serde_json::Map;

use crate::ops::error::OpError;
use crate::state::record::{Hold, Record};

crate::described! {
    /// A hold as vm_info and list_vms show it.
    #[derive(Debug, Clone, PartialEq, serde::Serialize)]
    pub struct Held {
        /// When the person took over (seconds since the epoch).
        pub since: i64,
        /// The same, as ISO 8601.
        pub since_iso: String,
    }
}

/// A new secret: 32 random bytes, hex (256 bits): a hold's, and `mcqemu view`'s URL's.
pub fn new_secret() -> Result<String, OpError> {
    use std::io::Read;
    let mut buf = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| OpError::host(format!("cannot read the host's /dev/urandom: {e}")))?;
    Ok(hex(&buf))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The digest a record keeps of a secret.
fn digest(secret: &str) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, secret.as_bytes()).as_ref())
}

/// The secret's digest a record's hold keeps.
fn digest_of(rec: &Record) -> Option<&str> {
    rec.hold.as_ref()?.sha256.as_deref()
}

/// The hold on a record, if one stands.
pub fn of(rec: &Record) -> Option<Held> {
    let since = rec.hold.as_ref()?.since?;
    Some(Held {
        since,
        since_iso: crate::clock::iso8601(since),
    })
}

crate::described! {
    /// A hold taken or given back (vm_takeover).
    #[derive(Debug, Clone, PartialEq, serde::Serialize)]
    pub struct Takeover {
        /// The VM.
        pub name: String,
        /// A hold stands now.
        pub held: bool,
        /// The new hold's secret: only its holder can release it.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub hold: Option<String>,
        /// When the hold began, as ISO 8601.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub since: Option<String>,
        /// A hold was released.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub released: Option<bool>,
    }
}

/// vm_takeover: takes a hold on running VM `name`, or with `release` gives back the one whose
/// secret is `secret`.
pub fn takeover(name: &str, release: bool, secret: Option<&str>) -> Result<Takeover, OpError> {
    if release {
        let secret = secret.ok_or_else(|| {
            OpError::invalid(
                "release needs hold: the secret vm_takeover returned when the hold began; only \
                 the person who took over can hand back",
            )
        })?;
        let released = self::release(name, secret)?;
        return Ok(Takeover {
            name: name.to_string(),
            held: false,
            hold: None,
            since: None,
            released: Some(released),
        });
    }
    crate::ops::vm::records::lookup_live(name, "launch it first")?;
    let (secret, h) = take(name)?;
    Ok(Takeover {
        name: name.to_string(),
        held: true,
        hold: Some(secret),
        since: Some(h.since_iso),
        released: None,
    })
}

/// Starts a hold on VM `name`; returns its secret (shown once, to whoever opens the view).
pub fn take(name: &str) -> Result<(String, Held), OpError> {
    let secret = new_secret()?;
    let sha = digest(&secret);
    let since = crate::clock::now_secs();
    let name = name.to_string();
    crate::state::registry::shared().update(|vms| {
        let Some(rec) = vms.get_mut(&name) else {
            return Err(OpError::not_found(format!(
                "no VM named {name:?}; list_vms shows the known VMs"
            )));
        };
        if let Some(h) = of(rec) {
            return Err(OpError::refused(format!(
                "a person already holds VM {name:?} (since {}); only the view that took it can \
                 hand it back",
                h.since_iso
            )));
        }
        rec.hold = Some(Hold {
            since: Some(since),
            sha256: Some(sha),
            other: Map::new(),
        });
        Ok(())
    })?;
    Ok((
        secret,
        Held {
            since,
            since_iso: crate::clock::iso8601(since),
        },
    ))
}

/// Ends the hold on VM `name` when `secret` is its own; a wrong or missing secret is refused
/// (the agent cannot end a person's hold). Ending no hold is no error.
pub fn release(name: &str, secret: &str) -> Result<bool, OpError> {
    let want = digest(secret);
    let name = name.to_string();
    crate::state::registry::shared().update(|vms| {
        let Some(rec) = vms.get_mut(&name) else {
            return Err(OpError::not_found(format!("no VM named {name:?}")));
        };
        let Some(stored) = digest_of(rec) else {
            return Ok(false);
        };
        if !same(stored, &want) {
            return Err(OpError::refused(format!(
                "that is not the secret of the hold on VM {name:?}: only the person who took \
                 over (the live view) can hand it back"
            )));
        }
        rec.hold = None;
        Ok(true)
    })
}

/// Compares two secrets (or digests) in time independent of where they differ.
pub fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// For the agent's input tools: an error when a person holds VM `name`, saying since when and
/// what the agent can do meanwhile.
pub fn check_agent(name: &str, tool: &str) -> Result<(), OpError> {
    let vms = crate::state::registry::shared().load();
    let Some(h) = vms.get(name).and_then(of) else {
        return Ok(());
    };
    Err(OpError::refused(format!(
        "{tool} refused: a person has taken over VM {name:?} since {} (vm_takeover) and is \
         using its screen, keyboard and mouse; they hand it back when done. Meanwhile look with \
         vm_screenshot, or wait for the screen to change with vm_screen_wait; guest_exec and the \
         guest file tools still work. If you need the person (a password, a CAPTCHA), say so \
         in your reply",
        h.since_iso
    )))
}

/// For the view's input: passes when no hold stands or `secret` is the hold's.
pub fn check_view(name: &str, secret: Option<&str>) -> Result<(), OpError> {
    let vms = crate::state::registry::shared().load();
    let Some(rec) = vms.get(name) else {
        return Err(OpError::not_found(format!("no VM named {name:?}")));
    };
    let Some(stored) = digest_of(rec) else {
        return Ok(());
    };
    match secret {
        Some(s) if same(stored, &digest(s)) => Ok(()),
        _ => Err(OpError::refused(format!(
            "VM {name:?} is held by a person; this input does not carry the hold's secret"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_matches_only_its_secret() {
        let s = "ab".repeat(32);
        assert!(same(&digest(&s), &digest(&s)));
        assert!(!same(&digest(&s), &digest("ab")));
        assert!(!same("abc", "ab"));
        assert_eq!(digest("").len(), 64);
    }

    #[test]
    fn a_record_shows_its_hold() {
        let mut rec = Record::default();
        assert_eq!(of(&rec), None);
        rec.hold = Some(Hold {
            since: Some(1_700_000_000),
            sha256: Some("x".into()),
            other: Map::new(),
        });
        let h = of(&rec).unwrap();
        assert_eq!(h.since, 1_700_000_000);
        assert!(h.since_iso.starts_with("2023-11-14"), "{}", h.since_iso);
    }
}
