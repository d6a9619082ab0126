//! The guest's half of a VM's mounts where its agent is qemu-ga: mcqemu-agent relays every
//! mount port by itself, but a guest with qemu-ga has no relay. There the host puts the static
//! mcqemu-agent of the guest's architecture into `/var/lib/mcqemu` (once per agent build) and
//! starts `mcqemu-agent fs-relay PORT` for each mount still waiting. Either way it then waits until
//! the guest has mounted them, or says why not.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::host;
use crate::ops::error::OpError;
use crate::ops::vm::mounts::{self, MountSpec, Shown};
use crate::ops::vm::records::lookup;
use crate::ops::work::Work;
use crate::qemu::agent_calls;
use crate::qemu::cmdline::MOUNT_PORT_PREFIX;

/// The largest piece of the relay written per guest-file-write.
const CHUNK: usize = 48 * 1024;

/// Makes sure the guest side of every mount of VM `name` runs, and waits (up to `within`)
/// until the guest mounted them; returns them as they stand.
pub fn activate(ctx: &dyn Work, name: &str, within: Duration) -> Result<Vec<Shown>, OpError> {
    let rec = lookup(name)?;
    let waiting: Vec<u32> = rec
        .mounts
        .iter()
        .flatten()
        .zip(mounts::shown(name, &rec))
        .filter(|(_, s)| s.state == "waiting")
        .filter_map(|(m, _)| m.id)
        .collect();
    let deadline = Instant::now() + within;
    if !super::agent_is_ours(name)? {
        // A qemu-ga guest that rebooted (or restarted qemu-ga) lost its relays, while the
        // host still says mounted: those are started again too.
        let mut waiting = waiting;
        for (m, shown) in rec.mounts.iter().flatten().zip(mounts::shown(name, &rec)) {
            let lost = shown.state == "mounted"
                && sh(name, "grep -q \" $0 fuse\" /proc/mounts", &[&shown.guest])? != Some(0);
            if lost {
                waiting.extend(m.id);
            }
        }
        if waiting.is_empty() {
            return Ok(mounts::shown(name, &rec));
        }
        let arch = rec.arch().unwrap_or_else(|| "x86_64".into());
        let (local, path) = relay_file(&arch)?;
        let ports: Vec<String> = waiting
            .iter()
            .map(|id| format!("{MOUNT_PORT_PREFIX}{id}"))
            .collect();
        // One guest program checks the relay and starts it for each port; only a guest that
        // lacks it (a clone of a template made without it) gets it written first.
        if start_relays(name, &path, &ports)? != Some(0) {
            write_relay(name, &local, &path)?;
            let code = start_relays(name, &path, &ports)?;
            if code != Some(0) {
                return Err(OpError::guest(format!(
                    "could not start the mount relay {path} in VM {name:?} (sh exited {code:?})"
                )));
            }
        }
    }
    mounts::wait_mounted(
        ctx,
        name,
        deadline.saturating_duration_since(Instant::now()),
    )
}

/// Where the relay goes in a guest with qemu-ga: a folder only root writes (not /tmp, where
/// any guest user could put a program of their own under the name), on the root file system
/// (/run is often mounted noexec, as Debian's is).
const RELAY_DIR: &str = "/var/lib/mcqemu";

/// In sh, with the relay's guest path as `$0` and [`RELAY_DIR`] as `$1`: the relay is
/// accepted when the folder is root's with mode 700 and the relay root's with mode 755 (one
/// `stat`, the clone's usual case); else the folder is made root's own first (a guest user may
/// have made it), a leftover temporary removed (it could be a user's symlink), and the relay
/// there accepted only if root's; exit 3 when it is not.
const RELAY_READY: &str =
    "[ \"$(stat -c %u:%a \"$1\" \"$0\" 2>/dev/null)\" = \"0:700\n0:755\" ] || \
     { mkdir -p \"$1\" && chown 0:0 \"$1\" && chmod 700 \"$1\" && rm -f \"$0.part\" && \
     test -x \"$0\" && [ \"$(stat -c %u \"$0\")\" = 0 ] || exit 3; }";

