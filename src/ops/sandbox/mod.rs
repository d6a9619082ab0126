//! Sandboxes and the states they come from: sandbox_vm's request and launch, templates and
//! their clones, warm pools, forks and suspends (a capture into a frozen state, its scratch
//! memory), and the careful destroy.
//!
//! sandbox_vm: a qcow2 overlay on an untouched base image, launched and waited on until the
//! guest agent answers (or cloud-init says on the console that none will), or a clone of a
//! template (from its warm pool when one fits). image_prepare boots its guest the same way.

pub mod capture;
pub mod clone;
pub mod destroy;
pub mod fork;
pub mod frozen;
pub mod image_root;
pub mod pool;
pub mod request;
pub mod result;
pub mod scratch;
pub mod suspend;
pub mod template_create;
pub mod template_manage;
pub mod templates;
pub mod travel;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::ops::error::OpError;
use crate::ops::guest::run as guest_run;
use crate::ops::sandbox::destroy::{destroy_quietly, overlay_path, serial_tail};
use crate::ops::sandbox::image_root::ImageRoot;
use crate::ops::sandbox::request::{checked_name, Root, SandboxRequest};
use crate::ops::sandbox::result::Sandboxed;
use crate::ops::vm::agent::{no_agent_reason, unseen_seed_reason, wait_for_agent, AgentWait};
use crate::ops::vm::checks::{checked_image, checked_path};
use crate::ops::vm::cloud_init::{CloudInitOut, ConsoleFinish, Waited};
use crate::ops::vm::disk_size;
use crate::ops::vm::launch;
use crate::ops::vm::launch_args::{self, LaunchArgs};
use crate::ops::vm::lifetime;
use crate::ops::vm::records::lookup;
use crate::ops::work::Work;
use crate::qemu::img;
use crate::state::record::Sandbox;
use crate::state::roots::Access;

/// sandbox_vm: an overlay on `base_image` launched and waited on (or, with `template`, a
/// clone). A sandbox whose agent does not answer within its wait (`wait_agent_s` above 0) is
/// removed and an error says why, with the console's last lines.
pub fn create(ctx: &dyn Work, req: &SandboxRequest) -> Result<Sandboxed, OpError> {
    // A template's mounts come first, then the call's own; all are checked before anything
    // starts. A clone plugs them in as soon as it runs, any other sandbox once its guest
    // answers; either way the call waits here until the guest has mounted them.
    let template = req
        .root
        .as_ref()
        .and_then(Root::template)
        .and_then(|t| crate::ops::sandbox::templates::load(t).ok());
    let mut mounts = template
        .as_ref()
        .map_or_else(Vec::new, |t| t.mounts.clone());
    mounts.extend(req.launch.mounts.iter().cloned());
    crate::ops::vm::mounts::check(&mounts, &[])?;
    let mut out = create_unmounted(ctx, req)?;
    if !mounts.is_empty() {
        let name = out.launched.name.clone();
        // A clone runs its template's agent: what it is was learned when the template was made.
        if let Some(ours) = template.as_ref().and_then(|t| t.agent_ours) {
            crate::ops::guest::note_agent(&name, ours);
        }
        // An agent not waited for (wait_agent_s 0): mounted in the background once it answers.
        let wait = out
            .agent_ready
            .then_some(crate::ops::vm::mounts::MOUNT_WAIT);
        match crate::ops::guest::mounts::after_start(ctx, &name, &mounts, wait) {
            Ok(m) => out.launched.mounts = m,
            Err(e) => {
                destroy_quietly(ctx, &name);
                return Err(e.context(format_args!(
                    "sandbox {name:?} could not mount its folders and was removed"
                )));
            }
        }
    }
    // Its idle clock starts when it is ready, not when its boot began.
    lifetime::touch(&out.launched.name);
    Ok(out)
}

fn create_unmounted(ctx: &dyn Work, req: &SandboxRequest) -> Result<Sandboxed, OpError> {
    if matches!(req.root, Some(Root::Template(_) | Root::Pushed(_))) {
        return boot(ctx, req).map(|(out, _, _)| out);
    }
    let (out, waited, wait) = boot(ctx, req)?;
    let name = out.launched.name.clone();
    let seeded = out.launched.cloud_init.is_some();
    let why = match &waited {
        AgentWait::Ready => return Ok(out),
        AgentWait::TimedOut if wait.is_zero() => return Ok(out),
        AgentWait::TimedOut => format!(
            "the guest agent of sandbox {name:?} did not answer within {} s (wait_agent_s) and \
             the console said nothing that explains it; the image may lack qemu-guest-agent \
             (image_prepare makes an agent-ready base) or boot slower than that under TCG \
             (raise wait_agent_s; 0 does not wait)",
            wait.as_secs_f64()
        ),
        AgentWait::NoAgent(f) => no_agent_reason(&name, f, seeded),
        AgentWait::Fatal(f) => format!(
            "{} before the guest agent of sandbox {name:?} answered",
            f.describe()
        ),
    };
    let serial = serial_tail(&out.launched, 8);
    destroy_quietly(ctx, &name);
    Err(OpError::host(format!(
        "{why}. The sandbox was removed. Last serial output: {serial}"
    )))
}

