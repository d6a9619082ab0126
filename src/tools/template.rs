//! Templates: a running guest saved once (RAM in a file, device state in a small stream, its
//! disk frozen as a backing file), from which sandbox_vm starts clones in well under a second
//! instead of booting. `template_create` and the template store are here; `template_list` and
//! `template_delete` in [`super::template_manage`]; the clones in [`super::clone`].

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::{checked_image, disk_size, guest_run, launch, object, sandbox, stop};
use crate::mcp::tool::{Annotations, Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::qemu::cmdline::SeedBus;
use crate::qemu::{img, migrate, vm};
use crate::state::paths;
use crate::state::registry::{valid_name, Record};
use crate::state::roots::{self, Access};

/// What a template holds, written last (atomically): a folder without it is not a template.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Template {
    /// Its name.
    pub name: String,
    /// The base image its disk was made over (None: an empty disk).
    pub base_image: Option<String>,
    /// Guest memory in MiB (the RAM file's size).
    pub memory_mb: u64,
    /// vCPUs.
    pub cpus: u64,
    /// QEMU architecture and machine type.
    pub arch: String,
    /// Machine type: concrete (`pc-q35-7.2`), so a newer QEMU loads it as the same machine;
    /// an alias in templates from before machine types were pinned.
    pub machine: String,
    /// The accelerator it ran under (a KVM state does not load under TCG).
    #[serde(default = "tcg")]
    pub accel: String,
    /// Its CPU model (None: QEMU's default, in templates from before it was recorded).
    #[serde(default)]
    pub cpu: Option<String>,
    /// The QEMU version that saved it: a clone needs the same or a newer one.
    #[serde(default)]
    pub qemu_version: String,
    /// Direct kernel boot, as the template booted (clones need the same).
    pub kernel: Option<String>,
    /// Initial ramdisk.
    pub initrd: Option<String>,
    /// Kernel command line.
    pub append: Option<String>,
    /// Whether a cloud-init seed CD-ROM was attached (clones need the same devices).
    pub seed: bool,
    /// Which device the seed was (templates older than the virtio seed have none recorded).
    #[serde(default = "legacy_seed_bus")]
    pub seed_bus: SeedBus,
    /// "bios" or "uefi"; a UEFI template keeps its variable store (`uefi-vars.fd`), and every
    /// clone boots from the same code file with a copy of it.
    #[serde(default = "bios")]
    pub firmware: String,
    /// The UEFI code file the template ran (clones must load the same one).
    #[serde(default)]
    pub uefi_code: Option<String>,
    /// The format of its code and variable store (`raw` when not recorded).
    #[serde(default)]
    pub uefi_format: Option<String>,
    /// Whether the template had a network card.
    pub no_net: bool,
    /// Operator extra_args, repeated for every clone (same devices).
    pub extra_args: Vec<String>,
    /// When it was saved.
    pub created_at: String,
    /// Bytes of the saved device state.
    pub state_bytes: u64,
}

fn legacy_seed_bus() -> SeedBus {
    SeedBus::Cdrom
}

fn tcg() -> String {
    "tcg".into()
}

fn bios() -> String {
    "bios".into()
}

/// The folder of all templates.
pub fn templates_dir() -> PathBuf {
    paths::state_dir().join("templates")
}

/// A template's folder.
pub fn dir_of(name: &str) -> PathBuf {
    templates_dir().join(name)
}

/// Its files.
pub fn disk_of(dir: &Path) -> PathBuf {
    dir.join("disk.qcow2")
}
/// Its RAM file.
pub fn ram_of(dir: &Path) -> PathBuf {
    dir.join("ram")
}
/// Its device state.
pub fn state_of(dir: &Path) -> PathBuf {
    dir.join("state")
}
/// Its seed, when it had one.
pub fn seed_of(dir: &Path) -> PathBuf {
    dir.join("seed.iso")
}
/// Its UEFI variable store, when it booted with UEFI.
pub fn vars_of(dir: &Path) -> PathBuf {
    dir.join("uefi-vars.fd")
}
/// Its record.
pub(super) fn meta_of(dir: &Path) -> PathBuf {
    dir.join("template.json")
}

