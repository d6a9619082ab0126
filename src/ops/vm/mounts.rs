//! Host folders mounted into a running VM: each is a virtio-serial port plugged in through the
//! monitor (`chardev-add`, `device_add`) and a file server of its own (`mcqemu fs-serve`, a
//! process that lives as long as the VM), handed the folder as a descriptor opened once,
//! inside the roots. The guest's side mounts it (see `agent::mounts`); the record keeps the
//! set, so vm_info and a restarted server see it.
//!
//! Mounts are plugged in after QEMU starts (at launch too), never on its command line: a
//! fork's, a resume's or a clone's devices stay those of the VM it came from.

use std::os::unix::io::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::fuse::helper::SHARE_FD;
use crate::ops::error::OpError;
use crate::ops::session;
use crate::ops::work::Work;
use crate::qemu::cmdline::{MOUNT_PORT_PREFIX, SPARE_MOUNT};
use crate::qemu::process;
use crate::qemu::qmp::{Qmp, QmpError};
use crate::qemu::sock;
use crate::qemu::vm;
use crate::state::beneath;
use crate::state::record::Mount;
use crate::state::registry::{Record, RegistryError};
use crate::state::roots::{self, Access};

/// Most mounts a VM may have.
pub const MAX_MOUNTS: usize = 8;
/// How long [`wait_mounted`] waits for a guest by default.
pub const MOUNT_WAIT: Duration = Duration::from_secs(20);

crate::params! {
    /// A mount as a call asks for it.
    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
    pub struct MountSpec {
        /// A folder in the roots (~ allowed).
        pub host: String = {"minLength": 1},
        /// e.g. /src
        pub guest: String = {"minLength": 2},
        /// Guest writes allowed.
        #[serde(default)]
        pub writable: bool = {"default": false},
    }
}

/// A mount checked and its folder opened: ready to plug in.
#[derive(Debug)]
pub struct Checked {
    host: PathBuf,
    folder: OwnedFd,
    guest: String,
    writable: bool,
}

crate::described! {
    /// A mount as vm_info shows it.
    #[derive(Debug, Clone, Serialize, PartialEq)]
    pub struct Shown {
        /// The host folder, resolved.
        pub host: String,
        /// Where the guest sees it.
        pub guest: String,
        /// Writes allowed.
        pub writable: bool,
        /// `mounted`, `waiting` (for the guest's relay), `failed`, or `ended` (its server is gone).
        pub state: String,
        /// Why it failed.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub error: Option<String>,
    }
}

/// The guest path: absolute, plain components, not the root, no control characters.
fn check_guest(raw: &str) -> Result<String, OpError> {
    let bad = |why: &str| {
        OpError::invalid(format!(
            "mount guest path {raw:?} {why}; give an absolute folder such as /src"
        ))
    };
    if !raw.starts_with('/') {
        return Err(bad("is not absolute"));
    }
    if raw.len() > 1024 || raw.chars().any(char::is_control) {
        return Err(bad("is too long or has control characters"));
    }
    let mut parts = Vec::new();
    for c in Path::new(raw).components() {
        match c {
            Component::RootDir => {}
            Component::Normal(n) => parts.push(n.to_string_lossy().into_owned()),
            _ => return Err(bad("has . or .. in it")),
        }
    }
    if parts.is_empty() {
        return Err(bad("is the guest's root"));
    }
    if ["proc", "sys", "dev"].contains(&parts[0].as_str()) {
        return Err(bad("is in the kernel's own file systems"));
    }
    Ok(format!("/{}", parts.join("/")))
}

