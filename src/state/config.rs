//! A VM's launch configuration, typed: everything `launch_vm` decided, in parts (machine,
//! compute, disks, boot, network, host channels, devices, start). It is stored once, in the
//! VM's record, and read back by everything that starts the same VM again: a fork's copies, a
//! resume, a template's clones. `qemu::cmdline` turns it into QEMU's argv.
//!
//! On disk the parts are flattened into one JSON object with the keys the flat spec of earlier
//! versions had, and its pairs (a disk and its format, the UEFI files, the memory file) keep
//! their array form, so records and templates written before read back unchanged.

use std::net::Ipv4Addr;
use std::path::PathBuf;

/// Everything a VM was launched with.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct VmConfig {
    /// VM name.
    pub name: String,
    /// The emulator and the machine it emulates.
    #[serde(flatten)]
    pub machine: Machine,
    /// vCPUs and memory.
    #[serde(flatten)]
    pub compute: Compute,
    /// Disks with their pinned formats, in the guest's order.
    pub disks: Vec<Disk>,
    /// Firmware, installer ISO and direct kernel boot.
    #[serde(flatten)]
    pub boot: Boot,
    /// The guest's network.
    #[serde(flatten)]
    pub network: Network,
    /// The host's ends: sockets, log and pidfile.
    #[serde(flatten)]
    pub channels: Channels,
    /// Devices beyond the disks: the cloud-init seed, the VM generation ID.
    #[serde(flatten)]
    pub devices: Devices,
    /// How QEMU starts: booting, or waiting for a migration stream.
    #[serde(flatten)]
    pub start: Start,
    /// Operator-supplied extra arguments (already checked).
    pub extra_args: Vec<String>,
    /// Keys this version does not know (a newer mcqemu's): kept as read and written back.
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// The emulator and the machine it emulates.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Machine {
    /// QEMU binary.
    pub binary: String,
    /// Machine type (`q35`, `pc-q35-7.2`, `virt`).
    #[serde(rename = "machine")]
    pub kind: String,
    /// The accelerator.
    pub accel: Accel,
    /// The CPU model (None: QEMU's default, as templates from before it was recorded had).
    pub cpu: Option<String>,
    /// Guest architecture (`x86_64`, `aarch64`).
    pub arch: String,
}

/// vCPUs and memory, and where that memory lives.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Compute {
    /// vCPUs.
    pub cpus: u64,
    /// RAM in MiB.
    pub memory_mb: u64,
    /// Guest RAM in this file (templates and their clones).
    pub memory_file: Option<MemoryFile>,
    /// Allocate that shared file's pages at start (`prealloc=on`): the receiver of a copy, whose
    /// memory is in /dev/shm, then takes the stream 4x faster (a page fault per page was most
    /// of the time a stopped guest waits for).
    pub memory_prealloc: bool,
    /// The id of that memory's backend, which names its RAM block in a migration stream: the
    /// machine's own (`pc.ram`) for a copy of a VM that booted without a memory file, None for
    /// `mcq-ram` (templates and their clones).
    pub memory_id: Option<String>,
}

/// Guest RAM kept in a file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(from = "(PathBuf, bool)", into = "(PathBuf, bool)")]
pub struct MemoryFile {
    /// The file.
    pub path: PathBuf,
    /// Shared (`share=on`: writes go to the file, as a template's do), or private (a clone's
    /// copy-on-write view of it).
    pub shared: bool,
}

impl From<(PathBuf, bool)> for MemoryFile {
    fn from((path, shared): (PathBuf, bool)) -> Self {
        MemoryFile { path, shared }
    }
}

impl From<MemoryFile> for (PathBuf, bool) {
    fn from(m: MemoryFile) -> Self {
        (m.path, m.shared)
    }
}

/// A disk and its format, probed once and pinned (a guest cannot turn a raw disk into a qcow2
/// header that names a host file).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(from = "(PathBuf, String)", into = "(PathBuf, String)")]
pub struct Disk {
    /// The image.
    pub path: PathBuf,
    /// Its format (`qcow2`, `raw`, ...).
    pub format: String,
}

impl Disk {
    /// A disk at `path` in `format`.
    pub fn new(path: impl Into<PathBuf>, format: impl Into<String>) -> Self {
        Disk {
            path: path.into(),
            format: format.into(),
        }
    }
}

impl From<(PathBuf, String)> for Disk {
    fn from((path, format): (PathBuf, String)) -> Self {
        Disk { path, format }
    }
}

impl From<Disk> for (PathBuf, String) {
    fn from(d: Disk) -> Self {
        (d.path, d.format)
    }
}

