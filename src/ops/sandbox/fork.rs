//! sandbox_fork: live copies of a running sandbox as it is now. The sandbox is captured while
//! it runs ([`crate::ops::sandbox::capture`]: stopped only for the last dirty pages and the disk step) into a
//! frozen state ([`crate::ops::sandbox::frozen`]); each copy then starts like a clone of a template from it:
//! its memory the frozen `ram` mapped copy-on-write, its own overlay on the frozen disk, a
//! fresh generation ID, its clock set and, without vmgenid, its randomness reseeded.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::ops::error::OpError;
use crate::ops::guest::clock as guest_clock;
use crate::ops::sandbox::capture::{self, Captured, Move, Plan, Then};
use crate::ops::sandbox::destroy::{destroy_quietly, overlay_path};
use crate::ops::sandbox::frozen;
use crate::ops::sandbox::templates;
use crate::ops::session;
use crate::ops::vm::launch::{self, LaunchRequest, Launched};
use crate::ops::vm::lifetime;
use crate::ops::vm::quota;
use crate::ops::vm::records::{lookup, spec_of};
use crate::ops::work::Work;
use crate::qemu::cmdline::x86;
use crate::qemu::forwards::{resolve_forwards, PortSpec};
use crate::qemu::{blockdev, live_migrate, migrate, vm};
use crate::state::config::{Disk, MemoryFile, Uefi, VmConfig};
use crate::state::record::{text, Network, Sandbox};
use crate::state::registry::{valid_name, Record, RegistryError};

/// Most copies one call makes.
pub const MAX_COPIES: usize = 16;
/// How long loading the frozen state into a copy may take.
const LOAD_BUDGET: Duration = Duration::from_secs(30);

/// sandbox_fork's request.
#[derive(Debug, Clone)]
pub struct ForkRequest {
    /// The running sandbox to copy.
    pub name: String,
    /// How many copies (1..=16).
    pub count: usize,
    /// Their names (default: NAME-fork-N, the first free).
    pub names: Option<Vec<String>>,
    /// How long each copy's agent may take to answer.
    pub wait_agent: Duration,
    /// The copies' lifetime (each part None: the parent's, else a sandbox's default).
    pub lifetime: lifetime::Asked,
}

crate::described! {
    /// What sandbox_fork made.
    #[derive(Debug, Clone, Serialize)]
    pub struct Forked {
        /// The sandbox copied; it runs on.
        pub parent: String,
        /// Each copy, as sandbox_vm describes a sandbox.
        pub copies: Vec<ForkCopy>,
        /// How long the parent was stopped.
        pub parent_paused_ms: u64,
        /// `live` (stopped only for the last dirty pages) or `stopped` (for the whole copy: a
        /// QEMU whose live copies lose writes).
        pub copied: &'static str,
        /// The capture of the parent (its copy into the frozen state).
        pub capture_ms: u64,
        /// The capture's steps: the live copy, the receiver's save, the memory written out.
        pub capture_steps_ms: CaptureSteps,
        /// From the call to the first copy's agent answering.
        pub first_ready_ms: u64,
        /// From the call to the last copy's agent answering.
        pub all_ready_ms: u64,
        /// Bytes of the frozen device state.
        pub state_bytes: u64,
        /// Bytes of frozen memory on disk (what the guest touched), shared by every copy.
        pub ram_bytes: u64,
        /// The frozen state's folder.
        pub frozen: String,
    }
}

crate::described! {
    /// One copy a fork started (in this order): the launch, then what the fork adds.
    #[derive(Debug, Clone, Serialize)]
    pub struct ForkCopy {
        /// The launch (its status the copy's now: running).
        #[serde(flatten)]
        pub launched: Launched,
        /// The sandbox it is a copy of.
        pub fork_of: String,
        /// Always true: a copy whose agent does not answer is removed.
        pub agent_ready: bool,
        /// From the fork call to its agent's answer.
        pub ready_at_ms: u64,
    }
}

crate::described! {
    /// A fork's capture steps, in milliseconds.
    #[derive(Debug, Clone, Copy, Serialize)]
    pub struct CaptureSteps {
        /// The live copy of the parent.
        pub copy: u64,
        /// The receiver's save.
        pub save: u64,
        /// The memory written out.
        pub write: u64,
    }
}

