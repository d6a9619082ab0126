//! Clones: sandbox_vm with `template` starts a QEMU with the template's machine and devices,
//! its RAM file mapped private (copy-on-write: the template is never written), a fresh vmgenid
//! (so the guest reseeds its random numbers), and `-incoming defer`; then loads the saved
//! device state over QMP, lets it run, and sets the guest clock. Ready when the agent answers.
//! Every guarantee of a sandbox holds: an overlay over an untouched base (the template's disk),
//! the network restricted unless `allow_network`, destroyed by sandbox_destroy.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cloudinit::CloudInit;
use crate::host::{self, binaries, decide};
use crate::net::egress::process::GUEST_URL;
use crate::ops::error::OpError;
use crate::ops::guest::clock as guest_clock;
use crate::ops::sandbox::destroy;
use crate::ops::sandbox::request::{checked_name, SandboxRequest};
use crate::ops::sandbox::result::{CloneSteps, Sandboxed};
use crate::ops::sandbox::templates as template;
use crate::ops::session;
use crate::ops::vm::launch::{self, LaunchRequest, Launched};
use crate::ops::vm::lifetime;
use crate::ops::vm::records::lookup;
use crate::ops::work::Work;
use crate::qemu::forwards::{resolve_forwards, PortSpec};
use crate::qemu::{migrate, vm};
use crate::state::config::{
    Boot, Channels, Compute, Devices, Disk, Machine, MemoryFile, Network, Start, Uefi, VmConfig,
};
use crate::state::record::{text, Record, Sandbox};

/// How long loading the template state may take.
const LOAD_BUDGET: Duration = Duration::from_secs(30);

/// sandbox_vm from a template.
/// Ready when the agent first answers; the clock is then being set (see [`guest_clock`]).
/// `checked`: what [`check`] returned for `req`.
pub fn start(
    ctx: &dyn Work,
    req: &SandboxRequest,
    template_name: &str,
    checked: Checked,
) -> Result<Sandboxed, OpError> {
    Ok(start_checked(ctx, req, template_name, checked, Record::default())?.0)
}

/// What [`check`] found: the template, the clone's own cloud-init, and the QEMU to run it.
pub struct Checked {
    template: template::Template,
    cloud_init: Option<CloudInit>,
    qemu: std::sync::Arc<binaries::Qemu>,
}

/// What a clone of `template_name` cannot honour in a sandbox request, refused before anything
/// starts (and before a warm pool is looked at, so the same call never succeeds or fails by the
/// pool's state); returns the template and the clone's own cloud-init.
pub fn check(req: &SandboxRequest, template_name: &str) -> Result<Checked, OpError> {
    let t = template::load(template_name)?;
    if let Some(refused) = fixed_by_template(req) {
        return Err(OpError::invalid(format!(
            "{refused} comes from the template and cannot be changed for a clone; drop it, or \
             make another template"
        )));
    }
    check_same(template_name, "arch", &t.arch, req.launch.arch.as_deref())?;
    check_same(
        template_name,
        "firmware",
        &t.firmware,
        req.launch.firmware.as_deref(),
    )?;
    let qemu = binaries::find(&t.arch)?;
    let saved = decide::Saved {
        arch: &t.arch,
        machine: &t.machine,
        accel: t.accel,
        qemu_version: &t.qemu_version,
    };
    decide::can_restore(&saved, host::get(), &qemu).map_err(|why| {
        OpError::from(why).context(format!(
            "template {template_name:?} cannot start a clone on this host"
        ))
    })?;
    checked_name(req.name.as_deref())?;
    let cloud_init = req.launch.cloud_init()?;
    if cloud_init.is_some() && !t.seed {
        return Err(OpError::invalid(format!(
            "template {template_name:?} was made without cloud_init, so its clones have no seed \
             CD-ROM to carry one; make the template with a cloud_init"
        )));
    }
    Ok(Checked {
        template: t,
        cloud_init,
        qemu,
    })
}

/// The first parameter a clone takes from its template but the request sets.
fn fixed_by_template(req: &SandboxRequest) -> Option<&'static str> {
    let l = &req.launch;
    [
        ("kernel", l.kernel.is_some()),
        ("initrd", l.initrd.is_some()),
        ("append", l.append.is_some()),
        ("memory_mb", l.memory_mb.is_some()),
        ("cpus", l.cpus.is_some()),
        ("extra_args", !l.extra_args.is_empty()),
        ("disk_size", req.disk_size.is_some()),
    ]
    .into_iter()
    .find(|(_, set)| *set)
    .map(|(name, _)| name)
}