/// Checks `specs` (and, with `existing`, against a VM's current mounts): every host folder
/// inside the roots (resolved once and opened, so a symlink swapped in later changes
/// nothing), every guest path once.
pub fn check(specs: &[MountSpec], existing: &[Mount]) -> Result<Vec<Checked>, OpError> {
    if specs.len() + existing.len() > MAX_MOUNTS {
        return Err(OpError::invalid(format!(
            "at most {MAX_MOUNTS} mounts per VM ({} asked, {} there)",
            specs.len(),
            existing.len()
        )));
    }
    let mut seen: Vec<String> = existing.iter().filter_map(|m| m.guest.clone()).collect();
    let mut out = Vec::new();
    for s in specs {
        let guest = check_guest(&s.guest)?;
        if seen.iter().any(|g| {
            g == &guest
                || guest.starts_with(&format!("{g}/"))
                || g.starts_with(&format!("{guest}/"))
        }) {
            return Err(OpError::invalid(format!(
                "mount guest path {guest} is already mounted, or inside or above another mount"
            )));
        }
        seen.push(guest.clone());
        let access = if s.writable {
            Access::Write
        } else {
            Access::Read
        };
        let host = roots::check_str(&s.host, access)
            .map_err(|e| OpError::from(e).context(format_args!("mount host {:?}", s.host)))?;
        if !host.is_dir() {
            return Err(OpError::not_found(format!(
                "mount host {} is not a folder",
                host.display()
            )));
        }
        let folder = beneath::Dir::open(&host)
            .map_err(|e| {
                OpError::refused(format!(
                    "mount host {} cannot be opened beneath its root ({e}): is a part of it a \
                     symlink? give the real path",
                    host.display()
                ))
            })?
            .into_fd();
        out.push(Checked {
            host,
            folder,
            guest,
            writable: s.writable,
        });
    }
    Ok(out)
}

/// Removes the runtime files of VM `name`'s mounts (their sockets and status files), once
/// its QEMU and their servers are gone.
pub fn remove_files(name: &str, rec: &Record) {
    for id in rec.mounts.iter().flatten().filter_map(|m| m.id) {
        let _ = std::fs::remove_file(socket_of(name, id));
        let _ = std::fs::remove_file(status_file(name, id));
    }
}

fn qemu_id(id: u32) -> String {
    format!("mcq-fs{id}")
}

/// Whether VM `rec` has a mount port from the start ([`SPARE_MOUNT`]).
fn has_spare(rec: &Record) -> bool {
    rec.spec.as_ref().is_some_and(|s| s.channels.mount_spare)
}

fn socket_of(name: &str, id: u32) -> PathBuf {
    vm::runtime_dir(name).join(format!("fs{id}.sock"))
}

fn status_file(name: &str, id: u32) -> PathBuf {
    vm::runtime_dir(name).join(format!("fs{id}.json"))
}

/// Plugs the mounts of `specs` that VM `name` (whose record is `rec`) does not have yet (by
/// guest path) and starts their servers: a clone's are plugged in as soon as it runs, so the
/// guest takes them while its agent comes up, and the call that waits for them finds them
/// there.
pub fn attach_missing(name: &str, rec: &Record, specs: &[MountSpec]) -> Result<(), OpError> {
    let have: Vec<&str> = rec
        .mounts
        .iter()
        .flatten()
        .filter_map(|m| m.guest.as_deref())
        .collect();
    let missing: Vec<Checked> = check(specs, &[])?
        .into_iter()
        .filter(|c| !have.contains(&c.guest.as_str()))
        .collect();
    if !missing.is_empty() {
        attach(name, rec, missing)?;
    }
    Ok(())
}

