//! sandbox_destroy: a verified kill, a careful delete inside the VM's own folder, the record
//! dropped only when its files are gone; and the sandbox's files (its state folder and overlay,
//! its console's last lines) that a failed start cleans up or quotes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::ops::error::OpError;
use crate::ops::vm::agent::tail;
use crate::ops::vm::launch::Launched;
use crate::ops::vm::records::lookup;
use crate::ops::work::Work;
use crate::qemu::process;
use crate::qemu::qmp;
use crate::qemu::vm::{self, measure};
use crate::state::registry::RegistryError;

/// A new sandbox's state folder (created) and the path of its overlay, unique per launch.
pub fn overlay_path(name: &str) -> Result<(PathBuf, PathBuf), OpError> {
    let sd = vm::state_dir(name);
    std::fs::create_dir_all(&sd)
        .map_err(|e| OpError::host(format!("cannot create {}: {e}", sd.display())))?;
    let overlay = sd.join(format!(
        "overlay-{}-{}.qcow2",
        crate::clock::now_secs(),
        std::process::id()
    ));
    Ok((sd, overlay))
}

/// The last `lines` lines of the serial log a launch result names.
pub fn serial_tail(launched: &Launched, lines: usize) -> String {
    match launched.serial_log.as_str() {
        "" => "(no serial log)".into(),
        p => tail(Path::new(p), lines),
    }
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

crate::described! {
    /// What sandbox_destroy did (its result, in this order).
    #[derive(Debug, Clone, serde::Serialize)]
    pub struct Destroyed {
        /// The sandbox.
        pub name: String,
        /// True when its process, files and record are all gone.
        pub destroyed: bool,
        /// How it was stopped.
        pub stopped: String,
        /// The files and folders removed.
        pub deleted: Vec<String>,
        /// Every problem met.
        pub errors: Vec<String>,
    }
}

/// sandbox_destroy: a verified kill, a careful delete inside the VM's own folder, the record
/// dropped only when its files are gone; every problem reported.
pub fn destroy(ctx: &dyn Work, name: &str) -> Result<Destroyed, OpError> {
    let name = name.to_string();
    let rec = lookup(&name)?;
    let sb = rec.sandbox.clone().ok_or_else(|| {
        OpError::invalid(format!(
            "VM {name:?} is not a sandbox; use stop_vm and forget_vm for ordinary VMs"
        ))
    })?;
    ctx.log("notice", &format!("sandbox_destroy {name}"));
    // Why it ends, unless its caller said (the tool, the watcher): a pool ended, a failed
    // start removed, a dead pooled clone replaced.
    let fresh = rec
        .ending
        .as_ref()
        .and_then(|e| e.at)
        .is_some_and(|at| crate::clock::now_secs() - at < 60);
    if !fresh {
        crate::ops::vm::ends::intend(
            &name,
            crate::ops::vm::ends::end(crate::ops::vm::ends::ASKED, Some("sandbox_destroy"), ""),
        );
    }
    let mut errors: Vec<String> = Vec::new();
    let mut deleted: Vec<String> = Vec::new();
    // 1. Stop, verified.
    let stopped = stop_verified(&name, &rec, &mut errors);
    if measure(&rec).alive() {
        return Ok(Destroyed {
            name,
            destroyed: false,
            stopped,
            deleted,
            errors,
        });
    }
    errors.extend(vm::cleanup_runtime(&rec));
    // What the operations keep there too: the activity clock and the mounts' files.
    crate::ops::vm::mounts::remove_files(&name, &rec);
    let rt = vm::runtime_dir(&name);
    // This very call touches the activity clock each second while it runs: a touch between
    // the file's removal and the folder's is met by a second try.
    for _ in 0..2 {
        let _ = std::fs::remove_file(crate::ops::vm::activity::activity_file(&name));
        if std::fs::remove_dir(&rt).is_ok() {
            deleted.push(rt.display().to_string());
            break;
        }
    }
    // 2. Delete only inside the VM's own state folder, checked twice.
    let own = vm::state_dir(&name);
    let own_c = std::fs::canonicalize(&own).unwrap_or(own.clone());
    let overlay = sb.overlay.as_ref().map(PathBuf::from);
    let base = sb.base_image.as_ref().map(PathBuf::from);
    if folder_is_ours(&name, &own_c, base, &overlay, &mut errors) && own_c.exists() {
        delete_folder(&own_c, &mut deleted, &mut errors);
    }
    // 3. Drop the record only when the files are gone.
    let files_gone = !overlay.as_ref().is_some_and(|o| o.exists());
    if files_gone {
        let n = name.clone();
        if let Err(e) = crate::state::registry::shared().update(move |vms| {
            vms.remove(&n);
            Ok::<_, RegistryError>(())
        }) {
            errors.push(e.to_string());
        }
    }
    // Frozen fork states that no VM stands on any more go with their last user.
    for problem in crate::ops::sandbox::frozen::collect() {
        ctx.log("warning", &problem);
    }
    let destroyed = files_gone && errors.is_empty();
    Ok(Destroyed {
        name,
        destroyed,
        stopped,
        deleted,
        errors,
    })
}

/// Ends the sandbox's QEMU (quit, then signals to a process proven to be it); says how.
fn stop_verified(
    name: &str,
    rec: &crate::state::registry::Record,
    errors: &mut Vec<String>,
) -> String {
    if !measure(rec).alive() {
        return "already stopped".to_string();
    }
    let sock_path = vm::qmp_socket(rec);
    let _ = qmp::with_session(&sock_path, |q| q.quit_within(Duration::from_secs(2)));
    let mut stopped = "quit".to_string();
    if let Some(pid) = vm::pid(rec) {
        if !process::wait_dead(pid, Duration::from_secs(2)) {
            if process::is_our_vm(pid, &vm::identity_socket(rec)) {
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
    if measure(rec).alive() {
        errors.push(format!(
            "the QEMU of sandbox {name:?} is still alive; nothing was deleted"
        ));
    }
    stopped
}

/// True when `own_c` is the sandbox's own folder under the state folder, holds no base image,
/// and holds its overlay, which no process has open (each doubt is reported).
fn folder_is_ours(
    name: &str,
    own_c: &Path,
    base: Option<PathBuf>,
    overlay: &Option<PathBuf>,
    errors: &mut Vec<String>,
) -> bool {
    let mut ok = own_c.starts_with(
        std::fs::canonicalize(crate::state::paths::state_dir())
            .unwrap_or_default()
            .join("vms"),
    ) && own_c.file_name().is_some_and(|f| f == name);
    if let Some(b) = &base {
        let bc = std::fs::canonicalize(b).unwrap_or(b.clone());
        if bc.starts_with(own_c) {
            errors.push(format!(
                "the base image {} lies inside the sandbox folder; refusing to delete the folder",
                bc.display()
            ));
            ok = false;
        }
    }
    if let Some(ov) = overlay {
        let oc = std::fs::canonicalize(ov).unwrap_or(ov.clone());
        if !oc.starts_with(own_c) {
            errors.push(format!(
                "the overlay {} is outside {}; not deleting it",
                oc.display(),
                own_c.display()
            ));
            ok = false;
        } else if oc.exists() {
            let held = holders(&oc);
            if !held.is_empty() {
                errors.push(format!(
                    "the overlay {} is still open in process(es) {held:?}; not deleting it",
                    oc.display()
                ));
                ok = false;
            }
        }
    }
    ok
}

/// Removes the folder's files one by one, then the folder, so every failure is reported.
fn delete_folder(own_c: &Path, deleted: &mut Vec<String>, errors: &mut Vec<String>) {
    let entries = match std::fs::read_dir(own_c) {
        Ok(entries) => entries,
        Err(err) => return errors.push(format!("cannot list {}: {err}", own_c.display())),
    };
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
    match std::fs::remove_dir(own_c) {
        Ok(()) => deleted.push(own_c.display().to_string()),
        Err(err) => errors.push(format!("cannot delete {}: {err}", own_c.display())),
    }
}
