//! The launch every VM starts with (launch_vm, sandbox_vm, templates, clones, image_prepare):
//! the request built from launch_vm-style arguments, the name reserved in the registry within
//! the quotas, the seed written, QEMU started (falling back to TCG when KVM fails it), and the
//! record written.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Map;

use crate::cloudinit::CloudInit;
use crate::host::decide;
use crate::net::egress::process::GUEST_URL;
use crate::net::egress::rules::Rule;
use crate::net::egress::secrets::{self, Placed, ProxySecret};
use crate::ops::error::OpError;
use crate::ops::vm::cloud_init::CloudInitOut;
use crate::ops::vm::egress;
use crate::ops::vm::quota;
use crate::ops::work::Work;
use crate::qemu::cmdline::{self, x86};
use crate::qemu::qmp::{self, QmpError};
use crate::qemu::vm::{self, measure};
use crate::qemu::{process, sock};
use crate::state::config::{Accel, Uefi, VmConfig};
use crate::state::record::{self, Record};
use crate::state::registry::RegistryError;

/// The `arch` default when the host's is not one launch_vm offers.
pub const DEFAULT_ARCH: &str = "x86_64";
/// Default `memory_mb`.
pub const DEFAULT_MEMORY_MB: i64 = 2048;
/// Default `cpus`, on a host with two CPUs or more (one on a one-CPU host).
pub const DEFAULT_CPUS: i64 = 2;
/// Default `firmware`.
pub const DEFAULT_FIRMWARE: &str = "bios";

/// The default `arch`: the host's when launch_vm offers it, else x86_64.
pub fn default_arch() -> &'static str {
    let host = crate::host::get().arch.as_str();
    ARCHES
        .iter()
        .map(|a| a.0)
        .find(|a| *a == host)
        .unwrap_or(DEFAULT_ARCH)
}

/// The default `firmware`: BIOS on x86 (and wherever a kernel is booted directly), UEFI on the
/// virt boards, which have no BIOS.
pub fn default_firmware(arch: &str, kernel: bool) -> &'static str {
    if x86(arch) || kernel {
        DEFAULT_FIRMWARE
    } else {
        "uefi"
    }
}

/// Architectures launch_vm accepts, with their default machine type.
pub const ARCHES: &[(&str, &str)] = &[
    ("x86_64", "q35"),
    ("i386", "q35"),
    ("aarch64", "virt"),
    ("riscv64", "virt"),
];

crate::described! {
    /// What a launch started: launch_vm's result (sandboxes and clones add to it).
    #[derive(Debug, Clone, Serialize)]
    pub struct Launched {
        /// The VM's name.
        pub name: String,
        /// QEMU's run state right after start (`running`, or `inmigrate` for a clone).
        pub status: String,
        /// QEMU's PID.
        pub pid: Option<i32>,
        /// The accelerator QEMU really uses.
        pub accel: String,
        /// Guest architecture.
        pub arch: String,
        /// The concrete machine type.
        pub machine: String,
        /// The version QEMU announced on its monitor.
        pub qemu_version: String,
        /// The forwards, resolved (auto host ports chosen).
        pub port_forwards: Vec<record::Forward>,
        /// The monitor's socket.
        pub qmp_socket: String,
        /// The guest agent's socket.
        pub qga_socket: String,
        /// The serial console's log.
        pub serial_log: String,
        /// What the caller should know (a TCG fallback, a slow monitor).
        pub warnings: Vec<String>,
        /// A sandbox's details.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub sandbox: Option<record::Sandbox>,
        /// The seed's instance id and path (and, once known, what cloud-init did).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub cloud_init: Option<CloudInitOut>,
        /// The egress rules and the proxy's URL in the guest.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub egress: Option<record::Egress>,
        /// Host folders mounted into it, and how each stands.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        pub mounts: Vec<crate::ops::vm::mounts::Shown>,
    }
}

