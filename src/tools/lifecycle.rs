//! Lifecycle tools: launch, stop, pause, resume, attach and forget VMs.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::{object, path_arg, vm_name_arg};
use crate::mcp::tool::{Annotations, Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::qemu::cmdline::{self, Forward, LaunchSpec};
use crate::qemu::qmp::{self, QmpError};
use crate::qemu::vm::{self, explain_qmp, measure};
use crate::qemu::{accel, firmware, img, process, sock};
use crate::state::paths;
use crate::state::registry::{Record, RegistryError};

impl From<RegistryError> for ToolError {
    fn from(e: RegistryError) -> Self {
        ToolError(e.to_string())
    }
}

/// Architectures launch_vm accepts, with their default machine type.
const ARCHES: &[(&str, &str)] = &[
    ("x86_64", "q35"),
    ("i386", "q35"),
    ("aarch64", "virt"),
    ("riscv64", "virt"),
];

/// Looks up a VM record or says how to find the right name.
pub fn lookup(name: &str) -> Result<Record, ToolError> {
    vm::registry().load().remove(name).ok_or_else(|| {
        ToolError::new(format!("no VM named {name:?}; list_vms shows the known VMs (attach_vm adopts one started elsewhere)"))
    })
}

/// Looks up a VM that must be running, judged without a QMP round trip (the caller's own
/// session will report a monitor that does not answer): a stopped VM or one still being
/// launched gets a clear error.
pub fn lookup_live(name: &str, what_next: &str) -> Result<Record, ToolError> {
    let rec = lookup(name)?;
    match vm::measure_process(&rec) {
        Some(m) if m.status == "starting" => Err(being_launched(name)),
        Some(m) if !m.alive() => Err(ToolError::new(format!(
            "VM {name:?} is not running; {what_next}"
        ))),
        _ => Ok(rec),
    }
}

fn forwards_json(fw: &[Forward]) -> Value {
    json!(fw.iter().map(|f| json!({"addr": f.addr.to_string(), "host": f.host, "guest": f.guest, "auto": f.auto})).collect::<Vec<_>>())
}

fn resolve_existing(args: &Args, key: &str, what: &str) -> Result<Option<PathBuf>, ToolError> {
    match args.opt_str(key)? {
        None => Ok(None),
        Some(_) => {
            let p = path_arg(args, key)?;
            if !p.is_file() {
                return Err(ToolError::new(format!(
                    "{what} {} does not exist or is not a file",
                    p.display()
                )));
            }
            Ok(Some(p))
        }
    }
}

/// Picks the accelerator: `auto` takes KVM only where it can really run guests.
pub fn choose_accel(requested: &str) -> Result<(String, Option<String>), ToolError> {
    match requested {
        "tcg" => Ok(("tcg".into(), None)),
        "kvm" => accel::kvm_usable()
            .map(|_| ("kvm".into(), None))
            .map_err(|why| {
                ToolError::new(format!(
                    "accel=\"kvm\" is not usable here: {why}. Use accel=\"auto\" or \"tcg\""
                ))
            }),
        "auto" => match accel::kvm_usable() {
            Ok(()) => Ok(("kvm".into(), None)),
            Err(why) => Ok(("tcg".into(), Some(format!("fell back to TCG: {why}")))),
        },
        other => Err(ToolError::new(format!(
            "unknown accel {other:?}; use auto, kvm or tcg"
        ))),
    }
}

/// Everything a launch needs beyond the spec, shared by launch_vm and sandbox_vm.
pub struct LaunchRequest {
    /// The spec (sockets and pidfile are filled in by [`launch`]).
    pub spec: LaunchSpec,
    /// Extra fields for the record (e.g. sandbox details).
    pub extra_record: Map<String, Value>,
    /// Why TCG was chosen, if auto fell back.
    pub accel_note: Option<String>,
    /// Firmware name for the record.
    pub firmware: String,
}

/// Reserves the name, starts QEMU, and records the VM. On failure the reservation is dropped.
pub fn launch(ctx: &ToolCtx, mut req: LaunchRequest) -> ToolResult {
    let name = req.spec.name.clone();
    let rt = vm::runtime_dir(&name);
    let sd = vm::state_dir(&name);
    let qmp_sock = rt.join("qmp.sock");
    req.spec.qmp_socket = qmp_sock.clone();
    req.spec.qga_socket = rt.join("qga.sock");
    req.spec.serial_socket = rt.join("serial.sock");
    req.spec.pidfile = rt.join("qemu.pid");
    req.spec.serial_log = sd.join("serial.log");
    for s in [
        &req.spec.qmp_socket,
        &req.spec.qga_socket,
        &req.spec.serial_socket,
    ] {
        if s.as_os_str().len() > sock::MAX_SOCKET_PATH {
            return Err(ToolError::new(format!(
                "socket path {} is longer than the {} bytes a unix socket allows; set MCQEMU_RUNTIME_DIR to a shorter folder",
                s.display(),
                sock::MAX_SOCKET_PATH
            )));
        }
    }
    // Reserve the name first, across threads and processes (the registry lock).
    vm::registry().update(|vms| {
        if let Some(old) = vms.get(&name) {
            let m = measure(old);
            if m.alive() {
                return Err(ToolError::new(format!(
                    "a VM named {name:?} is already {} ; stop_vm it first or choose another name",
                    m.status
                )));
            }
        }
        let mut rec = Map::new();
        rec.insert("name".into(), json!(name));
        rec.insert("qmp_socket".into(), json!(qmp_sock.display().to_string()));
        rec.insert(
            "launching".into(),
            json!({"owner_pid": std::process::id(), "since": crate::clock::now_secs()}),
        );
        vms.insert(name.clone(), rec);
        Ok(())
    })?;
    let result = start_reserved(ctx, &req, &rt, &sd);
    if result.is_err() {
        let _ = vm::registry().update(|vms| {
            if vms.get(&name).is_some_and(|r| r.contains_key("launching")) {
                vms.remove(&name);
            }
            Ok::<_, RegistryError>(())
        });
    }
    result
}

fn start_reserved(ctx: &ToolCtx, req: &LaunchRequest, rt: &Path, sd: &Path) -> ToolResult {
    let s = &req.spec;
    let name = &s.name;
    for dir in [rt, sd] {
        std::fs::create_dir_all(dir)
            .map_err(|e| ToolError::new(format!("cannot create {}: {e}", dir.display())))?;
    }
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(rt, std::fs::Permissions::from_mode(0o700));
    }
    if s.qmp_socket.exists() {
        if sock::is_listening(&s.qmp_socket) {
            return Err(ToolError::new(format!(
                "a QEMU is still listening on {}: VM {name:?} seems to be running outside the registry. Adopt it with attach_vm, or stop that QEMU first",
                s.qmp_socket.display()
            )));
        }
        for stale in [&s.qmp_socket, &s.qga_socket, &s.serial_socket] {
            let _ = std::fs::remove_file(stale);
        }
    }
    ctx.check_cancel()?;
    let argv = cmdline::build_argv(s);
    crate::log::stderr(
        "info",
        &format!("launching VM {name}: {} {}", s.binary, argv.join(" ")),
    );
    let started = process::spawn_daemon(&s.binary, &argv, &s.pidfile).map_err(ToolError::new)?;
    let mut warnings: Vec<String> = started.warning.into_iter().collect();
    let (actual_accel, status, version) = match qmp::with_session(&s.qmp_socket, |q| {
        let kvm = q.execute("query-kvm", None)?;
        let st = q.execute("query-status", None)?;
        Ok((kvm, st, q.version.clone()))
    }) {
        Ok((kvm, st, v)) => {
            let a = if kvm.get("enabled").and_then(Value::as_bool) == Some(true) {
                "kvm"
            } else {
                "tcg"
            };
            (
                a.to_string(),
                st.get("status")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown")
                    .to_string(),
                v,
            )
        }
        Err(e) => {
            warnings.push(format!("QMP did not answer right after start: {e}"));
            (s.accel.clone(), "unknown".into(), String::new())
        }
    };
    if let Some(n) = &req.accel_note {
        warnings.push(n.clone());
    }
    let mut rec = Map::new();
    rec.insert("name".into(), json!(name));
    rec.insert("source".into(), json!("spawned"));
    rec.insert("pid".into(), json!(started.pid));
    rec.insert("arch".into(), json!(s.arch));
    rec.insert("machine".into(), json!(s.machine));
    rec.insert("accel".into(), json!(actual_accel));
    rec.insert("memory_mb".into(), json!(s.memory_mb));
    rec.insert("cpus".into(), json!(s.cpus));
    rec.insert(
        "disks".into(),
        json!(s
            .disks
            .iter()
            .map(|(p, _)| p.display().to_string())
            .collect::<Vec<_>>()),
    );
    rec.insert(
        "iso".into(),
        json!(s.iso.as_ref().map(|p| p.display().to_string())),
    );
    rec.insert("firmware".into(), json!(req.firmware));
    rec.insert(
        "kernel".into(),
        json!(s.kernel.as_ref().map(|p| p.display().to_string())),
    );
    rec.insert(
        "initrd".into(),
        json!(s.initrd.as_ref().map(|p| p.display().to_string())),
    );
    rec.insert("append".into(), json!(s.append));
    rec.insert("no_net".into(), json!(s.no_net));
    rec.insert("restrict_net".into(), json!(s.restrict_net));
    rec.insert("port_forwards".into(), forwards_json(&s.forwards));
    rec.insert(
        "qmp_socket".into(),
        json!(s.qmp_socket.display().to_string()),
    );
    rec.insert(
        "qga_socket".into(),
        json!(s.qga_socket.display().to_string()),
    );
    rec.insert(
        "serial_socket".into(),
        json!(s.serial_socket.display().to_string()),
    );
    rec.insert(
        "serial_log".into(),
        json!(s.serial_log.display().to_string()),
    );
    rec.insert("pidfile".into(), json!(s.pidfile.display().to_string()));
    rec.insert("extra_args".into(), json!(s.extra_args));
    rec.insert("qemu_version".into(), json!(version));
    rec.insert(
        "created_at".into(),
        json!(crate::clock::iso8601(crate::clock::now_secs())),
    );
    for (k, v) in &req.extra_record {
        rec.insert(k.clone(), v.clone());
    }
    let name_c = name.clone();
    let rec_c = rec.clone();
    vm::registry().update(move |vms| {
        vms.insert(name_c, rec_c);
        Ok::<_, RegistryError>(())
    })?;
    let mut out = json!({
        "name": name,
        "status": if status == "running" { "running".to_string() } else { status },
        "pid": started.pid,
        "accel": actual_accel,
        "arch": s.arch,
        "machine": s.machine,
        "qemu_version": version,
        "port_forwards": forwards_json(&s.forwards),
        "qmp_socket": s.qmp_socket.display().to_string(),
        "qga_socket": s.qga_socket.display().to_string(),
        "serial_log": s.serial_log.display().to_string(),
        "warnings": warnings,
    });
    if let Some(sb) = req.extra_record.get("sandbox") {
        out["sandbox"] = sb.clone();
    }
    Ok(ToolOutput::json(out))
}