/// Refuses `param` when the request sets it to other than the template's `value`.
fn check_same(
    template_name: &str,
    param: &str,
    value: &str,
    asked: Option<&str>,
) -> Result<(), OpError> {
    match asked {
        Some(a) if a != value => Err(OpError::invalid(format!(
            "template {template_name:?} has {param} {value}; its clones cannot have {param} \
             {a}: drop {param}, or make another template"
        ))),
        _ => Ok(()),
    }
}

/// [`start`], with `fields` added to the clone's record from its launch on (a pooled clone's
/// mark); also returns the thread setting the clone's clock, when its agent answered.
pub fn start_with(
    ctx: &dyn Work,
    req: &SandboxRequest,
    template_name: &str,
    fields: Record,
) -> Result<(Sandboxed, Option<JoinHandle<guest_clock::Outcome>>), OpError> {
    let checked = check(req, template_name)?;
    start_checked(ctx, req, template_name, checked, fields)
}

/// What a clone's start made on disk before its QEMU runs.
struct Made {
    /// The clone's state folder, and whether this start created it.
    sd: PathBuf,
    sd_created: bool,
    overlay: PathBuf,
    uefi: Option<Uefi>,
    overlay_ms: Duration,
}

impl Made {
    /// Removes what this start made (a refused or failed clone leaves nothing behind).
    fn remove(&self) {
        let _ = std::fs::remove_file(&self.overlay);
        if let Some(u) = &self.uefi {
            let _ = std::fs::remove_file(&u.vars);
        }
        if self.sd_created {
            let _ = std::fs::remove_dir(&self.sd);
        }
    }
}

/// [`start_with`] for a request [`check`] has already passed: the clone's files made, its
/// QEMU launched, the template's state loaded, then its agent awaited.
fn start_checked(
    ctx: &dyn Work,
    req: &SandboxRequest,
    template_name: &str,
    checked: Checked,
    fields: Record,
) -> Result<(Sandboxed, Option<JoinHandle<guest_clock::Outcome>>), OpError> {
    let started = Instant::now();
    let tdir = template::dir_of(template_name);
    let name = checked_name(req.name.as_deref())?;
    let made = make_files(&name, template_name, &checked.template, &tdir)?;
    let mounts = checked.template.mounts.clone();
    let t_qemu = Instant::now();
    let launched = launch_clone(
        ctx,
        req,
        template_name,
        checked,
        &tdir,
        &name,
        &made,
        fields,
    );
    let launched = match launched {
        Ok(o) => o,
        Err(e) => {
            made.remove();
            return Err(e);
        }
    };
    let mut times = Times {
        overlay: made.overlay_ms,
        qemu: t_qemu.elapsed(),
        ..Times::default()
    };
    let rec = load_state(ctx, &name, template_name, &tdir, &mut times)?;
    // Its mounts go in now, while its agent comes up (sandbox_vm then waits for them).
    let mounts: Vec<_> = mounts.iter().chain(&req.launch.mounts).cloned().collect();
    if !mounts.is_empty() {
        if let Err(e) = crate::ops::vm::mounts::attach_missing(&name, &rec, &mounts) {
            destroy::destroy_quietly(ctx, &name);
            return Err(e.context(format_args!(
                "the clone {name:?} could not plug in its mounts and was removed"
            )));
        }
    }
    let out = hand_out(
        ctx,
        req,
        template_name,
        &tdir,
        &name,
        &rec,
        launched,
        &made,
        times,
    );
    let (mut out, clock) = out?;
    out.ready_ms = Some(started.elapsed().as_millis() as u64);
    Ok((out, clock))
}

/// The clone's state folder, its overlay on the template's disk and its UEFI variables.
fn make_files(
    name: &str,
    template_name: &str,
    t: &template::Template,
    tdir: &Path,
) -> Result<Made, OpError> {
    let sd_created = !vm::state_dir(name).exists();
    let (sd, overlay) = destroy::overlay_path(name)?;
    let mut made = Made {
        sd,
        sd_created,
        overlay,
        uefi: None,
        overlay_ms: Duration::ZERO,
    };
    let result = uefi_of(template_name, t, tdir, &made.sd).and_then(|uefi| {
        made.uefi = uefi;
        let t_overlay = Instant::now();
        template::new_overlay(tdir, &made.overlay)?;
        made.overlay_ms = t_overlay.elapsed();
        Ok(())
    });
    match result {
        Ok(()) => Ok(made),
        Err(e) => {
            made.remove();
            Err(e)
        }
    }
}