/// Plugs `mounts` into running VM `name` (whose record is `rec`) and starts their servers;
/// the record gets them one by one, so a failure half-way leaves the ones that worked shown.
pub fn attach(name: &str, rec: &Record, mounts: Vec<Checked>) -> Result<Vec<Shown>, OpError> {
    let used: Vec<u32> = rec.mounts.iter().flatten().filter_map(|m| m.id).collect();
    // A VM with a port from the start (a template's clone) gives it to its first mount: no
    // hot-plug, and the guest's relay already waits on it. The others are plugged in.
    let spare = has_spare(rec) && !used.contains(&SPARE_MOUNT);
    let first = used
        .iter()
        .max()
        .map_or(u32::from(has_spare(rec)), |m| m + 1);
    let ids = spare.then_some(SPARE_MOUNT).into_iter().chain(first..);
    let mut shown = Vec::new();
    for (id, m) in ids.zip(mounts) {
        let plugged = spare && id == SPARE_MOUNT;
        let socket = socket_of(name, id);
        if socket.as_os_str().len() > sock::MAX_SOCKET_PATH {
            return Err(OpError::host(format!(
                "socket path {} is too long for a unix socket; set MCQEMU_RUNTIME_DIR to a \
                 shorter folder",
                socket.display()
            )));
        }
        let _ = std::fs::remove_file(status_file(name, id));
        if !plugged {
            let _ = std::fs::remove_file(&socket);
            session::monitor(name, rec, |q| Ok(plug(q, id, &socket)?))?;
        }
        let pid = match start_server(name, id, &m, &socket) {
            Ok(pid) => pid,
            Err(e) => {
                if !plugged {
                    let _ = session::monitor(name, rec, |q| {
                        unplug(q, id);
                        Ok(())
                    });
                }
                return Err(e);
            }
        };
        let entry = Mount {
            id: Some(id),
            host: Some(m.host.display().to_string()),
            guest: Some(m.guest.clone()),
            writable: Some(m.writable),
            server_pid: Some(pid),
            ..Mount::default()
        };
        let vm_name = name.to_string();
        let recorded = crate::state::registry::shared().update(move |vms| {
            if let Some(r) = vms.get_mut(&vm_name) {
                r.mounts.get_or_insert_with(Vec::new).push(entry);
            }
            Ok::<_, RegistryError>(())
        });
        if let Err(e) = recorded {
            // Not recorded: not left running either.
            let _ = process::terminate_within(pid, Duration::from_secs(2));
            let _ = session::monitor(name, rec, |q| {
                unplug(q, id);
                Ok(())
            });
            return Err(e.into());
        }
        shown.push(Shown {
            host: m.host.display().to_string(),
            guest: m.guest,
            writable: m.writable,
            state: "waiting".into(),
            error: None,
        });
    }
    Ok(shown)
}

/// The monitor's half of plugging a mount in: its socket, then its port.
fn plug(q: &mut Qmp, id: u32, socket: &Path) -> Result<(), QmpError> {
    let qid = qemu_id(id);
    q.execute(
        "chardev-add",
        Some(json!({"id": qid, "backend": {"type": "socket", "data": {
            "addr": {"type": "unix", "data": {"path": socket.display().to_string()}},
            "server": true, "wait": false}}})),
    )?;
    let port = json!({"driver": "virtserialport", "bus": "mcq-vser.0", "chardev": qid,
        "name": format!("{MOUNT_PORT_PREFIX}{id}"), "id": qid});
    if let Err(e) = q.execute("device_add", Some(port)) {
        let _ = q.execute("chardev-remove", Some(json!({"id": qid})));
        return Err(e);
    }
    Ok(())
}

/// Unplugs a mount's port and removes its socket (best effort: each step is retried briefly,
/// as QEMU frees the socket once the port is gone).
fn unplug(q: &mut Qmp, id: u32) {
    let qid = qemu_id(id);
    let _ = q.execute("device_del", Some(json!({"id": qid})));
    let deadline = Instant::now() + Duration::from_secs(2);
    while q
        .execute("chardev-remove", Some(json!({"id": qid})))
        .is_err()
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts the mount's file server, its stderr in the VM's state folder; returns its PID.
fn start_server(name: &str, id: u32, m: &Checked, socket: &Path) -> Result<i32, OpError> {
    let exe = std::env::current_exe()
        .map_err(|e| OpError::host(format!("cannot find mcqemu's own binary: {e}")))?;
    let log_path = vm::state_dir(name).join(format!("mount-{id}.log"));
    let log = std::fs::File::create(&log_path)
        .map_err(|e| OpError::host(format!("cannot create {}: {e}", log_path.display())))?;
    let mut cmd = Command::new(exe);
    cmd.arg("fs-serve")
        .arg("--socket")
        .arg(socket)
        .arg("--guest")
        .arg(&m.guest)
        .arg("--status")
        .arg(status_file(name, id));
    if m.writable {
        cmd.arg("--writable");
    }
    cmd.env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log));
    let fd = m.folder.as_raw_fd();
    // SAFETY: setsid, dup2 and fcntl are async-signal-safe and touch no memory of the parent.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            if fd == SHARE_FD {
                libc::fcntl(fd, libc::F_SETFD, 0);
            } else if libc::dup2(fd, SHARE_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| OpError::host(format!("cannot start the mount's file server: {e}")))?;
    let pid = child.id() as i32;
    let _ = std::thread::Builder::new()
        .name(format!("fs-serve-{pid}-reaper"))
        .spawn(move || child.wait());
    Ok(pid)
}

