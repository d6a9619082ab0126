//! The operator's secrets: a file of theirs (`MCQEMU_SECRETS`, else `secrets.json` in mcqemu's
//! config folder; mode 600 or refused) that maps a name to a value (given, or read from an
//! environment variable or a file of the host), the hosts allowed to receive it, the guest
//! variable that holds its placeholder, and how it goes out. A tool call names secrets only;
//! the egress proxy swaps a VM's placeholders for the values in requests to those hosts.
//!
//! ```json
//! {"github": {"env_var": "GH_TOKEN_ON_HOST", "hosts": ["api.github.com"],
//!             "guest_env": "GITHUB_TOKEN"},
//!  "openai": {"file": "/etc/keys/openai", "hosts": ["api.openai.com"],
//!             "header": "Authorization: Bearer {value}"}}
//! ```

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::rules::{normal_host, Rule};
use crate::kind::Failed;

/// Largest secrets file read.
const MAX_FILE: u64 = 1 << 20;
/// Largest value (a file read for one is cut off there: refused).
const MAX_VALUE: usize = 16 << 10;
/// Secrets one VM may name.
pub const MAX_PER_VM: usize = 16;
/// What every placeholder starts with, so the proxy's log can name one it saw going elsewhere.
pub const PLACEHOLDER_PREFIX: &str = "mcqemu-secret-";

/// One entry of the file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    /// The value itself.
    value: Option<String>,
    /// A host environment variable holding it.
    env_var: Option<String>,
    /// A host file holding it (trailing newline dropped).
    file: Option<PathBuf>,
    /// The hosts that may receive it (egress rule syntax).
    hosts: Vec<String>,
    /// The guest variable holding its placeholder (default: the name in upper case).
    guest_env: Option<String>,
    /// A header set on every request to its hosts (`Name: text with {value}`); without one,
    /// the placeholder is replaced wherever it stands in the request's headers.
    header: Option<String>,
}

/// A secret as the proxy uses it: never shown, never logged.
#[derive(Clone, Serialize, Deserialize)]
pub struct ProxySecret {
    /// Its name in the file.
    pub name: String,
    /// The placeholder the guest holds.
    pub placeholder: String,
    /// The value.
    pub value: String,
    /// The hosts that may receive it.
    pub hosts: Vec<String>,
    /// The header to set, when it goes out as one.
    pub header: Option<String>,
}

impl std::fmt::Debug for ProxySecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxySecret")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

impl ProxySecret {
    /// Whether `host` (as the guest named it) on `port` may receive this secret.
    pub fn goes_to(&self, host: &str, port: u16) -> bool {
        let Ok(h) = normal_host(host) else {
            return false;
        };
        self.hosts
            .iter()
            .filter_map(|r| Rule::parse(r).ok())
            .any(|r| r.allows(&h, port))
    }
}

/// A secret placed in a VM: what its record keeps (no value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// Its name in the file.
    pub name: String,
    /// The guest variable.
    pub guest_env: String,
    /// Its placeholder.
    pub placeholder: String,
}

/// Where the operator's secrets file is.
pub fn file_path() -> PathBuf {
    if let Some(p) = std::env::var_os("MCQEMU_SECRETS").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .unwrap_or_else(|| PathBuf::from("/etc"));
    config.join("mcqemu").join("secrets.json")
}

