//! template_create: boot a guest, run its setup through the agent, and save it into the
//! template store ([`crate::ops::sandbox::templates`]), from which sandbox_vm starts clones
//! ([`crate::ops::sandbox::clone`]) in well under a second instead of booting.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::host::decide;
use crate::ops::error::OpError;
use crate::ops::guest::run as guest_run;
use crate::ops::sandbox::request::Root;
use crate::ops::sandbox::templates::{
    dir_of, disk_of, ensure_blank_overlay, meta_of, ram_of, remove_dir, seed_of, state_of, vars_of,
    Template,
};
use crate::ops::vm::agent::{self, AgentWait};
use crate::ops::vm::checks::{checked_image, checked_path, Access};
use crate::ops::vm::cloud_init::CloudInitOut;
use crate::ops::vm::disk_size;
use crate::ops::vm::launch::{self, LaunchRequest};
use crate::ops::vm::launch_args::{request as launch_request, LaunchArgs};
use crate::ops::work::Work;
use crate::ops::{vm::records, vm::stop};
use crate::qemu::{img, migrate, vm};
use crate::state::config::{Accel, Disk, MemoryFile};
use crate::state::record::{Record, Sandbox};

/// A template's build guest's memory, MiB, unless told (its clones get the same).
pub const TEMPLATE_MEMORY_MB: i64 = 512;

/// One setup step: a program (not a shell) run in the build guest.
#[derive(Debug, Clone)]
pub struct SetupStep {
    /// The program.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its bound, seconds (1-3600).
    pub timeout: f64,
}

crate::described! {
    /// What a setup step printed.
    #[derive(Debug, Clone, Serialize)]
    pub struct SetupRan {
        /// The program.
        pub command: String,
        /// Its arguments.
        pub args: Vec<String>,
        /// Its standard output.
        pub stdout: String,
    }
}

/// template_create's request (the name already checked).
#[derive(Debug, Clone, Default)]
pub struct TemplateRequest {
    /// The template's name.
    pub name: String,
    /// The build guest's launch parameters.
    pub launch: LaunchArgs,
    /// Network for the build guest.
    pub allow_network: bool,
    /// What its disk is an overlay of (a disk image or a container image's root; None: an
    /// empty disk for a kernel-booted guest).
    pub root: Option<Root>,
    /// The overlay's size.
    pub disk_size: Option<String>,
    /// How long to wait for its agent, seconds.
    pub wait_agent_s: f64,
    /// Wait for cloud-init too.
    pub wait_cloud_init: bool,
    /// How long, seconds.
    pub wait_cloud_init_s: f64,
    /// Programs run in order before the save.
    pub setup: Vec<SetupStep>,
    /// Warm clones to keep started.
    pub pool: u64,
}

crate::described! {
    /// What template_create made (in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct Created {
        /// The template.
        pub name: String,
        /// Its folder.
        pub path: String,
        /// Its guest's memory.
        pub memory_mb: u64,
        /// The saved state's size.
        pub state_bytes: u64,
        /// How long the save took.
        pub save_ms: u64,
        /// What each setup step printed.
        pub setup: Vec<SetupRan>,
        /// What went wrong but did not stop it (a cloud-init module that failed).
        pub warnings: Vec<String>,
        /// cloud-init's report, when it was waited for.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub cloud_init: Option<CloudInitOut>,
        /// Warm clones kept.
        pub pool: u64,
        /// How long it took.
        pub duration_ms: u64,
    }
}