/// How mount `m` of VM `name` stands, from its server's status file.
fn state_of(name: &str, m: &Mount) -> (String, Option<String>) {
    let id = m.id.unwrap_or(0);
    let v: Value = std::fs::read_to_string(status_file(name, id))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    // No status file yet: the server is starting, which for the caller is waiting too.
    let state = v["state"].as_str().unwrap_or("waiting").to_string();
    let error = v["error"].as_str().map(str::to_string);
    let alive = m.server_pid.is_some_and(is_our_server);
    if !alive && state != "failed" {
        return (
            "ended".into(),
            Some("its file server is not running".into()),
        );
    }
    (state, error)
}

/// The mounts of VM `name` as vm_info shows them.
pub fn shown(name: &str, rec: &Record) -> Vec<Shown> {
    rec.mounts
        .iter()
        .flatten()
        .map(|m| {
            let (state, error) = state_of(name, m);
            Shown {
                host: m.host.clone().unwrap_or_default(),
                guest: m.guest.clone().unwrap_or_default(),
                writable: m.writable.unwrap_or(false),
                state,
                error,
            }
        })
        .collect()
}

/// True when `pid` is a live `mcqemu fs-serve` (not a PID reused by something else).
fn is_our_server(pid: i32) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    process::alive(pid) && cmdline.split(|&b| b == 0).any(|a| a == b"fs-serve")
}