/// Everything a launch needs beyond the spec, shared by launch_vm and sandbox_vm.
pub struct LaunchRequest {
    /// The spec (sockets and pidfile are filled in by [`launch`]).
    pub spec: VmConfig,
    /// Fields laid over the record (e.g. sandbox details, a pooled clone's marks).
    pub extra_record: Record,
    /// Why TCG was chosen, if auto fell back.
    pub accel_note: Option<String>,
    /// The accelerator came from `auto`: a KVM that fails to start the guest falls back to TCG.
    pub kvm_fallback: bool,
    /// A cloud-init seed to write for this launch (a fresh instance id each time).
    pub cloud_init: Option<CloudInit>,
    /// The firmware's pristine UEFI variable store, copied to the VM's own (`spec.uefi`) once
    /// the name is reserved, when the VM has none yet.
    pub uefi_vars_from: Option<PathBuf>,
    /// `allow_network` rules: the VM gets an egress proxy and an empty network of its own.
    pub egress: Vec<Rule>,
    /// Names of the operator's secrets the proxy adds, each with a fresh placeholder.
    pub secrets: Vec<String>,
    /// Secrets that keep the placeholders the guest already holds (a resumed sandbox).
    pub kept_secrets: Vec<record::PlacedSecret>,
}

/// Writes the launch's cloud-init seed into the VM's folder (`seed.iso`, replaced at every
/// launch with a fresh instance id) and attaches it.
fn write_seed(req: &mut LaunchRequest, sd: &Path) -> Result<(), OpError> {
    let Some(ci) = &req.cloud_init else {
        return Ok(());
    };
    std::fs::create_dir_all(sd)
        .map_err(|e| OpError::host(format!("cannot create {}: {e}", sd.display())))?;
    let instance_id = crate::cloudinit::new_instance_id();
    let image = ci
        .seed(&instance_id, &req.spec.name, crate::clock::now_secs())
        .map_err(|e| OpError::invalid(format!("cloud_init: {e}")))?;
    let seed = sd.join("seed.iso");
    let tmp = sd.join(format!(".seed.iso.tmp-{}", std::process::id()));
    std::fs::write(&tmp, &image)
        .and_then(|()| std::fs::rename(&tmp, &seed))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            OpError::host(format!(
                "cannot write the cloud-init seed {}: {e}",
                seed.display()
            ))
        })?;
    req.extra_record.cloud_init = Some(record::Seed {
        instance_id: Some(instance_id),
        seed: Some(seed.display().to_string()),
        other: Map::new(),
    });
    req.spec.devices.seed = Some(seed);
    Ok(())
}

/// Gives the VM its own UEFI variable store, copied from the firmware's, unless it has one.
fn copy_uefi_vars(req: &LaunchRequest) -> Result<(), OpError> {
    let (Some(from), Some(Uefi { vars, .. })) = (&req.uefi_vars_from, &req.spec.boot.uefi) else {
        return Ok(());
    };
    if vars.exists() {
        return Ok(());
    }
    crate::state::copy::private(from, vars).map_err(|e| {
        OpError::host(format!(
            "cannot copy the UEFI variable store {}: {e}",
            from.display()
        ))
    })
}

