//! A VM's registry record as typed structs: a misspelt field is a compile error, not a silent
//! `None`.
//!
//! Records outlive the version that wrote them (older and newer mcqemu, the Python server share
//! one registry), so reading is lenient and nothing read is lost: a field this version does not
//! know, or a known field holding a value of another type (or `null`), is kept as read in
//! `other` and written back unchanged; the code sees the typed field as absent, as it saw a
//! mistyped value before. A value the code sets replaces what `other` kept.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

pub use super::config::Forward;
use super::config::VmConfig;

/// Declares a record struct whose fields are all optional and typed, with `other` for the rest,
/// and its lenient conversions from and to a JSON object (serde goes through them).
macro_rules! lenient {
    ($(#[$sm:meta])* pub struct $name:ident { $($(#[$fm:meta])* $field:ident: $ty:ty,)* }) => {
        lenient!(@with [] $(#[$sm])* pub struct $name { $($(#[$fm])* $field: $ty,)* });
    };
    // `projected`: the struct also writes the fields [`Record::flat`] projects from its typed
    // parts, and reads none of them back.
    (projected $(#[$sm:meta])* pub struct $name:ident { $($(#[$fm:meta])* $field:ident: $ty:ty,)* }) => {
        lenient!(@with [projected] $(#[$sm])* pub struct $name { $($(#[$fm])* $field: $ty,)* });
    };
    (@drop [] $r:ident) => {};
    (@drop [projected] $r:ident) => { $r.drop_flat(); };
    (@flat [] $s:ident $m:ident) => {};
    (@flat [projected] $s:ident $m:ident) => { $s.flat(&mut $m); };
    (@with [$($proj:ident)?] $(#[$sm:meta])* pub struct $name:ident { $($(#[$fm:meta])* $field:ident: $ty:ty,)* }) => {
        $(#[$sm])*
        #[derive(Debug, Clone, Default, PartialEq)]
        pub struct $name {
            $($(#[$fm])* pub $field: Option<$ty>,)*
            /// Fields this version does not know, and known ones holding another type: kept as
            /// read and written back.
            pub other: Map<String, Value>,
        }

        impl $name {
            /// The typed view of a JSON object; never fails (see the module doc).
            pub fn from_map(mut m: Map<String, Value>) -> Self {
                let mut r = Self::default();
                $(r.$field = take(&mut m, stringify!($field));)*
                r.other = m;
                lenient!(@drop [$($proj)?] r);
                r
            }

            /// The JSON object: typed fields in declaration order, then the others.
            pub fn to_map(&self) -> Map<String, Value> {
                let mut m = Map::new();
                $(put(&mut m, stringify!($field), &self.$field);)*
                lenient!(@flat [$($proj)?] self m);
                for (k, v) in &self.other {
                    m.entry(k.clone()).or_insert_with(|| v.clone());
                }
                m
            }
        }

        /// A record's part in a result: an object whose fields vary with its writer.
        impl $crate::schema::Schema for $name {
            fn schema() -> Value {
                serde_json::json!({"type": "object"})
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                self.to_map().serialize(s)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                Map::deserialize(d).map(Self::from_map)
            }
        }
    };
}

/// Takes `key` out of `m` as a `T`; a value of another type (or `null`) stays in `m`. One
/// function per type, not per field: the macro's expansions stay small.
#[inline(never)]
fn take<T: for<'de> Deserialize<'de>>(m: &mut Map<String, Value>, key: &str) -> Option<T> {
    let v = m.remove(key)?;
    match T::deserialize(&v) {
        Ok(x) if !v.is_null() => Some(x),
        _ => {
            m.insert(key.to_string(), v);
            None
        }
    }
}

/// Puts `field` into `m` as `key` when it is set.
#[inline(never)]
fn put<T: Serialize>(m: &mut Map<String, Value>, key: &str, field: &Option<T>) {
    if let Some(j) = field.as_ref().and_then(|v| serde_json::to_value(v).ok()) {
        m.insert(key.to_string(), j);
    }
}

lenient! {
    projected
    /// One VM's record (`vms.json`'s `vms.NAME`): its identity, the launch configuration
    /// (`spec`, the one place its launch facts are held), what its running QEMU is (PID,
    /// accelerator, version, input devices, where its sockets are now), and its sandbox,
    /// lifetime and other parts. The launch facts the Python server reads flat (`arch`,
    /// `memory_mb`, `port_forwards`...) are written from `spec` ([`Record::flat`]) and never
    /// read back; a record without a `spec` (an older writer's, an attached QEMU's) keeps its
    /// own as they were.
    pub struct Record {
        /// The VM's name (also its key).
        name: String,
        /// `spawned` or `attached` (absent: spawned).
        source: String,
        /// Its QEMU's PID (a positive integer; the registry skips a record with another).
        pid: i64,
        /// Accelerator in use (`kvm`, `tcg`).
        accel: String,
        /// Disk image paths, in records written before the launch config (`spec`) held them
        /// (the Python mcqemu's, older mcqemu's); read, never written: [`Record::disks`].
        disks: Vec<String>,
        /// Each disk's pinned format, in records from before `spec` held it: read, never
        /// written ([`Record::disk_format`]).
        disk_formats: BTreeMap<String, String>,
        /// The QMP socket.
        qmp_socket: String,
        /// The guest agent's socket.
        qga_socket: String,
        /// The serial console's socket.
        serial_socket: String,
        /// The serial console's log.
        serial_log: String,
        /// QEMU's pidfile.
        pidfile: String,
        /// The keyboard and pointers it has (input tools refuse a kind a VM lacks).
        input: Input,
        /// QEMU's version.
        qemu_version: String,
        /// When it was registered (ISO 8601).
        created_at: String,
        /// The launch configuration, typed and stored once: forks' copies, resumes and clones
        /// start the same devices from it.
        spec: VmConfig,
        /// A launch in progress: whose, since when.
        launching: Launching,
        /// What a sandbox was made from.
        sandbox: Sandbox,
        /// The cloud-init seed it booted with.
        cloud_init: Seed,
        /// Its egress proxy's rules.
        egress: Egress,
        /// A person's hold on its input (the live view).
        hold: Hold,
        /// Background processes by handle.
        background: BTreeMap<String, Background>,
        /// The template whose pool holds this clone (a pooled clone is not yet handed out).
        pooled: String,
        /// The pooled clone answered and may be handed out.
        pool_ready: bool,
        /// When it was pooled (seconds since the epoch).
        pooled_at: i64,
        /// The QMP socket its QEMU was started with (a pooled clone moves folders later).
        launch_qmp_socket: String,
        /// Where sandbox_suspend saved it (its QEMU is gone).
        suspended: Saved,
        /// The suspend folder it was resumed from.
        resumed_from: String,
        /// Why its clock could not be set after a clone or resume (vm_info shows it).
        clock_warning: String,
        /// Why its guest's random generator could not be reseeded.
        reseed_warning: String,
        /// Host folders mounted into it, in the order they were added.
        mounts: Vec<Mount>,
        /// When it ends by itself: a deadline, an idle limit, and what each does.
        lifetime: Lifetime,
        /// Why its QEMU is about to end, written by whoever ends it, before it does.
        ending: End,
        /// Why its QEMU ended, written when it did (cleared when it runs again).
        end: End,
    }
}

lenient! {
    /// A VM's lifetime: the watcher (`mcqemu watch`) ends it at `deadline`, or after `idle_s`
    /// seconds without activity, even with no server running.
    pub struct Lifetime {
        /// Its time to live as given, in seconds.
        ttl_s: u64,
        /// When it ends (seconds since the epoch).
        deadline: i64,
        /// What the deadline does: `stop`, `suspend` or `destroy`.
        on_ttl: String,
        /// How long it may be idle, in seconds.
        idle_s: u64,
        /// What idleness does: `stop`, `suspend` or `destroy`.
        on_idle: String,
        /// Where its idle clock starts (seconds since the epoch): the launch, a resume, a
        /// change of lifetime; activity after it is read from the activity file.
        since: i64,
    }
}

lenient! {
    /// Why a VM's QEMU ended (or is about to).
    pub struct End {
        /// `asked`, `ttl`, `idle`, `guest_poweroff`, `crashed`, `oom` or `killed`.
        reason: String,
        /// The tool (or `watcher`) that asked.
        tool: String,
        /// What was seen, in words.
        detail: String,
        /// When (seconds since the epoch).
        at: i64,
        /// QEMU's exit status, when it exited.
        exit_code: i64,
        /// The signal that ended QEMU.
        signal: i64,
    }
}

lenient! {
    /// A host folder mounted into a VM (served by `mcqemu fs-serve` over a port of its own).
    pub struct Mount {
        /// Its number: the port is `org.mcqemu.fs.N`, QEMU's ids `mcq-fsN`.
        id: u32,
        /// The host folder, resolved when the mount was made.
        host: String,
        /// Where the guest sees it.
        guest: String,
        /// Writes allowed.
        writable: bool,
        /// The file server's PID.
        server_pid: i32,
    }
}

lenient! {
    /// A VM's input devices by kind: a driver name, or `none`.
    pub struct Input {
        /// The keyboard.
        keyboard: String,
        /// The absolute pointer.
        pointer: String,
        /// The relative pointer (mouse).
        relative_pointer: String,
    }
}

lenient! {
    /// A reservation's owner while its QEMU starts.
    pub struct Launching {
        /// The launching server's PID.
        owner_pid: u32,
        /// Since when (seconds since the epoch).
        since: i64,
    }
}

lenient! {
    /// What a sandbox was made from and where its writes go.
    pub struct Sandbox {
        /// The image its overlay is on.
        base_image: String,
        /// That image's format.
        base_format: String,
        /// Its overlay (its disk).
        overlay: String,
        /// Whether, or where, it may reach the network.
        allow_network: Network,
        /// The template it was cloned from.
        template: String,
        /// The template this VM is building (a builder, not a sandbox to fork).
        template_build: String,
        /// The server building it.
        builder_pid: u32,
        /// The sandbox it was forked from.
        fork_of: String,
        /// The frozen image its overlay now sits on.
        frozen: String,
        /// Its frozen images, oldest first.
        chain: Vec<String>,
        /// The container image its root was made from, as the user named it.
        image: String,
        /// That image's manifest digest.
        image_digest: String,
    }
}

lenient! {
    /// The cloud-init seed a launch wrote.
    pub struct Seed {
        /// Its instance id (a fresh one each launch).
        instance_id: String,
        /// The seed ISO.
        seed: String,
    }
}

lenient! {
    /// Where and how sandbox_suspend saved a VM.
    pub struct Saved {
        /// The folder holding its `ram` and `state`.
        dir: String,
        /// When (seconds since the epoch).
        at: i64,
        /// The device state's size.
        state_bytes: u64,
        /// The memory's size.
        ram_bytes: u64,
        /// The id its memory backend had (the resumed QEMU's must match).
        memory_id: String,
        /// Its guest ran when it was saved.
        was_running: bool,
    }
}

lenient! {
    /// A VM's egress proxy as recorded.
    pub struct Egress {
        /// The rules as given.
        rules: Vec<String>,
        /// The proxy's URL in the guest.
        egress_proxy: String,
        /// The operator's secrets its proxy adds: names and placeholders, never values.
        secrets: Vec<PlacedSecret>,
        /// The guest trusts the proxy's CA (its certificate written there).
        trusted: bool,
    }
}

/// A secret placed in a VM: its name, the guest variable holding its placeholder, and the
/// placeholder (never its value).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacedSecret {
    /// Its name in the operator's file.
    pub name: String,
    /// The guest's environment variable.
    pub guest_env: String,
    /// What the guest holds in its place.
    pub placeholder: String,
}

lenient! {
    /// A person holds a VM's input from the live view.
    pub struct Hold {
        /// Since when (seconds since the epoch).
        since: i64,
        /// The hold's token digest.
        sha256: String,
    }
}

lenient! {
    /// A background process started with guest_exec.
    pub struct Background {
        /// Its guest PID.
        pid: i64,
        /// What was started.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Its spool's id in the guest (the wrapper's output files).
        spool: String,
        /// "mcqemu-agent" when the agent itself keeps its output and its group (no spool).
        kept_by: String,
        /// When (seconds since the epoch).
        started_at: i64,
        /// How it ended, once seen.
        ended: Ended,
    }
}

lenient! {
    /// How a background process ended.
    pub struct Ended {
        /// Its exit code.
        exitcode: i64,
        /// The signal that ended it.
        signal: i64,
    }
}

impl Record {
    /// This record with `over`'s fields laid over it: a field `over` holds replaces this one's.
    pub fn overlaid(&self, over: &Record) -> Record {
        let mut m = self.to_map();
        m.extend(over.to_map());
        Record::from_map(m)
    }

    /// The VM's disk images: from its launch config, else (a record written before the config
    /// held them) from `disks`.
    pub fn disk_paths(&self) -> Vec<std::path::PathBuf> {
        match &self.spec {
            Some(c) => c.disks.iter().map(|d| d.path.clone()).collect(),
            None => self.disks.iter().flatten().map(Into::into).collect(),
        }
    }

    /// The format pinned for the disk at `path`: from its launch config, else from an older
    /// record's `disk_formats`.
    pub fn disk_format(&self, path: &str) -> Option<String> {
        let pinned = self.spec.iter().flat_map(|c| &c.disks);
        if let Some(d) = pinned.into_iter().find(|d| d.path.as_os_str() == path) {
            return Some(d.format.clone());
        }
        self.disk_formats.as_ref()?.get(path).cloned()
    }
}

/// A sandbox's `allow_network`: all or nothing, or the egress rules it may reach.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Network {
    /// `true`: the whole network; `false`: only its forwards.
    All(bool),
    /// Only these names (its egress proxy's rules).
    Rules(Vec<String>),
}

/// A string field, absent when empty.
pub fn text(field: &Option<String>) -> Option<&str> {
    field.as_deref().filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec(v: Value) -> Record {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn known_fields_are_typed_and_unknown_ones_kept() {
        let r = rec(json!({"name": "a", "pid": 7, "future": {"k": [1]},
            "sandbox": {"overlay": "/o", "chain": ["x"], "later": 1}}));
        assert_eq!(r.name.as_deref(), Some("a"));
        assert_eq!(r.pid, Some(7));
        let sb = r.sandbox.as_ref().unwrap();
        assert_eq!(sb.chain.as_deref(), Some(&["x".to_string()][..]));
        let back = serde_json::to_value(&r).unwrap();
        assert_eq!(back["future"]["k"][0], 1);
        assert_eq!(back["sandbox"]["later"], 1);
        assert_eq!(rec(back), r);
    }

    #[test]
    fn a_mistyped_known_field_reads_absent_and_is_written_back() {
        let r = rec(json!({"pid": "lots", "pooled_at": 2, "serial_log": null, "spec": null}));
        assert_eq!(r.pid, None);
        assert_eq!(r.pooled_at, Some(2));
        assert_eq!((r.serial_log.clone(), r.spec.clone()), (None, None));
        let back = serde_json::to_value(&r).unwrap();
        assert_eq!(back["pid"], "lots");
        assert_eq!(back.get("serial_log"), Some(&Value::Null));
    }

    #[test]
    fn a_typed_value_replaces_the_mistyped_one_it_read() {
        let mut r = rec(json!({"pid": "lots"}));
        r.pid = Some(512);
        assert_eq!(serde_json::to_value(&r).unwrap()["pid"], 512);
    }

    #[test]
    fn empty_text_reads_absent() {
        assert_eq!(text(&Some(String::new())), None);
        assert_eq!(text(&Some("x".into())), Some("x"));
    }
}
