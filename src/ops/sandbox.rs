//! Sandboxes: a qcow2 overlay on an untouched base image, launched and waited on until the
//! guest agent answers (or cloud-init says on the console that none will); destroyed with a
//! verified kill and a careful delete. sandbox_vm, sandbox_destroy, image_prepare and clones
//! share these.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::{json, Value};

use super::agent::{no_agent_reason, tail, unseen_seed_reason, wait_for_agent, AgentWait};
use super::checks::{checked_image, checked_path};
use super::error::OpError;
use super::launch_args::{self, LaunchArgs};
use super::records::lookup;
use super::work::Work;
use super::{disk_size, guest_run, launch};
use crate::qemu::qmp;
use crate::qemu::vm::{self, measure};
use crate::qemu::{img, process};
use crate::state::registry::{valid_name, RegistryError};
use crate::state::roots::Access;
use std::time::Duration;

/// The first free sandbox name: sandbox, sandbox-2, ...
pub fn first_free_name() -> String {
    let vms = vm::registry().load();
    (1..1000)
        .map(|i| {
            if i == 1 {
                "sandbox".to_string()
            } else {
                format!("sandbox-{i}")
            }
        })
        .find(|n| !vms.contains_key(n))
        .unwrap_or_else(|| format!("sandbox-{}", std::process::id()))
}

/// sandbox_vm's request: a sandbox on `base_image` (an overlay) or a clone of `template`.
#[derive(Debug, Clone, Default)]
pub struct SandboxRequest {
    /// None: the first free `sandbox`, `sandbox-2`, ...
    pub name: Option<String>,
    /// A template to clone instead of an overlay on base_image.
    pub template: Option<String>,
    /// The disk image the overlay is on (never written).
    pub base_image: Option<String>,
    /// The overlay's size (never smaller than the base).
    pub disk_size: Option<String>,
    /// The launch's own parameters (port_forwards None: `auto:22`).
    pub launch: LaunchArgs,
    /// Guest-initiated traffic allowed.
    pub allow_network: bool,
    /// None: 90 s.
    pub wait_agent_s: Option<f64>,
    /// Also wait for cloud-init to finish.
    pub wait_cloud_init: bool,
    /// None: 600 s.
    pub wait_cloud_init_s: Option<f64>,
}

impl SandboxRequest {
    /// How long to wait for the guest agent.
    pub fn agent_wait(&self) -> Duration {
        Duration::from_secs_f64(self.wait_agent_s.unwrap_or(90.0).clamp(0.0, 3600.0))
    }

    /// How long to wait for cloud-init, once the agent answers.
    pub fn cloud_init_wait(&self) -> Duration {
        Duration::from_secs_f64(self.wait_cloud_init_s.unwrap_or(600.0).clamp(0.0, 3600.0))
    }
}

/// A requested VM name, checked, or the first free sandbox name.
pub fn checked_name(name: Option<&str>) -> Result<String, OpError> {
    match name {
        Some(n) if valid_name(n) => Ok(n.to_string()),
        Some(n) => Err(OpError::new(format!(
            "invalid VM name {n:?}: use 1-48 characters from A-Z a-z 0-9 _ . -, starting with a \
             letter or digit"
        ))),
        None => Ok(first_free_name()),
    }
}

/// sandbox_vm: an overlay on `base_image` launched and waited on (or, with `template`, a
/// clone). A sandbox whose agent does not answer within its wait (`wait_agent_s` above 0) is
/// removed and an error says why, with the console's last lines.
pub fn create(ctx: &dyn Work, req: &SandboxRequest) -> Result<Value, OpError> {
    if req.template.is_some() {
        return boot(ctx, req).map(|(out, _, _)| out);
    }
    let (out, waited, wait) = boot(ctx, req)?;
    let name = out["name"].as_str().unwrap_or_default().to_string();
    let seeded = out.get("cloud_init").is_some_and(|c| !c.is_null());
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
    let serial = serial_tail(&out, 8);
    destroy_quietly(ctx, &name);
    Err(OpError::new(format!(
        "{why}. The sandbox was removed. Last serial output: {serial}"
    )))
}

