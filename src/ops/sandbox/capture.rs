//! Capturing a running VM into a folder the way a template holds a saved guest: `ram` (its
//! memory, sparse) and `state` (its devices, saved without RAM). The guest is copied while it
//! runs into a receiving QEMU whose memory is a shared file ([`crate::qemu::live_migrate`]);
//! at the switchover, with the guest stopped, a fork also freezes its disk (the old top image
//! becomes `disk.qcow2`, the guest writes to a new overlay from then on). The receiver then
//! saves its devices without RAM and quits. sandbox_fork lets the guest run on; sandbox_suspend
//! quits it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::ops::error::OpError;
use crate::ops::sandbox::scratch::Scratch;
use crate::ops::session;
use crate::ops::work::Work;
use crate::qemu::cmdline::{build_argv, MEMORY_ID};
use crate::qemu::qmp::{Qmp, QmpError};
use crate::qemu::{blockdev, img, live_migrate, migrate, process, qcow2, vm};
use crate::state::config::{Disk, MemoryFile, Uefi, VmConfig};
use crate::state::registry::Record;

/// The whole capture's bound (a 2 GiB guest under TCG copies in a few seconds).
const BUDGET: Duration = Duration::from_secs(120);

/// What becomes of the captured VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// It runs on (a fork's parent); its disk is frozen into the folder.
    RunOn,
    /// Its QEMU quits (a suspend); its disk stays where it is.
    Quit,
}

/// A capture to make: VM `name` (its record and the spec it runs) into folder `dest`.
pub struct Plan<'a> {
    /// The VM.
    pub name: &'a str,
    /// Its record.
    pub rec: &'a Record,
    /// The spec its QEMU runs.
    pub spec: &'a VmConfig,
    /// The folder (made by the caller) that receives `ram`, `state` and, for a fork,
    /// `disk.qcow2` and `uefi-vars.fd`.
    pub dest: &'a Path,
    /// Fork or suspend.
    pub then: Then,
    /// For a fork: where the VM's first disk moves.
    pub next_overlay: Option<Move>,
}

/// A fork's move of the VM's first disk onto a new overlay.
#[derive(Debug, Clone)]
pub struct Move {
    /// The overlay, a path never used before (QEMU reopens images by the name it opened them
    /// with, so no file it holds is renamed).
    pub overlay: PathBuf,
    /// Its node name, one the VM's QEMU has not used.
    pub node: String,
    /// The node it goes on: the disk's top now.
    pub onto: String,
}

/// What a capture made and measured.
#[derive(Debug, Clone)]
pub struct Captured {
    /// How long the guest was stopped (QEMU's count, the disk step and the restart included).
    pub paused_ms: u64,
    /// From the call to the folder complete.
    pub total_ms: u64,
    /// Bytes of device state.
    pub state_bytes: u64,
    /// Bytes of memory written to `ram` (the pages the guest touched).
    pub ram_bytes: u64,
    /// Where the time went: the live copy (`copy`), the receiver's save (`save`), the memory
    /// written out (`write`), in ms.
    pub steps_ms: [u64; 3],
    /// The memory backend id the copies must use.
    pub memory_id: String,
    /// Whether the guest was running when captured (a paused one stays stopped).
    pub was_running: bool,
    /// Whether it was copied while it ran or stopped for the whole copy (a QEMU whose dirty
    /// tracking loses writes: [`live_migrate::copy_for`]).
    pub copy: live_migrate::Method,
}

/// The files of a capture's disks: each disk's overlay for the receiver and, for a fork, the
/// frozen name of the first disk and the overlay the VM moves to.
struct Disks {
    receiver: Vec<Disk>,
    frozen: Option<PathBuf>,
    next: Option<PathBuf>,
    /// Set once the VM writes to `next`: its files are then kept whatever happens.
    switched: std::cell::Cell<bool>,
}

/// A receiving QEMU: ended, and its folder removed, whatever happens.
struct Receiver {
    dir: PathBuf,
    pid: Option<i32>,
    qmp: PathBuf,
    migration: PathBuf,
}

impl Receiver {
    /// The receiver's folder (in the VM's runtime folder), made empty; no QEMU yet.
    fn new(name: &str) -> Result<Receiver, OpError> {
        let dir = vm::runtime_dir(name).join("capture");
        end_stale(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| OpError::host(format!("cannot create {}: {e}", dir.display())))?;
        let migration = dir.join("migrate.sock");
        if migration.as_os_str().len() > crate::qemu::sock::MAX_SOCKET_PATH {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(OpError::host(format!(
                "socket path {} is longer than a unix socket allows; set MCQEMU_RUNTIME_DIR \
                 to a shorter folder",
                migration.display()
            )));
        }
        Ok(Receiver {
            qmp: dir.join("qmp.sock"),
            migration,
            dir,
            pid: None,
        })
    }
}

