//! The launch facts a record also holds flat beside its `spec`, for the Python server that
//! reads them there: written from `spec` by one table ([`FLAT`]) and never read back from a
//! record that has a spec; a record without one (an older writer's, an attached QEMU's)
//! keeps its own, read through the accessors here.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::config::{Forward, VmConfig};
use super::record::Record;

/// A path as the record writes it.
fn path_text(p: &std::path::Path) -> Value {
    Value::String(p.display().to_string())
}

/// A launch fact written flat beside `spec`, and how it is read from `spec`.
type FlatFact = (&'static str, fn(&VmConfig) -> Value);

/// The launch facts written flat beside `spec` for the Python server, each from `spec` (every
/// one written, null when the launch has none, as the Python server writes them): the one list
/// of them, used to write them ([`Record::flat`]) and to drop them on reading.
const FLAT: &[FlatFact] = &[
    ("arch", |s| Value::from(s.machine.arch.clone())),
    ("machine", |s| Value::from(s.machine.kind.clone())),
    ("memory_mb", |s| Value::from(s.compute.memory_mb)),
    ("cpus", |s| Value::from(s.compute.cpus)),
    ("iso", |s| {
        s.boot.iso.as_deref().map_or(Value::Null, path_text)
    }),
    ("firmware", |s| Value::from(firmware_of(s))),
    ("kernel", |s| {
        s.boot.kernel.as_deref().map_or(Value::Null, path_text)
    }),
    ("initrd", |s| {
        s.boot.initrd.as_deref().map_or(Value::Null, path_text)
    }),
    ("append", |s| {
        s.boot.append.clone().map_or(Value::Null, Value::from)
    }),
    ("no_net", |s| Value::from(s.network.no_net)),
    ("restrict_net", |s| Value::from(s.network.restrict_net)),
    ("port_forwards", |s| {
        serde_json::to_value(&s.network.forwards).unwrap_or(Value::Null)
    }),
    ("extra_args", |s| Value::from(s.extra_args.clone())),
];

/// `uefi` when the launch has a UEFI firmware, else `bios`.
pub fn firmware_of(spec: &VmConfig) -> &'static str {
    if spec.boot.uefi.is_some() {
        "uefi"
    } else {
        "bios"
    }
}

impl Record {
    /// Writes the flat launch facts from `spec` into `m` (a record without one writes none:
    /// its own stay in `other`, as read).
    pub(super) fn flat(&self, m: &mut Map<String, Value>) {
        let Some(spec) = &self.spec else {
            return;
        };
        for (key, value) in FLAT {
            m.insert((*key).to_string(), value(spec));
        }
    }

    /// Drops the flat launch facts read beside a `spec`: they are written afresh from it. One
    /// is adopted first: the forwards, which vm_port_forward once changed in the flat copy
    /// only, so an older record's flat list is the live one.
    pub(super) fn drop_flat(&mut self) {
        let Some(spec) = self.spec.as_mut() else {
            return;
        };
        if let Some(Ok(live)) = self
            .other
            .get("port_forwards")
            .map(Vec::<Forward>::deserialize)
        {
            spec.network.forwards = live;
        }
        for (key, _) in FLAT {
            self.other.remove(*key);
        }
    }

    /// A launch fact of a record without a `spec` (an older writer's), as it wrote it.
    fn legacy<T: for<'de> Deserialize<'de>>(&self, key: &str) -> Option<T> {
        self.other.get(key).and_then(|v| T::deserialize(v).ok())
    }

    /// The guest architecture.
    pub fn arch(&self) -> Option<String> {
        match &self.spec {
            Some(s) => Some(s.machine.arch.clone()),
            None => self.legacy("arch"),
        }
    }

    /// The QEMU machine type.
    pub fn machine_kind(&self) -> Option<String> {
        match &self.spec {
            Some(s) => Some(s.machine.kind.clone()),
            None => self.legacy("machine"),
        }
    }

    /// Guest memory, MiB.
    pub fn memory_mb(&self) -> Option<u64> {
        match &self.spec {
            Some(s) => Some(s.compute.memory_mb),
            None => self.legacy("memory_mb"),
        }
    }

    /// vCPUs.
    pub fn cpus(&self) -> Option<u64> {
        match &self.spec {
            Some(s) => Some(s.compute.cpus),
            None => self.legacy("cpus"),
        }
    }

    /// `bios` or `uefi`.
    pub fn firmware(&self) -> Option<String> {
        match &self.spec {
            Some(s) => Some(firmware_of(s).to_string()),
            None => self.legacy("firmware"),
        }
    }

    /// It has no network card.
    pub fn no_net(&self) -> bool {
        match &self.spec {
            Some(s) => s.network.no_net,
            None => self.legacy("no_net").unwrap_or(false),
        }
    }

    /// Its host port forwards now.
    pub fn forwards(&self) -> Vec<Forward> {
        match &self.spec {
            Some(s) => s.network.forwards.clone(),
            None => self.legacy("port_forwards").unwrap_or_default(),
        }
    }

    /// Sets its host port forwards (where a launch would start them, so forks and resumes
    /// keep them).
    pub fn set_forwards(&mut self, list: Vec<Forward>) {
        match self.spec.as_mut() {
            Some(s) => s.network.forwards = list,
            None => {
                if let Ok(v) = serde_json::to_value(&list) {
                    self.other.insert("port_forwards".into(), v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rec(v: Value) -> Record {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn launch_facts_are_written_from_the_spec_and_never_read_back() {
        let mut spec = VmConfig::default();
        spec.machine.arch = "aarch64".into();
        spec.compute.memory_mb = 512;
        spec.network.forwards = vec![Forward {
            addr: std::net::Ipv4Addr::LOCALHOST,
            host: 2222,
            guest: 22,
            auto: true,
            other: Map::new(),
        }];
        // A stale flat copy beside the spec is dropped: the spec's facts are written.
        let r = rec(json!({"name": "a", "memory_mb": 4096, "arch": "x86_64",
            "spec": serde_json::to_value(&spec).unwrap()}));
        assert_eq!(
            (r.memory_mb(), r.arch().as_deref()),
            (Some(512), Some("aarch64"))
        );
        let back = serde_json::to_value(&r).unwrap();
        assert_eq!(
            (back["memory_mb"].clone(), back["arch"].clone()),
            (json!(512), json!("aarch64"))
        );
        assert_eq!(back["port_forwards"][0]["host"], 2222);
        assert_eq!(back["firmware"], "bios");
        // A record without a spec (an older writer's) keeps its own, as written.
        let old = rec(json!({"name": "b", "memory_mb": 1024, "port_forwards": [
            {"addr": "127.0.0.1", "host": 2200, "guest": 22}]}));
        assert_eq!(
            (old.memory_mb(), old.forwards()[0].host),
            (Some(1024), 2200)
        );
        assert_eq!(serde_json::to_value(&old).unwrap()["memory_mb"], 1024);
    }
}