/// sandbox_fork: `req.count` live copies of sandbox `req.name`; all of them or none.
pub fn fork(ctx: &dyn Work, req: &ForkRequest) -> Result<Forked, OpError> {
    let started = Instant::now();
    let names = copy_names(req)?;
    let rec = lookup(&req.name)?;
    let spec = forkable(&req.name, &rec)?;
    admit(&names, &spec)?;
    let f = freeze(ctx, &req.name, &rec, &spec)?;
    let (dest, id, captured) = (&f.dest, &f.id, &f.captured);
    ctx.progress_phase(&format!("starting {} copies", names.len()));
    let lifetime = copies_lifetime(&rec, &req.lifetime)?;
    let parent = Parent {
        lifetime,
        name: &req.name,
        rec: &rec,
        spec: &spec,
        dest,
        id,
        seed: f.seed.clone(),
        captured,
        wait: req.wait_agent,
        started,
    };
    let copies = start_all(ctx, &parent, &names)?;
    for c in &copies {
        lifetime::touch(&c.launched.name);
    }
    let ready = || copies.iter().map(|c| c.ready_at_ms);
    Ok(Forked {
        parent: req.name.clone(),
        first_ready_ms: ready().min().unwrap_or(0),
        all_ready_ms: ready().max().unwrap_or(0),
        copies,
        parent_paused_ms: captured.paused_ms,
        copied: match captured.copy {
            live_migrate::Method::Live => "live",
            live_migrate::Method::Stopped => "stopped",
        },
        capture_ms: captured.total_ms,
        capture_steps_ms: CaptureSteps {
            copy: captured.steps_ms[0],
            save: captured.steps_ms[1],
            write: captured.steps_ms[2],
        },
        state_bytes: captured.state_bytes,
        ram_bytes: captured.ram_bytes,
        frozen: dest.display().to_string(),
    })
}

/// A running sandbox captured into a frozen state of its own while it runs on (onto a new
/// overlay): what a fork's copies, and a pushed sandbox, start from.
pub struct Frozen {
    /// The frozen state's id.
    pub id: String,
    /// Its folder: `ram`, `state`, `disk.qcow2` (the frozen disk), `uefi-vars.fd`, `seed.iso`.
    pub dest: PathBuf,
    /// The seed the copies attach, when the sandbox had one.
    pub seed: Option<PathBuf>,
    /// What the capture made and measured.
    pub captured: Captured,
}

/// Captures sandbox `name` (its record `rec`, the spec it runs) into a new frozen state; it
/// runs on, its disk on a new overlay.
pub fn freeze(
    ctx: &dyn Work,
    name: &str,
    rec: &Record,
    spec: &VmConfig,
) -> Result<Frozen, OpError> {
    let next = next_move(name, rec)?;
    let id = frozen::new_id(name);
    let dest = frozen::dir_of(&id);
    std::fs::create_dir_all(&dest)
        .map_err(|e| OpError::host(format!("cannot create {}: {e}", dest.display())))?;
    let seed = keep_seed(spec, &dest)?;
    let plan = Plan {
        name,
        rec,
        spec,
        dest: &dest,
        then: Then::RunOn,
        next_overlay: Some(next.clone()),
    };
    let captured = capture::capture(ctx, &plan);
    settle_parent(name, rec, &next, &id);
    match captured {
        Ok(captured) => Ok(Frozen {
            id,
            dest,
            seed,
            captured,
        }),
        Err(e) => {
            frozen::collect();
            Err(e)
        }
    }
}

/// The copies' names: as given (each valid, free and distinct) or the first free
/// `NAME-fork-N`; `count` out of 1..=16 is refused.
fn copy_names(req: &ForkRequest) -> Result<Vec<String>, OpError> {
    if !(1..=MAX_COPIES).contains(&req.count) {
        return Err(OpError::invalid(format!(
            "count {} is out of range: a fork makes 1 to {MAX_COPIES} copies",
            req.count
        )));
    }
    let vms = crate::state::registry::shared().load();
    let names = match &req.names {
        Some(n) if n.len() != req.count => {
            return Err(OpError::invalid(format!(
                "names has {} entries but count is {}; give one name per copy or leave names out",
                n.len(),
                req.count
            )))
        }
        Some(n) => n.clone(),
        None => (1..)
            .map(|i| format!("{}-fork-{i}", req.name))
            .filter(|n| !vms.contains_key(n))
            .take(req.count)
            .collect(),
    };
    for (i, n) in names.iter().enumerate() {
        if !valid_name(n) {
            return Err(OpError::invalid(crate::state::registry::invalid_name(
                "VM", n,
            )));
        }
        if vms.contains_key(n) || names[..i].contains(n) {
            return Err(OpError::invalid(format!(
                "a VM named {n:?} already exists (or is named twice); choose other names"
            )));
        }
    }
    Ok(names)
}

