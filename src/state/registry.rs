//! The VM registry, `vms.json`: `{"version": 1, "vms": {NAME: record}}` (the legacy bare
//! mapping is read too). Records are typed ([`Record`]) and keep the fields other versions (or
//! the Python mcqemu) wrote, so those round-trip untouched.
//!
//! Every read-modify-write takes an exclusive lock on `vms.json.lock`, re-reads the file under
//! it, writes a PID-unique temporary file, fsyncs and renames: two server instances merge
//! instead of clobbering. An unparseable file is moved aside and the registry starts empty;
//! malformed records are skipped. Both are reported once through [`Registry::take_warnings`].

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Map, Value};

/// The registry of this process's state folder: one per process, shared by every operation.
pub fn shared() -> &'static Registry {
    static REG: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
    REG.get_or_init(|| Registry::new(super::paths::registry_file()))
}

/// The schema version this build writes.
pub const SCHEMA_VERSION: u64 = 1;

/// Largest registry file we read; anything bigger is treated as corrupt.
pub const MAX_FILE_BYTES: usize = 64 * 1024 * 1024;

/// How long to wait for another instance to release the lock.
const LOCK_WAIT: Duration = Duration::from_secs(10);

pub use super::record::Record;

/// All records by name.
pub type Vms = BTreeMap<String, Record>;

/// Why the registry could not be changed.
#[derive(Debug)]
pub enum RegistryError {
    /// I/O on the registry or its lock failed.
    Io(String),
    /// The file was written by a newer mcqemu; we never overwrite it.
    NewerSchema(u64),
    /// Another instance held the lock too long.
    LockTimeout,
}

impl std::fmt::Display for RegistryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegistryError::Io(m) => write!(
                f,
                "registry I/O failed: {m}; check that the state folder is writable"
            ),
            RegistryError::NewerSchema(v) => write!(
                f,
                "the registry was written by a newer mcqemu (schema version {v}); this version \
                 will not overwrite it. Upgrade mcqemu, or set MCQEMU_STATE_DIR to another folder"
            ),
            RegistryError::LockTimeout => write!(
                f,
                "another mcqemu instance held the registry lock for over {} s; retry",
                LOCK_WAIT.as_secs()
            ),
        }
    }
}

impl std::error::Error for RegistryError {}

/// What parsing a registry file produced.
#[derive(Debug, Default, PartialEq, Clone)]
pub struct Parsed {
    /// Valid records.
    pub vms: Vms,
    /// Schema version found (1 for the legacy mapping).
    pub version: u64,
    /// Top-level keys other than version and vms, kept for the next write.
    pub extra: Map<String, Value>,
    /// Records skipped and why.
    pub warnings: Vec<String>,
}

/// True for names matching `^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$`.
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        && name.len() <= 48
}

/// The one message for a name [`valid_name`] refuses; `what`: "VM" or "template".
pub fn invalid_name(what: &str, name: &str) -> String {
    format!(
        "invalid {what} name {name:?}: use 1-48 characters from A-Z a-z 0-9 _ . -, starting with \
         a letter or digit"
    )
}

/// Why a registry file as a whole is unusable.
#[derive(Debug)]
pub enum ParseError {
    /// Over [`MAX_FILE_BYTES`]; holds the size.
    TooBig(usize),
    /// Not JSON at all.
    NotJson(serde_json::Error),
    /// JSON, but not an object.
    NotObject,
    /// `version` is not a positive integer.
    BadVersion,
    /// `vms` is not an object.
    VmsNotObject,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseError::TooBig(size) => write!(
                f,
                "file is {size} bytes, over the {MAX_FILE_BYTES}-byte limit"
            ),
            ParseError::NotJson(e) => write!(f, "not valid JSON: {e}"),
            ParseError::NotObject => f.write_str("top level is not a JSON object"),
            ParseError::BadVersion => f.write_str("\"version\" is not a positive integer"),
            ParseError::VmsNotObject => f.write_str("\"vms\" is not a JSON object"),
        }
    }
}

impl std::error::Error for ParseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ParseError::NotJson(e) => Some(e),
            _ => None,
        }
    }
}