/// Firmware, installer ISO and direct kernel boot.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Boot {
    /// UEFI (None: the machine's BIOS, or the virt board's none).
    pub uefi: Option<Uefi>,
    /// Installer ISO.
    pub iso: Option<PathBuf>,
    /// Direct kernel boot.
    pub kernel: Option<PathBuf>,
    /// Initial ramdisk.
    pub initrd: Option<PathBuf>,
    /// Kernel command line.
    pub append: Option<String>,
}

/// UEFI firmware: its code and the VM's own variable store.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(
    from = "(PathBuf, PathBuf, String)",
    into = "(PathBuf, PathBuf, String)"
)]
pub struct Uefi {
    /// The firmware's code (read-only).
    pub code: PathBuf,
    /// The VM's variable store.
    pub vars: PathBuf,
    /// The format of both (`raw`, `qcow2`).
    pub format: String,
}

impl From<(PathBuf, PathBuf, String)> for Uefi {
    fn from((code, vars, format): (PathBuf, PathBuf, String)) -> Self {
        Uefi { code, vars, format }
    }
}

impl From<Uefi> for (PathBuf, PathBuf, String) {
    fn from(u: Uefi) -> Self {
        (u.code, u.vars, u.format)
    }
}

/// The guest's network.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Network {
    /// No network card at all.
    pub no_net: bool,
    /// Block guest-initiated traffic (slirp restrict=on).
    pub restrict_net: bool,
    /// Resolved port forwards.
    pub forwards: Vec<Forward>,
    /// The network is an empty namespace of the VM's egress proxy (allow_network rules): no
    /// slirp restriction (nothing outside is reachable), forwards listen on its loopback and
    /// the proxy listens on the host for them.
    pub jailed_net: bool,
}

/// The host's ends of a VM: every path here is in its runtime or state folder.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Channels {
    /// QMP socket.
    pub qmp_socket: PathBuf,
    /// Guest-agent socket.
    pub qga_socket: PathBuf,
    /// Serial console socket.
    pub serial_socket: PathBuf,
    /// Serial console log.
    pub serial_log: PathBuf,
    /// Pidfile.
    pub pidfile: PathBuf,
    /// mcqemu's own data channel: a virtio-serial port (`org.mcqemu.data.0`) on a socket
    /// beside the agent's that guest copies stream over. Kept so that a fork, a resume or a clone has the same devices as the VM it came
    /// from (VMs and templates made before the channel have none).
    pub data_channel: bool,
    /// A mount port plugged in from the start (mount 0, with no file server until a mount
    /// takes it): templates have one, so a clone's first mount needs no hot-plug (the guest's
    /// relay already waits on it in the saved state). Left out of records without one.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub mount_spare: bool,
}

/// Devices beyond the disks.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Devices {
    /// A cloud-init NoCloud seed attached read-only as a CD-ROM.
    pub seed: Option<PathBuf>,
    /// Where the seed goes (templates made before the seed moved to virtio keep theirs).
    pub seed_bus: SeedBus,
    /// A vmgenid device with this GUID (`auto` for a fresh one per clone; PC machines only).
    pub vmgenid: Option<String>,
    /// An image kernel's modules (ext4 labelled [`MODULES_LABEL`]), attached read-only after
    /// the disks: mcqemu-agent mounts it at `/lib/modules/RELEASE`. Left out of records
    /// without one, which then read and write as before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modules: Option<PathBuf>,
}

/// The file system label of the modules disk, by which the guest finds it (the agent's
/// `modules::LABEL`).
pub const MODULES_LABEL: &str = "mcq-modules";

/// The device a NoCloud seed is attached as.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SeedBus {
    /// A CD-ROM on a virtio-scsi controller, as Lima attaches it: every cloud kernel has
    /// virtio (Debian's cloud flavour has no AHCI, so q35's default CD-ROM is invisible to it),
    /// and the `virt` boards of other architectures have no IDE or AHCI at all.
    #[default]
    VirtioScsi,
    /// The machine's default CD-ROM interface (AHCI on q35, IDE on pc): what templates saved
    /// before the seed moved to virtio were made with, kept so their saved state still loads.
    Cdrom,
}

/// How QEMU starts.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Start {
    /// Wait for a migration stream (`-incoming defer`) instead of booting.
    pub incoming: bool,
    /// Stay stopped after the incoming state is loaded (`-S`): the QEMU that receives a
    /// running guest's memory for a fork or a suspend never runs it.
    pub start_paused: bool,
}

/// The accelerator a guest runs under.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// Hardware virtualisation.
    Kvm,
    /// QEMU's emulator: runs anywhere, slower.
    #[default]
    Tcg,
}