/// Makes sure the relay is in the guest of VM `name`, whose agent is qemu-ga: a template does
/// it before its guest is saved, so that its clones' mounts start at once instead of writing
/// the relay (1.3 MB through the agent, ~0.3 s under TCG) into every clone.
pub fn place_relay(name: &str) -> Result<(), OpError> {
    if super::agent_is_ours(name)? {
        return Ok(());
    }
    let arch = lookup(name)?.arch().unwrap_or_else(|| "x86_64".into());
    let (local, path) = relay_file(&arch)?;
    if sh(name, RELAY_READY, &[&path, RELAY_DIR])? != Some(0) {
        write_relay(name, &local, &path)?;
    }
    Ok(())
}

/// Checks the relay at `path` in the guest ([`RELAY_READY`]) and starts it for each of
/// `ports` in the background; the shell's exit code (3: the relay is not there).
fn start_relays(name: &str, path: &str, ports: &[String]) -> Result<Option<i64>, OpError> {
    let script = format!(
        "{RELAY_READY}; r=$0; shift; for p; do \"$r\" fs-relay \"$p\" </dev/null >/dev/null \
         2>&1 & done"
    );
    let mut args = vec![path, RELAY_DIR];
    args.extend(ports.iter().map(String::as_str));
    sh(name, &script, &args)
}

/// This host's mcqemu-agent for `arch` and its path in the guest's [`RELAY_DIR`] (named by
/// the build, so a new build is written again).
fn relay_file(arch: &str) -> Result<(std::path::PathBuf, String), OpError> {
    let local = host::agent::find(arch).map_err(|e| {
        OpError::invalid(format!(
            "mounts need mcqemu-agent in the guest, whose agent is qemu-ga: {e}"
        ))
    })?;
    let meta = std::fs::metadata(&local)
        .map_err(|e| OpError::host(format!("cannot read {}: {e}", local.display())))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    Ok((local, format!("{RELAY_DIR}/relay-{}-{mtime}", meta.len())))
}

/// Writes the relay `local` to `path` in the guest (through a temporary, made executable and
/// moved into place), after [`RELAY_READY`] made its folder root's.
fn write_relay(name: &str, local: &std::path::Path, path: &str) -> Result<(), OpError> {
    let bytes = std::fs::read(local)
        .map_err(|e| OpError::host(format!("cannot read {}: {e}", local.display())))?;
    let tmp = format!("{path}.part");
    super::with_guest(name, "guest-file-write", |q| {
        let h = agent_calls::file_open(q, &tmp, "w")?;
        for chunk in bytes.chunks(CHUNK) {
            agent_calls::file_write(q, h, chunk)?;
        }
        agent_calls::file_close(q, h, Duration::from_secs(10))
    })?;
    let code = sh(
        name,
        "chmod 755 \"$0\" && mv -f \"$0\" \"$1\"",
        &[&tmp, path],
    )?;
    if code != Some(0) {
        return Err(OpError::guest(format!(
            "could not make {path} executable in VM {name:?} (sh exited {code:?})"
        )));
    }
    Ok(())
}

/// `sh -c SCRIPT ARG0 ARGS...` in the guest, waited for (10 s at most); its exit code.
fn sh(name: &str, script: &str, args: &[&str]) -> Result<Option<i64>, OpError> {
    let mut argv = vec!["-c".to_string(), script.to_string()];
    argv.extend(args.iter().map(|a| a.to_string()));
    let launch = super::spool::Launch {
        command: "/bin/sh",
        args: &argv,
        ..super::spool::Launch::default()
    };
    super::with_guest(name, "guest-exec", |q| {
        super::spool::run_in(q, &launch, Duration::from_secs(10)).map(|s| s.exitcode)
    })
}

/// vm_mount: mounts added to and removed from a running VM.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// The VM.
    pub name: String,
    /// Mounts to add.
    pub add: Vec<MountSpec>,
    /// Guest paths of mounts to remove (first).
    pub remove: Vec<String>,
    /// How long to wait for the guest to mount what was added (or is still waiting).
    pub wait: Duration,
}

crate::described! {
    /// What vm_mount did.
    #[derive(Debug, Clone, Serialize)]
    pub struct Outcome {
        /// The VM.
        pub name: String,
        /// The mounts added.
        pub added: Vec<Shown>,
        /// The mounts removed.
        pub removed: Vec<Shown>,
        /// The VM's mounts now, as they stand.
        pub mounts: Vec<Shown>,
    }
}