fn launch_props() -> Value {
    json!({
        "name": {"type": "string", "minLength": 1, "maxLength": 48, "description": "VM name: ^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$."},
        "arch": {"type": "string", "enum": ARCHES.iter().map(|a| a.0).collect::<Vec<_>>(), "default": "x86_64"},
        "disks": {"type": "array", "items": {"type": "string"}, "default": [], "description": "Disk image paths; formats are probed."},
        "iso": {"type": ["string", "null"], "default": null, "description": "Installer ISO attached as a CD-ROM (boots first)."},
        "memory_mb": {"type": "integer", "minimum": 16, "maximum": 1048576, "default": 2048},
        "cpus": {"type": "integer", "minimum": 1, "maximum": 256, "default": 2},
        "machine": {"type": ["string", "null"], "default": null, "description": "Machine type; default q35 on x86, virt on aarch64/riscv64."},
        "firmware": {"type": "string", "enum": ["bios", "uefi"], "default": "bios"},
        "port_forwards": {"type": "array", "items": {"type": "string"}, "default": [], "description": "TCP forwards: \"HOST:GUEST\", \"auto:GUEST\", \"GUEST\", or \"ADDR:HOST:GUEST\". Host ports listen on 127.0.0.1 unless ADDR says otherwise."},
        "no_net": {"type": "boolean", "default": false, "description": "No network card at all."},
        "restrict_net": {"type": "boolean", "default": false, "description": "Block guest-initiated traffic (port forwards still work)."},
        "extra_args": {"type": "array", "items": {"type": "string"}, "default": [], "description": "OPERATOR-ONLY: extra QEMU arguments. Options reaching host files, devices or processes, or mcqemu's own control channels, are refused."},
        "accel": {"type": "string", "enum": ["auto", "kvm", "tcg"], "default": "auto", "description": "auto picks KVM only where it can really run guests; default from MCQEMU_ACCEL."},
        "kernel": {"type": ["string", "null"], "default": null, "description": "Direct kernel boot: kernel image."},
        "initrd": {"type": ["string", "null"], "default": null, "description": "Direct kernel boot: initial ramdisk."},
        "append": {"type": ["string", "null"], "default": null, "description": "Direct kernel boot: kernel command line."}
    })
}