/// Builds the template: a folder without template.json (an interrupted create) is never used
/// and is removed on failure.
pub fn create(ctx: &dyn Work, req: &TemplateRequest) -> Result<Created, OpError> {
    let started = Instant::now();
    let name = req.name.clone();
    let dir = dir_of(&name);
    end_stale_build(ctx, &name)?;
    if meta_of(&dir).exists() {
        return Err(OpError::invalid(format!(
            "a template named {name:?} already exists; template_delete it first or choose \
             another name"
        )));
    }
    // A folder without template.json is what an interrupted create left: never usable.
    let _ = remove_dir(&dir);
    std::fs::create_dir_all(&dir)
        .map_err(|e| OpError::host(format!("cannot create {}: {e}", dir.display())))?;
    let on = match &req.root {
        Some(Root::Oci(reference)) => {
            let resolved = crate::ops::sandbox::image_root::resolve(ctx, &req.launch, reference);
            let (pulled, launch) = resolved.inspect_err(|_| {
                let _ = remove_dir(&dir);
            })?;
            Base {
                image: Some(pulled.path),
                launch,
            }
        }
        Some(Root::Image(b)) => Base {
            image: Some(b.clone()),
            launch: req.launch.clone(),
        },
        Some(Root::Template(_) | Root::Pushed(_)) => {
            let _ = remove_dir(&dir);
            return Err(OpError::invalid(
                "a template is made from base_image or oci, not from another template or a \
                 pushed sandbox",
            ));
        }
        None => Base {
            image: None,
            launch: req.launch.clone(),
        },
    };
    let result = build(ctx, req, &on, &name, &dir);
    if result.is_err() {
        let _ = remove_dir(&dir);
    }
    let mut out = result?;
    if req.pool > 0 {
        crate::ops::sandbox::pool::set_size(ctx, &name, req.pool)?;
    }
    out.pool = req.pool;
    out.duration_ms = started.elapsed().as_millis() as u64;
    Ok(out)
}

/// What a template's disk stands on, and the launch that boots it.
struct Base {
    /// The disk image (a container image's root, once made).
    image: Option<String>,
    /// The build guest's launch (a container image's kernel and command line added).
    launch: LaunchArgs,
}

fn build(
    ctx: &dyn Work,
    req: &TemplateRequest,
    on: &Base,
    name: &str,
    dir: &Path,
) -> Result<Created, OpError> {
    let base = template_disk(req, on, dir)?;
    ctx.progress_phase("booting the template guest");
    // The guest boots like a sandbox, with its RAM in the template's file; the template's
    // own parameters (setup, pool, waits, disk_size) are not the QEMU's.
    let mut la = on.launch.clone();
    la.port_forwards = Some(Vec::new());
    la.memory_mb = la.memory_mb.or(Some(TEMPLATE_MEMORY_MB));
    let vm_name = format!("template-{name}");
    let mut lr = launch_request(&la, &vm_name, vec![Disk::new(disk_of(dir), "qcow2")])?;
    lr.spec.network.restrict_net = !req.allow_network;
    // A template's state travels to other hosts: under KVM not with the host's own CPU.
    lr.spec.machine.cpu =
        Some(decide::template_cpu_model(lr.spec.machine.accel, &lr.spec.machine.arch).to_string());
    lr.spec.compute.memory_file = Some(MemoryFile {
        path: ram_of(dir),
        shared: true,
    });
    lr.spec.devices.vmgenid = Some(new_guid());
    lr.spec.channels.mount_spare = true;
    lr.extra_record.sandbox = Some(Sandbox {
        template_build: Some(name.to_string()),
        builder_pid: Some(std::process::id()),
        ..Sandbox::default()
    });
    let mut meta = template_meta(name, base, &lr);
    // The template's mounts are its clones': the builder's saved state never holds one.
    crate::ops::vm::mounts::check(&req.launch.mounts, &[])?;
    meta.mounts = req.launch.mounts.clone();
    let launched = launch::launch(ctx, lr)?;
    // What really runs: the accelerator QEMU reports, the version it announced.
    meta.accel = if launched.accel == "kvm" {
        Accel::Kvm
    } else {
        Accel::Tcg
    };
    meta.qemu_version = launched.qemu_version;
    let result = prepare_and_save(ctx, req, &vm_name, dir, meta);
    // The template VM never runs again, whatever happened.
    let _ = stop::stop(ctx, &vm_name, true, Duration::ZERO);
    let _ = records::forget(&vm_name, false);
    let _ = std::fs::remove_dir_all(vm::state_dir(&vm_name));
    let _ = std::fs::remove_dir(vm::runtime_dir(&vm_name));
    result
}

