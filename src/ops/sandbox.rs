//! Sandboxes: a qcow2 overlay on an untouched base image, launched and waited on until the
//! guest agent answers (or cloud-init says on the console that none will); destroyed with a
//! verified kill and a careful delete. sandbox_vm, sandbox_destroy, image_prepare and clones
//! share these.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::{json, Map, Value};

use super::agent::{no_agent_reason, tail, unseen_seed_reason, wait_for_agent, AgentWait};
use super::checks::{checked_image, path_arg};
use super::error::OpError;
use super::records::lookup;
use super::work::Work;
use super::{disk_size, guest_run, launch};
use crate::mcp::tool::Args;
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

/// The sandbox's name from `args` (checked), or the first free one.
pub fn checked_name(args: &Args) -> Result<String, OpError> {
    match args.opt_str("name")? {
        Some(n) if valid_name(n) => Ok(n.to_string()),
        Some(n) => Err(OpError::new(format!(
            "invalid VM name {n:?}: use 1-48 characters from A-Z a-z 0-9 _ . -, starting with a \
             letter or digit"
        ))),
        None => Ok(first_free_name()),
    }
}

/// sandbox_vm: an overlay on `base_image` launched and waited on (or, with `template`, a
/// clone); `args` are sandbox_vm's. Returns its result. A sandbox whose agent does not answer
/// within its wait (`wait_agent_s` above 0) is removed and an error says why, with the
/// console's last lines.
pub fn create(ctx: &dyn Work, args: &Args) -> Result<Value, OpError> {
    if args.opt_str("template")?.is_some() {
        return boot(ctx, args).map(|(out, _, _)| out);
    }
    let (out, waited, wait) = boot(ctx, args)?;
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
pub fn boot(ctx: &dyn Work, args: &Args) -> Result<(Value, AgentWait, Duration), OpError> {
    if let Some(t) = args.opt_str("template")? {
        // What a clone refuses is refused whether or not a pool is ready.
        let checked = super::clone::check(args, t)?;
        if super::pool::size(t) > 0 && super::pool::fits(args) {
            let name = checked_name(args)?;
            if let Some(out) = super::pool::take(t, &name)? {
                return Ok((out, AgentWait::Ready, Duration::ZERO));
            }
        }
        return Ok((
            super::clone::start(ctx, args, t, checked)?,
            AgentWait::Ready,
            Duration::ZERO,
        ));
    }
    if args.opt_str("base_image")?.is_none() {
        return Err(OpError::new(
            "give base_image (a disk image to boot on an overlay) or template (from \
             template_create)",
        ));
    }
    let base = path_arg(args, "base_image", Access::Read)?;
    let checked = checked_image(&base, "base_image", None)?;
    let base_fmt = checked.format;
    let disk_size = disk_size::from_args(args, checked.virtual_size)?;
    let name = checked_name(args)?;
    // cloud_init is checked before anything is made on disk.
    if let Some(v) = args.0.get("cloud_init").filter(|v| !v.is_null()) {
        crate::cloudinit::CloudInit::parse(v)?;
    }
    let (sd, overlay) = overlay_path(&name)?;
    if let Err(e) = img::create(&overlay, "qcow2", disk_size, Some((&base, &base_fmt))) {
        let _ = std::fs::remove_dir(&sd);
        return Err(e.into());
    }
    let mut launch_args = args.0.clone();
    let forwards = match args.opt_str_list("port_forwards")? {
        Some(f) => f,
        None => vec!["auto:22".to_string()],
    };
    launch_args.insert("port_forwards".into(), json!(forwards));
    for k in [
        "base_image",
        "name",
        "allow_network",
        "wait_agent_s",
        "wait_cloud_init",
        "wait_cloud_init_s",
        "disk_size",
    ] {
        launch_args.remove(k);
    }
    let launch_args = crate::mcp::tool::Args(launch_args);
    let mut req = match launch::request_from_args(
        &launch_args,
        &name,
        vec![(overlay.clone(), "qcow2".into())],
    ) {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_file(&overlay);
            let _ = std::fs::remove_dir(&sd);
            return Err(e);
        }
    };
    req.spec.restrict_net = !args.bool_or("allow_network", false)?;
    let mut sb = Map::new();
    sb.insert("base_image".into(), json!(base.display().to_string()));
    sb.insert("base_format".into(), json!(base_fmt));
    sb.insert("overlay".into(), json!(overlay.display().to_string()));
    sb.insert("allow_network".into(), json!(!req.spec.restrict_net));
    req.extra_record.insert("sandbox".into(), Value::Object(sb));
    let launched = match launch::launch(ctx, req) {
        Ok(o) => o,
        Err(e) => {
            let _ = std::fs::remove_file(&overlay);
            let _ = std::fs::remove_dir(&sd);
            return Err(e);
        }
    };
    let mut out = launched;
    let wait = Duration::from_secs_f64(
        args.opt_f64("wait_agent_s")?
            .unwrap_or(90.0)
            .clamp(0.0, 3600.0),
    );
    let rec = lookup(&name)?;
    let started = Instant::now();
    let seeded = rec.get("cloud_init").is_some();
    let waited = wait_for_agent(ctx, &name, &rec, wait)?;
    let ready = waited == AgentWait::Ready;
    if let AgentWait::NoAgent(f) = &waited {
        if seeded && f.no_datasource() {
            destroy_quietly(ctx, &name);
            return Err(OpError::new(format!(
                "{}. The sandbox was removed.",
                unseen_seed_reason(&name, &f.datasource)
            )));
        }
        out["cloud_init"]["console"] = json!({
            "finished": true, "datasource": f.datasource, "version": f.version,
            "uptime_s": f.uptime_s
        });
    }
    out["agent_ready"] = json!(ready);
    out["agent_wait_ms"] = json!(started.elapsed().as_millis() as u64);
    out["overlay"] = json!(overlay.display().to_string());
    out["base_image"] = json!(base.display().to_string());
    if ready && args.bool_or("wait_cloud_init", false)? {
        let wait_ci = Duration::from_secs_f64(
            args.opt_f64("wait_cloud_init_s")?
                .unwrap_or(600.0)
                .clamp(0.0, 3600.0),
        );
        // Beside what the launch recorded (instance_id, seed), not instead of it.
        let waited = guest_run::wait_cloud_init(ctx, &name, wait_ci)?;
        if seeded && guest_run::saw_no_datasource(&waited) {
            let ds = waited["report"]["detail"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            destroy_quietly(ctx, &name);
            return Err(OpError::new(format!(
                "{}. The sandbox was removed.",
                unseen_seed_reason(&name, &ds)
            )));
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