/// Parses registry bytes. Err means the file as a whole is unusable (not JSON, not an object).
pub fn parse(bytes: &[u8]) -> Result<Parsed, ParseError> {
    if bytes.len() > MAX_FILE_BYTES {
        return Err(ParseError::TooBig(bytes.len()));
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Parsed {
            version: SCHEMA_VERSION,
            ..Parsed::default()
        });
    }
    let top = match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return Err(ParseError::NotObject),
        Err(e) => return Err(ParseError::NotJson(e)),
    };
    let mut parsed = Parsed::default();
    let vms_value = if top.contains_key("vms") || top.contains_key("version") {
        let mut top = top;
        parsed.version = match top.remove("version") {
            None => SCHEMA_VERSION,
            Some(v) => v
                .as_u64()
                .filter(|v| *v >= 1)
                .ok_or(ParseError::BadVersion)?,
        };
        let vms = top.remove("vms").unwrap_or_else(|| json!({}));
        parsed.extra = top;
        vms
    } else {
        parsed.version = SCHEMA_VERSION;
        Value::Object(top)
    };
    let vms = match vms_value {
        Value::Object(m) => m,
        _ => return Err(ParseError::VmsNotObject),
    };
    for (name, rec) in vms {
        if !valid_name(&name) {
            parsed
                .warnings
                .push(format!("skipped a record with an invalid name {name:?}"));
            continue;
        }
        match rec {
            Value::Object(r) => {
                let r = Record::from_map(r);
                if let Some(why) = malformed(&r) {
                    parsed
                        .warnings
                        .push(format!("skipped the record for {name:?}: {why}"));
                } else {
                    parsed.vms.insert(name, r);
                }
            }
            _ => parsed.warnings.push(format!(
                "skipped the record for {name:?}: not a JSON object"
            )),
        }
    }
    Ok(parsed)
}

fn malformed(r: &Record) -> Option<&'static str> {
    if super::record::text(&r.qmp_socket).is_none() {
        return Some("no qmp_socket path");
    }
    let pid_ok = match r.pid {
        None => r.other.get("pid").is_none_or(Value::is_null),
        Some(p) => p > 0 && p < i64::from(i32::MAX),
    };
    if !pid_ok {
        return Some("pid is not a positive integer");
    }
    None
}

/// Serializes a registry in the current schema.
pub fn serialize(vms: &Vms, extra: &Map<String, Value>) -> Vec<u8> {
    let mut top = Map::new();
    top.insert("version".into(), json!(SCHEMA_VERSION));
    top.insert("vms".into(), json!(vms));
    for (k, v) in extra {
        top.entry(k.clone()).or_insert_with(|| v.clone());
    }
    let mut out = serde_json::to_vec_pretty(&Value::Object(top)).unwrap_or_default();
    out.push(b'\n');
    out
}

/// The registry of one state folder.
pub struct Registry {
    path: PathBuf,
    seen_warnings: Mutex<HashSet<String>>,
    pending_warnings: Mutex<Vec<String>>,
    in_process: Mutex<()>,
    /// Whether reads keep the last file's bytes and what they parsed to ([`Registry::keep_reads`]).
    keep_reads: AtomicBool,
    last_read: Mutex<Option<(Vec<u8>, Parsed)>>,
}

impl Registry {
    /// The registry stored at `path` (normally `state_dir()/vms.json`).
    pub fn new(path: PathBuf) -> Self {
        Registry {
            path,
            seen_warnings: Mutex::new(HashSet::new()),
            pending_warnings: Mutex::new(Vec::new()),
            in_process: Mutex::new(()),
            keep_reads: AtomicBool::new(false),
            last_read: Mutex::new(None),
        }
    }

    /// Keeps the last file read and its parse: a read of the same bytes then costs a copy of
    /// the records, not a parse (a server reads the registry on every call; with 100 VMs a parse
    /// was most of list_vms' time). Keyed by the whole content, so never stale. A watcher,
    /// which must stay small, keeps its own slim copy instead.
    pub fn keep_reads(&self) {
        self.keep_reads.store(true, Ordering::Relaxed);
    }