impl Accel {
    /// QEMU's name for it (`-accel kvm`), also what records and results show.
    pub fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

impl std::fmt::Display for Accel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

crate::described! {
    /// A resolved forward: the one type for the launch config, the record and the live changes.
    #[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
    pub struct Forward {
        /// Host address.
        pub addr: Ipv4Addr,
        /// Host port.
        pub host: u16,
        /// Guest port.
        pub guest: u16,
        /// True when the host port was chosen by mcqemu (absent in older records: false).
        #[serde(default)]
        pub auto: bool,
        /// Fields a newer mcqemu wrote: kept as read and written back (a record loses nothing).
        #[serde(flatten, default, skip_serializing_if = "serde_json::Map::is_empty")]
        pub other: serde_json::Map<String, serde_json::Value>,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_recorded_forward_reads_without_auto_and_keeps_what_it_does_not_know() {
        let v = json!({"addr": "127.0.0.1", "host": 40022, "guest": 22, "via": "proxy"});
        let f: Forward = serde_json::from_value(v.clone()).unwrap();
        assert_eq!((f.host, f.guest, f.auto), (40022, 22, false));
        let mut back = v;
        back["auto"] = json!(false);
        assert_eq!(serde_json::to_value(&f).unwrap(), back);
    }

    /// The flat spec an earlier mcqemu kept in a record (keys and array forms as written then).
    fn flat_spec() -> serde_json::Value {
        json!({
            "name": "old", "binary": "qemu-system-x86_64", "machine": "pc-q35-7.2",
            "accel": "tcg", "cpu": "max", "arch": "x86_64", "memory_mb": 256, "cpus": 1,
            "disks": [["/s/vms/old/overlay.qcow2", "qcow2"]], "iso": null,
            "uefi": ["/usr/share/OVMF/OVMF_CODE.fd", "/s/vms/old/vars.fd", "raw"],
            "no_net": false, "restrict_net": true,
            "forwards": [{"addr": "127.0.0.1", "host": 2222, "guest": 22, "auto": false}],
            "jailed_net": false, "kernel": null, "initrd": null, "append": null,
            "qmp_socket": "/r/old/qmp.sock", "qga_socket": "/r/old/qga.sock",
            "serial_socket": "/r/old/serial.sock", "serial_log": "/s/vms/old/serial.log",
            "pidfile": "/r/old/qemu.pid", "extra_args": [], "seed": "/s/vms/old/seed.iso",
            "seed_bus": "virtio-scsi", "memory_file": ["/t/ram", true],
            "memory_prealloc": false, "memory_id": null, "vmgenid": "auto",
            "data_channel": true, "incoming": false, "start_paused": false
        })
    }

    #[test]
    fn an_earlier_flat_spec_reads_into_the_parts_and_writes_back_the_same_keys() {
        let c: VmConfig = serde_json::from_value(flat_spec()).unwrap();
        assert_eq!(c.machine.kind, "pc-q35-7.2");
        assert_eq!(c.machine.accel, Accel::Tcg);
        assert_eq!(
            c.disks,
            vec![Disk::new("/s/vms/old/overlay.qcow2", "qcow2")]
        );
        let uefi = c.boot.uefi.clone().unwrap();
        assert_eq!(
            (uefi.vars.to_str(), uefi.format.as_str()),
            (Some("/s/vms/old/vars.fd"), "raw")
        );
        assert_eq!(
            c.compute.memory_file,
            Some(MemoryFile {
                path: "/t/ram".into(),
                shared: true
            })
        );
        assert_eq!(c.network.forwards.len(), 1);
        assert!(c.channels.data_channel);
        let back = serde_json::to_value(&c).unwrap();
        let (mut a, mut b) = (
            back.as_object().unwrap().clone(),
            flat_spec().as_object().unwrap().clone(),
        );
        a.sort_keys();
        b.sort_keys();
        assert_eq!(a, b);
    }

    #[test]
    fn a_newer_versions_keys_are_kept_and_written_back() {
        let mut v = flat_spec();
        v["mounts"] = json!([{"tag": "work", "path": "/w"}]);
        let c: VmConfig = serde_json::from_value(v).unwrap();
        assert_eq!(c.other.keys().collect::<Vec<_>>(), vec!["mounts"]);
        assert_eq!(c.machine.kind, "pc-q35-7.2", "the known keys still read");
        let back = serde_json::to_value(&c).unwrap();
        assert_eq!(back["mounts"][0]["tag"], "work");
    }

    #[test]
    fn a_spec_from_before_a_field_existed_gets_its_default() {
        let c: VmConfig = serde_json::from_value(json!({"name": "older", "accel": "kvm"})).unwrap();
        assert_eq!(c.machine.accel, Accel::Kvm);
        assert_eq!(c.compute.memory_id, None);
        assert!(!c.compute.memory_prealloc && !c.channels.data_channel);
        assert_eq!(c.devices.seed_bus, SeedBus::VirtioScsi);
    }

    #[test]
    fn an_unknown_accelerator_is_an_error_not_a_silent_default() {
        let r = serde_json::from_value::<VmConfig>(json!({"name": "x", "accel": "hax"}));
        assert!(r.is_err());
    }
}