fn launch_out() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "status": {"type": "string"},
            "pid": {"type": ["integer", "null"]},
            "accel": {"type": "string"},
            "arch": {"type": "string"},
            "machine": {"type": "string"},
            "qemu_version": {"type": "string"},
            "port_forwards": {"type": "array", "items": {"type": "object"}},
            "qmp_socket": {"type": "string"},
            "qga_socket": {"type": "string"},
            "serial_log": {"type": "string"},
            "warnings": {"type": "array", "items": {"type": "string"}},
            "sandbox": {"type": "object"}
        },
        "required": ["name", "status", "accel", "qmp_socket"]
    })
}

/// Builds a launch request from launch_vm-style arguments (also used by sandbox_vm).
pub fn request_from_args(
    args: &Args,
    name: &str,
    disks: Vec<(PathBuf, String)>,
) -> Result<LaunchRequest, ToolError> {
    let arch = args.str_or("arch", "x86_64")?.to_string();
    let default_machine = ARCHES
        .iter()
        .find(|a| a.0 == arch)
        .map(|a| a.1)
        .ok_or_else(|| ToolError::new(format!("unsupported arch {arch:?}")))?;
    let machine = args
        .opt_str("machine")?
        .unwrap_or(default_machine)
        .to_string();
    let env_accel = std::env::var("MCQEMU_ACCEL").ok().filter(|s| !s.is_empty());
    let requested = match args.opt_str("accel")? {
        Some(a) => a.to_string(),
        None => env_accel.unwrap_or_else(|| "auto".into()),
    };
    let (accel, accel_note) = choose_accel(&requested)?;
    let extra_args = args.str_list("extra_args")?;
    cmdline::check_extra_args(&extra_args).map_err(ToolError::new)?;
    let no_net = args.bool_or("no_net", false)?;
    let fw_specs = args.str_list("port_forwards")?;
    if no_net && !fw_specs.is_empty() {
        return Err(ToolError::new(
            "port_forwards need a network; drop no_net=true or the forwards",
        ));
    }
    let forwards = cmdline::resolve_forwards(&fw_specs).map_err(ToolError::new)?;
    let firmware = args.str_or("firmware", "bios")?.to_string();
    let uefi = if firmware == "uefi" {
        let fw = firmware::find_uefi(&arch).map_err(ToolError::new)?;
        let sd = vm::state_dir(name);
        std::fs::create_dir_all(&sd)
            .map_err(|e| ToolError::new(format!("cannot create {}: {e}", sd.display())))?;
        let vars = sd.join("uefi-vars.fd");
        if !vars.exists() {
            std::fs::copy(&fw.vars, &vars).map_err(|e| {
                ToolError::new(format!(
                    "cannot copy the UEFI variable store {}: {e}",
                    fw.vars.display()
                ))
            })?;
        }
        Some((fw.code, vars))
    } else {
        None
    };
    let spec = LaunchSpec {
        name: name.to_string(),
        binary: format!("qemu-system-{arch}"),
        machine,
        accel,
        arch,
        memory_mb: args.i64_or("memory_mb", 2048)?.max(16) as u64,
        cpus: args.i64_or("cpus", 2)?.max(1) as u64,
        disks,
        iso: resolve_existing(args, "iso", "ISO")?,
        uefi,
        no_net,
        restrict_net: args.bool_or("restrict_net", false)?,
        forwards,
        kernel: resolve_existing(args, "kernel", "kernel")?,
        initrd: resolve_existing(args, "initrd", "initrd")?,
        append: args.opt_str("append")?.map(str::to_string),
        extra_args,
        ..LaunchSpec::default()
    };
    if spec.initrd.is_some() && spec.kernel.is_none() {
        return Err(ToolError::new("initrd needs kernel (direct kernel boot)"));
    }
    Ok(LaunchRequest {
        spec,
        extra_record: Map::new(),
        accel_note,
        firmware,
    })
}

