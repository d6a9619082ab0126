//! Sandboxes: a qcow2 overlay on an untouched base image, launched and waited on until the
//! guest agent answers; destroyed with a verified kill and a careful delete.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::launch_schema;
use super::lifecycle::lookup;
use super::{checked_image, disk_size, object, path_arg};
use super::{guest_run, launch};
use crate::cloudinit::console;
use crate::mcp::tool::{Annotations, Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::qemu::qga;
use crate::qemu::qmp;
use crate::qemu::vm::{self, measure};
use crate::qemu::{img, process};
use crate::state::registry::{valid_name, RegistryError};
use crate::state::roots::Access;

/// Longest one agent probe may take while waiting; the wait never overshoots by more.
const POLL_SLICE: Duration = Duration::from_millis(500);

const SANDBOX_DESCRIPTION: &str = "Create a qcow2 overlay on base_image (the base is never \
    modified), launch a VM on it, and wait up to wait_agent_s seconds for qemu-guest-agent to \
    answer, with progress. Then use guest_exec / guest_file_* and finally sandbox_destroy. \
    Guest-initiated network traffic is blocked unless allow_network=true (port forwards still \
    work; default forwards one auto host port to guest port 22). The agent can answer before the \
    guest has finished booting. kernel/initrd/append boot a kernel directly (the base image then \
    serves as a data disk).";

/// `sandbox_vm`.
pub const SANDBOX: ToolDef = ToolDef {
    name: "sandbox_vm",
    title: "Start a disposable sandbox VM",
    description: SANDBOX_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "base_image": {
                    "type": ["string", "null"], "minLength": 1, "default": null,
                    "description": "Base disk image; left untouched. Give this or template."
                },
                "template": {
                    "type": ["string", "null"], "default": null,
                    "description": "Start a clone of this template (template_create) instead of \
                        booting: ready in well under a second. The template fixes memory, \
                        cpus, kernel and disks."
                },
                "name": {
                    "type": ["string", "null"], "default": null,
                    "description": "VM name; default the first free of sandbox, sandbox-2, ..."
                },
                "memory_mb": launch_schema::memory_schema(),
                "cpus": launch_schema::cpus_schema(),
                "port_forwards": {
                    "type": ["array", "null"],
                    "items": {"type": "string"},
                    "default": null,
                    "description": "null means [\"auto:22\"]; [] means none."
                },
                "allow_network": {"type": "boolean", "default": false},
                "wait_agent_s": {"type": "number", "minimum": 0, "maximum": 3600, "default": 90},
                "kernel": {"type": ["string", "null"], "default": null},
                "initrd": {"type": ["string", "null"], "default": null},
                "append": {"type": ["string", "null"], "default": null},
                "firmware": {
                    "type": "string", "enum": ["bios", "uefi"], "default": launch::DEFAULT_FIRMWARE,
                    "description": "How the base image boots (cloud images: bios for Debian and \
                        Ubuntu on x86_64, uefi on aarch64)."
                },
                "disk_size": disk_size::schema(),
                "cloud_init": launch_schema::cloud_init_schema(),
                "wait_cloud_init": {
                    "type": "boolean", "default": false,
                    "description": "Also wait, through the agent, until cloud-init has finished \
                        (/var/lib/cloud/instance/boot-finished), and report its status."
                },
                "wait_cloud_init_s": {
                    "type": "number", "minimum": 0, "maximum": 3600, "default": 600,
                    "description": "How long to wait for cloud-init after the agent answers."
                }
            }),
            &[],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "status": {"type": "string"},
                "pid": {"type": ["integer", "null"]},
                "accel": {"type": "string"},
                "agent_ready": {"type": "boolean"},
                "agent_wait_ms": {"type": "integer"},
                "overlay": {"type": "string"},
                "base_image": {"type": "string"},
                "port_forwards": {"type": "array", "items": {"type": "object"}},
                "warnings": {"type": "array", "items": {"type": "string"}},
                "cloud_init": {"type": "object"}
            },
            "required": ["name", "status", "agent_ready", "overlay", "base_image"]
        })
    },
    annotations: Annotations {
        read_only: false,
        destructive: false,
        idempotent: false,
        open_world: false,
    },
    handler: sandbox_vm,
};

