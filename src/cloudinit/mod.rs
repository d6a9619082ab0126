//! cloud-init NoCloud seeds: the `cloud_init` parameter of launch_vm and sandbox_vm, checked
//! field by field before anything starts, turned into `#cloud-config` user-data, meta-data with
//! a fresh instance-id (so every sandbox from one base is a new instance), and an optional
//! network-config, all written into a small ISO 9660 image labelled `cidata`.

pub mod console;
pub mod final_message;
pub mod iso;
mod proxy;
pub mod yaml;

use serde_json::{json, Map, Value};

/// Why a `cloud_init` object was refused: the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cloud_init: {}", self.0)
    }
}

impl std::error::Error for ConfigError {}

fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

/// The fields `cloud_init` accepts.
pub const FIELDS: &[&str] = &[
    "hostname",
    "users",
    "ssh_authorized_keys",
    "packages",
    "runcmd",
    "write_files",
    "network_config",
    "user_data",
];
const USER_FIELDS: &[&str] = &[
    "name",
    "ssh_authorized_keys",
    "sudo",
    "shell",
    "groups",
    "lock_passwd",
];
const FILE_FIELDS: &[&str] = &["path", "content", "encoding", "permissions", "owner"];
/// Longest user-data accepted.
pub const MAX_USER_DATA: usize = 1024 * 1024;

fn string(v: &Value, path: &str) -> Result<String, ConfigError> {
    match v.as_str() {
        Some(s) if s.len() <= MAX_USER_DATA => Ok(s.to_string()),
        Some(_) => err(format!("{path} is longer than {MAX_USER_DATA} bytes")),
        None => err(format!("{path} must be a string")),
    }
}

fn strings(v: &Value, path: &str) -> Result<Vec<Value>, ConfigError> {
    let a = v
        .as_array()
        .ok_or_else(|| ConfigError(format!("{path} must be an array of strings")))?;
    a.iter()
        .enumerate()
        .map(|(i, s)| string(s, &format!("{path}[{i}]")).map(Value::String))
        .collect()
}

fn object<'a>(
    v: &'a Value,
    path: &str,
    fields: &[&str],
) -> Result<&'a Map<String, Value>, ConfigError> {
    let m = v
        .as_object()
        .ok_or_else(|| ConfigError(format!("{path} must be an object")))?;
    if let Some(unknown) = m.keys().find(|k| !fields.contains(&k.as_str())) {
        return err(format!(
            "{path} has an unknown field {unknown:?}; known fields: {}",
            fields.join(", ")
        ));
    }
    Ok(m)
}

/// A checked `cloud_init` parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct CloudInit {
    /// The host name for the guest (also `local-hostname` in meta-data).
    pub hostname: Option<String>,
    /// The cloud-config document, or the caller's verbatim user-data.
    pub user_data: UserData,
    /// network-config, when given.
    pub network_config: Option<Value>,
    /// Files of mcqemu's own beside user-data on the seed (never from a tool call): what a
    /// guest copies off its seed instead of parsing it out of user-data (cloud-init reads
    /// user-data's YAML in pure Python at each of its stages: a 600 KB program inlined there
    /// cost a TCG guest about 100 s).
    pub files: Vec<SeedFile>,
}

/// One extra file on the seed.
#[derive(Clone, PartialEq)]
pub struct SeedFile {
    /// Its name on the seed.
    pub name: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for SeedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SeedFile({:?}, {} bytes)", self.name, self.bytes.len())
    }
}

/// What goes into `user-data`.
#[derive(Debug, Clone, PartialEq)]
pub enum UserData {
    /// A `#cloud-config` document built from the structured fields.
    Config(Map<String, Value>),
    /// The caller's own user-data, passed verbatim.
    Raw(String),
}