/// [`create`] without its verdict on the agent: the sandbox as launched and how the wait for
/// its agent ended (image_prepare says itself what a guest without an agent means).
pub fn boot(
    ctx: &dyn Work,
    req: &SandboxRequest,
) -> Result<(Sandboxed, AgentWait, Duration), OpError> {
    if (req.run || req.expose) && !matches!(req.root, Some(Root::Oci(_))) {
        return Err(OpError::invalid(
            "run and expose need oci (a container image): they start and forward what the \
             image's config names",
        ));
    }
    match &req.root {
        Some(Root::Template(t)) => boot_clone(ctx, req, t),
        Some(Root::Pushed(r)) => {
            crate::ops::sandbox::travel::sandbox::start(ctx, req, r).map(|out| {
                let ready = out.ready_ms.unwrap_or(0);
                (out, AgentWait::Ready, Duration::from_millis(ready))
            })
        }
        _ => boot_overlay(ctx, req),
    }
}

/// A clone of template `t`: a ready one from its pool when the request fits one, else a
/// fresh one. What a clone refuses is refused whether or not a pool is ready.
fn boot_clone(
    ctx: &dyn Work,
    req: &SandboxRequest,
    t: &str,
) -> Result<(Sandboxed, AgentWait, Duration), OpError> {
    let checked = crate::ops::sandbox::clone::check(req, t)?;
    if crate::ops::sandbox::pool::size(t) > 0 && crate::ops::sandbox::pool::fits(req) {
        let name = checked_name(req.name.as_deref())?;
        let lt = lifetime::resolve(
            lifetime::Kind::Sandbox,
            &req.launch.lifetime,
            crate::clock::now_secs(),
        )?;
        if let Some(out) = crate::ops::sandbox::pool::take(t, &name, lt)? {
            return Ok((out, AgentWait::Ready, Duration::ZERO));
        }
    }
    let out = crate::ops::sandbox::clone::start(ctx, req, t, checked)?;
    Ok((out, AgentWait::Ready, Duration::ZERO))
}

/// A sandbox on an overlay of `base_image`: checked, made, launched, then waited on.
fn boot_overlay(
    ctx: &dyn Work,
    req: &SandboxRequest,
) -> Result<(Sandboxed, AgentWait, Duration), OpError> {
    let image = match &req.root {
        Some(Root::Oci(reference)) => Some(image_root::request(ctx, req, reference)?),
        _ => None,
    };
    let base_raw =
        match (&req.root, &image) {
            (_, Some(i)) => i.pulled.path.as_str(),
            (Some(Root::Image(b)), None) => b.as_str(),
            _ => return Err(OpError::invalid(
                "give base_image (a disk image to boot on an overlay), oci (a container image) \
                 or template (from template_create)",
            )),
        };
    let launch = image.as_ref().map_or(&req.launch, |i| &i.launch);
    let base = checked_path(base_raw, "base_image", Access::Read)?;
    let checked = checked_image(&base, "base_image", None)?;
    let disk_size = disk_size::checked(req.disk_size.as_deref(), checked.virtual_size)?;
    let name = checked_name(req.name.as_deref())?;
    // cloud_init is checked before anything is made on disk.
    launch.cloud_init()?;
    let (sd, overlay) = overlay_path(&name)?;
    let made = img::create(&overlay, "qcow2", disk_size, Some((&base, &checked.format)))
        .map_err(OpError::from)
        .and_then(|()| {
            let on = Overlay {
                launch,
                image: image.as_ref(),
                base: &base,
                base_fmt: &checked.format,
                overlay: &overlay,
            };
            launch_overlay(ctx, req, &name, &on)
        });
    let out = match made {
        Ok(out) => out,
        Err(e) => {
            let _ = std::fs::remove_file(&overlay);
            let _ = std::fs::remove_dir(&sd);
            return Err(e);
        }
    };
    let (mut out, waited, wait) = wait_ready(ctx, req, &name, out)?;
    let command = image.as_ref().map(ImageRoot::command).unwrap_or_default();
    if req.run && waited == AgentWait::Ready {
        match image_root::run_program(ctx, &name, &command) {
            Ok(started) => out.image_process = Some(started),
            Err(e) => {
                destroy_quietly(ctx, &name);
                return Err(OpError::guest(format!(
                    "the image's program did not start in sandbox {name:?}: {e}. The sandbox \
                     was removed."
                )));
            }
        }
    }
    Ok((out, waited, wait))
}