/// Reserves the name, starts QEMU, and records the VM. On failure the reservation is dropped.
/// Returns launch_vm's result.
pub fn launch(ctx: &dyn Work, mut req: LaunchRequest) -> Result<Launched, OpError> {
    let name = req.spec.name.clone();
    let rt = vm::runtime_dir(&name);
    let sd = vm::state_dir(&name);
    let qmp_sock = rt.join("qmp.sock");
    req.spec.channels.qmp_socket = qmp_sock.clone();
    req.spec.channels.qga_socket = rt.join("qga.sock");
    req.spec.channels.serial_socket = rt.join("serial.sock");
    req.spec.channels.pidfile = rt.join("qemu.pid");
    req.spec.channels.serial_log = sd.join("serial.log");
    for s in [
        &req.spec.channels.qmp_socket,
        &req.spec.channels.qga_socket,
        &req.spec.channels.serial_socket,
    ] {
        if s.as_os_str().len() > sock::MAX_SOCKET_PATH {
            return Err(OpError::host(format!(
                "socket path {} is longer than the {} bytes a unix socket allows; set \
                 MCQEMU_RUNTIME_DIR to a shorter folder",
                s.display(),
                sock::MAX_SOCKET_PATH
            )));
        }
    }
    // Reserve the name first, across threads and processes (the registry lock), within the
    // quotas.
    let limits = quota::Limits::current();
    let (memory_mb, cpus) = (req.spec.compute.memory_mb, req.spec.compute.cpus);
    let extra = req.extra_record.clone();
    crate::state::registry::shared().update(|vms| {
        quota::admit(vms, &name, memory_mb, cpus, limits)?;
        if let Some(old) = vms.get(&name) {
            if old.suspended.is_some() && extra.resumed_from.is_none() {
                return Err(OpError::invalid(format!(
                    "a VM named {name:?} is suspended; sandbox_resume it, or sandbox_destroy it \
                     first, or choose another name"
                )));
            }
            let m = measure(old);
            if m.alive() {
                return Err(OpError::invalid(format!(
                    "a VM named {name:?} is already {}; stop_vm it first or choose another name",
                    m.status
                )));
            }
        }
        // Who is launching, and since when: a reservation whose owner died is an interrupted
        // launch.
        let reservation = Record {
            name: Some(name.clone()),
            qmp_socket: Some(qmp_sock.display().to_string()),
            // Its memory counts against the quota while it starts.
            spec: Some(req.spec.clone()),
            launching: Some(record::Launching {
                owner_pid: Some(std::process::id()),
                since: Some(crate::clock::now_secs()),
                other: Map::new(),
            }),
            ..Record::default()
        };
        // The caller's marks from the reservation on: a pooled clone being started is never
        // listed as a VM of the caller's.
        vms.insert(name.clone(), extra.overlaid(&reservation));
        Ok(())
    })?;
    let result = write_seed(&mut req, &sd).and_then(|()| start_reserved(ctx, &req, &rt, &sd));
    if result.is_err() {
        let _ = crate::state::registry::shared().update(|vms| {
            if vms.get(&name).is_some_and(|r| r.launching.is_some()) {
                vms.remove(&name);
            }
            Ok::<_, RegistryError>(())
        });
    }
    result
}

/// The secrets of a launch: resolved from the operator's file by name, with fresh
/// placeholders or, for a resumed guest, the ones it holds.
fn placed_secrets(req: &LaunchRequest) -> Result<(Vec<ProxySecret>, Vec<Placed>), OpError> {
    let names: Vec<String> = if req.kept_secrets.is_empty() {
        req.secrets.clone()
    } else {
        req.kept_secrets.iter().map(|k| k.name.clone()).collect()
    };
    if names.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let (mut proxy, mut placed) =
        secrets::resolve(&secrets::file_path(), &names).map_err(OpError::from)?;
    for k in &req.kept_secrets {
        for p in proxy.iter_mut().filter(|p| p.name == k.name) {
            p.placeholder = k.placeholder.clone();
        }
        for p in placed.iter_mut().filter(|p| p.name == k.name) {
            p.placeholder = k.placeholder.clone();
            p.guest_env = k.guest_env.clone();
        }
    }
    Ok((proxy, placed))
}

/// What a VM's record keeps of its egress: its rules, and its secrets' names and placeholders.
fn egress_record(rules: &[Rule], placed: &[Placed]) -> record::Egress {
    record::Egress {
        rules: Some(rules.iter().map(Rule::text).collect()),
        egress_proxy: Some(GUEST_URL.to_string()),
        secrets: (!placed.is_empty()).then(|| {
            placed
                .iter()
                .map(|p| record::PlacedSecret {
                    name: p.name.clone(),
                    guest_env: p.guest_env.clone(),
                    placeholder: p.placeholder.clone(),
                })
                .collect()
        }),
        trusted: None,
        other: Map::new(),
    }
}