/// Applies a vm_mount request: removals, then additions (plugged in, then mounted by the
/// guest); with neither, the guest side of mounts still waiting is started.
pub fn apply(ctx: &dyn Work, req: &Request) -> Result<Outcome, OpError> {
    let rec = mountable(&req.name)?;
    let mut removed = Vec::new();
    for g in &req.remove {
        let now = lookup(&req.name)?;
        removed.push(mounts::detach(&req.name, &now, g)?);
    }
    let now = lookup(&req.name)?;
    let checked = mounts::check(&req.add, now.mounts.as_deref().unwrap_or_default())?;
    let added_guests: Vec<String> = mounts::attach(&req.name, &rec, checked)?
        .into_iter()
        .map(|m| m.guest)
        .collect();
    let all = activate(ctx, &req.name, req.wait)?;
    fail_if_not_mounted(&req.name, &all)?;
    Ok(Outcome {
        name: req.name.clone(),
        added: all
            .iter()
            .filter(|m| added_guests.contains(&m.guest))
            .cloned()
            .collect(),
        removed,
        mounts: all,
    })
}

/// The record of running VM `name`, when mcqemu started it.
fn mountable(name: &str) -> Result<crate::state::registry::Record, OpError> {
    let rec = crate::ops::vm::records::lookup_live(name, "start it first")?;
    if !crate::qemu::vm::spawned(&rec) {
        return Err(OpError::invalid(format!(
            "VM {name:?} was adopted with attach_vm: mcqemu did not start it and cannot plug \
             ports into it"
        )));
    }
    Ok(rec)
}

/// A mount the guest did not make is an error that says why and what to do.
fn fail_if_not_mounted(name: &str, all: &[Shown]) -> Result<(), OpError> {
    let bad: Vec<String> = all
        .iter()
        .filter(|m| m.state != "mounted")
        .map(|m| {
            format!(
                "{} is {}{}",
                m.guest,
                m.state,
                m.error
                    .as_ref()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            )
        })
        .collect();
    if bad.is_empty() {
        return Ok(());
    }
    Err(OpError::guest(format!(
        "VM {name:?}: {}. The guest needs fuse.ko (Debian's kernels have it) and a running \
         agent; vm_info shows the mounts, vm_mount {{\"name\": {name:?}}} tries again, and \
         vm_mount remove drops one",
        bad.join("; ")
    )))
}

/// Mounts `specs` into VM `name`, which has just started (launch_vm) or become ready
/// (sandbox_vm). `wait`: how long to wait for the guest to mount them (None: not at all; a
/// guest with qemu-ga gets its side once its agent answers, from a thread of this server).
pub fn after_start(
    ctx: &dyn Work,
    name: &str,
    specs: &[MountSpec],
    wait: Option<Duration>,
) -> Result<Vec<Shown>, OpError> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let rec = mountable(name)?;
    mounts::attach_missing(name, &rec, specs)?;
    match wait {
        Some(w) => {
            let all = activate(ctx, name, w)?;
            fail_if_not_mounted(name, &all)?;
            Ok(all)
        }
        None => {
            let vm = name.to_string();
            let _ = std::thread::Builder::new()
                .name(format!("mounts-{name}"))
                .spawn(move || activate_when_ready(&vm));
            Ok(mounts::shown(name, &lookup(name)?))
        }
    }
}

/// Waits (up to [`READY_WAIT`]) for a launched VM's agent, then starts its mounts' guest side.
fn activate_when_ready(name: &str) {
    let deadline = Instant::now() + READY_WAIT;
    while Instant::now() < deadline {
        let Ok(rec) = lookup(name) else { return };
        if mounts::shown(name, &rec)
            .iter()
            .all(|m| m.state != "waiting")
        {
            return;
        }
        let answered = super::with_guest(name, "guest-ping", |q| {
            agent_calls::ping(q, Duration::from_secs(2))
        });
        if answered.is_ok() {
            if let Err(e) = activate(&crate::ops::work::Detached, name, mounts::MOUNT_WAIT) {
                crate::log::stderr("warn", &format!("mounts of VM {name:?}: {e}"));
            }
            return;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// How long a launched VM's mounts wait for its agent in the background.
const READY_WAIT: Duration = Duration::from_secs(600);