/// A UEFI template's firmware (still installed) and the clone's copy of its variables.
fn uefi_of(
    template_name: &str,
    t: &template::Template,
    tdir: &Path,
    sd: &Path,
) -> Result<Option<Uefi>, OpError> {
    let ("uefi", Some(code)) = (&t.firmware[..], &t.uefi_code) else {
        return Ok(None);
    };
    let code = PathBuf::from(code);
    if !code.is_file() {
        return Err(OpError::host(format!(
            "template {template_name:?} was saved with the UEFI firmware {}, which is no longer \
             there (a firmware package update?); reinstall it, or template_delete the template \
             and create it again",
            code.display()
        )));
    }
    let vars = sd.join("uefi-vars.fd");
    crate::state::copy::private(&template::vars_of(tdir), &vars).map_err(|e| {
        OpError::host(format!(
            "cannot copy the template's UEFI variable store: {e}"
        ))
    })?;
    let format = t.uefi_format.clone().unwrap_or_else(|| "raw".into());
    Ok(Some(Uefi { code, vars, format }))
}

/// Launches the clone's QEMU waiting for its state (`-incoming defer`), its RAM the
/// template's file mapped private.
#[allow(clippy::too_many_arguments)]
fn launch_clone(
    ctx: &dyn Work,
    req: &SandboxRequest,
    template_name: &str,
    checked: Checked,
    tdir: &Path,
    name: &str,
    made: &Made,
    fields: Record,
) -> Result<Launched, OpError> {
    let Checked {
        template: t,
        cloud_init,
        qemu,
    } = checked;
    let forwards = match &req.launch.port_forwards {
        Some(f) => f.clone(),
        None if t.no_net => Vec::new(),
        None => vec![PortSpec::auto(22)],
    };
    let spec = VmConfig {
        name: name.to_string(),
        machine: Machine {
            binary: qemu.path.display().to_string(),
            kind: t.machine.clone(),
            accel: t.accel,
            cpu: t.cpu.clone(),
            arch: t.arch.clone(),
        },
        compute: Compute {
            cpus: t.cpus,
            memory_mb: t.memory_mb,
            memory_file: Some(MemoryFile {
                path: template::ram_of(tdir),
                shared: false,
            }),
            ..Compute::default()
        },
        disks: vec![Disk::new(made.overlay.clone(), "qcow2")],
        boot: Boot {
            uefi: made.uefi.clone(),
            iso: None,
            kernel: t.kernel.as_ref().map(PathBuf::from),
            initrd: t.initrd.as_ref().map(PathBuf::from),
            append: t.append.clone(),
        },
        network: Network {
            no_net: t.no_net,
            restrict_net: !req.allow_network,
            forwards: resolve_forwards(&forwards)?,
            jailed_net: !req.launch.egress.is_empty(),
        },
        channels: Channels {
            data_channel: t.data_channel,
            mount_spare: t.mount_spare,
            ..Channels::default()
        },
        devices: Devices {
            // The template's own seed keeps the device set; a clone's cloud_init replaces it.
            seed: t.seed.then(|| template::seed_of(tdir)),
            seed_bus: t.seed_bus,
            vmgenid: Some("auto".into()),
            modules: t.modules.as_ref().map(PathBuf::from),
        },
        start: Start {
            incoming: true,
            start_paused: false,
        },
        extra_args: t.extra_args.clone(),
        other: serde_json::Map::new(),
    };
    let tdisk = template::disk_of(tdir);
    let mut extra = fields;
    let kind = match extra.pooled {
        Some(_) => lifetime::Kind::Pooled,
        None => lifetime::Kind::Sandbox,
    };
    extra.lifetime = lifetime::resolve(kind, &req.launch.lifetime, crate::clock::now_secs())?;
    extra.sandbox = Some(Sandbox {
        base_image: Some(tdisk.display().to_string()),
        base_format: Some("qcow2".into()),
        overlay: Some(made.overlay.display().to_string()),
        allow_network: Some(req.network()),
        template: Some(template_name.to_string()),
        ..Sandbox::default()
    });
    let lr = LaunchRequest {
        spec,
        extra_record: extra,
        accel_note: None,
        kvm_fallback: false,
        cloud_init: match req.launch.egress.is_empty() {
            true => cloud_init,
            false => cloud_init.map(|c| c.with_proxy(GUEST_URL)),
        },
        uefi_vars_from: None,
        egress: req.launch.egress.clone(),
        secrets: req.launch.secrets.clone(),
        kept_secrets: Vec::new(),
    };
    launch::launch(ctx, lr)
}

/// Where a clone's time went, step by step (the bench prints each step's share).
#[derive(Default)]
struct Times {
    overlay: Duration,
    qemu: Duration,
    load: Duration,
    agent: Duration,
}

/// Loads the template's saved state into the waiting QEMU; a clone that cannot is removed.
fn load_state(
    ctx: &dyn Work,
    name: &str,
    template_name: &str,
    tdir: &Path,
    times: &mut Times,
) -> Result<crate::state::registry::Record, OpError> {
    let t_load = Instant::now();
    let rec = lookup(name)?;
    let resumed = session::monitor(name, &rec, |q| {
        migrate::load(q, &template::state_of(tdir), Instant::now() + LOAD_BUDGET)?;
        Ok(())
    });
    if let Err(e) = resumed {
        destroy::destroy_quietly(ctx, name);
        return Err(OpError::host(format!(
            "the clone of template {template_name:?} could not load its saved state: {}; the \
             clone was removed. If this repeats, template_delete the template and create it again",
            e.msg
        )));
    }
    times.load = t_load.elapsed();
    Ok(rec)
}