impl CloudInit {
    /// Checks a `cloud_init` object: unknown fields and wrong types are errors naming the field.
    pub fn parse(v: &Value) -> Result<CloudInit, ConfigError> {
        let m = object(v, "cloud_init", FIELDS)?;
        let hostname = m
            .get("hostname")
            .map(|h| string(h, "hostname"))
            .transpose()?;
        if let Some(h) = &hostname {
            check_hostname(h)?;
        }
        let network_config = match m.get("network_config") {
            None | Some(Value::Null) => None,
            Some(n @ Value::Object(_)) => Some(n.clone()),
            Some(_) => return err("network_config must be an object (network-config v1 or v2)"),
        };
        if let Some(raw) = m.get("user_data") {
            if let Some(other) = m
                .keys()
                .find(|k| !matches!(k.as_str(), "user_data" | "network_config"))
            {
                return err(format!(
                    "user_data is passed verbatim and cannot be combined with {other:?}; put \
                     everything in user_data, or use the structured fields only"
                ));
            }
            return Ok(CloudInit {
                hostname: None,
                user_data: UserData::Raw(string(raw, "user_data")?),
                network_config,
                files: Vec::new(),
            });
        }
        let cfg = config(m, hostname.as_deref())?;
        Ok(CloudInit {
            hostname,
            user_data: UserData::Config(cfg),
            network_config,
            files: Vec::new(),
        })
    }

    /// The `user-data` file (verbatim user-data with its own `final_message` gets mcqemu's
    /// end-of-cloud-init line added: [`final_message`]).
    pub fn user_data(&self) -> String {
        match &self.user_data {
            UserData::Raw(s) => final_message::user_data(s),
            UserData::Config(cfg) => {
                format!(
                    "#cloud-config\n{}",
                    yaml::to_yaml(&Value::Object(cfg.clone()))
                )
            }
        }
    }

    /// The `meta-data` file for one instance.
    pub fn meta_data(&self, instance_id: &str, fallback_hostname: &str) -> String {
        let host = self.hostname.as_deref().unwrap_or(fallback_hostname);
        yaml::to_yaml(&json!({"instance-id": instance_id, "local-hostname": host}))
    }

    /// The `network-config` file, when given.
    pub fn network_config(&self) -> Option<String> {
        self.network_config.as_ref().map(yaml::to_yaml)
    }

    /// The seed image: `cidata` with user-data, meta-data and network-config.
    pub fn seed(
        &self,
        instance_id: &str,
        fallback_hostname: &str,
        now: i64,
    ) -> Result<Vec<u8>, iso::IsoError> {
        let user = self.user_data();
        let meta = self.meta_data(instance_id, fallback_hostname);
        let net = self.network_config();
        let mut files: Vec<(&str, &[u8])> = vec![
            ("user-data", user.as_bytes()),
            ("meta-data", meta.as_bytes()),
        ];
        if let Some(n) = &net {
            files.push(("network-config", n.as_bytes()));
        }
        for f in &self.files {
            files.push((f.name.as_str(), f.bytes.as_slice()));
        }
        iso::write("cidata", &files, now)
    }
}

/// A host name: 1-63 of A-Z a-z 0-9 and -, not starting with -.
fn check_hostname(h: &str) -> Result<(), ConfigError> {
    let ok = !h.is_empty()
        && h.len() <= 63
        && h.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        && !h.starts_with('-');
    if !ok {
        return err(format!(
            "hostname {h:?} is not a host name (1-63 of A-Z a-z 0-9 -, not starting with -)"
        ));
    }
    Ok(())
}

