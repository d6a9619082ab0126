//! launch_vm's parameters as a typed request, and how they become a [`LaunchRequest`]: the
//! machine and accelerator decided for this host, extra_args, forwards and paths checked,
//! the firmware found. Nothing is written here: a refused request leaves nothing behind (the
//! UEFI variable store is copied by the launch, once the name is reserved).

use std::path::PathBuf;

use serde_json::Value;

use crate::cloudinit::CloudInit;
use crate::host::{self, binaries, decide};
use crate::net::egress::process::GUEST_URL;
use crate::net::egress::rules::{parse_rules, Rule};
use crate::ops::error::OpError;
use crate::ops::vm::checks::{checked_image, checked_path};
use crate::ops::vm::launch::{
    default_arch, default_firmware, LaunchRequest, ARCHES, DEFAULT_MEMORY_MB,
};
use crate::qemu::cmdline::x86;
use crate::qemu::extra_args::check_extra_args;
use crate::qemu::firmware;
pub use crate::qemu::forwards::PortSpec;
use crate::qemu::forwards::{resolve_forwards, Forward};
use crate::qemu::vm;
use crate::state::config::{
    Boot, Channels, Compute, Devices, Disk, Machine, Network, Uefi, VmConfig,
};
use crate::state::record::Record;
use crate::state::roots::{self, Access};

/// What launch_vm (and sandbox_vm, template_create, image_prepare) were asked for, as given:
/// None is "the default". Path parameters are the caller's text, checked here.
#[derive(Debug, Clone, Default)]
pub struct LaunchArgs {
    /// Guest architecture.
    pub arch: Option<String>,
    /// Machine type.
    pub machine: Option<String>,
    /// `kvm`, `tcg` or `auto`.
    pub accel: Option<String>,
    /// RAM in MiB.
    pub memory_mb: Option<i64>,
    /// vCPUs.
    pub cpus: Option<i64>,
    /// `bios` or `uefi`.
    pub firmware: Option<String>,
    /// An installer ISO.
    pub iso: Option<String>,
    /// A kernel to boot directly.
    pub kernel: Option<String>,
    /// Its initial ramdisk.
    pub initrd: Option<String>,
    /// Its command line.
    pub append: Option<String>,
    /// Extra QEMU arguments (checked against the allowlist).
    pub extra_args: Vec<String>,
    /// No network at all.
    pub no_net: bool,
    /// Block guest-initiated traffic.
    pub restrict_net: bool,
    /// None: none for launch_vm; sandboxes forward `auto:22` unless told.
    pub port_forwards: Option<Vec<PortSpec>>,
    /// The `cloud_init` parameter as given (parsed and checked here).
    pub cloud_init: Option<Value>,
    /// Files of mcqemu's own for the seed, beside user-data (image_prepare's agent); only
    /// with a `cloud_init`.
    pub seed_files: Vec<crate::cloudinit::SeedFile>,
    /// `allow_network` rules (already parsed): the VM reaches only these names, through its
    /// egress proxy.
    pub egress: Vec<Rule>,
    /// Names of the operator's secrets its egress proxy adds (their values never pass here).
    pub secrets: Vec<String>,
    /// Host folders to mount into the guest once it runs.
    pub mounts: Vec<crate::ops::vm::mounts::MountSpec>,
    /// The lifetime asked for (each part None: the kind's default).
    pub lifetime: crate::ops::vm::lifetime::Asked,
    /// An image kernel's modules disk (from its kit, never from a tool call).
    pub modules: Option<PathBuf>,
}

impl LaunchArgs {
    /// The cloud-init config, parsed and checked (None when not given).
    pub fn cloud_init(&self) -> Result<Option<CloudInit>, OpError> {
        self.cloud_init
            .as_ref()
            .filter(|v| !v.is_null())
            .map(CloudInit::parse)
            .transpose()
            .map(|c| {
                c.map(|mut c| {
                    c.files = self.seed_files.clone();
                    c
                })
            })
            .map_err(OpError::from)
    }
}

/// launch_vm's `disks`: each inside the roots, existing, and checked as an untrusted image;
/// a format an earlier launch of VM `name` pinned stays pinned (a guest that wrote another
/// format's header into its raw disk cannot change how the next launch opens it).
pub fn checked_disks(name: &str, disks: &[String]) -> Result<Vec<Disk>, OpError> {
    let previous = crate::state::registry::shared().load().remove(name);
    let mut out = Vec::new();
    for (i, d) in disks.iter().enumerate() {
        let p = roots::check_str(d, Access::Write)
            .map_err(|e| OpError::from(e).context(format!("disks[{i}]")))?;
        if !p.is_file() {
            return Err(OpError::not_found(format!(
                "disks[{i}]: {} does not exist or is not a file; create one with image_create",
                p.display()
            )));
        }
        let pin = previous
            .as_ref()
            .and_then(|r| r.disk_format(&p.display().to_string()));
        let fmt = checked_image(&p, &format!("disks[{i}]"), pin.as_deref())?.format;
        out.push(Disk::new(p, fmt));
    }
    Ok(out)
}