/// The spec of a sandbox that can be forked: running (or paused) under this mcqemu, on one
/// qcow2 overlay in its own folder, not a template's build.
pub fn forkable(name: &str, rec: &Record) -> Result<VmConfig, OpError> {
    let sb = rec.sandbox.as_ref().ok_or_else(|| {
        OpError::invalid(format!(
            "VM {name:?} is not a sandbox; sandbox_fork copies VMs made by sandbox_vm (or its \
             forks), whose disk is an overlay mcqemu owns"
        ))
    })?;
    if sb.template_build.is_some() || rec.pooled.is_some() {
        return Err(OpError::invalid(format!(
            "VM {name:?} belongs to a template (its build or its warm pool); fork a sandbox"
        )));
    }
    live(name, rec)?;
    crate::ops::vm::mounts::refuse_if_mounted(name, rec, "sandbox_fork and sandbox_suspend")?;
    let spec = spec_of(name, rec)?;
    let own = vm::state_dir(name);
    let overlay = sb.overlay.as_ref().map(PathBuf::from);
    match spec.disks.as_slice() {
        [Disk { path: disk, format }] if format == "qcow2" && Some(disk) == overlay.as_ref() => {
            if !disk.starts_with(&own) {
                return Err(OpError::invalid(format!(
                    "sandbox {name:?}'s overlay {} is not in its own folder {}; it cannot be \
                     forked",
                    disk.display(),
                    own.display()
                )));
            }
        }
        _ => {
            return Err(OpError::invalid(format!(
                "sandbox {name:?} does not run on one qcow2 overlay of its own; it cannot be \
                 forked"
            )))
        }
    }
    if spec.compute.memory_file.as_ref().is_some_and(|m| m.shared) {
        return Err(OpError::invalid(format!(
            "VM {name:?} writes its memory to a template's file; fork a sandbox"
        )));
    }
    Ok(spec)
}

/// Refuses a VM that has no QEMU to copy: being launched, suspended or stopped.
pub fn live(name: &str, rec: &Record) -> Result<(), OpError> {
    match vm::measure_process(rec) {
        Some(m) if m.status == vm::Status::Starting => {
            Err(crate::ops::vm::records::being_launched(name))
        }
        Some(m) if m.status == vm::Status::Suspended => Err(OpError::invalid(format!(
            "VM {name:?} is suspended; sandbox_resume it first"
        ))),
        Some(m) if !m.alive() => Err(OpError::invalid(format!(
            "VM {name:?} is not running; there is nothing to copy"
        ))),
        _ => Ok(()),
    }
}

/// Refuses the fork before anything starts when its copies would pass the quotas.
fn admit(names: &[String], spec: &VmConfig) -> Result<(), OpError> {
    let vms = crate::state::registry::shared().load();
    let limits = quota::Limits::current();
    let first = names.first().map(String::as_str).unwrap_or_default();
    quota::admit_many(
        &vms,
        first,
        names.len() as u64,
        spec.compute.memory_mb,
        spec.compute.cpus,
        limits,
    )
}

/// A copy of the parent's cloud-init seed in the frozen state (the parent's is rewritten when
/// it is launched again).
fn keep_seed(spec: &VmConfig, dest: &Path) -> Result<Option<PathBuf>, OpError> {
    let Some(seed) = &spec.devices.seed else {
        return Ok(None);
    };
    let kept = dest.join("seed.iso");
    std::fs::copy(seed, &kept)
        .map_err(|e| OpError::host(format!("cannot keep the seed {}: {e}", seed.display())))?;
    Ok(Some(kept))
}

/// Where the parent's disk moves: a new overlay in its own folder (never a name QEMU has
/// open), under a node name its QEMU has not used, onto its disk's top node now. Asked before
/// the guest stops.
fn next_move(name: &str, rec: &Record) -> Result<Move, OpError> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let overlay = vm::state_dir(name).join(format!(
        "overlay-{}-{}-{seq}.qcow2",
        crate::clock::now_secs(),
        std::process::id()
    ));
    let onto = session::monitor(name, rec, |q| Ok(blockdev::top_node(q, "mcq-disk0")?))?;
    Ok(Move {
        overlay,
        node: blockdev::next_node_name(&onto, "mcq-top"),
        onto,
    })
}