/// The `#cloud-config` document of the structured fields in `m` (checked by [`CloudInit::parse`]).
fn config(
    m: &Map<String, Value>,
    hostname: Option<&str>,
) -> Result<Map<String, Value>, ConfigError> {
    let mut cfg = Map::new();
    if let Some(h) = hostname {
        cfg.insert("hostname".into(), json!(h));
        cfg.insert("fqdn".into(), json!(h));
    }
    if let Some(users) = m.get("users") {
        let list = users
            .as_array()
            .ok_or_else(|| ConfigError("users must be an array of objects".into()))?;
        // "default" keeps the image's own default user beside the new ones.
        let mut out = vec![json!("default")];
        for (i, u) in list.iter().enumerate() {
            out.push(Value::Object(user(u, &format!("users[{i}]"))?));
        }
        cfg.insert("users".into(), Value::Array(out));
    }
    if let Some(k) = m.get("ssh_authorized_keys") {
        cfg.insert(
            "ssh_authorized_keys".into(),
            Value::Array(strings(k, "ssh_authorized_keys")?),
        );
    }
    if let Some(p) = m.get("packages") {
        cfg.insert("packages".into(), Value::Array(strings(p, "packages")?));
    }
    if let Some(r) = m.get("runcmd") {
        cfg.insert("runcmd".into(), runcmd(r)?);
    }
    if let Some(w) = m.get("write_files") {
        let list = w
            .as_array()
            .ok_or_else(|| ConfigError("write_files must be an array of objects".into()))?;
        let mut out = Vec::new();
        for (i, f) in list.iter().enumerate() {
            out.push(Value::Object(write_file(f, &format!("write_files[{i}]"))?));
        }
        cfg.insert("write_files".into(), Value::Array(out));
    }
    Ok(cfg)
}

/// `runcmd`: each command a string (run by sh) or an array of strings (argv).
fn runcmd(r: &Value) -> Result<Value, ConfigError> {
    let list = r
        .as_array()
        .ok_or_else(|| ConfigError("runcmd must be an array".into()))?;
    let mut out = Vec::new();
    for (i, c) in list.iter().enumerate() {
        let path = format!("runcmd[{i}]");
        out.push(match c {
            Value::String(_) => Value::String(string(c, &path)?),
            Value::Array(_) => Value::Array(strings(c, &path)?),
            _ => return err(format!("{path} must be a string or an array of strings")),
        });
    }
    Ok(Value::Array(out))
}

fn user(v: &Value, path: &str) -> Result<Map<String, Value>, ConfigError> {
    let m = object(v, path, USER_FIELDS)?;
    let mut out = Map::new();
    let name = m
        .get("name")
        .ok_or_else(|| ConfigError(format!("{path}.name is required")))?;
    out.insert("name".into(), json!(string(name, &format!("{path}.name"))?));
    for (k, val) in m {
        let p = format!("{path}.{k}");
        match k.as_str() {
            "name" => {}
            "ssh_authorized_keys" => {
                out.insert(k.clone(), Value::Array(strings(val, &p)?));
            }
            "sudo" => {
                out.insert(
                    k.clone(),
                    match val {
                        Value::Bool(false) => json!(false),
                        Value::Bool(true) => json!("ALL=(ALL) NOPASSWD:ALL"),
                        Value::String(_) => json!(string(val, &p)?),
                        _ => {
                            return err(format!(
                                "{p} must be a string (a sudoers rule) or a boolean"
                            ))
                        }
                    },
                );
            }
            "shell" => {
                out.insert(k.clone(), json!(string(val, &p)?));
            }
            "groups" => {
                let groups = match val {
                    Value::String(_) => json!(string(val, &p)?),
                    Value::Array(_) => Value::Array(strings(val, &p)?),
                    _ => return err(format!("{p} must be a string or an array of strings")),
                };
                out.insert(k.clone(), groups);
            }
            "lock_passwd" => {
                let b = val
                    .as_bool()
                    .ok_or_else(|| ConfigError(format!("{p} must be a boolean")))?;
                out.insert(k.clone(), json!(b));
            }
            _ => {}
        }
    }
    Ok(out)
}