/// `launch_vm`.
pub const LAUNCH: ToolDef = ToolDef {
    name: "launch_vm",
    title: "Launch a VM",
    description: "Start a QEMU virtual machine that outlives this server, with a QMP control socket, a guest-agent channel (virtio-serial org.qemu.guest_agent.0) and a serial console log. Disk formats are probed. Returns the PID, the accelerator QEMU really uses, resolved host ports and socket/log paths. Boot an installer with iso; boot a kernel directly with kernel/initrd/append.",
    input_schema: || object(launch_props(), &["name"]),
    output_schema: launch_out,
    annotations: Annotations { read_only: false, destructive: false, idempotent: false, open_world: false },
    handler: launch_vm,
};

fn launch_vm(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let mut disks = Vec::new();
    for (i, d) in args.str_list("disks")?.iter().enumerate() {
        let p = paths::resolve(d).map_err(|e| ToolError::new(format!("disks[{i}]: {e}")))?;
        if !p.is_file() {
            return Err(ToolError::new(format!(
                "disks[{i}]: {} does not exist or is not a file; create one with image_create",
                p.display()
            )));
        }
        let fmt = img::probe_format(&p)?;
        disks.push((p, fmt));
    }
    let req = request_from_args(args, &name, disks)?;
    launch(ctx, req)
}

