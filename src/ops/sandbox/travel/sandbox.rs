//! Sandboxes that travel: sandbox_push captures a running sandbox as sandbox_fork does (it runs
//! on; its disk moves onto a new overlay), or takes a suspended one's saved state, and sends it
//! as one artifact:
//! its packed memory, device state, each image of its disk's chain (the base its own layer,
//! so a second push of a sandbox on the same base sends only what changed), and the files it
//! boots from, with its launch spec, network rules and lifetime as the config.
//! sandbox_vm {"from": REF} starts it on another host as a fork's copy starts: on an overlay
//! of the pulled disk, its memory mapped from the pulled file, its devices loaded from the
//! pulled state; its processes go on where they were. Host folders never travel.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::{fetch, loads_here, pushed_by, send, Needs, Sent};
use crate::oci::artifact::{self, Part};
use crate::ops::error::OpError;
use crate::ops::sandbox::capture::Captured;
use crate::ops::sandbox::fork::{self, Parent};
use crate::ops::sandbox::frozen;
use crate::ops::sandbox::request::{checked_name, SandboxRequest};
use crate::ops::sandbox::result::Sandboxed;
use crate::ops::sandbox::templates;
use crate::ops::vm::lifetime;
use crate::ops::vm::mounts::{self, MountSpec};
use crate::ops::vm::records::{lookup, spec_of};
use crate::ops::work::Work;
use crate::qemu::{img, live_migrate};
use crate::state::config::VmConfig;
use crate::state::record::{Egress, Lifetime, Record, Sandbox};

/// The artifact type of a sandbox.
pub const SANDBOX_TYPE: &str = "application/vnd.mcqemu.sandbox.v1";
/// Its config's media type.
const SANDBOX_CONFIG: &str = "application/vnd.mcqemu.sandbox.config.v1+json";

/// What a sandbox artifact's config holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Config {
    /// Its name where it ran.
    name: String,
    /// The spec it ran (paths as they were there).
    spec: VmConfig,
    /// The QEMU version that saved it.
    qemu_version: String,
    /// Its memory backend's id (the loading QEMU's must match).
    memory_id: String,
    /// Its guest ran when it was captured.
    was_running: bool,
    /// Its network as recorded (all, none, or names).
    sandbox: Option<Sandbox>,
    /// Its egress proxy's rules.
    egress: Option<Egress>,
    /// Its lifetime's limits.
    lifetime: Option<Lifetime>,
    /// The formats of its disk's chain, top first (layers `disk.0`, `disk.1`, ...).
    disks: Vec<String>,
    /// The mcqemu that pushed it.
    pushed_by: String,
}

crate::described! {
    /// What sandbox_push sent.
    #[derive(Debug, Clone, Serialize)]
    pub struct Pushed {
        /// The sandbox (it runs on).
        pub name: String,
        /// Where it went and what was sent.
        #[serde(flatten)]
        pub sent: Sent,
        /// The guest paths of host folders it mounts that were not sent (without_mounts).
        pub left_behind: Vec<String>,
        /// How long the sandbox was paused by the capture.
        pub paused_ms: u64,
        /// How long it took.
        pub push_ms: u64,
    }
}

/// Pushes running sandbox `name` to `reference`; it runs on. Its host folders never travel:
/// a sandbox with mounts is refused, or, `without_mounts`, unmounted for the capture and
/// mounted again after it (whether the push worked or not).
pub fn push(
    work: &dyn Work,
    name: &str,
    reference: &str,
    without_mounts: bool,
) -> Result<Pushed, OpError> {
    let rec = lookup(name)?;
    refuse_host_cpu(name, &rec)?;
    let mounts: Vec<MountSpec> = rec
        .mounts
        .iter()
        .flatten()
        .map(|m| MountSpec {
            host: m.host.clone().unwrap_or_default(),
            guest: m.guest.clone().unwrap_or_default(),
            writable: m.writable.unwrap_or(false),
        })
        .collect();
    if mounts.is_empty() {
        return push_unmounted(work, name, reference, rec, Vec::new());
    }
    if !without_mounts {
        let first = &mounts[0];
        return Err(OpError::invalid(format!(
            "sandbox {name:?} mounts the host folder {} at {}: host folders never travel. \
             Push it with \"without_mounts\": true (they are unmounted for the capture and \
             mounted again after), or vm_mount {{\"remove\": [{:?}]}} first",
            first.host, first.guest, first.guest
        )));
    }
    work.progress_phase("unmounting its host folders for the capture");
    let pushed = mounts
        .iter()
        .try_for_each(|m| mounts::detach(name, &rec, &m.guest).map(|_| ()))
        .and_then(|()| {
            let guests = mounts.iter().map(|m| m.guest.clone()).collect();
            push_unmounted(work, name, reference, lookup(name)?, guests)
        });
    let again = lookup(name).and_then(|now| mounts::attach_missing(name, &now, &mounts));
    match (pushed, again) {
        (pushed, Ok(())) => pushed,
        (Ok(p), Err(e)) => Err(e.context(format!(
            "sandbox {name:?} was pushed without its host folders (digest {}), and they could \
             not be mounted again; vm_mount adds them",
            p.sent.digest
        ))),
        (Err(e), Err(_)) => Err(e.context(format!(
            "sandbox {name:?} was not pushed, and its host folders could not be mounted \
             again; vm_mount adds them"
        ))),
    }
}