/// Resolves the secrets `names` from the file at `path` for one VM, each with a fresh
/// placeholder: what its proxy needs, and what its record keeps. Refuses a file others may read,
/// a name the file lacks, a value that cannot be read; no message holds a value.
pub fn resolve(path: &Path, names: &[String]) -> Result<(Vec<ProxySecret>, Vec<Placed>), Failed> {
    if names.len() > MAX_PER_VM {
        return Err(Failed::invalid(format!(
            "at most {MAX_PER_VM} secrets a VM"
        )));
    }
    let entries = read_file(path)?;
    let mut proxy = Vec::new();
    let mut placed = Vec::new();
    for name in names {
        if placed.iter().any(|p: &Placed| &p.name == name) {
            continue;
        }
        let e = entries.get(name).ok_or_else(|| {
            let known: Vec<&str> = entries.keys().map(String::as_str).collect();
            Failed::invalid(format!(
                "no secret named {name:?} in {} (it names: {}); the operator adds secrets there",
                path.display(),
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            ))
        })?;
        let value = value_of(name, e)?;
        for h in &e.hosts {
            Rule::parse(h).map_err(|why| {
                Failed::invalid(format!(
                    "secret {name:?} in {}: hosts: {why}",
                    path.display()
                ))
            })?;
        }
        if e.hosts.is_empty() {
            return Err(Failed::invalid(format!(
                "secret {name:?} in {} names no hosts to receive it",
                path.display()
            )));
        }
        if let Some(h) = &e.header {
            check_header(name, h)?;
        }
        let guest_env = e
            .guest_env
            .clone()
            .unwrap_or_else(|| name.to_ascii_uppercase().replace('-', "_"));
        if guest_env.is_empty()
            || !guest_env
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
            || guest_env.starts_with(|c: char| c.is_ascii_digit())
        {
            return Err(Failed::invalid(format!(
                "secret {name:?}: guest_env {guest_env:?} is not a variable name"
            )));
        }
        let placeholder = placeholder(name)?;
        proxy.push(ProxySecret {
            name: name.clone(),
            placeholder: placeholder.clone(),
            value,
            hosts: e.hosts.clone(),
            header: e.header.clone(),
        });
        placed.push(Placed {
            name: name.clone(),
            guest_env,
            placeholder,
        });
    }
    Ok((proxy, placed))
}