/// When the parent's QEMU now writes to overlay `next` (its top node is the one the fork
/// added: asked of QEMU itself, whatever the capture returned), its record says so: its disk,
/// its overlay, its spec, and the frozen state its disk now stands on. Without this a restart
/// or a resume of the parent would open the disk it had before the fork.
fn settle_parent(name: &str, rec: &Record, next: &Move, id: &str) {
    let top = session::monitor(name, rec, |q| Ok(blockdev::top_node(q, "mcq-disk0")?));
    if top.ok() != Some(next.node.clone()) {
        return;
    }
    let (n, id, next) = (
        name.to_string(),
        id.to_string(),
        next.overlay.display().to_string(),
    );
    let _ = crate::state::registry::shared().update(move |vms| {
        if let Some(r) = vms.get_mut(&n) {
            moved_onto(r, &next, &id);
        }
        Ok::<_, RegistryError>(())
    });
}

/// A record's first disk moved onto overlay `next`, over frozen state `id`.
fn moved_onto(r: &mut Record, next: &str, id: &str) {
    if let Some(first) = r.spec.as_mut().and_then(|s| s.disks.first_mut()) {
        *first = Disk::new(next, "qcow2");
        // The config holds the disks now; the copies older versions kept beside it go.
        r.disks = None;
        r.disk_formats = None;
    }
    if let Some(sb) = r.sandbox.as_mut() {
        sb.overlay = Some(next.to_string());
        sb.chain.get_or_insert_with(Vec::new).push(id.to_string());
    }
}

/// What every copy starts from: a frozen state, and the sandbox it was (here, or on the host
/// a pushed sandbox came from).
pub struct Parent<'a> {
    /// The copies' lifetime.
    pub lifetime: Option<crate::state::record::Lifetime>,
    /// The sandbox frozen.
    pub name: &'a str,
    /// Its record (its sandbox and egress parts are the copies').
    pub rec: &'a Record,
    /// The spec it ran.
    pub spec: &'a VmConfig,
    /// The frozen state's folder.
    pub dest: &'a Path,
    /// Its id.
    pub id: &'a str,
    /// The seed the copies attach.
    pub seed: Option<PathBuf>,
    /// What the capture made.
    pub captured: &'a Captured,
    /// How long a copy's agent may take.
    pub wait: Duration,
    /// When the call began.
    pub started: Instant,
}

/// Starts every copy at once; when one fails, the others are destroyed and the error says
/// which failed and why.
fn start_all(ctx: &dyn Work, p: &Parent, names: &[String]) -> Result<Vec<ForkCopy>, OpError> {
    templates::ensure_blank_overlay(p.dest)?;
    let results: Vec<Result<ForkCopy, OpError>> = std::thread::scope(|s| {
        let handles: Vec<_> = names
            .iter()
            .map(|n| s.spawn(move || start_copy(ctx, p, n)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(OpError::host("a copy's start panicked")))
            })
            .collect()
    });
    let failed: Vec<String> = results
        .iter()
        .zip(names)
        .filter_map(|(r, n)| r.as_ref().err().map(|e| format!("{n}: {}", e.msg)))
        .collect();
    if failed.is_empty() {
        return Ok(results.into_iter().filter_map(Result::ok).collect());
    }
    for (r, n) in results.iter().zip(names) {
        if r.is_ok() {
            destroy_quietly(ctx, n);
        }
    }
    frozen::collect();
    Err(OpError::host(format!(
        "the fork of {:?} made no copies: {}. {:?} runs on as it was",
        p.name,
        failed.join("; "),
        p.name
    )))
}

