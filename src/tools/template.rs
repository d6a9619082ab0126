//! `template_create`: boot a guest, run its setup through the agent, and save it into the
//! template store ([`crate::ops::sandbox::templates`]), from which sandbox_vm starts clones
//! ([`crate::ops::sandbox::clone`]) in well under a second instead of booting. `template_list` and
//! `template_delete` are in [`super::template_manage`].

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::params::{self, launch_args};
use super::{checked_image, object, presets, template_name_arg};
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::ops::guest::run as guest_run;
use crate::ops::sandbox::templates::{
    dir_of, disk_of, ensure_blank_overlay, meta_of, ram_of, remove_dir, seed_of, state_of, vars_of,
    Template,
};
use crate::ops::vm::agent::{self, AgentWait};
use crate::ops::vm::disk_size;
use crate::ops::vm::launch::{self, LaunchRequest};
use crate::ops::vm::launch_args::request as launch_request;
use crate::ops::{vm::records, vm::stop};
use crate::qemu::{img, migrate, vm};
use crate::state::registry::Record;
use crate::state::roots::{self, Access};

fn setup_schema() -> Value {
    json!({
        "type": "array", "default": [],
        "items": {"type": "object", "properties": {
            "command": {"type": "string", "minLength": 1},
            "args": {"type": "array", "items": {"type": "string"}, "default": []},
            "timeout": {"type": "number", "minimum": 1, "maximum": 3600, "default": 300}
        }, "required": ["command"], "additionalProperties": false},
        "description": "Commands run in the guest through the agent before it is saved, in \
            order; the first failure stops template_create with its output."
    })
}

const CREATE_DESCRIPTION: &str = "Make a template for instant sandboxes: boot a guest (from \
    base_image, or kernel/initrd), wait for its agent, run each setup command, then save the \
    running guest (RAM in a file, device state, its disk frozen as the clones' backing file) \
    and stop it for good. sandbox_vm with template then starts a clone in well under a second. \
    Takes the sandbox_vm parameters (cloud_init included). Progress per phase.";

/// `template_create`.
pub const CREATE: ToolDef = ToolDef {
    name: "template_create",
    title: "Create a sandbox template",
    description: CREATE_DESCRIPTION,
    input_schema: || {
        let mut props = params::sandbox_props();
        if let Some(p) = props.as_object_mut() {
            p.remove("name");
            p.remove("template");
            p.remove("port_forwards");
            p.insert(
                "name".into(),
                json!({"type": "string", "minLength": 1, "maxLength": 48,
                       "description": "Template name: ^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$."}),
            );
            p.insert("setup".into(), setup_schema());
            p.insert(
                "pool".into(),
                json!({"type": "integer", "minimum": 0, "maximum": crate::ops::sandbox::pool::MAX_POOL,
                       "description": "Clones to keep started for instant sandbox_vm \
                           (template_pool changes it later); 0: none."}),
            );
            if let Some(b) = p.get_mut("base_image") {
                b["description"] = json!(
                    "Base disk image; left untouched. Absent: an empty 1 GiB disk (with kernel)."
                );
            }
            if let Some(m) = p.get_mut("memory_mb") {
                m["default"] = json!(512);
            }
        }
        object(props, &["name"])
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"}, "path": {"type": "string"},
                "memory_mb": {"type": "integer"}, "state_bytes": {"type": "integer"},
                "save_ms": {"type": "integer"}, "setup": {"type": "array"},
                "duration_ms": {"type": "integer"},
                "warnings": {"type": "array", "items": {"type": "string"}},
                "cloud_init": {"type": "object"}
            },
            "required": ["name", "path", "memory_mb", "save_ms"]
        })
    },
    annotations: presets::ADDITIVE,
    handler: create,
    ui: crate::mcp::tool::Ui::NONE,
};