/// Refuses a sandbox running with the host's own CPU model, before anything is sent or
/// changed.
fn refuse_host_cpu(name: &str, rec: &Record) -> Result<(), OpError> {
    if rec.spec.as_ref().and_then(|s| s.machine.cpu.as_deref()) == Some("host") {
        return Err(OpError::invalid(format!(
            "sandbox {name:?} runs with the host's own CPU model (-cpu host, under KVM), which \
             only a machine with this CPU can load; a sandbox cloned from a template travels \
             (templates made under KVM on x86_64 get the named model {})",
            crate::host::decide::TRAVELLING_X86_CPU
        )));
    }
    Ok(())
}

/// The files a sandbox's push sends, and the formats of its disk's chain (top first): its
/// memory and device state, each image of the chain, its UEFI variables and seed, and the files
/// it boots from.
fn parts_of(from: &From) -> Result<(Vec<Part>, Vec<String>), OpError> {
    let chain = img::info_chain(&from.disk, "qcow2").map_err(OpError::from)?;
    let mut parts = vec![
        part("ram", from.dir.join("ram"), true),
        part("state", from.dir.join("state"), false),
    ];
    let mut formats = Vec::new();
    for (i, info) in chain.iter().enumerate() {
        let path = info.raw["filename"].as_str().ok_or_else(|| {
            OpError::host("qemu-img named no file for an image of the disk's chain")
        })?;
        parts.push(part(&format!("disk.{i}"), PathBuf::from(path), false));
        formats.push(info.format.clone().unwrap_or_else(|| "raw".into()));
    }
    if let Some(vars) = from.vars.as_ref().filter(|v| v.is_file()) {
        parts.push(part("uefi-vars.fd", vars.clone(), false));
    }
    if let Some(seed) = &from.seed {
        parts.push(part("seed.iso", seed.clone(), false));
    }
    let boot = &from.spec;
    for (title, file) in [
        ("kernel", &boot.boot.kernel),
        ("initrd", &boot.boot.initrd),
        ("modules", &boot.devices.modules),
    ] {
        if let Some(p) = file {
            parts.push(part(title, p.clone(), false));
        }
    }
    Ok((parts, formats))
}

/// Pushes `name`, whose record `rec` has no mounts; `left` are the guest paths of the ones
/// taken off for the push.
fn push_unmounted(
    work: &dyn Work,
    name: &str,
    reference: &str,
    rec: Record,
    left: Vec<String>,
) -> Result<Pushed, OpError> {
    let started = Instant::now();
    let from = source(work, name, &rec)?;
    let (parts, formats) = parts_of(&from)?;
    let spec = from.spec;
    let config = serde_json::to_vec(&Config {
        name: name.to_string(),
        spec,
        qemu_version: rec.qemu_version.clone().unwrap_or_default(),
        memory_id: from.memory_id,
        was_running: from.was_running,
        sandbox: rec.sandbox.clone().map(|s| Sandbox {
            allow_network: s.allow_network,
            ..Sandbox::default()
        }),
        // Secrets never travel: not their values (never here), nor their names and
        // placeholders, which mean nothing on another host.
        egress: rec.egress.clone().map(|mut e| {
            e.secrets = None;
            e.trusted = None;
            e
        }),
        lifetime: rec.lifetime.clone(),
        disks: formats,
        pushed_by: pushed_by(),
    })
    .map_err(|e| OpError::host(format!("cannot write the sandbox's config: {e}")))?;
    let sent = send(
        work,
        reference,
        (SANDBOX_TYPE, SANDBOX_CONFIG),
        &config,
        &parts,
    )?;
    Ok(Pushed {
        name: name.to_string(),
        sent,
        left_behind: left,
        paused_ms: from.paused_ms,
        push_ms: started.elapsed().as_millis() as u64,
    })
}