/// One copy: its overlay on the frozen disk, its QEMU waiting for the frozen state, the state
/// loaded, its agent awaited (then its clock set and, without vmgenid, its randomness reseeded).
pub fn start_copy(ctx: &dyn Work, p: &Parent, name: &str) -> Result<ForkCopy, OpError> {
    let launched = launch_copy(ctx, p, name)?;
    let rec = lookup(name)?;
    let loaded = session::monitor(name, &rec, |q| {
        migrate::load(q, &p.dest.join("state"), Instant::now() + LOAD_BUDGET)?;
        Ok(())
    });
    if let Err(e) = loaded {
        destroy_quietly(ctx, name);
        return Err(OpError::host(format!(
            "it could not load the frozen state: {}",
            e.msg
        )));
    }
    let reseed = (p.spec.devices.vmgenid.is_none() || !x86(&p.spec.machine.arch))
        .then(|| p.spec.machine.arch.clone());
    let ready = match text(&rec.qga_socket) {
        Some(sock) => guest_clock::answer_then_set(Path::new(sock), p.wait, reseed),
        None => Err("it has no guest-agent socket".to_string()),
    };
    if let Err(why) = ready {
        destroy_quietly(ctx, name);
        return Err(OpError::timed_out(format!(
            "its guest agent did not answer ({why})"
        )));
    }
    let mut launched = launched;
    launched.status = "running".into();
    Ok(ForkCopy {
        launched,
        fork_of: p.name.to_string(),
        agent_ready: true,
        ready_at_ms: p.started.elapsed().as_millis() as u64,
    })
}

/// Makes the copy's files and launches its QEMU waiting for the frozen state.
fn launch_copy(ctx: &dyn Work, p: &Parent, name: &str) -> Result<Launched, OpError> {
    let (sd, overlay) = overlay_path(name)?;
    templates::new_overlay(p.dest, &overlay)?;
    let uefi = match &p.spec.boot.uefi {
        Some(Uefi { code, format, .. }) => {
            let vars = sd.join("uefi-vars.fd");
            crate::state::copy::private(&p.dest.join("uefi-vars.fd"), &vars).map_err(|e| {
                let _ = std::fs::remove_file(&overlay);
                OpError::host(format!("cannot copy the frozen UEFI variables: {e}"))
            })?;
            Some(Uefi {
                code: code.clone(),
                vars,
                format: format.clone(),
            })
        }
        None => None,
    };
    let spec = copy_spec(p, name, &overlay, uefi)?;
    let lr = LaunchRequest {
        spec,
        extra_record: copy_record(p, &overlay),
        accel_note: None,
        kvm_fallback: false,
        cloud_init: None,
        uefi_vars_from: None,
        egress: crate::ops::vm::egress::rules_from(p.rec)?,
        // A copy's guest gets fresh placeholders; the parent's go on meaning only the parent.
        secrets: crate::ops::vm::egress::secrets_of(p.rec)
            .into_iter()
            .map(|s| s.name)
            .collect(),
        kept_secrets: Vec::new(),
    };
    match launch::launch(ctx, lr) {
        Ok(l) => Ok(l),
        Err(e) => {
            let _ = std::fs::remove_file(&overlay);
            let _ = std::fs::remove_file(sd.join("uefi-vars.fd"));
            let _ = std::fs::remove_dir(&sd);
            Err(e)
        }
    }
}

/// The parent's spec for a copy: its own name, overlay and UEFI variables, the frozen memory
/// mapped private, a fresh generation ID, the parent's guest ports forwarded from free host
/// ports, waiting for the frozen state.
fn copy_spec(
    p: &Parent,
    name: &str,
    overlay: &Path,
    uefi: Option<Uefi>,
) -> Result<VmConfig, OpError> {
    let forwards: Vec<PortSpec> = p
        .spec
        .network
        .forwards
        .iter()
        .map(|f| PortSpec::auto_on(f.addr, f.guest))
        .collect();
    let mut s = p.spec.clone();
    s.name = name.to_string();
    s.disks = vec![Disk::new(overlay, "qcow2")];
    s.boot.uefi = uefi;
    s.devices.seed = p.seed.clone();
    s.network.forwards = resolve_forwards(&forwards)?;
    s.compute.memory_file = Some(MemoryFile {
        path: p.dest.join("ram"),
        shared: false,
    });
    s.compute.memory_id = Some(p.captured.memory_id.clone());
    s.devices.vmgenid = s.devices.vmgenid.as_ref().map(|_| "auto".to_string());
    s.start.incoming = true;
    s.start.start_paused = false;
    Ok(s)
}

/// A copy's `sandbox` record: its overlay on the frozen disk, the frozen states its disk
/// stands on (the parent's and this fork's), the memory it maps, the template it descends from.
fn copy_record(p: &Parent, overlay: &Path) -> Record {
    let psb = p.rec.sandbox.as_ref();
    let mut chain = frozen::chain_of(p.rec);
    chain.push(p.id.to_string());
    let sb = Sandbox {
        base_image: Some(p.dest.join("disk.qcow2").display().to_string()),
        base_format: Some("qcow2".into()),
        overlay: Some(overlay.display().to_string()),
        allow_network: Some(
            psb.and_then(|s| s.allow_network.clone())
                .unwrap_or(Network::All(false)),
        ),
        template: psb.and_then(|s| s.template.clone()),
        fork_of: Some(p.name.to_string()),
        frozen: Some(p.id.to_string()),
        chain: Some(chain),
        ..Sandbox::default()
    };
    Record {
        sandbox: Some(sb),
        lifetime: p.lifetime.clone(),
        ..Record::default()
    }
}