/// Loads a template, checking that its files are all there and whole.
pub fn load(name: &str) -> Result<Template, ToolError> {
    if !valid_name(name) {
        return Err(ToolError::new(format!("invalid template name {name:?}")));
    }
    let dir = dir_of(name);
    let bytes = std::fs::read(meta_of(&dir)).map_err(|_| {
        ToolError::new(format!(
            "no template named {name:?}; template_list shows the templates, template_create \
             makes one"
        ))
    })?;
    let t: Template = serde_json::from_slice(&bytes).map_err(|e| {
        ToolError::new(format!(
            "template {name:?} is damaged ({}: {e}); template_delete it and create it again",
            meta_of(&dir).display()
        ))
    })?;
    let ram_len = std::fs::metadata(ram_of(&dir)).map(|m| m.len()).ok();
    let state_len = std::fs::metadata(state_of(&dir))
        .map(|m| m.len())
        .unwrap_or(0);
    let problem = match ram_len {
        None => Some("its RAM file is missing".to_string()),
        Some(len) if len != t.memory_mb * 1024 * 1024 => Some(format!(
            "its RAM file is {len} bytes, not {} MiB",
            t.memory_mb
        )),
        _ if !disk_of(&dir).is_file() => Some("its disk is missing".to_string()),
        _ if state_len == 0 => Some("its saved state is missing or empty".to_string()),
        _ if t.state_bytes > 0 && state_len != t.state_bytes => Some(format!(
            "its saved state is {state_len} bytes, not the {} saved",
            t.state_bytes
        )),
        _ if t.seed && !seed_of(&dir).is_file() => {
            Some("its cloud-init seed is missing".to_string())
        }
        _ if t.firmware == "uefi" && !vars_of(&dir).is_file() => {
            Some("its UEFI variable store is missing".to_string())
        }
        _ => None,
    };
    match problem {
        Some(p) => Err(ToolError::new(format!(
            "template {name:?} is damaged: {p}; template_delete it and create it again"
        ))),
        None => Ok(t),
    }
}

/// Names of the live clones of template `name`.
pub fn clones_of(name: &str) -> Vec<String> {
    vm::registry()
        .load()
        .into_iter()
        .filter(|(_, r)| {
            r.get("sandbox")
                .and_then(|s| s.get("template"))
                .and_then(Value::as_str)
                == Some(name)
                && vm::measure_process(r).is_none_or(|m| m.alive())
        })
        .map(|(n, _)| n)
        .collect()
}

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
        let mut props = (sandbox::SANDBOX.input_schema)()["properties"].clone();
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
            if let Some(b) = p.get_mut("base_image") {
                b["type"] = json!(["string", "null"]);
                b["default"] = Value::Null;
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
                "duration_ms": {"type": "integer"}
            },
            "required": ["name", "path", "memory_mb", "save_ms"]
        })
    },
    annotations: Annotations {
        read_only: false,
        destructive: false,
        idempotent: false,
        open_world: false,
    },
    handler: create,
};

/// Removes a template folder's known files and then the folder, reporting what failed.
pub(super) fn remove_dir(dir: &Path) -> Vec<String> {
    let mut errors = Vec::new();
    if !dir.starts_with(templates_dir()) || dir == templates_dir() {
        return vec![format!(
            "refusing to delete {} (not a template folder)",
            dir.display()
        )];
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                errors.push(format!("{} is a folder; left alone", p.display()));
                continue;
            }
            if let Err(err) = std::fs::remove_file(&p) {
                errors.push(format!("cannot delete {}: {err}", p.display()));
            }
        }
    }
    if let Err(err) = std::fs::remove_dir(dir) {
        if err.kind() != std::io::ErrorKind::NotFound {
            errors.push(format!("cannot delete {}: {err}", dir.display()));
        }
    }
    errors
}

fn create(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let started = Instant::now();
    let name = args.str("name")?.to_string();
    if !valid_name(&name) {
        return Err(ToolError::new(format!(
            "invalid template name {name:?}: use 1-48 characters from A-Z a-z 0-9 _ . -, \
             starting with a letter or digit"
        )));
    }
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
    out["duration_ms"] = json!(started.elapsed().as_millis() as u64);
    Ok(ToolOutput::json(out))
}