/// [`create`] without its verdict on the agent: the sandbox as launched and how the wait for
/// its agent ended (image_prepare says itself what a guest without an agent means).
pub fn boot(ctx: &dyn Work, req: &SandboxRequest) -> Result<(Value, AgentWait, Duration), OpError> {
    match &req.template {
        Some(t) => boot_clone(ctx, req, t),
        None => boot_overlay(ctx, req),
    }
}

/// A clone of template `t`: a ready one from its pool when the request fits one, else a
/// fresh one. What a clone refuses is refused whether or not a pool is ready.
fn boot_clone(
    ctx: &dyn Work,
    req: &SandboxRequest,
    t: &str,
) -> Result<(Value, AgentWait, Duration), OpError> {
    let checked = super::clone::check(req, t)?;
    if super::pool::size(t) > 0 && super::pool::fits(req) {
        let name = checked_name(req.name.as_deref())?;
        if let Some(out) = super::pool::take(t, &name)? {
            return Ok((out, AgentWait::Ready, Duration::ZERO));
        }
    }
    let out = super::clone::start(ctx, req, t, checked)?;
    Ok((out, AgentWait::Ready, Duration::ZERO))
}

/// A sandbox on an overlay of `base_image`: checked, made, launched, then waited on.
fn boot_overlay(
    ctx: &dyn Work,
    req: &SandboxRequest,
) -> Result<(Value, AgentWait, Duration), OpError> {
    let Some(base_raw) = req.base_image.as_deref() else {
        return Err(OpError::new(
            "give base_image (a disk image to boot on an overlay) or template (from \
             template_create)",
        ));
    };
    let base = checked_path(base_raw, "base_image", Access::Read)?;
    let checked = checked_image(&base, "base_image", None)?;
    let disk_size = disk_size::checked(req.disk_size.as_deref(), checked.virtual_size)?;
    let name = checked_name(req.name.as_deref())?;
    // cloud_init is checked before anything is made on disk.
    req.launch.cloud_init()?;
    let (sd, overlay) = overlay_path(&name)?;
    let made = img::create(&overlay, "qcow2", disk_size, Some((&base, &checked.format)))
        .map_err(OpError::from)
        .and_then(|()| launch_overlay(ctx, req, &name, &base, &checked.format, &overlay));
    let out = match made {
        Ok(out) => out,
        Err(e) => {
            let _ = std::fs::remove_file(&overlay);
            let _ = std::fs::remove_dir(&sd);
            return Err(e);
        }
    };
    wait_ready(ctx, req, &name, out)
}

/// Launches sandbox `name` on its overlay, its record saying what it was made from.
fn launch_overlay(
    ctx: &dyn Work,
    req: &SandboxRequest,
    name: &str,
    base: &Path,
    base_fmt: &str,
    overlay: &Path,
) -> Result<Value, OpError> {
    let mut la = req.launch.clone();
    if la.port_forwards.is_none() {
        la.port_forwards = Some(vec!["auto:22".to_string()]);
    }
    la.restrict_net = !req.allow_network;
    let mut lr = launch_args::request(&la, name, vec![(overlay.to_path_buf(), "qcow2".into())])?;
    let sb = json!({
        "base_image": base.display().to_string(), "base_format": base_fmt,
        "overlay": overlay.display().to_string(), "allow_network": req.allow_network,
    });
    lr.extra_record.insert("sandbox".into(), sb);
    let mut out = launch::launch(ctx, lr)?;
    out["overlay"] = json!(overlay.display().to_string());
    out["base_image"] = json!(base.display().to_string());
    Ok(out)
}