fn write_file(v: &Value, path: &str) -> Result<Map<String, Value>, ConfigError> {
    let m = object(v, path, FILE_FIELDS)?;
    let mut out = Map::new();
    let file = m
        .get("path")
        .ok_or_else(|| ConfigError(format!("{path}.path is required")))?;
    let file = string(file, &format!("{path}.path"))?;
    if !file.starts_with('/') {
        return err(format!("{path}.path must be an absolute path in the guest"));
    }
    out.insert("path".into(), json!(file));
    out.insert(
        "content".into(),
        json!(m
            .get("content")
            .map(|c| string(c, &format!("{path}.content")))
            .transpose()?
            .unwrap_or_default()),
    );
    if let Some(e) = m.get("encoding") {
        let e = string(e, &format!("{path}.encoding"))?;
        let known = [
            "text/plain",
            "b64",
            "base64",
            "gzip",
            "gz",
            "gz+base64",
            "gzip+base64",
            "gz+b64",
            "gzip+b64",
        ];
        if !known.contains(&e.as_str()) {
            return err(format!(
                "{path}.encoding {e:?} is not one of {}",
                known.join(", ")
            ));
        }
        out.insert("encoding".into(), json!(e));
    }
    if let Some(p) = m.get("permissions") {
        let p = string(p, &format!("{path}.permissions"))?;
        if !(p.len() >= 3 && p.len() <= 5 && p.chars().all(|c| ('0'..='7').contains(&c))) {
            return err(format!(
                "{path}.permissions {p:?} must be octal, like \"0644\""
            ));
        }
        out.insert("permissions".into(), json!(p));
    }
    if let Some(o) = m.get("owner") {
        out.insert("owner".into(), json!(string(o, &format!("{path}.owner"))?));
    }
    Ok(out)
}

/// A fresh instance id: every launch is a new cloud-init instance.
pub fn new_instance_id() -> String {
    let mut b = [0u8; 8];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_ok();
    if !ok {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        b = (t ^ u64::from(std::process::id()).rotate_left(32)).to_le_bytes();
    }
    format!(
        "iid-mcqemu-{}",
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_and_wrong_types_name_the_field() {
        let cases = [
            (json!({"hostnme": "x"}), "hostnme"),
            (
                json!({"users": [{"name": "a", "shel": "/bin/sh"}]}),
                "users[0]",
            ),
            (json!({"users": [{"shell": "/bin/sh"}]}), "users[0].name"),
            (json!({"packages": "vim"}), "packages"),
            (json!({"runcmd": [1]}), "runcmd[0]"),
            (
                json!({"write_files": [{"path": "rel"}]}),
                "write_files[0].path",
            ),
            (
                json!({"write_files": [{"path": "/a", "permissions": "rw"}]}),
                "permissions",
            ),
            (
                json!({"user_data": "#cloud-config\n", "hostname": "x"}),
                "user_data",
            ),
            (json!({"hostname": "bad host"}), "hostname"),
            (json!("nope"), "cloud_init"),
        ];
        for (v, field) in cases {
            let e = CloudInit::parse(&v)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains(field), "{v}: {e}");
        }
    }

    #[test]
    fn structured_fields_become_cloud_config() {
        let c = CloudInit::parse(&json!({
            "hostname": "box",
            "users": [{"name": "dev", "sudo": true, "ssh_authorized_keys": ["ssh-ed25519 AAA x"]}],
            "runcmd": ["echo hi", ["touch", "/tmp/a b"]],
            "write_files": [{"path": "/etc/x", "content": "a: b\n# c", "permissions": "0600"}]
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let u = c.user_data();
        assert!(u.starts_with("#cloud-config\n"), "{u}");
        assert!(
            u.contains("\"users\":\n  - \"default\"\n  - \"name\": \"dev\""),
            "{u}"
        );
        assert!(u.contains("\"sudo\": \"ALL=(ALL) NOPASSWD:ALL\""), "{u}");
        assert!(u.contains("\"content\": \"a: b\\n# c\""), "{u}");
        let m = c.meta_data("iid-1", "fallback");
        assert_eq!(
            m,
            "\"instance-id\": \"iid-1\"\n\"local-hostname\": \"box\"\n"
        );
        let raw = CloudInit::parse(&json!({"user_data": "#!/bin/sh\necho raw"}))
            .map(|c| c.user_data())
            .unwrap_or_default();
        assert_eq!(raw, "#!/bin/sh\necho raw");
    }

    #[test]
    fn instance_ids_differ() {
        assert_ne!(new_instance_id(), new_instance_id());
    }
}
