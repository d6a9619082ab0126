//! Clones: sandbox_vm with `template` starts a QEMU with the template's machine and devices,
//! its RAM file mapped private (copy-on-write: the template is never written), a fresh vmgenid
//! (so the guest reseeds its random numbers), and `-incoming defer`; then loads the saved
//! device state over QMP, lets it run, and sets the guest clock. Ready when the agent answers.
//! Every guarantee of a sandbox holds: an overlay over an untouched base (the template's disk),
//! the network restricted unless `allow_network`, destroyed by sandbox_destroy.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::error::OpError;
use super::launch::{self, LaunchRequest};
use super::records::lookup;
use super::session;
use super::work::Work;
use super::{guest_clock, sandbox, templates as template};
use crate::cloudinit::CloudInit;
use crate::host::{self, binaries, decide};
use crate::mcp::tool::Args;
use crate::qemu::cmdline::LaunchSpec;
use crate::qemu::forwards::resolve_forwards;
use crate::qemu::{migrate, vm};

/// How long loading the template state may take.
const LOAD_BUDGET: Duration = Duration::from_secs(30);

/// sandbox_vm from a template.
/// Ready when the agent first answers; the clock is then being set (see [`guest_clock`]).
/// `checked`: what [`check`] returned for these `args`.
pub fn start(
    ctx: &dyn Work,
    args: &Args,
    template_name: &str,
    checked: Checked,
) -> Result<Value, OpError> {
    Ok(start_checked(ctx, args, template_name, checked, Map::new())?.0)
}

/// What [`check`] found: the template, the clone's own cloud-init, and the QEMU to run it.
pub struct Checked {
    template: template::Template,
    cloud_init: Option<CloudInit>,
    qemu: std::sync::Arc<binaries::Qemu>,
}