/// Waits for a launched sandbox's agent (and, when asked, cloud-init); a seed the guest never
/// saw removes the sandbox with the reason.
fn wait_ready(
    ctx: &dyn Work,
    req: &SandboxRequest,
    name: &str,
    mut out: Value,
) -> Result<(Value, AgentWait, Duration), OpError> {
    let wait = req.agent_wait();
    let rec = lookup(name)?;
    let started = Instant::now();
    let seeded = rec.get("cloud_init").is_some();
    let waited = wait_for_agent(ctx, name, &rec, wait)?;
    let ready = waited == AgentWait::Ready;
    if let AgentWait::NoAgent(f) = &waited {
        if seeded && f.no_datasource() {
            destroy_quietly(ctx, name);
            return Err(OpError::new(format!(
                "{}. The sandbox was removed.",
                unseen_seed_reason(name, &f.datasource)
            )));
        }
        out["cloud_init"]["console"] = json!({
            "finished": true, "datasource": f.datasource, "version": f.version,
            "uptime_s": f.uptime_s
        });
    }
    out["agent_ready"] = json!(ready);
    out["agent_wait_ms"] = json!(started.elapsed().as_millis() as u64);
    if ready && req.wait_cloud_init {
        let waited = cloud_init_step(ctx, name, seeded, req.cloud_init_wait())?;
        if let (Some(problem), Some(w)) = (
            guest_run::cloud_init_problem(&waited),
            out["warnings"].as_array_mut(),
        ) {
            w.push(json!(problem));
        }
        match (
            out.get_mut("cloud_init").and_then(Value::as_object_mut),
            waited,
        ) {
            (Some(launched), Value::Object(w)) => launched.extend(w),
            (_, w) => out["cloud_init"] = w,
        }
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
) -> Result<Value, OpError> {
    let waited = guest_run::wait_cloud_init(ctx, name, wait)?;
    if seeded && guest_run::saw_no_datasource(&waited) {
        let ds = waited["report"]["detail"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        destroy_quietly(ctx, name);
        return Err(OpError::new(format!(
            "{}. The sandbox was removed.",
            unseen_seed_reason(name, &ds)
        )));
    }
    Ok(waited)
}

/// A new sandbox's state folder (created) and the path of its overlay, unique per launch.
pub fn overlay_path(name: &str) -> Result<(PathBuf, PathBuf), OpError> {
    let sd = vm::state_dir(name);
    std::fs::create_dir_all(&sd)
        .map_err(|e| OpError::new(format!("cannot create {}: {e}", sd.display())))?;
    let overlay = sd.join(format!(
        "overlay-{}-{}.qcow2",
        crate::clock::now_secs(),
        std::process::id()
    ));
    Ok((sd, overlay))
}

/// The last `lines` lines of the serial log a launch result names.
pub fn serial_tail(launched: &Value, lines: usize) -> String {
    launched["serial_log"]
        .as_str()
        .map(|p| tail(Path::new(p), lines))
        .unwrap_or_else(|| "(no serial log)".into())
}

/// Destroys a sandbox this call made and is giving up on, ignoring what that reports.
pub fn destroy_quietly(ctx: &dyn Work, name: &str) {
    let _ = destroy(ctx, name);
}

/// PIDs that hold `path` open, from /proc/*/fd.
pub fn holders(path: &Path) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        if fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == path))
        {
            out.push(pid);
        }
    }
    out
}