fn create(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let started = Instant::now();
    let name = template_name_arg(args)?;
    let dir = dir_of(&name);
    end_stale_build(ctx, &name)?;
    if meta_of(&dir).exists() {
        return Err(ToolError::new(format!(
            "a template named {name:?} already exists; template_delete it first or choose \
             another name"
        )));
    }
    // A folder without template.json is what an interrupted create left: never usable.
    let _ = remove_dir(&dir);
    std::fs::create_dir_all(&dir)
        .map_err(|e| ToolError::new(format!("cannot create {}: {e}", dir.display())))?;
    let result = build(ctx, args, &name, &dir);
    if result.is_err() {
        let _ = remove_dir(&dir);
    }
    let mut out = result?;
    let pool = args.i64_or("pool", 0)?.max(0) as u64;
    if pool > 0 {
        crate::ops::sandbox::pool::set_size(ctx, &name, pool)?;
    }
    out["pool"] = json!(pool);
    out["duration_ms"] = json!(started.elapsed().as_millis() as u64);
    Ok(ToolOutput::json(out))
}

fn build(ctx: &ToolCtx, args: &Args, name: &str, dir: &Path) -> Result<Value, ToolError> {
    let base = template_disk(args, dir)?;
    ctx.progress_phase("booting the template guest");
    // The guest boots like a sandbox, with its RAM in the template's file; the template's
    // own parameters (setup, pool, waits, disk_size) are not the QEMU's.
    let mut la = launch_args(args)?;
    la.port_forwards = Some(Vec::new());
    la.memory_mb = la.memory_mb.or(Some(512));
    let vm_name = format!("template-{name}");
    let mut req = launch_request(&la, &vm_name, vec![(disk_of(dir), "qcow2".into())])?;
    req.spec.restrict_net = !args.bool_or("allow_network", false)?;
    req.spec.memory_file = Some((ram_of(dir), true));
    req.spec.vmgenid = Some(new_guid());
    let mut sb = Map::new();
    sb.insert("template_build".into(), json!(name));
    sb.insert("builder_pid".into(), json!(std::process::id()));
    req.extra_record.insert("sandbox".into(), Value::Object(sb));
    let mut meta = template_meta(name, base, &req);
    let launched = launch::launch(ctx, req)?;
    // What really runs: the accelerator QEMU reports, the version it announced.
    meta.accel = launched.accel;
    meta.qemu_version = launched.qemu_version;
    let result = prepare_and_save(ctx, args, &vm_name, dir, meta);
    // The template VM never runs again, whatever happened.
    let _ = stop::stop(ctx, &vm_name, true, Duration::ZERO);
    let _ = records::forget(&vm_name, false);
    let _ = std::fs::remove_dir_all(vm::state_dir(&vm_name));
    let _ = std::fs::remove_dir(vm::runtime_dir(&vm_name));
    result
}