/// What a clone of `template_name` cannot honour in sandbox_vm `args`, refused before anything
/// starts (and before a warm pool is looked at, so the same call never succeeds or fails by the
/// pool's state); returns the template and the clone's own cloud-init.
pub fn check(args: &Args, template_name: &str) -> Result<Checked, OpError> {
    let t = template::load(template_name)?;
    for refused in [
        "base_image",
        "kernel",
        "initrd",
        "append",
        "memory_mb",
        "cpus",
        "extra_args",
        "disk_size",
    ] {
        if args.0.get(refused).is_some_and(|v| !v.is_null()) {
            return Err(OpError::new(format!(
                "{refused} comes from the template and cannot be changed for a clone; drop it, \
                 or make another template"
            )));
        }
    }
    if let Some(arch) = args.opt_str("arch")? {
        if arch != t.arch {
            return Err(OpError::new(format!(
                "template {template_name:?} is an {} guest; its clones cannot be {arch}: drop \
                 arch, or make another template",
                t.arch
            )));
        }
    }
    if let Some(fw) = args.opt_str("firmware")? {
        if fw != t.firmware {
            return Err(OpError::new(format!(
                "template {template_name:?} boots with {}; its clones cannot use firmware={fw}: \
                 drop firmware, or make another template",
                t.firmware
            )));
        }
    }
    let qemu = binaries::find(&t.arch).map_err(OpError::new)?;
    let saved = decide::Saved {
        arch: &t.arch,
        machine: &t.machine,
        accel: &t.accel,
        qemu_version: &t.qemu_version,
    };
    decide::can_restore(&saved, host::get(), &qemu).map_err(|why| {
        OpError::new(format!(
            "template {template_name:?} cannot start a clone on this host: {why}"
        ))
    })?;
    sandbox::checked_name(args)?;
    let cloud_init = match args.0.get("cloud_init") {
        None | Some(Value::Null) => None,
        Some(v) => Some(CloudInit::parse(v)?),
    };
    if cloud_init.is_some() && !t.seed {
        return Err(OpError::new(format!(
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

/// [`start`], with `fields` added to the clone's record from its launch on (a pooled clone's
/// mark); also returns the thread setting the clone's clock, when its agent answered.
pub fn start_with(
    ctx: &dyn Work,
    args: &Args,
    template_name: &str,
    fields: Map<String, Value>,
) -> Result<(Value, Option<JoinHandle<guest_clock::Outcome>>), OpError> {
    let checked = check(args, template_name)?;
    start_checked(ctx, args, template_name, checked, fields)
}

/// [`start_with`] for arguments [`check`] has already passed.
fn start_checked(
    ctx: &dyn Work,
    args: &Args,
    template_name: &str,
    checked: Checked,
    fields: Map<String, Value>,
) -> Result<(Value, Option<JoinHandle<guest_clock::Outcome>>), OpError> {
    let started = Instant::now();
    let Checked {
        template: t,
        cloud_init,
        qemu,
    } = checked;
    let tdir = template::dir_of(template_name);
    let name = sandbox::checked_name(args)?;
    let forwards = match args.opt_str_list("port_forwards")? {
        Some(f) => f,
        None if t.no_net => Vec::new(),
        None => vec!["auto:22".to_string()],
    };
    let (sd, overlay) = sandbox::overlay_path(&name)?;
    let uefi = match (&t.firmware[..], &t.uefi_code) {
        ("uefi", Some(code)) => {
            let code = PathBuf::from(code);
            if !code.is_file() {
                return Err(OpError::new(format!(
                    "template {template_name:?} was saved with the UEFI firmware {}, which is \
                     no longer there (a firmware package update?); reinstall it, or \
                     template_delete the template and create it again",
                    code.display()
                )));
            }
            let vars = sd.join("uefi-vars.fd");
            crate::state::copy::private(&template::vars_of(&tdir), &vars).map_err(|e| {
                OpError::new(format!(
                    "cannot copy the template's UEFI variable store: {e}"
                ))
            })?;
            Some((
                code,
                vars,
                t.uefi_format.clone().unwrap_or_else(|| "raw".into()),
            ))
        }
        _ => None,
    };
    let tdisk = template::disk_of(&tdir);
    let t_overlay = Instant::now();
    template::new_overlay(&tdir, &overlay)?;
    let overlay_ms = t_overlay.elapsed();
    let spec = LaunchSpec {
        name: name.clone(),
        binary: qemu.path.display().to_string(),
        machine: t.machine.clone(),
        accel: t.accel.clone(),
        cpu: t.cpu.clone(),
        arch: t.arch.clone(),
        memory_mb: t.memory_mb,
        cpus: t.cpus,
        disks: vec![(overlay.clone(), "qcow2".into())],
        no_net: t.no_net,
        restrict_net: !args.bool_or("allow_network", false)?,
        forwards: resolve_forwards(&forwards)?,
        kernel: t.kernel.as_ref().map(PathBuf::from),
        initrd: t.initrd.as_ref().map(PathBuf::from),
        append: t.append.clone(),
        extra_args: t.extra_args.clone(),
        // The template's own seed keeps the device set; a clone's cloud_init replaces it.
        seed: t.seed.then(|| template::seed_of(&tdir)),
        seed_bus: t.seed_bus,
        uefi,
        memory_file: Some((template::ram_of(&tdir), false)),
        vmgenid: Some("auto".into()),
        incoming: true,
        ..LaunchSpec::default()
    };
    let mut sb = Map::new();
    sb.insert("base_image".into(), json!(tdisk.display().to_string()));
    sb.insert("base_format".into(), json!("qcow2"));
    sb.insert("overlay".into(), json!(overlay.display().to_string()));
    sb.insert("allow_network".into(), json!(!spec.restrict_net));
    sb.insert("template".into(), json!(template_name));
    let mut extra = fields;
    extra.insert("sandbox".into(), Value::Object(sb));
    let req = LaunchRequest {
        spec,
        extra_record: extra,
        accel_note: None,
        kvm_fallback: false,
        firmware: t.firmware.clone(),
        cloud_init,
    };
    let t_qemu = Instant::now();
    let launched = match launch::launch(ctx, req) {
        Ok(o) => o,
        Err(e) => {
            let _ = std::fs::remove_file(&overlay);
            return Err(e);
        }
    };
    let qemu_ms = t_qemu.elapsed();
    let t_load = Instant::now();
    let rec = lookup(&name)?;
    let resumed = session::monitor(&name, &rec, |q| {
        migrate::load(q, &template::state_of(&tdir), Instant::now() + LOAD_BUDGET)?;
        Ok(())
    });
    if let Err(e) = resumed {
        sandbox::destroy_quietly(ctx, &name);
        return Err(OpError::new(format!(
            "the clone of template {template_name:?} could not load its saved state: {}; the \
             clone was removed. If this repeats, template_delete the template and create it again",
            e.0
        )));
    }
    let wait = Duration::from_secs_f64(
        args.opt_f64("wait_agent_s")?
            .unwrap_or(90.0)
            .clamp(0.0, 3600.0),
    );
    let load_ms = t_load.elapsed();
    let t_agent = Instant::now();
    let ready = match vm::field(&rec, "qga_socket") {
        Some(sock) => guest_clock::answer_then_set(Path::new(sock), wait),
        None => Err("the clone has no guest-agent socket".to_string()),
    };
    let agent_ms = t_agent.elapsed();
    let (ready, clock) = match ready {
        Ok(setter) => (Ok(()), Some(setter)),
        Err(why) => (Err(why), None),
    };
    let mut out = launched;
    // Where a clone's time goes, step by step (the bench prints each step's share).
    let ms = |d: Duration| (d.as_secs_f64() * 1000.0 * 10.0).round() / 10.0;
    out["steps_ms"] = json!({
        "overlay": ms(overlay_ms), "qemu_start": ms(qemu_ms), "state_load": ms(load_ms),
        "first_agent_answer": ms(agent_ms),
    });
    // The launch saw the QEMU waiting for its state; it runs now.
    out["status"] = json!("running");
    out["template"] = json!(template_name);
    out["agent_ready"] = json!(ready.is_ok());
    out["ready_ms"] = json!(started.elapsed().as_millis() as u64);
    out["overlay"] = json!(overlay.display().to_string());
    out["base_image"] = json!(tdisk.display().to_string());
    if let (Err(why), true) = (&ready, wait.is_zero()) {
        if let Some(w) = out["warnings"].as_array_mut() {
            w.push(json!(format!(
                "{why} (wait_agent_s is 0); sandbox_destroy {name} removes the clone"
            )));
        }
    } else if let Err(why) = ready {
        let serial = sandbox::serial_tail(&out, 8);
        sandbox::destroy_quietly(ctx, &name);
        return Err(OpError::new(format!(
            "the clone of template {template_name:?} was removed: its guest agent did not \
             answer ({why}). Last serial output: {serial}"
        )));
    }
    Ok((out, clock))
}