/// sandbox_destroy: a verified kill, a careful delete inside the VM's own folder, the record
/// dropped only when its files are gone; every problem reported.
pub fn destroy(ctx: &dyn Work, name: &str) -> Result<Value, OpError> {
    let name = name.to_string();
    let rec = lookup(&name)?;
    let sb = rec
        .get("sandbox")
        .and_then(Value::as_object)
        .cloned()
        .ok_or_else(|| {
            OpError::new(format!(
                "VM {name:?} is not a sandbox; use stop_vm and forget_vm for ordinary VMs"
            ))
        })?;
    ctx.log("notice", &format!("sandbox_destroy {name}"));
    let mut errors: Vec<String> = Vec::new();
    let mut deleted: Vec<String> = Vec::new();
    // 1. Stop, verified.
    let mut stopped = "already stopped".to_string();
    if measure(&rec).alive() {
        let sock_path = vm::qmp_socket(&rec);
        let _ = qmp::with_session(&sock_path, |q| {
            q.execute_within("quit", None, Duration::from_secs(2))
        });
        stopped = "quit".into();
        if let Some(pid) = vm::pid(&rec) {
            if !process::wait_dead(pid, Duration::from_secs(2)) {
                if process::is_our_vm(pid, &vm::identity_socket(&rec)) {
                    match process::terminate(pid) {
                        Ok(steps) => stopped = steps.last().copied().unwrap_or("quit").to_string(),
                        Err(e) => errors.push(e.to_string()),
                    }
                } else {
                    errors.push(format!(
                        "PID {pid} no longer looks like this sandbox's QEMU; not signalled"
                    ));
                }
            }
        }
        if measure(&rec).alive() {
            errors.push(format!(
                "the QEMU of sandbox {name:?} is still alive; nothing was deleted"
            ));
            return Ok(json!({
                "name": name, "destroyed": false, "stopped": stopped, "deleted": deleted,
                "errors": errors
            }));
        }
    }
    errors.extend(vm::cleanup_runtime(&rec));
    let rt = vm::runtime_dir(&name);
    if std::fs::remove_dir(&rt).is_ok() {
        deleted.push(rt.display().to_string());
    }
    // 2. Delete only inside the VM's own state folder, checked twice.
    let own = vm::state_dir(&name);
    let own_c = std::fs::canonicalize(&own).unwrap_or(own.clone());
    let base = sb
        .get("base_image")
        .and_then(Value::as_str)
        .map(PathBuf::from);
    let overlay = sb.get("overlay").and_then(Value::as_str).map(PathBuf::from);
    let mut folder_ok = own_c.starts_with(
        std::fs::canonicalize(crate::state::paths::state_dir())
            .unwrap_or_default()
            .join("vms"),
    ) && own_c.file_name().is_some_and(|f| f == name.as_str());
    if let Some(b) = &base {
        let bc = std::fs::canonicalize(b).unwrap_or(b.clone());
        if bc.starts_with(&own_c) {
            errors.push(format!(
                "the base image {} lies inside the sandbox folder; refusing to delete the folder",
                bc.display()
            ));
            folder_ok = false;
        }
    }
    if let Some(ov) = &overlay {
        let oc = std::fs::canonicalize(ov).unwrap_or(ov.clone());
        if !oc.starts_with(&own_c) {
            errors.push(format!(
                "the overlay {} is outside {}; not deleting it",
                oc.display(),
                own_c.display()
            ));
            folder_ok = false;
        } else if oc.exists() {
            let held = holders(&oc);
            if !held.is_empty() {
                errors.push(format!(
                    "the overlay {} is still open in process(es) {held:?}; not deleting it",
                    oc.display()
                ));
                folder_ok = false;
            }
        }
    }
    if folder_ok && own_c.exists() {
        // Remove the folder's files one by one, so every failure is reported.
        match std::fs::read_dir(&own_c) {
            Ok(entries) => {
                for e in entries.flatten() {
                    let p = e.path();
                    let r = if p.is_dir() && !p.is_symlink() {
                        std::fs::remove_dir_all(&p)
                    } else {
                        std::fs::remove_file(&p)
                    };
                    match r {
                        Ok(()) => deleted.push(p.display().to_string()),
                        Err(err) => errors.push(format!("cannot delete {}: {err}", p.display())),
                    }
                }
                match std::fs::remove_dir(&own_c) {
                    Ok(()) => deleted.push(own_c.display().to_string()),
                    Err(err) => errors.push(format!("cannot delete {}: {err}", own_c.display())),
                }
            }
            Err(err) => errors.push(format!("cannot list {}: {err}", own_c.display())),
        }
    }
    // 3. Drop the record only when the files are gone.
    let files_gone = !overlay.as_ref().is_some_and(|o| o.exists());
    if files_gone {
        let n = name.clone();
        if let Err(e) = vm::registry().update(move |vms| {
            vms.remove(&n);
            Ok::<_, RegistryError>(())
        }) {
            errors.push(e.to_string());
        }
    }
    let destroyed = files_gone && errors.is_empty();
    Ok(json!({
        "name": name, "destroyed": destroyed, "stopped": stopped, "deleted": deleted,
        "errors": errors
    }))
}