/// Makes the template's own disk: an overlay over base_image (never written), or an empty one
/// for a kernel-booted guest. Returns the base image's path, if there is one.
fn template_disk(args: &Args, dir: &Path) -> Result<Option<PathBuf>, ToolError> {
    let base = match args.opt_str("base_image")? {
        Some(b) => {
            let p = roots::check_str(b, Access::Read)
                .map_err(|e| ToolError::new(format!("parameter 'base_image': {e}")))?;
            let checked = checked_image(&p, "base_image", None)?;
            Some((p, checked.format, checked.virtual_size))
        }
        None => None,
    };
    let disk_size =
        disk_size::checked(args.opt_str("disk_size")?, base.as_ref().map_or(0, |b| b.2))?;
    if base.is_none() && args.opt_str("kernel")?.is_none() {
        return Err(ToolError::new(
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
        memory_mb: req.spec.memory_mb,
        cpus: req.spec.cpus,
        arch: req.spec.arch.clone(),
        machine: req.spec.machine.clone(),
        accel: req.spec.accel.clone(),
        cpu: req.spec.cpu.clone(),
        qemu_version: String::new(),
        kernel: req.spec.kernel.as_ref().map(|p| p.display().to_string()),
        initrd: req.spec.initrd.as_ref().map(|p| p.display().to_string()),
        append: req.spec.append.clone(),
        seed: req.cloud_init.is_some(),
        seed_bus: req.spec.seed_bus,
        firmware: req.firmware.clone(),
        uefi_code: req
            .spec
            .uefi
            .as_ref()
            .map(|(code, _, _)| code.display().to_string()),
        uefi_format: req.spec.uefi.as_ref().map(|(_, _, f)| f.clone()),
        no_net: req.spec.no_net,
        data_channel: req.spec.data_channel,
        extra_args: req.spec.extra_args.clone(),
        created_at: String::new(),
        state_bytes: 0,
    }
}

/// A build VM left by a server that died mid-create (its record names the builder's PID):
/// stopped and forgotten, so the template can be created again. A build that a live server
/// is still running is refused instead.
fn end_stale_build(ctx: &ToolCtx, name: &str) -> Result<(), ToolError> {
    let vm_name = format!("template-{name}");
    let Some(rec) = vm::registry().load().remove(&vm_name) else {
        return Ok(());
    };
    let builder = rec
        .get("sandbox")
        .and_then(|s| s.get("builder_pid"))
        .and_then(Value::as_i64)
        .map(|p| p as i32);
    if let Some(p) = builder {
        if p as u32 != std::process::id() && crate::qemu::process::alive(p) {
            return Err(ToolError::new(format!(
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
    ctx: &ToolCtx,
    args: &Args,
    vm_name: &str,
    dir: &Path,
    mut meta: Template,
) -> Result<Value, ToolError> {
    let rec = crate::ops::vm::records::lookup(vm_name)?;
    let ready = wait_ready(ctx, args, vm_name, &rec, meta.seed)?;
    let ran = run_setup(ctx, args, vm_name)?;
    if meta.seed {
        let seed = vm::state_dir(vm_name).join("seed.iso");
        std::fs::copy(&seed, seed_of(dir))
            .map_err(|e| ToolError::new(format!("cannot keep the seed {}: {e}", seed.display())))?;
    }
    ctx.progress_phase("saving the running guest");
    let save_start = Instant::now();
    let tmp = dir.join("state.tmp");
    let bytes = crate::ops::session::monitor(vm_name, &rec, |q| {
        let bytes = migrate::save(q, &tmp, Instant::now() + Duration::from_secs(60))?;
        let _ = q.execute_within("quit", None, Duration::from_secs(2));
        Ok(bytes)
    })?;
    let save_ms = save_start.elapsed().as_millis() as u64;
    std::fs::rename(&tmp, state_of(dir))
        .map_err(|e| ToolError::new(format!("cannot place the saved state: {e}")))?;
    if meta.firmware == "uefi" {
        keep_vars(vm_name, &rec, dir)?;
    }
    ensure_blank_overlay(dir)?;
    meta.state_bytes = bytes;
    meta.created_at = crate::clock::iso8601(crate::clock::now_secs());
    write_meta(dir, &meta)?;
    let mut out = json!({
        "name": meta.name,
        "path": dir.display().to_string(),
        "memory_mb": meta.memory_mb,
        "state_bytes": bytes,
        "save_ms": save_ms,
        "setup": ran,
        "warnings": ready["warnings"],
    });
    if ready["cloud_init"].is_object() {
        out["cloud_init"] = ready["cloud_init"].clone();
    }
    Ok(out)
}

/// Waits for the build guest's agent and, with wait_cloud_init, for cloud-init; a guest that
/// never gets there (or never saw its seed) is refused before anything is saved. Returns
/// `warnings` (a cloud-init module that failed) and what is known of `cloud_init`.
fn wait_ready(
    ctx: &ToolCtx,
    args: &Args,
    vm_name: &str,
    rec: &Record,
    seed: bool,
) -> Result<Value, ToolError> {
    let wait = Duration::from_secs_f64(
        args.opt_f64("wait_agent_s")?
            .unwrap_or(90.0)
            .clamp(1.0, 3600.0),
    );
    let (how, saw) = agent::wait_for_agent(ctx, vm_name, rec, wait)?;
    let mut ready = json!({"warnings": []});
    saw.add_to(&mut ready, vm_name);
    match how {
        AgentWait::Ready => {}
        AgentWait::TimedOut => {
            return Err(ToolError::new(format!(
                "the template guest's agent did not answer within {} s; a template needs \
                 qemu-guest-agent in the guest (nothing was saved)",
                wait.as_secs()
            )))
        }
        AgentWait::Fatal(f) => {
            return Err(ToolError::new(format!(
                "{} before the template guest's agent answered (nothing was saved)",
                f.describe()
            )))
        }
        AgentWait::NoAgent(f) => {
            return Err(ToolError::new(format!(
                "{}; a template needs the agent (nothing was saved)",
                agent::no_agent_reason(vm_name, &f, seed)
            )))
        }
    }
    if args.bool_or("wait_cloud_init", false)? {
        let w = args
            .opt_f64("wait_cloud_init_s")?
            .unwrap_or(600.0)
            .clamp(0.0, 3600.0);
        let waited = guest_run::wait_cloud_init(ctx, vm_name, Duration::from_secs_f64(w))?;
        if seed && guest_run::saw_no_datasource(&waited) {
            let ds = waited["report"]["detail"].as_str().unwrap_or_default();
            return Err(ToolError::new(format!(
                "{}; nothing was saved",
                agent::unseen_seed_reason(vm_name, ds)
            )));
        }
        guest_run::report_cloud_init(&mut ready, waited, &saw);
    }
    Ok(ready)
}

/// Runs each setup step in the guest, in order; the first that fails ends template_create
/// with its output. Returns what each step printed.
fn run_setup(ctx: &ToolCtx, args: &Args, vm_name: &str) -> Result<Vec<Value>, ToolError> {
    let mut ran = Vec::new();
    let steps = args
        .0
        .get("setup")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (i, step) in steps.iter().enumerate() {
        let command = step["command"].as_str().unwrap_or_default();
        let argv: Vec<&str> = step["args"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let timeout = step["timeout"].as_f64().unwrap_or(300.0).clamp(1.0, 3600.0);
        ctx.progress_phase(&format!("setup {}: {command}", i + 1));
        let r = guest_run::run(
            ctx,
            vm_name,
            command,
            &argv,
            Duration::from_secs_f64(timeout),
        )?;
        if r.exitcode != Some(0) {
            return Err(ToolError::new(format!(
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
        ran.push(json!({"command": command, "args": argv, "stdout": r.stdout}));
    }
    Ok(ran)
}

/// Writes template.json through a temporary file: its presence is what makes a template.
fn write_meta(dir: &Path, meta: &Template) -> Result<(), ToolError> {
    let meta_tmp = dir.join(".template.json.tmp");
    let text = serde_json::to_vec_pretty(meta).unwrap_or_default();
    std::fs::write(&meta_tmp, text)
        .and_then(|()| std::fs::rename(&meta_tmp, meta_of(dir)))
        .map_err(|e| ToolError::new(format!("cannot write the template's record: {e}")))
}

/// Copies the stopped build VM's UEFI variable store into the template, once its QEMU is gone
/// (so every write the firmware made is in the file).
fn keep_vars(vm_name: &str, rec: &Record, dir: &Path) -> Result<(), ToolError> {
    if let Some(pid) = vm::pid(rec) {
        if !crate::qemu::process::wait_dead(pid, Duration::from_secs(10)) {
            return Err(ToolError::new(format!(
                "the template guest's QEMU (PID {pid}) did not exit after saving, so its UEFI \
                 variable store cannot be copied whole; nothing was kept"
            )));
        }
    }
    let vars = vm::state_dir(vm_name).join("uefi-vars.fd");
    crate::state::copy::private(&vars, &vars_of(dir)).map_err(|e| {
        ToolError::new(format!(
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