/// The copies' lifetime: what was asked, else the parent's own limits (from the copy's
/// start), else a sandbox's defaults.
fn copies_lifetime(
    parent: &Record,
    asked: &lifetime::Asked,
) -> Result<Option<crate::state::record::Lifetime>, OpError> {
    let pl = parent.lifetime.clone().unwrap_or_default();
    let had = parent.lifetime.is_some();
    let from_parent = |mine: &Option<u64>, theirs: Option<u64>| match (mine, had) {
        (Some(v), _) => Some(*v),
        (None, true) => Some(theirs.unwrap_or(0)),
        (None, false) => None,
    };
    let merged = lifetime::Asked {
        ttl_s: from_parent(&asked.ttl_s, pl.ttl_s),
        idle_s: from_parent(&asked.idle_s, pl.idle_s),
        on_idle: asked.on_idle.clone().or(pl.on_idle),
        on_ttl: asked.on_ttl.clone().or(pl.on_ttl),
    };
    lifetime::resolve(lifetime::Kind::Sandbox, &merged, crate::clock::now_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req(count: usize, names: Option<Vec<&str>>) -> ForkRequest {
        ForkRequest {
            name: "p".into(),
            count,
            names: names.map(|n| n.into_iter().map(String::from).collect()),
            wait_agent: Duration::from_secs(1),
            lifetime: Default::default(),
        }
    }

    #[test]
    fn counts_and_names_are_checked_before_anything_starts() {
        use crate::ops::error::ErrorKind::InvalidArgument;
        for bad in [0, 17] {
            let e = copy_names(&req(bad, None)).unwrap_err();
            assert_eq!(e.kind, InvalidArgument, "{e}");
            assert!(e.msg.contains("1 to 16"), "{e}");
        }
        let e = copy_names(&req(2, Some(vec!["a"]))).unwrap_err();
        assert_eq!(e.kind, InvalidArgument, "{e}");
        assert!(e.msg.contains("one name per copy"), "{e}");
        let e = copy_names(&req(2, Some(vec!["a", "a"]))).unwrap_err();
        assert_eq!(e.kind, InvalidArgument, "{e}");
        assert!(e.msg.contains("named twice"), "{e}");
        let e = copy_names(&req(1, Some(vec!["../x"]))).unwrap_err();
        assert_eq!(e.kind, InvalidArgument, "{e}");
    }

    #[test]
    fn a_moved_disk_is_recorded_in_the_config_and_older_copies_go() {
        let mut r: Record = serde_json::from_value(json!({
            "disks": ["/s/old.qcow2"], "disk_formats": {"/s/old.qcow2": "qcow2"},
            "spec": {"disks": [["/s/old.qcow2", "qcow2"]]},
            "sandbox": {"overlay": "/s/old.qcow2", "chain": ["a"]}
        }))
        .unwrap();
        moved_onto(&mut r, "/s/new.qcow2", "b");
        let r = serde_json::to_value(&r).unwrap();
        assert_eq!(r.get("disks"), None, "the config holds the disks: {r}");
        assert_eq!(r.get("disk_formats"), None, "{r}");
        assert_eq!(r["spec"]["disks"], json!([["/s/new.qcow2", "qcow2"]]));
        assert_eq!(r["sandbox"]["overlay"], json!("/s/new.qcow2"));
        assert_eq!(r["sandbox"]["chain"], json!(["a", "b"]));
    }

    #[test]
    fn a_vm_that_is_no_sandbox_cannot_be_forked() {
        let rec: Record = serde_json::from_value(json!({"pid": 1})).unwrap();
        let e = forkable("v", &rec).unwrap_err();
        assert!(e.msg.contains("not a sandbox"), "{e}");
        let rec: Record =
            serde_json::from_value(json!({"sandbox": {"template_build": "t"}})).unwrap();
        let e = forkable("v", &rec).unwrap_err();
        assert!(e.msg.contains("template"), "{e}");
    }
}