fn start_reserved(
    ctx: &dyn Work,
    req: &LaunchRequest,
    rt: &Path,
    sd: &Path,
) -> Result<Launched, OpError> {
    prepare_dirs(&req.spec, rt, sd)?;
    copy_uefi_vars(req)?;
    ctx.check_cancel()?;
    // The values go to the proxy on a pipe; this server keeps only the placeholders.
    let (secrets, placed) = placed_secrets(req)?;
    let proxy = match req.egress.is_empty() {
        true => None,
        false => Some(egress::start(
            &req.spec.name,
            &req.egress,
            &req.spec.network.forwards,
            &secrets,
        )?),
    };
    drop(secrets);
    let spawned = spawn_with_fallback(req, &sd.join("qemu.log"), proxy.as_ref());
    let (started, spec, fallback_note) = match (spawned, proxy) {
        (Ok(s), p) => {
            if let Some(p) = p {
                p.keep();
            }
            s
        }
        (Err(e), p) => {
            if let Some(p) = p {
                p.abandon();
            }
            return Err(e);
        }
    };
    let s = &spec;
    let mut warnings: Vec<String> = started.warning.into_iter().collect();
    warnings.extend(fallback_note);
    let (actual_accel, status, version) = match first_look(&s.channels.qmp_socket) {
        Ok(look) => look,
        Err(e) => {
            warnings.push(format!("QMP did not answer right after start: {e}"));
            (
                s.machine.accel.name().to_string(),
                "unknown".into(),
                String::new(),
            )
        }
    };
    warnings.extend(req.accel_note.clone());
    // The launch's own facts win over what the caller carries (a resumed record's old PID and
    // sockets give way to the new QEMU's).
    let mut rec =
        req.extra_record
            .overlaid(&launched_record(s, started.pid, &actual_accel, &version));
    if !req.egress.is_empty() {
        rec.egress = Some(egress_record(&req.egress, &placed));
    }
    let egress_rec = (!req.egress.is_empty())
        .then(|| rec.egress.clone())
        .flatten();
    let name_c = s.name.clone();
    let has_lifetime = rec.lifetime.is_some();
    crate::state::registry::shared().update(move |vms| {
        vms.insert(name_c, rec);
        Ok::<_, RegistryError>(())
    })?;
    if has_lifetime {
        crate::ops::vm::lifetime::touch(&s.name);
        crate::ops::vm::lifetime::ensure_watcher();
    }
    Ok(Launched {
        name: s.name.clone(),
        status,
        pid: started.pid,
        accel: actual_accel,
        arch: s.machine.arch.clone(),
        machine: s.machine.kind.clone(),
        qemu_version: version,
        port_forwards: s.network.forwards.clone(),
        qmp_socket: s.channels.qmp_socket.display().to_string(),
        qga_socket: s.channels.qga_socket.display().to_string(),
        serial_log: s.channels.serial_log.display().to_string(),
        warnings,
        sandbox: req.extra_record.sandbox.clone(),
        cloud_init: req
            .extra_record
            .cloud_init
            .as_ref()
            .map(CloudInitOut::of_seed),
        egress: egress_rec,
        mounts: Vec::new(),
    })
}

/// The VM's runtime folder (private) and state folder; stale sockets of a dead QEMU removed,
/// a live one refused.
fn prepare_dirs(s: &VmConfig, rt: &Path, sd: &Path) -> Result<(), OpError> {
    crate::state::paths::ensure_runtime_dir()?;
    for dir in [rt, sd] {
        std::fs::create_dir_all(dir)
            .map_err(|e| OpError::host(format!("cannot create {}: {e}", dir.display())))?;
    }
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(rt, std::fs::Permissions::from_mode(0o700));
    }
    if s.channels.qmp_socket.exists() {
        if sock::is_listening(&s.channels.qmp_socket) {
            return Err(OpError::refused(format!(
                "a QEMU is still listening on {}: VM {:?} seems to be running outside the \
                 registry. Adopt it with attach_vm, or stop that QEMU first",
                s.channels.qmp_socket.display(),
                s.name
            )));
        }
        for stale in [
            &s.channels.qmp_socket,
            &s.channels.qga_socket,
            &s.channels.serial_socket,
        ] {
            let _ = std::fs::remove_file(stale);
        }
    }
    Ok(())
}