/// Waits (up to `within`) until every mount of VM `name` is mounted by the guest, or one
/// failed; returns them as they stand.
pub fn wait_mounted(ctx: &dyn Work, name: &str, within: Duration) -> Result<Vec<Shown>, OpError> {
    let deadline = Instant::now() + within;
    ctx.progress_phase(&format!(
        "waiting for VM {name:?}'s guest to mount its folders"
    ));
    // The mounts were recorded before the wait; what moves is their servers' status files.
    let rec = crate::ops::vm::records::lookup(name)?;
    loop {
        ctx.check_cancel()?;
        let now = shown(name, &rec);
        let settled = now.iter().all(|m| m.state != "waiting");
        if settled || Instant::now() >= deadline {
            return Ok(now);
        }
        // A look is a status file per mount (one small read): cheap enough to make every
        // millisecond, which a clone's mount, ready in tens of them, is waited for to the last.
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Removes the mount of VM `name` at guest path `guest`: its server ends (the guest's relay
/// unmounts the folder, lazily: programs inside it get errors, never a hang), its port is
/// unplugged, and the record forgets it.
pub fn detach(name: &str, rec: &Record, guest: &str) -> Result<Shown, OpError> {
    let want = check_guest(guest)?;
    let m = rec
        .mounts
        .iter()
        .flatten()
        .find(|m| m.guest.as_deref() == Some(want.as_str()))
        .cloned()
        .ok_or_else(|| {
            let have: Vec<String> = rec
                .mounts
                .iter()
                .flatten()
                .filter_map(|m| m.guest.clone())
                .collect();
            OpError::not_found(format!(
                "VM {name:?} has no mount at {want} (its mounts: {})",
                if have.is_empty() {
                    "none".to_string()
                } else {
                    have.join(", ")
                }
            ))
        })?;
    let id = m.id.unwrap_or(0);
    let (state, error) = state_of(name, &m);
    if let Some(pid) = m.server_pid.filter(|&p| is_our_server(p)) {
        let _ = process::terminate_within(pid, Duration::from_secs(2));
    }
    // The port a VM has from the start stays for its next mount (the guest's relay waits on
    // it again once the server is gone); a plugged-in one goes.
    let spare = has_spare(rec) && id == SPARE_MOUNT;
    if !spare {
        session::monitor(name, rec, |q| {
            unplug(q, id);
            Ok(())
        })?;
    }
    forget(name, id)?;
    if !spare {
        let _ = std::fs::remove_file(socket_of(name, id));
    }
    let _ = std::fs::remove_file(status_file(name, id));
    Ok(Shown {
        host: m.host.unwrap_or_default(),
        guest: want,
        writable: m.writable.unwrap_or(false),
        state: if state == "failed" {
            state
        } else {
            "removed".into()
        },
        error,
    })
}

fn forget(name: &str, id: u32) -> Result<(), OpError> {
    let vm_name = name.to_string();
    crate::state::registry::shared().update(move |vms| {
        if let Some(r) = vms.get_mut(&vm_name) {
            if let Some(list) = r.mounts.as_mut() {
                list.retain(|m| m.id != Some(id));
            }
            if r.mounts.as_ref().is_some_and(Vec::is_empty) {
                r.mounts = None;
            }
        }
        Ok::<_, RegistryError>(())
    })?;
    Ok(())
}

/// Refuses `what` (a fork, a suspend, a template) of a VM with mounts: the copy would wake with
/// the guest's kernel holding files of a server that is not there. Names the mounts and how to
/// go on.
pub fn refuse_if_mounted(name: &str, rec: &Record, what: &str) -> Result<(), OpError> {
    let list: Vec<String> = rec
        .mounts
        .iter()
        .flatten()
        .map(|m| {
            format!(
                "{} at {}",
                m.host.as_deref().unwrap_or("?"),
                m.guest.as_deref().unwrap_or("?")
            )
        })
        .collect();
    if list.is_empty() {
        return Ok(());
    }
    let first = rec
        .mounts
        .iter()
        .flatten()
        .find_map(|m| m.guest.clone())
        .unwrap_or_default();
    Err(OpError::refused(format!(
        "VM {name:?} has host folders mounted ({}): {what} cannot carry a mount, whose file \
         server runs on the host outside the guest's saved state. Remove them first with \
         vm_mount {{\"name\": {name:?}, \"remove\": [{first:?}]}}, and add them again afterwards \
         (to the copy too, with its own mounts)",
        list.join("; ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_paths_are_absolute_plain_folders() {
        assert_eq!(check_guest("/src").unwrap(), "/src");
        assert_eq!(check_guest("/a//b/").unwrap(), "/a/b");
        assert_eq!(check_guest("/./a").unwrap(), "/a");
        for bad in ["src", "/", "/a/../b", "/proc/x", "/dev", "/a\nb"] {
            assert!(check_guest(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn nested_or_repeated_guest_paths_are_refused() {
        let existing = vec![Mount {
            guest: Some("/src".into()),
            ..Mount::default()
        }];
        for g in ["/src", "/src/sub", "/"] {
            let spec = MountSpec {
                host: "/tmp".into(),
                guest: g.into(),
                writable: false,
            };
            assert!(check(&[spec], &existing).is_err(), "{g}");
        }
        let too_many: Vec<MountSpec> = (0..9)
            .map(|i| MountSpec {
                host: "/tmp".into(),
                guest: format!("/m{i}"),
                writable: false,
            })
            .collect();
        let e = check(&too_many, &[]).unwrap_err();
        assert!(e.to_string().contains("at most 8"), "{e}");
    }
}