/// The launch `a` asks for, of VM `name` on `disks` (already checked).
pub fn request(a: &LaunchArgs, name: &str, disks: Vec<Disk>) -> Result<LaunchRequest, OpError> {
    let arch = a.arch.clone().unwrap_or_else(|| default_arch().to_string());
    let pc = x86(&arch);
    let qemu = binaries::find(&arch)?;
    let machine = machine(a, &arch, &qemu)?;
    let requested = requested_accel(a);
    let (accel, accel_note) = decide::accel(host::get(), &arch, &requested)?;
    check_extra(&a.extra_args)?;
    if a.no_net && !a.egress.is_empty() {
        return Err(OpError::invalid(
            "allow_network rules need a network; drop no_net=true or the rules",
        ));
    }
    if !a.secrets.is_empty() && a.egress.is_empty() {
        return Err(OpError::invalid(
            "secrets are added by the egress proxy, which only a VM with allow_network rules \
             has: give rules that name the secrets' hosts; nothing was started",
        ));
    }
    let forwards = forwards(a)?;
    let firmware = firmware_name(a, &arch)?;
    let (uefi, uefi_vars_from) = if firmware == "uefi" {
        let fw = firmware::find_uefi(&arch, &machine)?;
        let vars = vm::state_dir(name).join("uefi-vars.fd");
        (
            Some(Uefi {
                code: fw.code,
                vars,
                format: fw.format,
            }),
            Some(fw.vars),
        )
    } else {
        (None, None)
    };
    let spec = VmConfig {
        name: name.to_string(),
        machine: Machine {
            binary: qemu.path.display().to_string(),
            kind: machine,
            accel,
            cpu: Some(decide::cpu_model(accel, &arch).to_string()),
            arch,
        },
        compute: Compute {
            memory_mb: a.memory_mb.unwrap_or(DEFAULT_MEMORY_MB).max(16) as u64,
            cpus: match a.cpus {
                Some(c) => c.max(1) as u64,
                None => decide::default_cpus(host::get()),
            },
            ..Compute::default()
        },
        disks,
        boot: Boot {
            uefi,
            iso: existing(a.iso.as_deref(), "iso", "ISO")?,
            kernel: existing(a.kernel.as_deref(), "kernel", "kernel")?,
            initrd: existing(a.initrd.as_deref(), "initrd", "initrd")?,
            append: a.append.clone(),
        },
        network: Network {
            no_net: a.no_net,
            restrict_net: a.restrict_net,
            forwards,
            jailed_net: !a.egress.is_empty(),
        },
        channels: Channels {
            data_channel: true,
            ..Channels::default()
        },
        devices: Devices {
            // A fresh generation ID at every start, on the machines that have the device: a
            // fork's copies and a resumed sandbox then tell the guest it was copied (it
            // reseeds at once).
            vmgenid: pc.then(|| "auto".to_string()),
            modules: a.modules.clone(),
            ..Devices::default()
        },
        extra_args: a.extra_args.clone(),
        ..VmConfig::default()
    };
    if spec.boot.initrd.is_some() && spec.boot.kernel.is_none() {
        return Err(OpError::invalid("initrd needs kernel (direct kernel boot)"));
    }
    let lifetime = crate::ops::vm::lifetime::resolve(
        crate::ops::vm::lifetime::Kind::Launched,
        &a.lifetime,
        crate::clock::now_secs(),
    )?;
    Ok(LaunchRequest {
        spec,
        extra_record: Record {
            lifetime,
            ..Record::default()
        },
        accel_note,
        kvm_fallback: requested == "auto",
        cloud_init: match a.egress.is_empty() {
            true => a.cloud_init()?,
            false => a.cloud_init()?.map(|c| c.with_proxy(GUEST_URL)),
        },
        uefi_vars_from,
        egress: a.egress.clone(),
        secrets: a.secrets.clone(),
        kept_secrets: Vec::new(),
    })
}

/// `allow_network` as a list of rules, parsed; the error says which rule is wrong and how.
pub fn egress_rules(list: &[String]) -> Result<Vec<Rule>, OpError> {
    parse_rules(list).map_err(|e| {
        OpError::invalid(format!(
            "allow_network: {e}. Rules are \"host\", \"host:port\" or \"*.domain\" (ports 80 \
             and 443 unless given); nothing was started"
        ))
    })
}