/// Makes the template's own disk: an overlay over base_image (never written), or an empty one
/// for a kernel-booted guest. Returns the base image's path, if there is one.
fn template_disk(req: &TemplateRequest, on: &Base, dir: &Path) -> Result<Option<PathBuf>, OpError> {
    let base = match &on.image {
        Some(b) => {
            let p = checked_path(b, "base_image", Access::Read)?;
            let checked = checked_image(&p, "base_image", None)?;
            Some((p, checked.format, checked.virtual_size))
        }
        None => None,
    };
    let disk_size = disk_size::checked(req.disk_size.as_deref(), base.as_ref().map_or(0, |b| b.2))?;
    if base.is_none() && on.launch.kernel.is_none() {
        return Err(OpError::invalid(
            "give base_image, or kernel (and initrd) for a guest without a disk image",
        ));
    }
    let disk = disk_of(dir);
    match &base {
        Some((b, f, _)) => img::create(&disk, "qcow2", disk_size, Some((b, f)))?,
        None => img::create(&disk, "qcow2", Some(disk_size.unwrap_or(1 << 30)), None)?,
    }
    Ok(base.map(|(b, _, _)| b))
}

/// The template's record as the launch request describes it; what only the running QEMU
/// knows (accelerator, version) and the save (size, time) are filled in later.
fn template_meta(name: &str, base: Option<PathBuf>, req: &LaunchRequest) -> Template {
    Template {
        name: name.to_string(),
        base_image: base.map(|b| b.display().to_string()),
        memory_mb: req.spec.compute.memory_mb,
        cpus: req.spec.compute.cpus,
        arch: req.spec.machine.arch.clone(),
        machine: req.spec.machine.kind.clone(),
        accel: req.spec.machine.accel,
        cpu: req.spec.machine.cpu.clone(),
        qemu_version: String::new(),
        kernel: req
            .spec
            .boot
            .kernel
            .as_ref()
            .map(|p| p.display().to_string()),
        initrd: req
            .spec
            .boot
            .initrd
            .as_ref()
            .map(|p| p.display().to_string()),
        append: req.spec.boot.append.clone(),
        modules: req
            .spec
            .devices
            .modules
            .as_ref()
            .map(|p| p.display().to_string()),
        seed: req.cloud_init.is_some(),
        seed_bus: req.spec.devices.seed_bus,
        firmware: crate::state::flat::firmware_of(&req.spec).to_string(),
        uefi_code: req
            .spec
            .boot
            .uefi
            .as_ref()
            .map(|u| u.code.display().to_string()),
        uefi_format: req.spec.boot.uefi.as_ref().map(|u| u.format.clone()),
        no_net: req.spec.network.no_net,
        data_channel: req.spec.channels.data_channel,
        mount_spare: req.spec.channels.mount_spare,
        extra_args: req.spec.extra_args.clone(),
        mounts: Vec::new(),
        agent_ours: None,
        created_at: String::new(),
        state_bytes: 0,
    }
}

/// A build VM left by a server that died mid-create (its record names the builder's PID):
/// stopped and forgotten, so the template can be created again. A build that a live server
/// is still running is refused instead.
fn end_stale_build(ctx: &dyn Work, name: &str) -> Result<(), OpError> {
    let vm_name = format!("template-{name}");
    let Some(rec) = crate::state::registry::shared().load().remove(&vm_name) else {
        return Ok(());
    };
    let builder = rec.sandbox.as_ref().and_then(|s| s.builder_pid);
    if let Some(p) = builder.and_then(|p| i32::try_from(p).ok()) {
        if p as u32 != std::process::id() && crate::qemu::process::alive(p) {
            return Err(OpError::busy(format!(
                "template {name:?} is being created by another mcqemu (PID {p}); wait for it"
            )));
        }
    }
    stop::stop(ctx, &vm_name, true, Duration::ZERO)?;
    let _ = records::forget(&vm_name, false);
    let _ = std::fs::remove_dir_all(vm::state_dir(&vm_name));
    let _ = std::fs::remove_dir(vm::runtime_dir(&vm_name));
    Ok(())
}