// ---- stop ----

/// `stop_vm`.
pub const STOP: ToolDef = ToolDef {
    name: "stop_vm",
    title: "Stop a VM",
    description: "Stop a VM. Graceful by default: ACPI power-down, then wait up to timeout seconds for QEMU to exit (a guest without an OS or still booting may ignore it). force=true: QMP quit, then SIGTERM and SIGKILL, each verified. The record stays (list_vms shows it stopped); forget_vm drops it.",
    input_schema: || object(json!({
        "name": {"type": "string", "minLength": 1},
        "force": {"type": "boolean", "default": false},
        "timeout": {"type": "number", "minimum": 0, "maximum": 3600, "default": 30, "description": "Seconds to wait for a graceful stop."}
    }), &["name"]),
    output_schema: || json!({"type": "object", "properties": {
        "name": {"type": "string"}, "status": {"type": "string"}, "method": {"type": "string"},
        "events": {"type": "array", "items": {"type": "string"}}, "elapsed_ms": {"type": "integer"},
        "cleanup_errors": {"type": "array", "items": {"type": "string"}}
    }, "required": ["name", "status", "method"]}),
    annotations: Annotations { read_only: false, destructive: true, idempotent: true, open_world: false },
    handler: stop_vm,
};

fn stop_vm(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = args.str("name")?.to_string();
    let force = args.bool_or("force", false)?;
    let timeout =
        Duration::from_secs_f64(args.opt_f64("timeout")?.unwrap_or(30.0).clamp(0.0, 3600.0));
    let rec = lookup(&name)?;
    let started = Instant::now();
    let m = measure(&rec);
    if m.status == "starting" {
        return Err(being_launched(&name));
    }
    if !m.alive() {
        let cleanup = vm::cleanup_runtime(&rec);
        return Ok(ToolOutput::json(
            json!({"name": name, "status": "stopped", "method": "already stopped", "events": [], "elapsed_ms": 0, "cleanup_errors": cleanup}),
        ));
    }
    ctx.log
        .log("notice", &format!("stop_vm {name} (force={force})"));
    let (method, events) = if force {
        force_stop(&name, &rec)?
    } else {
        graceful_stop(ctx, &name, &rec, timeout)?
    };
    let cleanup = vm::cleanup_runtime(&rec);
    Ok(ToolOutput::json(json!({
        "name": name, "status": "stopped", "method": method, "events": events,
        "elapsed_ms": started.elapsed().as_millis() as u64, "cleanup_errors": cleanup,
    })))
}