/// Starts the QEMU daemonized. When `auto` chose KVM and KVM failed this guest (a busy or
/// broken /dev/kvm, a CPU model the host lacks), the guest still runs, emulated, and a note
/// says why. Returns the spec that really runs.
fn spawn_with_fallback(
    req: &LaunchRequest,
    log: &Path,
    proxy: Option<&egress::Started>,
) -> Result<(process::Started, VmConfig, Option<String>), OpError> {
    let spawn = |s: &VmConfig, enter: Option<process::PreExec>| {
        let enter = match s.compute.memory_file {
            Some(_) => Some(process::without_thp(enter)),
            None => enter,
        };
        let argv = cmdline::build_argv(s);
        crate::log::stderr(
            "info",
            &format!(
                "launching VM {}: {} {}",
                s.name,
                s.machine.binary,
                argv.join(" ")
            ),
        );
        process::spawn_detached(
            &s.machine.binary,
            &argv,
            &s.channels.pidfile,
            &s.channels.qmp_socket,
            log,
            enter,
        )
    };
    let s = &req.spec;
    match spawn(s, enter_for(proxy)?) {
        Ok(started) => Ok((started, s.clone(), None)),
        Err(e @ process::SpawnError::Failed { .. })
            if req.kvm_fallback && s.machine.accel == Accel::Kvm =>
        {
            let mut tcg = s.clone();
            tcg.machine.accel = Accel::Tcg;
            tcg.machine.cpu = Some(decide::cpu_model(Accel::Tcg, &s.machine.arch).to_string());
            let note = format!(
                "KVM failed to start this guest ({e}); it runs under TCG instead (emulated, \
                 slower)"
            );
            Ok((spawn(&tcg, enter_for(proxy)?)?, tcg, Some(note)))
        }
        Err(e) => Err(e.into()),
    }
}

/// What QEMU's child does before exec to run in the empty network of the VM's egress proxy.
fn enter_for(proxy: Option<&egress::Started>) -> Result<Option<process::PreExec>, OpError> {
    let Some(p) = proxy else {
        return Ok(None);
    };
    let join = p.join()?;
    Ok(Some(Box::new(move || join.enter())))
}

/// The accelerator QEMU really uses, its run state and its version, asked right after start.
fn first_look(qmp_socket: &Path) -> Result<(String, String, String), QmpError> {
    let (kvm, st, version) = qmp::with_session(qmp_socket, |q| -> Result<_, QmpError> {
        let kvm = q.kvm_enabled()?;
        let st = q.query_status()?;
        Ok((kvm, st, q.version.clone()))
    })?;
    let accel = if kvm { "kvm" } else { "tcg" };
    Ok((accel.to_string(), st.status, version))
}

/// The registry record of a VM just started from `s`.
fn launched_record(s: &VmConfig, pid: Option<i32>, accel: &str, version: &str) -> Record {
    let display = |p: &Path| Some(p.display().to_string());
    Record {
        name: Some(s.name.clone()),
        source: Some("spawned".into()),
        pid: pid.map(i64::from),
        accel: Some(accel.to_string()),
        qmp_socket: display(&s.channels.qmp_socket),
        qga_socket: display(&s.channels.qga_socket),
        serial_socket: display(&s.channels.serial_socket),
        serial_log: display(&s.channels.serial_log),
        pidfile: display(&s.channels.pidfile),
        input: Some(crate::ops::vm::records::input_devices(
            &s.machine.arch,
            &s.machine.kind,
            &s.extra_args,
        )),
        qemu_version: Some(version.to_string()),
        created_at: Some(crate::clock::iso8601(crate::clock::now_secs())),
        spec: Some(s.clone()),
        ..Record::default()
    }
}