    /// The kept parse of `bytes`, when the last file read had exactly these.
    fn kept(&self, bytes: &[u8]) -> Option<Parsed> {
        if !self.keep_reads.load(Ordering::Relaxed) {
            return None;
        }
        let last = self.last_read.lock().unwrap_or_else(|p| p.into_inner());
        match last.as_ref() {
            Some((b, p)) if b.as_slice() == bytes => Some(p.clone()),
            _ => None,
        }
    }

    fn keep(&self, bytes: Vec<u8>, parsed: &Parsed) {
        if self.keep_reads.load(Ordering::Relaxed) {
            *self.last_read.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((bytes, parsed.clone()));
        }
    }

    /// Where the file lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn warn(&self, msg: String) {
        let mut seen = self.seen_warnings.lock().unwrap_or_else(|p| p.into_inner());
        if seen.insert(msg.clone()) {
            crate::log::stderr("warn", &format!("registry: {msg}"));
            self.pending_warnings
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(msg);
        }
    }

    /// Warnings not yet reported (each is reported once per server process).
    pub fn take_warnings(&self) -> Vec<String> {
        std::mem::take(
            &mut *self
                .pending_warnings
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        )
    }

    fn read_file(&self) -> Result<Option<Vec<u8>>, RegistryError> {
        match std::fs::read(&self.path) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(RegistryError::Io(format!(
                "cannot read {}: {e}",
                self.path.display()
            ))),
        }
    }

    /// Reads the records. Without the lock: renames make every read see a whole file. A corrupt
    /// file is quarantined (under the lock) and an empty registry returned.
    pub fn load(&self) -> Vms {
        match self.read_parsed(false) {
            Ok(p) => p.vms,
            Err(e) => {
                self.warn(e.to_string());
                Vms::new()
            }
        }
    }

    fn read_parsed(&self, locked: bool) -> Result<Parsed, RegistryError> {
        let bytes = match self.read_file()? {
            None => {
                return Ok(Parsed {
                    version: SCHEMA_VERSION,
                    ..Parsed::default()
                })
            }
            Some(b) => b,
        };
        if let Some(p) = self.kept(&bytes) {
            return Ok(p);
        }
        match parse(&bytes) {
            Ok(p) => {
                for w in &p.warnings {
                    self.warn(w.clone());
                }
                self.keep(bytes, &p);
                Ok(p)
            }
            Err(why) if locked => {
                self.quarantine(&why)?;
                Ok(Parsed {
                    version: SCHEMA_VERSION,
                    ..Parsed::default()
                })
            }
            Err(_) => self.with_lock(|| self.read_parsed(true)),
        }
    }

    fn quarantine(&self, why: &ParseError) -> Result<(), RegistryError> {
        let aside = self.path.with_file_name(format!(
            "vms.json.corrupt-{}-{}",
            crate::clock::now_secs(),
            std::process::id()
        ));
        std::fs::rename(&self.path, &aside).map_err(|e| {
            RegistryError::Io(format!("cannot move the corrupt registry aside: {e}"))
        })?;
        self.warn(format!(
            "{} was unreadable ({why}); moved aside to {} and started empty. VMs still running \
             can be adopted again with attach_vm",
            self.path.display(),
            aside.display()
        ));
        Ok(())
    }

    fn with_lock<T>(
        &self,
        f: impl FnOnce() -> Result<T, RegistryError>,
    ) -> Result<T, RegistryError> {
        let _inproc = self.in_process.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| RegistryError::Io(format!("cannot create {}: {e}", dir.display())))?;
        }
        let lock_path = self.path.with_file_name("vms.json.lock");
        let held = super::lockfile::lock_within(&lock_path, LOCK_WAIT, &|| false)
            .map_err(|e| RegistryError::Io(format!("cannot lock {}: {e}", lock_path.display())))?;
        match held {
            Some(_held) => f(),
            None => Err(RegistryError::LockTimeout),
        }
    }

    /// Read-modify-write under the lock. `f` sees the current records (re-read under the lock)
    /// and may change them; they are written back only when `f` succeeds and changed something.
    pub fn update<T, E: From<RegistryError>>(
        &self,
        f: impl FnOnce(&mut Vms) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut outcome: Option<Result<T, E>> = None;
        let res = self.with_lock(|| {
            let parsed = self.read_parsed(true)?;
            if parsed.version > SCHEMA_VERSION {
                return Err(RegistryError::NewerSchema(parsed.version));
            }
            let mut vms = parsed.vms.clone();
            let r = f(&mut vms);
            let changed = vms != parsed.vms;
            let ok = r.is_ok();
            outcome = Some(r);
            if ok && changed {
                self.write(&vms, &parsed.extra)?;
            }
            Ok(())
        });
        match res {
            Err(e) => Err(E::from(e)),
            Ok(()) => outcome
                .unwrap_or_else(|| Err(E::from(RegistryError::Io("update did not run".into())))),
        }
    }

    fn write(&self, vms: &Vms, extra: &Map<String, Value>) -> Result<(), RegistryError> {
        let tmp = self
            .path
            .with_file_name(format!("vms.json.tmp-{}", std::process::id()));
        let io =
            |e: std::io::Error| RegistryError::Io(format!("cannot write {}: {e}", tmp.display()));
        let mut f = File::create(&tmp).map_err(io)?;
        f.write_all(&serialize(vms, extra)).map_err(io)?;
        f.sync_all().map_err(io)?;
        drop(f);
        std::fs::rename(&tmp, &self.path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            RegistryError::Io(format!("cannot replace {}: {e}", self.path.display()))
        })?;
        if let Some(dir) = self.path.parent() {
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mcqemu-reg-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn parses_both_layouts_and_skips_bad_records() {
        let text = concat!(
            r#"{"version":1,"vms":{"a":{"qmp_socket":"/s","x":1},"#,
            r#""bad name":{"qmp_socket":"/s"},"b":3,"c":{}}}"#
        );
        let p = parse(text.as_bytes()).unwrap();
        assert_eq!(p.vms.len(), 1);
        assert_eq!(p.vms["a"].other["x"], 1);
        assert_eq!(p.warnings.len(), 3);
        let legacy = parse(br#"{"a":{"qmp_socket":"/s"}}"#).unwrap();
        assert_eq!(legacy.vms.len(), 1);
        assert!(parse(b"[1]").is_err());
        assert!(parse(b"{\"vms\":").is_err());
        assert!(parse(b"").unwrap().vms.is_empty());
    }

    /// A registry file the previous (map-record) version wrote, with every kind of record:
    /// launched, sandbox fork with an egress proxy, hold and background processes, pooled
    /// clone, suspended, attached, a reservation, and a Python-era record with its own fields.
    const OLD_FILE: &str = include_str!("testdata/vms-v1.json");

    #[test]
    fn an_old_registry_file_reads_typed_and_writes_back_what_it_held() {
        let p = parse(OLD_FILE.as_bytes()).unwrap();
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
        assert_eq!(p.vms.len(), 7);
        let sb = &p.vms["sb"];
        let sandbox = sb.sandbox.as_ref().unwrap();
        assert_eq!(sandbox.chain.as_ref().unwrap(), &["sb-0", "sb-1"]);
        assert_eq!(sandbox.frozen.as_deref(), Some("sb-1"));
        assert_eq!(sb.forwards()[0].host, 40022);
        let bg = sb.background.as_ref().unwrap();
        assert_eq!(bg["bg-1"].ended.as_ref().unwrap().exitcode, Some(0));
        assert_eq!(
            sb.egress.as_ref().unwrap().rules.as_ref().unwrap()[0],
            "deb.debian.org"
        );
        assert_eq!(p.vms["deb-pool-1"].pooled.as_deref(), Some("deb"));
        assert_eq!(
            p.vms["new"].launching.as_ref().unwrap().owner_pid,
            Some(4242)
        );
        assert_eq!(p.vms["zz"].pid, None);
        let py = &p.vms["py"];
        assert_eq!(py.memory_mb(), None, "a mistyped field reads absent");
        assert_eq!(py.other["memory_mb"], "1G");
        assert_eq!(py.other["vnc_display"], ":3");
        assert_eq!(
            p.extra["written_by"],
            "mcqemu 0.9 (a later field of the file)"
        );

        let written = serialize(&p.vms, &p.extra);
        let mut before: Value = serde_json::from_str(OLD_FILE).unwrap();
        let after: Value = serde_json::from_slice(&written).unwrap();
        // What changes: a record with a spec writes its flat launch facts from the spec (this
        // file's "sb" said restrict_net true beside a spec saying false: the spec is the
        // launch), and keeps the forwards its flat list held (older versions changed only
        // that copy).
        assert_eq!(after["vms"]["sb"]["restrict_net"], false);
        before["vms"]["sb"]["restrict_net"] = json!(false);
        assert_eq!(after["vms"]["sb"]["spec"]["forwards"][0]["host"], 40022);
        before["vms"]["sb"]["spec"]["forwards"] = after["vms"]["sb"]["spec"]["forwards"].clone();
        assert_eq!(after, before);
        assert_eq!(parse(&written).unwrap(), p);
    }

    #[test]
    fn unknown_fields_round_trip() {
        let p =
            parse(br#"{"version":1,"vms":{"a":{"qmp_socket":"/s","future":{"k":[1]}}},"top":"t"}"#)
                .unwrap();
        let again = parse(&serialize(&p.vms, &p.extra)).unwrap();
        assert_eq!(again.vms["a"].other["future"]["k"][0], 1);
        assert_eq!(again.extra["top"], "t");
    }

    #[test]
    fn corrupt_file_is_quarantined_once() {
        let d = tmpdir("corrupt");
        std::fs::write(d.join("vms.json"), b"{not json").unwrap();
        let reg = Registry::new(d.join("vms.json"));
        assert!(reg.load().is_empty());
        assert_eq!(reg.take_warnings().len(), 1);
        assert!(reg.take_warnings().is_empty());
        let moved = std::fs::read_dir(&d)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with("vms.json.corrupt-")
            })
            .count();
        assert_eq!(moved, 1);
        reg.update(|vms| {
            vms.insert(
                "a".into(),
                serde_json::from_value(json!({"qmp_socket": "/s"})).unwrap(),
            );
            Ok::<_, RegistryError>(())
        })
        .unwrap();
        assert_eq!(reg.load().len(), 1);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A kept read is never stale: a file of the same size in the same instant (another
    /// server's write, by hand, or a reused inode) is parsed again.
    #[test]
    fn kept_reads_follow_every_change() {
        let d = tmpdir("kept");
        let path = d.join("vms.json");
        let write = |sock: &str| {
            let body = json!({"version": 1, "vms": {"a": {"qmp_socket": sock}}});
            std::fs::write(&path, body.to_string()).unwrap();
        };
        let reg = Registry::new(path.clone());
        reg.keep_reads();
        write("/s1");
        let first = reg.load();
        assert_eq!(reg.load(), first);
        write("/s2");
        assert_eq!(reg.load()["a"].qmp_socket.as_deref(), Some("/s2"));
        reg.update(|vms| {
            vms.insert(
                "b".into(),
                serde_json::from_value(json!({"qmp_socket": "/s3"})).unwrap(),
            );
            Ok::<_, RegistryError>(())
        })
        .unwrap();
        assert_eq!(reg.load().len(), 2);
        assert_eq!(reg.load(), Registry::new(path).load());
        std::fs::write(d.join("vms.json"), b"{not json").unwrap();
        assert!(reg.load().is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn newer_schema_is_never_overwritten() {
        let d = tmpdir("newer");
        let body = br#"{"version":2,"vms":{}}"#;
        std::fs::write(d.join("vms.json"), body).unwrap();
        let reg = Registry::new(d.join("vms.json"));
        let r = reg.update(|_| Ok::<_, RegistryError>(()));
        assert!(matches!(r, Err(RegistryError::NewerSchema(2))));
        assert_eq!(std::fs::read(d.join("vms.json")).unwrap(), body);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn concurrent_updates_merge() {
        let d = tmpdir("merge");
        let path = d.join("vms.json");
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let reg = Registry::new(path);
                    reg.update(|vms| {
                        vms.insert(
                            format!("vm{i}"),
                            serde_json::from_value(json!({"qmp_socket": "/s"})).unwrap(),
                        );
                        Ok::<_, RegistryError>(())
                    })
                    .unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(Registry::new(path).load().len(), 8);
        let _ = std::fs::remove_dir_all(&d);
    }
}