fn gone(rec: &Record) -> bool {
    match vm::pid(rec) {
        Some(p) => !process::alive(p),
        None => !sock::is_listening(&vm::qmp_socket(rec)),
    }
}

fn graceful_stop(
    ctx: &ToolCtx,
    name: &str,
    rec: &Record,
    timeout: Duration,
) -> Result<(String, Vec<String>), ToolError> {
    let sock_path = vm::qmp_socket(rec);
    let deadline = Instant::now() + timeout;
    let outcome = qmp::with_session(&sock_path, |q| {
        q.execute("system_powerdown", None)?;
        loop {
            if gone(rec) {
                return Ok((true, q.event_names()));
            }
            if Instant::now() >= deadline || ctx.cancelled() {
                return Ok((false, q.event_names()));
            }
            match q.next_event(Duration::from_millis(100)) {
                Ok(_) => {}
                Err(QmpError::Closed) => {
                    // QEMU closed the monitor: it is exiting. Wait (bounded) for the process.
                    let until = Instant::now() + Duration::from_secs(5);
                    while !gone(rec) && Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    return Ok((gone(rec), q.event_names()));
                }
                Err(e) => return Err(e),
            }
        }
    });
    let (ended, events) = outcome.map_err(|e| ToolError::new(explain_qmp(name, rec, &e)))?;
    if ended {
        if events.iter().any(|e| e == "SHUTDOWN") {
            return Ok(("acpi".into(), events));
        }
        return Err(ToolError::new(format!(
            "VM {name:?} exited without a guest shutdown event (events seen: [{}]): QEMU may have crashed; see its serial log",
            events.join(", ")
        )));
    }
    ctx.check_cancel()?;
    Err(ToolError::new(format!(
        "VM {name:?} did not power off within {} s after ACPI power-down (events seen: [{}]). The guest may ignore ACPI (no OS, still booting, or no acpid). Retry with a longer timeout, or use force=true",
        timeout.as_secs_f64(),
        events.join(", ")
    )))
}