/// The first free sandbox name: sandbox, sandbox-2, ...
pub(super) fn first_free_name() -> String {
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

fn sandbox_vm(ctx: &ToolCtx, args: &Args) -> ToolResult {
    if let Some(t) = args.opt_str("template")? {
        return super::clone::start(ctx, args, t);
    }
    if args.opt_str("base_image")?.is_none() {
        return Err(ToolError::new(
            "give base_image (a disk image to boot on an overlay) or template (from \
             template_create)",
        ));
    }
    let base = path_arg(args, "base_image", Access::Read)?;
    let checked = checked_image(&base, "base_image", None)?;
    let base_fmt = checked.format;
    let disk_size = disk_size::from_args(args, checked.virtual_size)?;
    let name = match args.opt_str("name")? {
        Some(n) if valid_name(n) => n.to_string(),
        Some(n) => {
            return Err(ToolError::new(format!(
                "invalid VM name {n:?}: use 1-48 characters from A-Z a-z 0-9 _ . -, starting with \
                 a letter or digit"
            )))
        }
        None => first_free_name(),
    };
    // cloud_init is checked before anything is made on disk.
    if let Some(v) = args.0.get("cloud_init").filter(|v| !v.is_null()) {
        crate::cloudinit::CloudInit::parse(v)?;
    }
    let sd = vm::state_dir(&name);
    std::fs::create_dir_all(&sd)
        .map_err(|e| ToolError::new(format!("cannot create {}: {e}", sd.display())))?;
    let overlay = sd.join(format!(
        "overlay-{}-{}.qcow2",
        crate::clock::now_secs(),
        std::process::id()
    ));
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
    let mut out = launched.structured;
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
            return Err(ToolError::new(format!(
                "{}. The sandbox was removed.",
                unseen_seed_reason(&name, &f.datasource)
            )));
        }
        if let Some(w) = out["warnings"].as_array_mut() {
            w.push(json!(no_agent_reason(&name, f, seeded)));
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
            return Err(ToolError::new(format!(
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
    if waited == AgentWait::TimedOut && wait > Duration::ZERO {
        if let Some(w) = out["warnings"].as_array_mut() {
            w.push(json!(format!(
                "the guest agent did not answer within {} s; the VM is running. Retry guest_ping \
                 later, or check vm_serial_read; sandbox_destroy removes it",
                wait.as_secs_f64()
            )));
        }
    }
    Ok(ToolOutput::json(out))
}

/// How a wait for the guest agent ended.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum AgentWait {
    /// The agent answered.
    Ready,
    /// The wait ran out.
    TimedOut,
    /// cloud-init printed its final message and the agent still did not answer
    /// [`AFTER_CLOUD_INIT`] later: it is not coming (a stock image without qemu-guest-agent, or
    /// a seed that installs it never seen or failed).
    NoAgent(console::Finished),
}

/// How long the agent may take to answer once cloud-init has finished: whatever cloud-init
/// installs or enables has started by then.
const AFTER_CLOUD_INIT: Duration = Duration::from_secs(10);

/// Polls the agent in short slices until it answers, QEMU dies, cloud-init finishes without it
/// (read from the serial console), or `wait` runs out.
pub(super) fn wait_for_agent(
    ctx: &ToolCtx,
    name: &str,
    rec: &crate::state::registry::Record,
    wait: Duration,
) -> Result<AgentWait, ToolError> {
    let Some(sock_path) = vm::field(rec, "qga_socket").map(PathBuf::from) else {
        return Ok(AgentWait::TimedOut);
    };
    let mut console = vm::field(rec, "serial_log").map(|p| console::Watch::from_end(Path::new(p)));
    let mut cloud_init_done: Option<(Instant, console::Finished)> = None;
    let deadline = Instant::now() + wait;
    let start = Instant::now();
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(AgentWait::TimedOut);
        }
        ctx.check_cancel()?;
        if let Some(pid) = vm::pid(rec) {
            if !process::alive(pid) {
                let log = vm::field(rec, "serial_log")
                    .map(|p| tail(Path::new(p), 5))
                    .unwrap_or_default();
                return Err(ToolError::new(format!(
                    "QEMU for sandbox {name:?} exited while waiting for the guest agent. Last \
                     serial output: {log}"
                )));
            }
        }
        let slice = POLL_SLICE.min(deadline - now);
        let probe = qga::with_agent(&sock_path, slice, |q| {
            q.execute_within("guest-ping", None, slice.max(Duration::from_millis(50)))
        });
        if probe.is_ok() {
            return Ok(AgentWait::Ready);
        }
        if cloud_init_done.is_none() {
            if let Some(f) = console.as_mut().and_then(console::Watch::poll) {
                cloud_init_done = Some((Instant::now(), f));
            }
        }
        let what = match &cloud_init_done {
            Some((at, f)) if at.elapsed() >= AFTER_CLOUD_INIT => {
                return Ok(AgentWait::NoAgent(f.clone()))
            }
            Some(_) => "cloud-init has finished; waiting briefly for the guest agent",
            None => "waiting for the guest agent",
        };
        ctx.progress(
            start.elapsed().as_secs_f64(),
            Some(wait.as_secs_f64()),
            what,
        );
        let left = deadline.saturating_duration_since(Instant::now());
        std::thread::sleep(Duration::from_millis(100).min(left));
    }
}

/// What a guest that finished cloud-init without an agent tells the caller: the cause and the
/// fix. `seeded`: a cloud-init seed was attached.
pub(super) fn no_agent_reason(name: &str, f: &console::Finished, seeded: bool) -> String {
    if seeded && f.no_datasource() {
        return unseen_seed_reason(name, &f.datasource);
    }
    format!(
        "cloud-init finished in VM {name:?} (datasource {}) and no guest agent answered {} s \
         later: the image has no running qemu-guest-agent (stock cloud images ship without it). \
         Make an agent-ready base with image_prepare, or install and enable qemu-guest-agent \
         through cloud_init (packages, with allow_network=true)",
        if f.datasource.is_empty() {
            "none"
        } else {
            &f.datasource
        },
        AFTER_CLOUD_INIT.as_secs()
    )
}

/// The cause and fix of a cloud-init that ran without the seed attached to it.
pub(super) fn unseen_seed_reason(name: &str, datasource: &str) -> String {
    format!(
        "the guest of VM {name:?} never saw its cloud-init seed: cloud-init ran with no \
         datasource ({}), so hostname, users, runcmd and write_files were not applied. The seed \
         is a CD-ROM labelled cidata on a virtio-scsi controller; the guest needs the \
         virtio_scsi, sr_mod and isofs drivers (every distribution cloud kernel has them) and a \
         cloud-init whose datasource_list includes NoCloud. Check with guest_exec `lsblk` or \
         vm_serial_read; an image without them needs its kernel or cloud-init configuration \
         changed",
        if datasource.is_empty() {
            "DataSourceNone"
        } else {
            datasource
        }
    )
}

/// The last `lines` lines of the serial log a launch result names.
pub(super) fn serial_tail(launched: &Value, lines: usize) -> String {
    launched["serial_log"]
        .as_str()
        .map(|p| tail(Path::new(p), lines))
        .unwrap_or_else(|| "(no serial log)".into())
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read(path).map(|b| {
        let start = b.len().saturating_sub(4096);
        String::from_utf8_lossy(&b[start..]).into_owned()
    });
    match text {
        Ok(t) => t
            .lines()
            .rev()
            .take(lines)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join(" | "),
        Err(_) => "(no serial log)".into(),
    }
}

/// Destroys a sandbox this call made and is giving up on, ignoring what that reports.
pub(super) fn destroy_quietly(ctx: &ToolCtx, name: &str) {
    let mut d = Map::new();
    d.insert("name".into(), json!(name));
    let _ = destroy(ctx, &Args(d));
}

const DESTROY_DESCRIPTION: &str = "Stop a sandbox VM (verified, with SIGKILL if needed), delete \
    its overlay and its own state folder, and drop its record. Only for VMs made by sandbox_vm; \
    the base image is never touched. Refuses to delete an overlay that any process still holds \
    open. destroyed says what really happened; errors lists every cleanup problem.";

/// `sandbox_destroy`.
pub const DESTROY: ToolDef = ToolDef {
    name: "sandbox_destroy",
    title: "Destroy a sandbox",
    description: DESTROY_DESCRIPTION,
    input_schema: || {
        object(
            json!({"name": {"type": "string", "minLength": 1}}),
            &["name"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "destroyed": {"type": "boolean"},
                "stopped": {"type": "string"},
                "deleted": {"type": "array", "items": {"type": "string"}},
                "errors": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["name", "destroyed", "deleted", "errors"]
        })
    },
    annotations: Annotations {
        read_only: false,
        destructive: true,
        idempotent: false,
        open_world: false,
    },
    handler: destroy,
};

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

fn destroy(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = args.str("name")?.to_string();
    let rec = lookup(&name)?;
    let sb = rec
        .get("sandbox")
        .and_then(Value::as_object)
        .cloned()
        .ok_or_else(|| {
            ToolError::new(format!(
                "VM {name:?} is not a sandbox; use stop_vm and forget_vm for ordinary VMs"
            ))
        })?;
    ctx.log.log("notice", &format!("sandbox_destroy {name}"));
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
                if process::is_our_vm(pid, &sock_path) {
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
            return Ok(ToolOutput::json(json!({
                "name": name, "destroyed": false, "stopped": stopped, "deleted": deleted,
                "errors": errors
            })));
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
    Ok(ToolOutput::json(json!({
        "name": name, "destroyed": destroyed, "stopped": stopped, "deleted": deleted,
        "errors": errors
    })))
}