/// Readies the running build VM (agent, cloud-init, setup), saves it into the template's
/// folder and writes the template's record last.
fn prepare_and_save(
    ctx: &dyn Work,
    req: &TemplateRequest,
    vm_name: &str,
    dir: &Path,
    mut meta: Template,
) -> Result<Created, OpError> {
    let rec = crate::ops::vm::records::lookup(vm_name)?;
    let ready = wait_ready(ctx, req, vm_name, &rec, meta.seed)?;
    meta.agent_ours = crate::ops::guest::agent_is_ours(vm_name).ok();
    let ran = run_setup(ctx, &req.setup, vm_name)?;
    load_fuse(ctx, vm_name);
    // A qemu-ga guest gets the mount relay now, so its clones need not have it written. Best
    // effort: without it (no mcqemu-agent on this host) a clone's mount writes it then.
    let _ = crate::ops::guest::mounts::place_relay(vm_name);
    if meta.seed {
        let seed = vm::state_dir(vm_name).join("seed.iso");
        std::fs::copy(&seed, seed_of(dir))
            .map_err(|e| OpError::host(format!("cannot keep the seed {}: {e}", seed.display())))?;
    }
    ctx.progress_phase("saving the running guest");
    let save_start = Instant::now();
    let tmp = dir.join("state.tmp");
    let bytes = crate::ops::session::monitor(vm_name, &rec, |q| {
        let bytes = migrate::save(q, &tmp, Instant::now() + Duration::from_secs(60))?;
        let _ = q.quit_within(Duration::from_secs(2));
        Ok(bytes)
    })?;
    let save_ms = save_start.elapsed().as_millis() as u64;
    std::fs::rename(&tmp, state_of(dir))
        .map_err(|e| OpError::host(format!("cannot place the saved state: {e}")))?;
    if meta.firmware == "uefi" {
        keep_vars(vm_name, &rec, dir)?;
    }
    ensure_blank_overlay(dir)?;
    meta.state_bytes = bytes;
    meta.created_at = crate::clock::iso8601(crate::clock::now_secs());
    write_meta(dir, &meta)?;
    Ok(Created {
        name: meta.name,
        path: dir.display().to_string(),
        memory_mb: meta.memory_mb,
        state_bytes: bytes,
        save_ms,
        setup: ran,
        warnings: ready.warnings,
        cloud_init: ready.cloud_init,
        pool: 0,
        duration_ms: 0,
    })
}

/// Waits for the build guest's agent and, with wait_cloud_init, for cloud-init; a guest that
/// never gets there (or never saw its seed) is refused before anything is saved. Returns
/// `warnings` (a cloud-init module that failed) and what is known of `cloud_init`.
fn wait_ready(
    ctx: &dyn Work,
    req: &TemplateRequest,
    vm_name: &str,
    rec: &Record,
    seed: bool,
) -> Result<Ready, OpError> {
    // A template needs its agent: at least a second, whatever a sandbox may ask for.
    let wait = super::request::BOOT_AGENT_WAIT
        .of(Some(req.wait_agent_s))
        .max(Duration::from_secs(1));
    let (how, saw) = agent::wait_for_agent(ctx, vm_name, rec, wait)?;
    let mut ready = Ready::default();
    saw.add_to(&mut ready.warnings, &mut ready.cloud_init, vm_name);
    match how {
        AgentWait::Ready => {}
        AgentWait::TimedOut => {
            return Err(OpError::timed_out(format!(
                "the template guest's agent did not answer within {} s; a template needs \
                 qemu-guest-agent in the guest (nothing was saved)",
                wait.as_secs()
            )))
        }
        AgentWait::Fatal(f) => {
            return Err(OpError::guest(format!(
                "{} before the template guest's agent answered (nothing was saved)",
                f.describe()
            )))
        }
        AgentWait::NoAgent(f) => {
            return Err(OpError::guest(format!(
                "{}; a template needs the agent (nothing was saved)",
                agent::no_agent_reason(vm_name, &f, seed)
            )))
        }
    }
    if req.wait_cloud_init {
        let w = req.wait_cloud_init_s.clamp(0.0, 3600.0);
        let waited = guest_run::wait_cloud_init(ctx, vm_name, Duration::from_secs_f64(w))?;
        if seed && guest_run::saw_no_datasource(&waited) {
            let ds = waited.report["detail"].as_str().unwrap_or_default();
            return Err(OpError::host(format!(
                "{}; nothing was saved",
                agent::unseen_seed_reason(vm_name, ds)
            )));
        }
        guest_run::report_cloud_init(&mut ready.warnings, &mut ready.cloud_init, waited, &saw);
    }
    Ok(ready)
}