/// The concrete machine type: the one asked for or the arch's default, as this QEMU names it.
fn machine(a: &LaunchArgs, arch: &str, qemu: &binaries::Qemu) -> Result<String, OpError> {
    let default_machine = ARCHES
        .iter()
        .find(|x| x.0 == arch)
        .map(|x| x.1)
        .ok_or_else(|| OpError::invalid(format!("unsupported arch {arch:?}")))?;
    Ok(decide::concrete_machine(
        qemu,
        a.machine.as_deref().unwrap_or(default_machine),
    )?)
}

/// The accelerator asked for: the parameter, else `MCQEMU_ACCEL`, else `auto`.
fn requested_accel(a: &LaunchArgs) -> String {
    let env_accel = std::env::var("MCQEMU_ACCEL").ok().filter(|s| !s.is_empty());
    match &a.accel {
        Some(x) => x.clone(),
        None => env_accel.unwrap_or_else(|| "auto".into()),
    }
}

/// extra_args checked, and every file they name inside the roots (a drive image's whole
/// chain too: it is untrusted data like any disk).
fn check_extra(extra_args: &[String]) -> Result<(), OpError> {
    for file in check_extra_args(extra_args)? {
        let path = roots::check_str(&file.path, file.access).map_err(|e| {
            OpError::from(e).context(format!("extra_args: -{} names {:?}", file.opt, file.path))
        })?;
        if let Some(format) = &file.image_format {
            if path.is_file() {
                checked_image(
                    &path,
                    &format!("extra_args -{} image", file.opt),
                    Some(format),
                )?;
            }
        }
    }
    Ok(())
}

/// The port forwards, resolved; fixed host ports checked against what this host allows.
fn forwards(a: &LaunchArgs) -> Result<Vec<Forward>, OpError> {
    let specs = a.port_forwards.clone().unwrap_or_default();
    if a.no_net && !specs.is_empty() {
        return Err(OpError::invalid(
            "port_forwards need a network; drop no_net=true or the forwards",
        ));
    }
    let forwards = resolve_forwards(&specs)?;
    for f in forwards.iter().filter(|f| !f.auto) {
        decide::host_port(host::get(), f.host)
            .map_err(|e| OpError::from(e).context("port_forwards"))?;
    }
    Ok(forwards)
}

/// The firmware name: given, or the arch's default; BIOS refused where nothing could boot.
fn firmware_name(a: &LaunchArgs, arch: &str) -> Result<String, OpError> {
    let has_kernel = a.kernel.is_some();
    let firmware = match &a.firmware {
        Some(f) => f.clone(),
        None => default_firmware(arch, has_kernel).to_string(),
    };
    if firmware == "bios" && !has_kernel && !x86(arch) {
        return Err(OpError::invalid(format!(
            "firmware=\"bios\" cannot boot an {arch} guest: its virt board has no BIOS, so \
             without kernel nothing would run. Use firmware=\"uefi\" (the default there), or \
             boot a kernel directly with kernel/initrd/append"
        )));
    }
    Ok(firmware)
}

/// An optional path parameter naming a file that must exist.
fn existing(raw: Option<&str>, param: &str, what: &str) -> Result<Option<PathBuf>, OpError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let p = checked_path(raw, param, Access::Read)?;
    if !p.is_file() {
        return Err(OpError::not_found(format!(
            "{what} {} does not exist or is not a file",
            p.display()
        )));
    }
    Ok(Some(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn firmware_defaults_by_arch_and_bios_on_a_virt_board_needs_a_kernel() {
        let none = LaunchArgs::default();
        assert_eq!(firmware_name(&none, "x86_64").unwrap(), "bios");
        assert_eq!(firmware_name(&none, "aarch64").unwrap(), "uefi");
        let bios = LaunchArgs {
            firmware: Some("bios".into()),
            ..LaunchArgs::default()
        };
        let e = firmware_name(&bios, "aarch64").unwrap_err();
        assert!(e.msg.contains("firmware=\"uefi\""), "{e}");
        let kernel = LaunchArgs {
            kernel: Some("/k".into()),
            ..bios.clone()
        };
        assert_eq!(firmware_name(&kernel, "aarch64").unwrap(), "bios");
    }

    #[test]
    fn forwards_need_a_network() {
        let a = LaunchArgs {
            no_net: true,
            port_forwards: Some(vec![PortSpec::auto(22)]),
            ..LaunchArgs::default()
        };
        assert!(forwards(&a).unwrap_err().msg.contains("no_net"));
        let ok = LaunchArgs {
            port_forwards: Some(vec![PortSpec::auto(22)]),
            ..LaunchArgs::default()
        };
        let f = forwards(&ok).unwrap();
        assert_eq!((f.len(), f[0].guest, f[0].auto), (1, 22, true));
        assert!(forwards(&LaunchArgs::default()).unwrap().is_empty());
    }
}