/// What a push sends: a frozen state (a running sandbox captured now) or a suspended
/// sandbox's saved one.
struct From {
    /// The spec it ran.
    spec: VmConfig,
    /// The folder holding `ram` and `state`.
    dir: PathBuf,
    /// The top of its disk's chain, not written while it is pushed.
    disk: PathBuf,
    /// Its UEFI variable store.
    vars: Option<PathBuf>,
    /// Its cloud-init seed.
    seed: Option<PathBuf>,
    /// Its memory backend's id.
    memory_id: String,
    /// Its guest ran when it was saved.
    was_running: bool,
    /// How long the capture paused it (0: suspended already).
    paused_ms: u64,
}

/// A suspended sandbox as it was saved; a running one captured now (it runs on).
fn source(work: &dyn Work, name: &str, rec: &Record) -> Result<From, OpError> {
    if let Some(saved) = &rec.suspended {
        let spec = spec_of(name, rec)?;
        let disk = spec.disks.first().map(|d| d.path.clone()).ok_or_else(|| {
            OpError::host(format!(
                "the suspended sandbox {name:?} has no disk in its record"
            ))
        })?;
        return Ok(From {
            dir: saved.dir.clone().map(PathBuf::from).unwrap_or_default(),
            disk,
            vars: spec.boot.uefi.as_ref().map(|u| u.vars.clone()),
            seed: spec.devices.seed.clone(),
            memory_id: saved.memory_id.clone().unwrap_or_default(),
            was_running: saved.was_running.unwrap_or(true),
            paused_ms: 0,
            spec,
        });
    }
    let spec = fork::forkable(name, rec)?;
    work.progress_phase("capturing the sandbox (it runs on)");
    let f = fork::freeze(work, name, rec, &spec)?;
    Ok(From {
        disk: f.dest.join("disk.qcow2"),
        vars: Some(f.dest.join("uefi-vars.fd")),
        seed: f.seed,
        memory_id: f.captured.memory_id,
        was_running: f.captured.was_running,
        paused_ms: f.captured.paused_ms,
        dir: f.dest,
        spec,
    })
}

fn part(title: &str, path: PathBuf, sparse: bool) -> Part {
    Part {
        title: title.to_string(),
        path,
        sparse,
    }
}

/// sandbox_vm {"from": `reference`}: the pushed sandbox started here as `req.name`.
pub fn start(ctx: &dyn Work, req: &SandboxRequest, reference: &str) -> Result<Sandboxed, OpError> {
    let started = Instant::now();
    let name = checked_name(req.name.as_deref())?;
    let (opened, _) = fetch(ctx, reference, SANDBOX_TYPE)?;
    let c: Config = serde_json::from_slice(&opened.config).map_err(|e| {
        OpError::invalid(format!("the sandbox's config is not one mcqemu reads: {e}"))
    })?;
    let qemu = loads_here(
        "sandbox",
        &Needs {
            arch: &c.spec.machine.arch,
            machine: &c.spec.machine.kind,
            accel: c.spec.machine.accel,
            qemu_version: &c.qemu_version,
            cpu: c.spec.machine.cpu.as_deref(),
            uefi_code: c.spec.boot.uefi.as_ref().map(|u| u.code.as_path()),
        },
    )?;
    let id = frozen::new_id(&name);
    let dest = frozen::dir_of(&id);
    std::fs::create_dir_all(&dest)
        .map_err(|e| OpError::host(format!("cannot create {}: {e}", dest.display())))?;
    let made = place(ctx, &opened, &c, &dest).and_then(|mut spec| {
        spec.machine.binary = qemu.path.display().to_string();
        begin(ctx, req, &c, &spec, (&dest, &id), (&name, started))
    });
    if made.is_err() {
        frozen::collect();
    }
    made
}