/// What waiting for a template's guest found: warnings, and cloud-init's end when awaited.
#[derive(Default)]
struct Ready {
    warnings: Vec<String>,
    cloud_init: Option<CloudInitOut>,
}

/// Runs each setup step in the guest, in order; the first that fails ends template_create
/// with its output. Returns what each step printed.
fn run_setup(ctx: &dyn Work, steps: &[SetupStep], vm_name: &str) -> Result<Vec<SetupRan>, OpError> {
    let mut ran = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let command = step.command.as_str();
        let argv: Vec<&str> = step.args.iter().map(String::as_str).collect();
        let timeout = step.timeout.clamp(1.0, 3600.0);
        ctx.progress_phase(&format!("setup {}: {command}", i + 1));
        let r = guest_run::run(
            ctx,
            vm_name,
            command,
            &argv,
            Duration::from_secs_f64(timeout),
        )?;
        if r.exitcode != Some(0) {
            return Err(OpError::guest(format!(
                "setup[{i}] ({command} {}) failed ({}); nothing was saved. stdout: {} stderr: {}",
                argv.join(" "),
                r.exitcode
                    .map_or("killed by a signal".to_string(), |c| format!(
                        "exit code {c}"
                    )),
                r.stdout.trim(),
                r.stderr.trim()
            )));
        }
        ran.push(SetupRan {
            command: command.to_string(),
            args: step.args.clone(),
            stdout: r.stdout,
        });
    }
    Ok(ran)
}

/// Loads FUSE in the guest before it is saved, so a clone's first mount costs no module load
/// (about 10 ms of a TCG guest's time). Best effort: a guest without a shell, modprobe or
/// fuse.ko mounts nothing, or loads it then.
fn load_fuse(ctx: &dyn Work, vm_name: &str) {
    let _ = guest_run::run(
        ctx,
        vm_name,
        "/bin/sh",
        &["-c", "grep -qw fuse /proc/filesystems || modprobe fuse"],
        Duration::from_secs(10),
    );
}

/// Writes template.json through a temporary file: its presence is what makes a template.
fn write_meta(dir: &Path, meta: &Template) -> Result<(), OpError> {
    let meta_tmp = dir.join(".template.json.tmp");
    let text = serde_json::to_vec_pretty(meta).unwrap_or_default();
    std::fs::write(&meta_tmp, text)
        .and_then(|()| std::fs::rename(&meta_tmp, meta_of(dir)))
        .map_err(|e| OpError::host(format!("cannot write the template's record: {e}")))
}

/// Copies the stopped build VM's UEFI variable store into the template, once its QEMU is gone
/// (so every write the firmware made is in the file).
fn keep_vars(vm_name: &str, rec: &Record, dir: &Path) -> Result<(), OpError> {
    if let Some(pid) = vm::pid(rec) {
        if !crate::qemu::process::wait_dead(pid, Duration::from_secs(10)) {
            return Err(OpError::host(format!(
                "the template guest's QEMU (PID {pid}) did not exit after saving, so its UEFI \
                 variable store cannot be copied whole; nothing was kept"
            )));
        }
    }
    let vars = vm::state_dir(vm_name).join("uefi-vars.fd");
    crate::state::copy::private(&vars, &vars_of(dir)).map_err(|e| {
        OpError::host(format!(
            "cannot keep the UEFI variable store {}: {e}",
            vars.display()
        ))
    })
}

/// A random RFC 4122 version-4 GUID for the template's vmgenid.
fn new_guid() -> String {
    let hex: String = (0..2)
        .map(|_| {
            crate::cloudinit::new_instance_id()
                .trim_start_matches("iid-mcqemu-")
                .to_string()
        })
        .collect();
    let h = format!("{hex:0<32}");
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}