/// The file's entries, after its permissions are checked.
fn read_file(path: &Path) -> Result<BTreeMap<String, Entry>, Failed> {
    let meta = std::fs::metadata(path).map_err(|e| {
        Failed::invalid(format!(
            "secrets are the operator's, in {} (MCQEMU_SECRETS names another file), which \
             cannot be read: {e}",
            path.display()
        ))
    })?;
    if meta.mode() & 0o077 != 0 {
        return Err(Failed::refused(format!(
            "{} may be read by others (mode {:o}); its secrets are used only from a file of \
             mode 600: chmod 600 {}",
            path.display(),
            meta.mode() & 0o777,
            path.display()
        )));
    }
    if meta.len() > MAX_FILE {
        return Err(Failed::invalid(format!(
            "{} is larger than {MAX_FILE} bytes",
            path.display()
        )));
    }
    let bytes = std::fs::read(path)
        .map_err(|e| Failed::invalid(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_slice(&bytes).map_err(|e| {
        // serde's message names a line and column, never the text at it.
        Failed::invalid(format!(
            "{} is not a secrets file ({{\"NAME\": {{\"value\" | \"env_var\" | \"file\", \
             \"hosts\": [...]}}}}): {}",
            path.display(),
            e
        ))
    })
}

/// The value of secret `name`: exactly one source, read now.
fn value_of(name: &str, e: &Entry) -> Result<String, Failed> {
    let value = match (&e.value, &e.env_var, &e.file) {
        (Some(v), None, None) => v.clone(),
        (None, Some(var), None) => std::env::var(var).map_err(|_| {
            Failed::invalid(format!(
                "secret {name:?} comes from the host variable {var}, which this server's \
                 environment does not have"
            ))
        })?,
        (None, None, Some(f)) => {
            let text = std::fs::read_to_string(f).map_err(|e| {
                Failed::invalid(format!(
                    "secret {name:?} comes from {}, which cannot be read: {e}",
                    f.display()
                ))
            })?;
            text.trim_end_matches(['\n', '\r']).to_string()
        }
        _ => {
            return Err(Failed::invalid(format!(
                "secret {name:?} needs exactly one of value, env_var and file"
            )))
        }
    };
    if value.is_empty() || value.len() > MAX_VALUE || value.chars().any(|c| c.is_control()) {
        return Err(Failed::invalid(format!(
            "secret {name:?}'s value is empty, longer than {MAX_VALUE} bytes, or has control \
             characters (it goes into a header)"
        )));
    }
    Ok(value)
}

/// A header template: `Name: text` with `{value}` in the text, a token as its name.
fn check_header(name: &str, h: &str) -> Result<(), Failed> {
    let ok = h.split_once(':').is_some_and(|(n, v)| {
        !n.is_empty()
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
            && v.contains("{value}")
            && !v.chars().any(|c| c.is_control())
    });
    if ok {
        Ok(())
    } else {
        Err(Failed::invalid(format!(
            "secret {name:?}: header {h:?} is not \"Name: text with {{value}}\""
        )))
    }
}

/// A fresh placeholder for secret `name`: useless anywhere but in this VM's requests.
fn placeholder(name: &str) -> Result<String, Failed> {
    let mut bytes = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| Failed::host("the host gave no random bytes for a placeholder"))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let safe: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    Ok(format!("{PLACEHOLDER_PREFIX}{safe}-{hex}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn file(dir: &Path, body: &str, mode: u32) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let p = dir.join("secrets.json");
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn names_resolve_to_values_and_fresh_placeholders() {
        let dir = std::env::temp_dir().join(format!("mcq-secrets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tok"), "from-a-file\n").unwrap();
        let body = format!(
            r#"{{"github": {{"value": "v-one", "hosts": ["api.github.com"]}},
                 "ai-key": {{"file": "{}", "hosts": ["*.example.com:8443"],
                             "guest_env": "AI", "header": "Authorization: Bearer {{value}}"}}}}"#,
            dir.join("tok").display()
        );
        let p = file(&dir, &body, 0o600);
        let (proxy, placed) = resolve(&p, &["github".into(), "ai-key".into()]).unwrap();
        assert_eq!(proxy[0].value, "v-one");
        assert_eq!(proxy[1].value, "from-a-file");
        assert_eq!(placed[0].guest_env, "GITHUB");
        assert_eq!(placed[1].guest_env, "AI");
        assert!(placed[0].placeholder.starts_with("mcqemu-secret-github-"));
        assert!(
            !format!("{proxy:?}").contains("v-one"),
            "Debug shows no value"
        );
        assert!(proxy[0].goes_to("api.github.com", 443));
        assert!(!proxy[0].goes_to("github.com", 443));
        assert!(proxy[1].goes_to("a.example.com", 8443));
        let (_, again) = resolve(&p, &["github".into()]).unwrap();
        assert_ne!(again[0].placeholder, placed[0].placeholder);

        let e = resolve(&p, &["nope".into()]).unwrap_err();
        assert!(e.msg.contains("no secret named \"nope\"") && e.msg.contains("github"));
        assert!(!e.msg.contains("v-one"));

        let p = file(&dir, &body, 0o644);
        let e = resolve(&p, &["github".into()]).unwrap_err();
        assert!(e.msg.contains("chmod 600"), "{}", e.msg);

        let p = file(
            &dir,
            r#"{"x": {"value": "a", "env_var": "B", "hosts": ["h"]}}"#,
            0o600,
        );
        assert!(resolve(&p, &["x".into()])
            .unwrap_err()
            .msg
            .contains("exactly one"));
        let p = file(
            &dir,
            r#"{"x": {"value": "a", "hosts": ["h"], "header": "X: a"}}"#,
            0o600,
        );
        assert!(resolve(&p, &["x".into()])
            .unwrap_err()
            .msg
            .contains("{value}"));
        let p = file(&dir, r#"{"x": {"value": "secret-text"#, 0o600);
        let e = resolve(&p, &["x".into()]).unwrap_err();
        assert!(!e.msg.contains("secret-text"), "{}", e.msg);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