/// Waits for the running clone's agent and shapes its result; a clone whose agent does not
/// answer is removed (with `wait_agent_s` 0 it is handed out with a warning).
#[allow(clippy::too_many_arguments)]
fn hand_out(
    ctx: &dyn Work,
    req: &SandboxRequest,
    template_name: &str,
    tdir: &Path,
    name: &str,
    rec: &crate::state::registry::Record,
    launched: Launched,
    made: &Made,
    mut times: Times,
) -> Result<(Sandboxed, Option<JoinHandle<guest_clock::Outcome>>), OpError> {
    let wait = req.agent_wait();
    let t_agent = Instant::now();
    let ready = match text(&rec.qga_socket) {
        // x86 clones get a fresh vmgenid, whose driver reseeds the kernel's randomness at
        // once; the virt boards have none, so the host reseeds it through the agent.
        Some(sock) => guest_clock::answer_then_set(
            Path::new(sock),
            wait,
            rec.arch().filter(|a| !crate::qemu::cmdline::x86(a)),
        ),
        None => Err("the clone has no guest-agent socket".to_string()),
    };
    times.agent = t_agent.elapsed();
    let (ready, clock) = match ready {
        Ok(setter) => (Ok(()), Some(setter)),
        Err(why) => (Err(why), None),
    };
    let ms = |d: Duration| (d.as_secs_f64() * 1000.0 * 10.0).round() / 10.0;
    let mut out = Sandboxed::of(launched);
    out.steps_ms = Some(CloneSteps {
        overlay: ms(times.overlay),
        qemu_start: ms(times.qemu),
        state_load: ms(times.load),
        first_agent_answer: ms(times.agent),
    });
    // The launch saw the QEMU waiting for its state; it runs now.
    out.launched.status = "running".into();
    out.template = Some(template_name.to_string());
    out.agent_ready = ready.is_ok();
    out.overlay = Some(made.overlay.display().to_string());
    out.base_image = Some(template::disk_of(tdir).display().to_string());
    match ready {
        Ok(()) => {}
        Err(why) if wait.is_zero() => {
            out.launched.warnings.push(format!(
                "{why} (wait_agent_s is 0); sandbox_destroy {name} removes the clone"
            ));
        }
        Err(why) => {
            let serial = destroy::serial_tail(&out.launched, 8);
            destroy::destroy_quietly(ctx, name);
            return Err(OpError::guest(format!(
                "the clone of template {template_name:?} was removed: its guest agent did not \
                 answer ({why}). Last serial output: {serial}"
            )));
        }
    }
    Ok((out, clock))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::sandbox::request::Root;
    use crate::ops::vm::launch_args::LaunchArgs;

    #[test]
    fn what_the_template_fixes_is_named_and_the_rest_passes() {
        let mut req = SandboxRequest {
            root: Some(Root::Template("t".into())),
            name: Some("c".into()),
            allow_network: true,
            ..SandboxRequest::default()
        };
        req.launch.port_forwards = Some(vec![
            crate::qemu::forwards::parse_forward("8080:80").unwrap()
        ]);
        assert_eq!(fixed_by_template(&req), None);
        req.launch.memory_mb = Some(512);
        assert_eq!(fixed_by_template(&req), Some("memory_mb"));
        let extra = SandboxRequest {
            launch: LaunchArgs {
                extra_args: vec!["-device".into(), "virtio-rng-pci".into()],
                ..LaunchArgs::default()
            },
            ..SandboxRequest::default()
        };
        assert_eq!(fixed_by_template(&extra), Some("extra_args"));
        let disk = SandboxRequest {
            disk_size: Some("4G".into()),
            ..SandboxRequest::default()
        };
        assert_eq!(fixed_by_template(&disk), Some("disk_size"));
    }

    #[test]
    fn arch_and_firmware_must_match_the_template_when_given() {
        assert!(check_same("t", "arch", "x86_64", None).is_ok());
        assert!(check_same("t", "arch", "x86_64", Some("x86_64")).is_ok());
        let e = check_same("t", "arch", "x86_64", Some("aarch64")).unwrap_err();
        assert_eq!(e.kind, crate::ops::error::ErrorKind::InvalidArgument, "{e}");
        assert!(
            e.msg.contains("arch x86_64") && e.msg.contains("drop arch"),
            "{e}"
        );
    }
}