/// Writes the artifact's files into frozen folder `dest`; the spec with this host's paths.
fn place(
    ctx: &dyn Work,
    opened: &artifact::Opened,
    c: &Config,
    dest: &Path,
) -> Result<VmConfig, OpError> {
    let mut spec = c.spec.clone();
    let disk = |i: usize| match i {
        0 => dest.join("disk.qcow2"),
        i => dest.join(format!("chain-{i}.img")),
    };
    let titles = opened.titles();
    let total = titles.len() as f64;
    for (i, title) in titles.iter().copied().enumerate() {
        ctx.check_cancel()?;
        ctx.progress(i as f64, Some(total), &format!("writing {title}"));
        let to = match title {
            "ram" | "state" | "uefi-vars.fd" | "seed.iso" | "kernel" | "initrd" | "modules" => {
                dest.join(title)
            }
            t => match t
                .strip_prefix("disk.")
                .and_then(|n| n.parse::<usize>().ok())
            {
                Some(n) if n < c.disks.len() => disk(n),
                _ => {
                    return Err(OpError::refused(format!(
                        "the sandbox carries a file named {t:?}, which a sandbox does not have"
                    )))
                }
            },
        };
        opened.extract(title, &to)?;
        match title {
            "kernel" => spec.boot.kernel = Some(to),
            "initrd" => spec.boot.initrd = Some(to),
            "modules" => spec.devices.modules = Some(to),
            _ => {}
        }
    }
    // Each image of the chain names the one below it where it was made: the copy here now.
    for i in 0..c.disks.len().saturating_sub(1) {
        img::rebase_unsafe(&disk(i), &disk(i + 1), &c.disks[i + 1]).map_err(OpError::from)?;
    }
    Ok(spec)
}

/// Starts sandbox `name` from the frozen state placed in `dest` (id `id`).
fn begin(
    ctx: &dyn Work,
    req: &SandboxRequest,
    c: &Config,
    spec: &VmConfig,
    (dest, id): (&Path, &str),
    (name, started): (&str, Instant),
) -> Result<Sandboxed, OpError> {
    // What it was, as far as this host is concerned: its network and rules, never a
    // template or frozen states of the host it came from.
    let rec = Record {
        sandbox: c.sandbox.clone(),
        egress: c.egress.clone(),
        ..Record::default()
    };
    let ram = std::fs::metadata(dest.join("ram")).map_or(0, |m| m.len());
    let state = std::fs::metadata(dest.join("state")).map_or(0, |m| m.len());
    let captured = Captured {
        paused_ms: 0,
        total_ms: 0,
        state_bytes: state,
        ram_bytes: ram,
        steps_ms: [0; 3],
        memory_id: c.memory_id.clone(),
        was_running: c.was_running,
        copy: live_migrate::Method::Live,
    };
    let seed = dest.join("seed.iso");
    let parent = Parent {
        lifetime: lifetime_of(req, c)?,
        name: &c.name,
        rec: &rec,
        spec,
        dest,
        id,
        seed: seed.is_file().then_some(seed),
        captured: &captured,
        wait: req.agent_wait(),
        started,
    };
    templates::ensure_blank_overlay(dest)?;
    let copy = fork::start_copy(ctx, &parent, name)?;
    lifetime::touch(name);
    let mut out = Sandboxed::of(copy.launched);
    out.agent_ready = true;
    out.ready_ms = Some(copy.ready_at_ms);
    out.base_image = Some(dest.join("disk.qcow2").display().to_string());
    out.overlay = lookup(name)
        .ok()
        .and_then(|r| r.sandbox)
        .and_then(|s| s.overlay);
    Ok(out)
}

/// Its lifetime here: what the call asks, else the limits it had (counted from now).
fn lifetime_of(req: &SandboxRequest, c: &Config) -> Result<Option<Lifetime>, OpError> {
    let had = c.lifetime.clone().unwrap_or_default();
    let asked = &req.launch.lifetime;
    let ask = lifetime::Asked {
        ttl_s: asked.ttl_s.or(had.ttl_s),
        idle_s: asked.idle_s.or(had.idle_s),
        on_idle: asked.on_idle.clone().or(had.on_idle),
        on_ttl: asked.on_ttl.clone().or(had.on_ttl),
    };
    lifetime::resolve(lifetime::Kind::Sandbox, &ask, crate::clock::now_secs())
}