/// A sandbox's overlay and what it stands on.
struct Overlay<'a> {
    /// The launch (the image's, for a container image's root).
    launch: &'a LaunchArgs,
    /// The container image, when the root is one.
    image: Option<&'a ImageRoot>,
    /// The image the overlay is on.
    base: &'a Path,
    /// Its format.
    base_fmt: &'a str,
    /// The overlay (the sandbox's disk).
    overlay: &'a Path,
}

/// Launches sandbox `name` on its overlay, its record saying what it was made from.
fn launch_overlay(
    ctx: &dyn Work,
    req: &SandboxRequest,
    name: &str,
    on: &Overlay,
) -> Result<Sandboxed, OpError> {
    let (base, base_fmt, overlay) = (on.base, on.base_fmt, on.overlay);
    let mut la = on.launch.clone();
    if la.port_forwards.is_none() {
        la.port_forwards = Some(vec![crate::qemu::forwards::PortSpec::auto(22)]);
    }
    la.restrict_net = !req.allow_network;
    // A sandbox's lifetime has its own defaults and actions (a launched VM's only stops).
    la.lifetime = Default::default();
    let mut lr = launch_args::request(
        &la,
        name,
        vec![crate::state::config::Disk::new(overlay, "qcow2")],
    )?;
    lr.extra_record.lifetime = lifetime::resolve(
        lifetime::Kind::Sandbox,
        &req.launch.lifetime,
        crate::clock::now_secs(),
    )?;
    lr.extra_record.sandbox = Some(Sandbox {
        base_image: Some(base.display().to_string()),
        base_format: Some(base_fmt.to_string()),
        overlay: Some(overlay.display().to_string()),
        allow_network: Some(req.network()),
        image: on.image.map(|i| i.reference.clone()),
        image_digest: on.image.map(|i| i.pulled.digest.clone()),
        ..Sandbox::default()
    });
    let mut out = Sandboxed::of(launch::launch(ctx, lr)?);
    out.overlay = Some(overlay.display().to_string());
    out.base_image = Some(base.display().to_string());
    Ok(out)
}

/// Waits for a launched sandbox's agent (and, when asked, cloud-init); a seed the guest never
/// saw removes the sandbox with the reason.
fn wait_ready(
    ctx: &dyn Work,
    req: &SandboxRequest,
    name: &str,
    mut out: Sandboxed,
) -> Result<(Sandboxed, AgentWait, Duration), OpError> {
    let wait = req.agent_wait();
    let rec = lookup(name)?;
    let started = Instant::now();
    let seeded = rec.cloud_init.is_some();
    let (waited, saw) = wait_for_agent(ctx, name, &rec, wait)?;
    let ready = waited == AgentWait::Ready;
    let l = &mut out.launched;
    saw.add_to(&mut l.warnings, &mut l.cloud_init, name);
    if let AgentWait::NoAgent(f) = &waited {
        if seeded && f.no_datasource() {
            destroy_quietly(ctx, name);
            return Err(OpError::host(format!(
                "{}. The sandbox was removed.",
                unseen_seed_reason(name, &f.datasource)
            )));
        }
        l.cloud_init
            .get_or_insert_with(CloudInitOut::default)
            .console = Some(ConsoleFinish {
            finished: true,
            datasource: f.datasource.clone(),
            version: f.version.clone(),
            uptime_s: f.uptime_s,
        });
    }
    out.agent_ready = ready;
    out.agent_wait_ms = Some(started.elapsed().as_millis() as u64);
    if ready && req.wait_cloud_init {
        let waited = cloud_init_step(ctx, name, seeded, req.cloud_init_wait())?;
        let l = &mut out.launched;
        guest_run::report_cloud_init(&mut l.warnings, &mut l.cloud_init, waited, &saw);
    }
    Ok((out, waited, wait))
}

/// Waits for cloud-init in a VM whose agent answers; a seed it never saw, or cloud-init
/// reporting an error, removes the VM with the reason.
pub fn cloud_init_step(
    ctx: &dyn Work,
    name: &str,
    seeded: bool,
    wait: Duration,
) -> Result<Waited, OpError> {
    let waited = guest_run::wait_cloud_init(ctx, name, wait)?;
    if seeded && guest_run::saw_no_datasource(&waited) {
        let ds = waited.report["detail"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        destroy_quietly(ctx, name);
        return Err(OpError::host(format!(
            "{}. The sandbox was removed.",
            unseen_seed_reason(name, &ds)
        )));
    }
    Ok(waited)
}