/// Ends a receiver a server that died mid-capture left waiting in `dir` (it would wait for a
/// stream forever).
fn end_stale(dir: &Path) {
    let pid = std::fs::read_to_string(dir.join("qemu.pid"))
        .ok()
        .and_then(|t| t.trim().parse::<i32>().ok());
    if let Some(pid) = pid.filter(|p| process::is_our_vm(*p, &dir.join("qmp.sock"))) {
        process::signal(pid, libc::SIGKILL);
        process::wait_dead(pid, Duration::from_secs(5));
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(pid) = self.pid.filter(|p| process::is_our_vm(*p, &self.qmp)) {
            process::signal(pid, libc::SIGKILL);
            process::wait_dead(pid, Duration::from_secs(5));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Captures `plan.name` into `plan.dest`. On failure the VM runs on as before (a frozen disk
/// whose switchover happened stays frozen: the VM already writes to its new overlay).
pub fn capture(ctx: &dyn Work, plan: &Plan) -> Result<Captured, OpError> {
    let started = Instant::now();
    let deadline = started + BUDGET;
    let Look {
        memory_id,
        was_running,
        copy,
        vmgenid,
    } = look(plan)?;
    let scratch = Scratch::new(plan.dest, plan.spec.compute.memory_mb)?;
    let mut recv = Receiver::new(plan.name)?;
    let disks = prepare_disks(plan, &recv.dir)?;
    let copied =
        start_receiver(plan, &mut recv, &scratch, &disks, &memory_id, vmgenid).and_then(|()| {
            ctx.progress_phase(match copy {
                live_migrate::Method::Live => "copying the running guest",
                live_migrate::Method::Stopped => "copying the guest, stopped",
            });
            copy_guest(plan, &recv, &disks, (was_running, copy), deadline)
        });
    let copy_ms = started.elapsed().as_millis() as u64;
    let paused_ms = match copied {
        Ok(ms) => ms,
        Err(e) => {
            disks.undo();
            if was_running && plan.then == Then::RunOn {
                ensure_running(plan);
            }
            return Err(e);
        }
    };
    ctx.progress_phase("saving the copy");
    let t_save = Instant::now();
    let state_bytes = save_receiver(&recv, &plan.dest.join("state"), deadline)?;
    drop(recv);
    let save_ms = t_save.elapsed().as_millis() as u64;
    let t_write = Instant::now();
    let ram_bytes = scratch.finish(&plan.dest.join("ram"), plan.then == Then::Quit)?;
    Ok(Captured {
        steps_ms: [copy_ms, save_ms, t_write.elapsed().as_millis() as u64],
        paused_ms,
        total_ms: started.elapsed().as_millis() as u64,
        state_bytes,
        ram_bytes,
        memory_id,
        was_running,
        copy,
    })
}

/// After a failed copy: a guest that ran before runs again (QEMU restarts it when the copy
/// is cancelled; this makes sure).
fn ensure_running(plan: &Plan) {
    let _ = session::monitor(plan.name, plan.rec, |q| {
        if !q.query_status()?.running {
            q.cont()?;
        }
        Ok(())
    });
}

/// What the capture needs to know of the running VM.
struct Look {
    /// The id of its memory backend (the machine's own RAM id when it has no memory file).
    memory_id: String,
    /// Whether the guest runs.
    was_running: bool,
    /// How its QEMU can copy it soundly.
    copy: live_migrate::Method,
    /// Its generation ID, which the receiver takes too (else the receiver's would be written
    /// into the frozen memory).
    vmgenid: Option<String>,
}

/// Looks at the VM; refuses one that cannot migrate, naming why.
fn look(plan: &Plan) -> Result<Look, OpError> {
    let spec = plan.spec;
    session::monitor(plan.name, plan.rec, |q| {
        let blocked = live_migrate::blockers(q)?;
        if !blocked.is_empty() {
            return Err(OpError::host(format!(
                "VM {:?} cannot be copied: QEMU says {}",
                plan.name,
                blocked.join("; ")
            ))
            .into());
        }
        let running = q.query_status()?.running;
        let memory_id = match (&spec.compute.memory_id, &spec.compute.memory_file) {
            (Some(id), _) => id.clone(),
            (None, Some(_)) => MEMORY_ID.to_string(),
            (None, None) => default_ram_id(q, &spec.machine.kind)?,
        };
        let (version, kvm) = live_migrate::engine(q)?;
        let vmgenid = match &spec.devices.vmgenid {
            Some(_) => q.vm_generation_id()?.filter(|g| is_guid(g)),
            None => None,
        };
        Ok(Look {
            memory_id,
            was_running: running,
            copy: live_migrate::copy_for(version, kvm),
            vmgenid,
        })
    })
}

/// A GUID as QEMU prints one (8-4-4-4-12 hex digits): nothing else reaches the receiver's
/// command line.
fn is_guid(g: &str) -> bool {
    let parts: Vec<&str> = g.split('-').collect();
    parts.iter().map(|p| p.len()).eq([8, 4, 4, 4, 12])
        && parts
            .iter()
            .all(|p| p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The RAM id QEMU gives machine `machine` when no memory backend is named (`pc.ram`).
fn default_ram_id(q: &mut Qmp, machine: &str) -> Result<String, QmpError> {
    q.query_machines()?
        .into_iter()
        .find(|m| m.name == machine || m.alias.as_deref() == Some(machine))
        .and_then(|m| m.default_ram_id)
        .ok_or_else(|| {
            QmpError::Garbage(format!(
                "QEMU names no default RAM id for machine {machine:?} (query-machines)"
            ))
        })
}

/// Makes the disks' files: the receiver's overlays (never written: it never runs) and, for a
/// fork, the first disk's frozen name (a hard link, so nothing is copied) and the overlay the
/// VM moves to at the switchover. Made before the guest stops, without opening the images.
fn prepare_disks(plan: &Plan, dir: &Path) -> Result<Disks, OpError> {
    let mut disks = Disks {
        receiver: Vec::new(),
        frozen: None,
        next: None,
        switched: std::cell::Cell::new(false),
    };
    let result = (|| {
        for (i, Disk { path, format }) in plan.spec.disks.iter().enumerate() {
            let size = disk_size(path, format)?;
            let mut backing = path.clone();
            if let (0, Some(Move { overlay: next, .. })) = (i, &plan.next_overlay) {
                let frozen = plan.dest.join("disk.qcow2");
                std::fs::hard_link(path, &frozen).map_err(|e| {
                    OpError::host(format!(
                        "cannot freeze {} as {}: {e}",
                        path.display(),
                        frozen.display()
                    ))
                })?;
                disks.frozen = Some(frozen.clone());
                img::create_overlay_unopened(next, &frozen, "qcow2", size)?;
                disks.next = Some(next.clone());
                backing = frozen;
            }
            let own = dir.join(format!("disk{i}.qcow2"));
            let _ = std::fs::remove_file(&own);
            img::create_overlay_unopened(&own, &backing, format, size)?;
            disks.receiver.push(Disk::new(own, "qcow2"));
        }
        Ok(())
    })();
    match result {
        Ok(()) => Ok(disks),
        Err(e) => {
            disks.undo();
            Err(e)
        }
    }
}

fn disk_size(path: &Path, format: &str) -> Result<u64, OpError> {
    let size = match format {
        "qcow2" => qcow2::virtual_size(path),
        "raw" => std::fs::metadata(path).ok().map(|m| m.len()),
        _ => None,
    };
    size.ok_or_else(|| {
        OpError::host(format!(
            "cannot read the size of disk {} ({format}); only qcow2 and raw disks can be copied",
            path.display()
        ))
    })
}

impl Disks {
    /// Removes what [`prepare_disks`] made (the frozen disk and the new overlay only when the
    /// VM has not moved onto them).
    fn undo(&self) {
        for d in &self.receiver {
            let _ = std::fs::remove_file(&d.path);
        }
        if self.switched.get() {
            return;
        }
        for p in [&self.frozen, &self.next].into_iter().flatten() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Starts the receiving QEMU: the VM's own devices and generation ID, its memory the shared
/// scratch file, no forwards, stopped (`-S`) and waiting for the stream.
fn start_receiver(
    plan: &Plan,
    recv: &mut Receiver,
    scratch: &Scratch,
    disks: &Disks,
    memory_id: &str,
    vmgenid: Option<String>,
) -> Result<(), OpError> {
    let dir = &recv.dir;
    let mut r = plan.spec.clone();
    r.name = format!("{}-capture", plan.name);
    r.channels.qmp_socket = recv.qmp.clone();
    r.channels.qga_socket = dir.join("qga.sock");
    r.channels.serial_socket = dir.join("serial.sock");
    r.channels.serial_log = dir.join("serial.log");
    r.channels.pidfile = dir.join("qemu.pid");
    r.disks = disks.receiver.clone();
    r.network.forwards = Vec::new();
    // A VM with allow_network rules runs in its proxy's empty network; the receiver, which
    // runs in the host's, gets a restricted one (it never runs the guest either).
    if r.network.jailed_net {
        r.network.jailed_net = false;
        r.network.restrict_net = true;
    }
    if vmgenid.is_some() {
        r.devices.vmgenid = vmgenid;
    }
    r.compute.memory_file = Some(MemoryFile {
        path: scratch.path().to_path_buf(),
        shared: true,
    });
    // In /dev/shm the pages are allocated before the guest stops; a file on disk stays sparse.
    r.compute.memory_prealloc = scratch.in_memory();
    r.compute.memory_id = Some(memory_id.to_string());
    r.start.incoming = true;
    r.start.start_paused = true;
    if let Some(uefi) = &mut r.boot.uefi {
        let own = dir.join("uefi-vars.fd");
        crate::state::copy::private(&uefi.vars, &own)
            .map_err(|e| OpError::host(format!("cannot copy {}: {e}", uefi.vars.display())))?;
        uefi.vars = own;
    }
    let log = dir.join("qemu.log");
    let started = process::spawn_detached(
        &r.machine.binary,
        &build_argv(&r),
        &r.channels.pidfile,
        &r.channels.qmp_socket,
        &log,
        None,
    )
    .map_err(|e| {
        OpError::host(format!(
            "the QEMU that receives the copy did not start: {e}"
        ))
    })?;
    recv.pid = started.pid;
    Ok(())
}

/// Copies the guest (running or stopped, `how`) into the receiver; at the switchover freezes
/// its disk (a fork), then lets it run on or quits it. Returns how long the guest was stopped,
/// in ms.
fn copy_guest(
    plan: &Plan,
    recv: &Receiver,
    disks: &Disks,
    (was_running, how): (bool, live_migrate::Method),
    deadline: Instant,
) -> Result<u64, OpError> {
    let mut rq = Qmp::connect(&recv.qmp, Duration::from_secs(10))
        .map_err(|e| OpError::timed_out(format!("the receiving QEMU did not answer: {e}")))?;
    live_migrate::listen(&mut rq, &recv.migration, deadline)
        .map_err(|e| OpError::host(format!("the receiving QEMU refused the copy: {e}")))?;
    session::monitor(plan.name, plan.rec, |q| {
        let mut at_switchover = |q: &mut Qmp| freeze(q, plan, disks);
        let sent = live_migrate::send(q, &recv.migration, deadline, how, &mut at_switchover)?;
        let t = Instant::now();
        match plan.then {
            Then::RunOn if was_running => {
                q.cont()?;
            }
            Then::RunOn => {}
            Then::Quit => {
                let _ = q.quit_within(Duration::from_secs(2));
            }
        }
        Ok(sent.downtime_ms + t.elapsed().as_millis() as u64)
    })
}

/// At the switchover (the guest stopped): the first disk moves onto its new overlay and the UEFI
/// variables are copied as they are now.
fn freeze(q: &mut Qmp, plan: &Plan, disks: &Disks) -> Result<(), QmpError> {
    let (Some(next), Some(m)) = (&disks.next, &plan.next_overlay) else {
        return Ok(());
    };
    blockdev::snapshot_onto(q, &m.onto, next, &m.node)?;
    disks.switched.set(true);
    if let Some(Uefi { vars, .. }) = &plan.spec.boot.uefi {
        crate::state::copy::private(vars, &plan.dest.join("uefi-vars.fd")).map_err(|e| {
            QmpError::Garbage(format!(
                "cannot copy the UEFI variables {}: {e}",
                vars.display()
            ))
        })?;
    }
    Ok(())
}

/// Waits for the receiver to hold the whole guest, saves its devices without RAM into `to`,
/// and quits it.
fn save_receiver(recv: &Receiver, to: &Path, deadline: Instant) -> Result<u64, OpError> {
    let mut rq = Qmp::connect(&recv.qmp, Duration::from_secs(10))
        .map_err(|e| OpError::timed_out(format!("the receiving QEMU did not answer: {e}")))?;
    let fail = |e: QmpError| OpError::host(format!("saving the copied guest failed: {e}"));
    live_migrate::wait_received(&mut rq, deadline).map_err(fail)?;
    let bytes = migrate::save(&mut rq, to, deadline).map_err(fail)?;
    let _ = rq.quit_within(Duration::from_secs(2));
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_guid_is_taken_for_the_receiver() {
        assert!(is_guid("7741a676-0102-8b4c-a9a1-87e7760e230a"));
        assert!(!is_guid("7741a676-0102-8b4c-a9a1-87e7760e230"));
        assert!(!is_guid("7741a676-0102-8b4c-a9a1-87e7760e230a,x=y"));
        assert!(!is_guid("auto"));
    }
}