fn build(ctx: &ToolCtx, args: &Args, name: &str, dir: &Path) -> Result<Value, ToolError> {
    // The template's own disk: an overlay over the base (never written), or an empty one.
    let base = match args.opt_str("base_image")? {
        Some(b) => {
            let p = roots::check_str(b, Access::Read)
                .map_err(|e| ToolError::new(format!("parameter 'base_image': {e}")))?;
            let checked = checked_image(&p, "base_image", None)?;
            Some((p, checked.format, checked.virtual_size))
        }
        None => None,
    };
    let disk_size = disk_size::from_args(args, base.as_ref().map_or(0, |b| b.2))?;
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
    ctx.progress_phase("booting the template guest");
    // The guest boots like a sandbox, with its RAM in the template's file.
    let mut launch_args = args.0.clone();
    // Parameters of the template itself, not of the QEMU it launches.
    for k in [
        "name",
        "setup",
        "base_image",
        "allow_network",
        "wait_agent_s",
        "wait_cloud_init",
        "wait_cloud_init_s",
        "disk_size",
    ] {
        launch_args.remove(k);
    }
    launch_args.insert("port_forwards".into(), json!([]));
    if !launch_args.contains_key("memory_mb") {
        launch_args.insert("memory_mb".into(), json!(512));
    }
    let vm_name = format!("template-{name}");
    let mut req = launch::request_from_args(
        &Args(launch_args),
        &vm_name,
        vec![(disk.clone(), "qcow2".into())],
    )?;
    req.spec.restrict_net = !args.bool_or("allow_network", false)?;
    req.spec.memory_file = Some((ram_of(dir), true));
    req.spec.vmgenid = Some(new_guid());
    let mut sb = Map::new();
    sb.insert("template_build".into(), json!(name));
    sb.insert("builder_pid".into(), json!(std::process::id()));
    req.extra_record.insert("sandbox".into(), Value::Object(sb));
    let mut meta = Template {
        name: name.to_string(),
        base_image: base.as_ref().map(|(b, _, _)| b.display().to_string()),
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
        extra_args: req.spec.extra_args.clone(),
        created_at: String::new(),
        state_bytes: 0,
    };
    let launched = launch::launch(ctx, req)?.structured;
    // What really runs: the accelerator QEMU reports, the version it announced.
    meta.accel = launched["accel"]
        .as_str()
        .unwrap_or(&meta.accel)
        .to_string();
    meta.qemu_version = launched["qemu_version"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let result = prepare_and_save(ctx, args, &vm_name, dir, meta);
    // The template VM never runs again, whatever happened.
    let mut s = Map::new();
    s.insert("name".into(), json!(vm_name));
    s.insert("force".into(), json!(true));
    let _ = (stop::STOP.handler)(ctx, &Args(s.clone()));
    s.remove("force");
    let _ = (super::lifecycle::FORGET.handler)(ctx, &Args(s));
    let _ = std::fs::remove_dir_all(vm::state_dir(&vm_name));
    let _ = std::fs::remove_dir(vm::runtime_dir(&vm_name));
    result
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
    let mut s = Map::new();
    s.insert("name".into(), json!(vm_name));
    s.insert("force".into(), json!(true));
    (stop::STOP.handler)(ctx, &Args(s.clone()))?;
    s.remove("force");
    let _ = (super::lifecycle::FORGET.handler)(ctx, &Args(s));
    let _ = std::fs::remove_dir_all(vm::state_dir(&vm_name));
    let _ = std::fs::remove_dir(vm::runtime_dir(&vm_name));
    Ok(())
}

fn prepare_and_save(
    ctx: &ToolCtx,
    args: &Args,
    vm_name: &str,
    dir: &Path,
    mut meta: Template,
) -> Result<Value, ToolError> {
    let rec = super::lifecycle::lookup(vm_name)?;
    let wait = Duration::from_secs_f64(
        args.opt_f64("wait_agent_s")?
            .unwrap_or(90.0)
            .clamp(1.0, 3600.0),
    );
    match sandbox::wait_for_agent(ctx, vm_name, &rec, wait)? {
        sandbox::AgentWait::Ready => {}
        sandbox::AgentWait::TimedOut => {
            return Err(ToolError::new(format!(
                "the template guest's agent did not answer within {} s; a template needs \
                 qemu-guest-agent in the guest (nothing was saved)",
                wait.as_secs()
            )))
        }
        sandbox::AgentWait::NoAgent(f) => {
            return Err(ToolError::new(format!(
                "{}; a template needs the agent (nothing was saved)",
                sandbox::no_agent_reason(vm_name, &f, meta.seed)
            )))
        }
    }
    if args.bool_or("wait_cloud_init", false)? {
        let w = args
            .opt_f64("wait_cloud_init_s")?
            .unwrap_or(600.0)
            .clamp(0.0, 3600.0);
        let waited = guest_run::wait_cloud_init(ctx, vm_name, Duration::from_secs_f64(w))?;
        if meta.seed && guest_run::saw_no_datasource(&waited) {
            let ds = waited["report"]["detail"].as_str().unwrap_or_default();
            return Err(ToolError::new(format!(
                "{}; nothing was saved",
                sandbox::unseen_seed_reason(vm_name, ds)
            )));
        }
    }
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
    if meta.seed {
        let seed = vm::state_dir(vm_name).join("seed.iso");
        std::fs::copy(&seed, seed_of(dir))
            .map_err(|e| ToolError::new(format!("cannot keep the seed {}: {e}", seed.display())))?;
    }
    ctx.progress_phase("saving the running guest");
    let save_start = Instant::now();
    let tmp = dir.join("state.tmp");
    let bytes = super::session::monitor(vm_name, &rec, |q| {
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
    meta.state_bytes = bytes;
    meta.created_at = crate::clock::iso8601(crate::clock::now_secs());
    let meta_tmp = dir.join(".template.json.tmp");
    let text = serde_json::to_vec_pretty(&meta).unwrap_or_default();
    std::fs::write(&meta_tmp, text)
        .and_then(|()| std::fs::rename(&meta_tmp, meta_of(dir)))
        .map_err(|e| ToolError::new(format!("cannot write the template's record: {e}")))?;
    Ok(json!({
        "name": meta.name,
        "path": dir.display().to_string(),
        "memory_mb": meta.memory_mb,
        "state_bytes": bytes,
        "save_ms": save_ms,
        "setup": ran,
    }))
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