fn force_stop(name: &str, rec: &Record) -> Result<(String, Vec<String>), ToolError> {
    let sock_path = vm::qmp_socket(rec);
    let quit = qmp::with_session(&sock_path, |q| {
        match q.execute_within("quit", None, Duration::from_secs(2)) {
            Ok(_) | Err(QmpError::Closed) => Ok(q.event_names()),
            Err(e) => Err(e),
        }
    });
    let events = quit.as_ref().cloned().unwrap_or_default();
    match vm::pid(rec) {
        Some(pid) => {
            if quit.is_ok() && process::wait_dead(pid, Duration::from_secs(2)) {
                return Ok(("quit".into(), events));
            }
            if !process::is_our_vm(pid, &sock_path) && vm::spawned(rec) && process::alive(pid) {
                return Err(ToolError::new(format!(
                    "PID {pid} is no longer VM {name:?}'s QEMU; refusing to signal it"
                )));
            }
            let steps = process::terminate(pid).map_err(ToolError::new)?;
            Ok((steps.last().copied().unwrap_or("quit").to_string(), events))
        }
        None => {
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until {
                if !sock::is_listening(&sock_path) {
                    return Ok(("quit".into(), events));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(ToolError::new(format!(
                "VM {name:?} still answers on its QMP socket after quit, and no PID is known to signal; stop the QEMU process by hand"
            )))
        }
    }
}

// ---- pause / resume ----

fn run_state_out() -> Value {
    json!({"type": "object", "properties": {"name": {"type": "string"}, "status": {"type": "string"}}, "required": ["name", "status"]})
}

fn name_only() -> Value {
    object(
        json!({"name": {"type": "string", "minLength": 1}}),
        &["name"],
    )
}

/// `pause_vm`.
pub const PAUSE: ToolDef = ToolDef {
    name: "pause_vm",
    title: "Pause a VM",
    description: "Freeze a running VM's vCPUs (QMP stop); reports the resulting run state. The guest agent does not answer while paused.",
    input_schema: name_only,
    output_schema: run_state_out,
    annotations: Annotations { read_only: false, destructive: false, idempotent: true, open_world: false },
    handler: |_ctx, args| run_state_change(args, "stop"),
};

/// `resume_vm`.
pub const RESUME: ToolDef = ToolDef {
    name: "resume_vm",
    title: "Resume a VM",
    description: "Resume a paused VM (QMP cont); reports the resulting run state.",
    input_schema: name_only,
    output_schema: run_state_out,
    annotations: Annotations {
        read_only: false,
        destructive: false,
        idempotent: true,
        open_world: false,
    },
    handler: |_ctx, args| run_state_change(args, "cont"),
};

/// The error for a VM whose launch (by this or another server) has not finished: its record
/// has no PID or final sockets yet, so stopping or pausing it now would act on nothing.
fn being_launched(name: &str) -> ToolError {
    ToolError::new(format!(
        "VM {name:?} is still being launched; wait for launch_vm to return (list_vms shows it running), then retry"
    ))
}

fn run_state_change(args: &Args, cmd: &str) -> ToolResult {
    let name = args.str("name")?.to_string();
    let rec = lookup_live(&name, "launch it with launch_vm")?;
    let st = qmp::with_session(&vm::qmp_socket(&rec), |q| {
        q.execute(cmd, None)?;
        q.execute("query-status", None)
    })
    .map_err(|e| ToolError::new(explain_qmp(&name, &rec, &e)))?;
    Ok(ToolOutput::json(
        json!({"name": name, "status": st.get("status").and_then(Value::as_str).unwrap_or("unknown")}),
    ))
}

// ---- attach / forget ----

/// `attach_vm`.
pub const ATTACH: ToolDef = ToolDef {
    name: "attach_vm",
    title: "Adopt a running QEMU",
    description: "Register a QEMU started elsewhere so the other tools can drive it. qmp_socket must be a unix socket that answers QMP; qga_socket (optional) is its guest-agent socket; pid (optional) lets stop_vm signal it. Its liveness is judged by connecting to the socket.",
    input_schema: || object(json!({
        "name": {"type": "string", "minLength": 1, "maxLength": 48},
        "qmp_socket": {"type": "string", "minLength": 1},
        "qga_socket": {"type": ["string", "null"], "default": null},
        "pid": {"type": ["integer", "null"], "minimum": 1, "default": null}
    }), &["name", "qmp_socket"]),
    output_schema: || json!({"type": "object", "properties": {
        "name": {"type": "string"}, "status": {"type": "string"}, "qmp_socket": {"type": "string"},
        "qga_socket": {"type": ["string", "null"]}, "pid": {"type": ["integer", "null"]}, "qemu_version": {"type": "string"}
    }, "required": ["name", "status", "qmp_socket"]}),
    annotations: Annotations { read_only: false, destructive: false, idempotent: false, open_world: false },
    handler: attach_vm,
};

fn socket_arg(args: &Args, key: &str) -> Result<Option<PathBuf>, ToolError> {
    if args.opt_str(key)?.is_none() {
        return Ok(None);
    }
    let p = path_arg(args, key)?;
    let p = std::fs::canonicalize(&p)
        .map_err(|e| ToolError::new(format!("{key} {}: {e}", p.display())))?;
    if !sock::is_socket(&p) {
        return Err(ToolError::new(format!(
            "{key} {} is not a unix socket",
            p.display()
        )));
    }
    Ok(Some(p))
}

fn attach_vm(_ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = vm_name_arg(args)?;
    let qmp_path =
        socket_arg(args, "qmp_socket")?.ok_or_else(|| ToolError::new("missing qmp_socket"))?;
    let qga = socket_arg(args, "qga_socket")?;
    let pid = args.opt_i64("pid")?.map(|p| p as i32);
    if let Some(p) = pid {
        if !process::alive(p) {
            return Err(ToolError::new(format!("process {p} is not running")));
        }
    }
    let (status, version) = qmp::with_session(&qmp_path, |q| {
        let st = q.execute("query-status", None)?;
        Ok((st.get("status").and_then(Value::as_str).unwrap_or("unknown").to_string(), q.version.clone()))
    })
    .map_err(|e| match e {
        QmpError::NoGreeting => ToolError::new(format!("{} accepts connections but sends no QMP greeting: another client holds that monitor. Free it and retry", qmp_path.display())),
        other => ToolError::new(format!("{} does not answer QMP: {other}", qmp_path.display())),
    })?;
    let mut rec = Map::new();
    rec.insert("name".into(), json!(name));
    rec.insert("source".into(), json!("attached"));
    rec.insert("pid".into(), json!(pid));
    rec.insert("qmp_socket".into(), json!(qmp_path.display().to_string()));
    rec.insert(
        "qga_socket".into(),
        json!(qga.as_ref().map(|p| p.display().to_string())),
    );
    rec.insert("qemu_version".into(), json!(version));
    rec.insert(
        "created_at".into(),
        json!(crate::clock::iso8601(crate::clock::now_secs())),
    );
    let name_c = name.clone();
    vm::registry().update(move |vms| {
        if let Some(old) = vms.get(&name_c) {
            if measure(old).alive() {
                return Err(ToolError::new(format!(
                    "a live VM is already registered as {name_c:?}; choose another name"
                )));
            }
        }
        vms.insert(name_c, rec);
        Ok(())
    })?;
    Ok(ToolOutput::json(json!({
        "name": name, "status": status, "qmp_socket": qmp_path.display().to_string(),
        "qga_socket": qga.map(|p| p.display().to_string()), "pid": pid, "qemu_version": version,
    })))
}

/// `forget_vm`.
pub const FORGET: ToolDef = ToolDef {
    name: "forget_vm",
    title: "Forget a VM",
    description: "Drop a VM's registry record only; the QEMU process and its files are left alone. Refuses a live VM that mcqemu spawned unless force=true (it would keep running unmanaged). Attached VMs can always be forgotten.",
    input_schema: || object(json!({"name": {"type": "string", "minLength": 1}, "force": {"type": "boolean", "default": false}}), &["name"]),
    output_schema: || json!({"type": "object", "properties": {"name": {"type": "string"}, "forgotten": {"type": "boolean"}, "was_running": {"type": "boolean"}}, "required": ["name", "forgotten"]}),
    annotations: Annotations { read_only: false, destructive: true, idempotent: false, open_world: false },
    handler: forget_vm,
};

fn forget_vm(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let name = args.str("name")?.to_string();
    let force = args.bool_or("force", false)?;
    let name_c = name.clone();
    let (was_running, rec) = vm::registry().update(move |vms| {
        let rec = vms.get(&name_c).cloned().ok_or_else(|| ToolError::new(format!("no VM named {name_c:?}; list_vms shows the known VMs")))?;
        let alive = measure(&rec).alive();
        if alive && vm::spawned(&rec) && !force {
            return Err(ToolError::new(format!("VM {name_c:?} is still running; stop_vm it first, or pass force=true to leave it running unmanaged")));
        }
        vms.remove(&name_c);
        Ok((alive, rec))
    })?;
    if !was_running {
        let _ = vm::cleanup_runtime(&rec);
    }
    ctx.log.log(
        "notice",
        &format!("forget_vm {name} (was running: {was_running})"),
    );
    Ok(ToolOutput::json(
        json!({"name": name, "forgotten": true, "was_running": was_running}),
    ))
}
