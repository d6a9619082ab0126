//! Warm pools: a template may ask the server to keep clones of it started, clock set and
//! agent answering, so that sandbox_vm {template} hands one out in milliseconds instead of
//! starting it (a fresh clone is ~250 ms under TCG, most of it the first agent round trips).
//!
//! - A pool's size is a file in the template's folder (`pool`); 0 or missing is none.
//! - Pooled clones are ordinary clone records marked `pooled: TEMPLATE`, named `pool-<id>`, in
//!   the registry (so they count in the quotas and a second server sees them), hidden from
//!   list_vms. A server that exits leaves them running; the next one adopts them as they are.
//! - Taking one happens under the registry lock (two servers never take the same clone): its
//!   record moves to the requested name and its folders are renamed to that name's (QEMU keeps
//!   its open files; its sockets move with their folder). A clone that died or froze is never
//!   handed out: it is destroyed and the caller gets a fresh clone.
//! - The keeper thread ([`start_keeper`]) refills every pool, replaces dead or frozen pooled
//!   clones, and ends the pools of deleted templates; a take wakes it at once.

use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use crate::ops::error::OpError;
use crate::ops::sandbox::clone;
use crate::ops::sandbox::destroy;
use crate::ops::sandbox::request::{Root, SandboxRequest};
use crate::ops::sandbox::result::Sandboxed;
use crate::ops::sandbox::templates;
use crate::ops::vm::launch::Launched;
use crate::ops::work::Work;
use crate::qemu::vm::{self, Status};
use crate::qemu::{qga, qmp};
use crate::state::record::text;
use crate::state::registry::{Record, RegistryError};

/// Largest pool a template may keep.
pub const MAX_POOL: u64 = 16;
/// How often the keeper looks at the pools when nothing wakes it.
const KEEPER_PERIOD: Duration = Duration::from_secs(2);

/// The file holding a template's pool size.
fn size_file(template: &str) -> PathBuf {
    templates::dir_of(template).join("pool")
}

/// Ends a template's pool (also one whose template is damaged): its size file goes, its
/// clones are destroyed, and the keeper is woken.
pub fn end(ctx: &dyn Work, template: &str) {
    if size(template) == 0 && pooled(template).is_empty() {
        return;
    }
    let _ = std::fs::remove_file(size_file(template));
    for c in pooled(template) {
        destroy::destroy_quietly(ctx, &c);
    }
    wake();
}

/// A template's pool size (0: none).
pub fn size(template: &str) -> u64 {
    std::fs::read_to_string(size_file(template))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// The file holding how long a template's pooled clones outlive the last server keeping them.
fn idle_file(template: &str) -> PathBuf {
    templates::dir_of(template).join("pool-idle")
}

/// How long a template's pooled clones live on once no server keeps the pool, in seconds.
pub fn idle_s(template: &str) -> u64 {
    std::fs::read_to_string(idle_file(template))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(crate::ops::vm::lifetime::POOL_IDLE_S)
}

/// Sets how long a template's pooled clones live on once no server keeps the pool, for its
/// clones now and later (0: until a server ends the pool).
pub fn set_idle_s(template: &str, s: u64) -> Result<(), OpError> {
    use crate::ops::vm::lifetime::{self, Asked, Kind};
    templates::load(template)?;
    let asked = Asked {
        idle_s: Some(s),
        ..Asked::default()
    };
    let lt = lifetime::resolve(Kind::Pooled, &asked, crate::clock::now_secs())?;
    let file = idle_file(template);
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, format!("{s}\n"))
        .and_then(|()| std::fs::rename(&tmp, &file))
        .map_err(|e| OpError::host(format!("cannot record the pool's idle_s: {e}")))?;
    let t = template.to_string();
    let has = lt.is_some();
    crate::state::registry::shared().update(move |vms| {
        for r in vms.values_mut() {
            if r.pooled.as_deref() == Some(t.as_str()) {
                r.lifetime = lt.clone();
            }
        }
        Ok::<_, RegistryError>(())
    })?;
    if has {
        lifetime::ensure_watcher();
    }
    Ok(())
}

crate::described! {
    /// A template's pool as template_pool leaves it.
    #[derive(Debug, Clone, serde::Serialize)]
    pub struct PoolState {
        /// The template.
        pub name: String,
        /// Clones kept started.
        pub pool: u64,
        /// Of those, the ones ready to hand out now.
        pub pool_ready: usize,
        /// How long pooled clones live on once no server keeps the pool.
        pub idle_s: u64,
    }
}

/// template_pool: the pool's idle limit (when given), then its size; the pool as it stands.
pub fn set(
    ctx: &dyn Work,
    template: &str,
    size: u64,
    idle: Option<u64>,
) -> Result<PoolState, OpError> {
    if let Some(s) = idle {
        set_idle_s(template, s)?;
    }
    set_size(ctx, template, size)?;
    Ok(PoolState {
        name: template.to_string(),
        pool: self::size(template),
        pool_ready: ready(template),
        idle_s: idle_s(template),
    })
}

/// Sets a template's pool size, checked against the quotas (its clones run all the time), and
/// wakes the keeper. 0 ends the pool: its clones are destroyed.
pub fn set_size(ctx: &dyn Work, template: &str, n: u64) -> Result<(), OpError> {
    let t = templates::load(template)?;
    if n > MAX_POOL {
        return Err(OpError::refused(format!(
            "pool {n} is more than the {MAX_POOL} clones a pool may keep; ask for fewer"
        )));
    }
    let have = pooled(template).len() as u64;
    if n > have {
        // The pool's clones run all the time: the quotas admit them as they would any VMs.
        let limits = crate::ops::vm::quota::Limits::current();
        crate::ops::vm::quota::admit_many(
            &crate::state::registry::shared().load(),
            "",
            n - have,
            t.memory_mb,
            t.cpus,
            limits,
        )
        .map_err(|e| {
            e.context(format_args!(
                "a pool of {n} clones of template {template:?}"
            ))
        })?;
    }
    let file = size_file(template);
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, format!("{n}\n"))
        .and_then(|()| std::fs::rename(&tmp, &file))
        .map_err(|e| OpError::host(format!("cannot record the pool size: {e}")))?;
    if n < have {
        for name in pooled(template).into_iter().skip(n as usize) {
            destroy::destroy_quietly(ctx, &name);
        }
    }
    wake();
    Ok(())
}

/// The pooled clones of `template` whose QEMU is alive (ready or starting), oldest first.
pub fn pooled(template: &str) -> Vec<String> {
    let mut v: Vec<(String, i64)> = crate::state::registry::shared()
        .load()
        .into_iter()
        .filter(|(_, r)| r.pooled.as_deref() == Some(template))
        .filter(|(_, r)| vm::measure_process(r).is_none_or(|m| m.alive()))
        .map(|(n, r)| (n, r.pooled_at.unwrap_or(0)))
        .collect();
    v.sort_by_key(|(n, at)| (*at, n.clone()));
    v.into_iter().map(|(n, _)| n).collect()
}

/// True when a sandbox request asks for nothing a pooled clone was not started with (its own
/// cloud_init, port forwards, or network).
pub fn fits(req: &SandboxRequest) -> bool {
    req.launch.cloud_init.as_ref().is_none_or(Value::is_null)
        && req.launch.port_forwards.is_none()
        && !req.allow_network
        && req.launch.egress.is_empty()
}

/// Takes a ready pooled clone of `template` for VM `name`: its record and folders become
/// `name`'s. None when the pool has none ready (the caller starts a fresh clone). A claimed
/// clone whose QEMU does not answer now (killed since the keeper's last round) is destroyed
/// and the next one is tried: the registry alone is never trusted with a take.
pub fn take(
    template: &str,
    name: &str,
    lifetime: Option<crate::state::record::Lifetime>,
) -> Result<Option<Sandboxed>, OpError> {
    let started = Instant::now();
    // Each failed try removes one pooled clone, so a pool is tried through at most once.
    for _ in 0..=MAX_POOL {
        let Some((old, rec)) = claim(template, name, lifetime.clone())? else {
            return Ok(None);
        };
        if let Err(why) = answers(&rec) {
            crate::log::stderr(
                "warn",
                &format!("pooled clone {old} of template {template} is dead ({why}); removed"),
            );
            destroy::destroy_quietly(&crate::ops::work::Detached, name);
            wake();
            continue;
        }
        // The agent answered when the clone joined the pool, and the keeper pings every ready
        // one each round: the taker reaches it by its new path, so no connection kept under
        // the old one may hold the agent's single channel.
        if let Some(old_sock) = text(&rec.qga_socket) {
            let pairs = [(vm::runtime_dir(&old), vm::runtime_dir(name))];
            qga::release_idle(Path::new(&unrewrite(old_sock, &pairs)));
        }
        wake();
        if rec.lifetime.is_some() {
            crate::ops::vm::lifetime::ensure_watcher();
        }
        return Ok(Some(taken(template, name, &rec, started)));
    }
    Ok(None)
}

/// How long a take waits for a claimed clone's monitor: a live QEMU answers in well under a
/// millisecond; one being killed accepts the connection and then says nothing.
const TAKE_CHECK: Duration = Duration::from_millis(500);

/// Whether a claimed clone's QEMU runs now: its process alive as ours, its monitor answering
/// and its guest running.
fn answers(rec: &Record) -> Result<(), OpError> {
    if !runs(rec) {
        return Err(OpError::host("its QEMU process is gone"));
    }
    let st = qmp::with_session_within(&vm::qmp_socket(rec), TAKE_CHECK, |q| {
        q.query_status_within(TAKE_CHECK)
    })
    .map_err(|e: qmp::QmpError| OpError::host(format!("its monitor did not answer: {e}")))?;
    match st.status.as_str() {
        "running" => Ok(()),
        other => Err(OpError::guest(format!("its guest is {other}"))),
    }
}

/// sandbox_vm's result for a clone taken from the pool.
fn taken(template: &str, name: &str, rec: &Record, started: Instant) -> Sandboxed {
    let own = |f: &Option<String>| f.clone().unwrap_or_default();
    let sb = rec.sandbox.clone();
    Sandboxed {
        template: Some(template.to_string()),
        pooled: Some(true),
        agent_ready: true,
        ready_ms: Some(started.elapsed().as_millis() as u64),
        overlay: sb.as_ref().and_then(|s| s.overlay.clone()),
        base_image: sb.as_ref().and_then(|s| s.base_image.clone()),
        ..Sandboxed::of(Launched {
            name: name.to_string(),
            status: "running".into(),
            pid: vm::pid(rec),
            accel: own(&rec.accel),
            arch: rec.arch().unwrap_or_default(),
            machine: rec.machine_kind().unwrap_or_default(),
            qemu_version: own(&rec.qemu_version),
            port_forwards: vm::forwards(rec),
            qmp_socket: own(&rec.qmp_socket),
            qga_socket: own(&rec.qga_socket),
            serial_log: own(&rec.serial_log),
            warnings: Vec::new(),
            sandbox: sb,
            cloud_init: None,
            egress: None,
            mounts: Vec::new(),
        })
    }
}

/// Under the registry lock: the oldest live, unfrozen pooled clone of `template` is renamed
/// to `name` (record and folders). Returns its old name and new record.
fn claim(
    template: &str,
    name: &str,
    lifetime: Option<crate::state::record::Lifetime>,
) -> Result<Option<(String, Record)>, OpError> {
    let name = name.to_string();
    let template = template.to_string();
    crate::state::registry::shared().update(move |vms| {
        if let Some(r) = vms.get(&name) {
            if vm::measure_process(r).is_none_or(|m| m.alive()) {
                return Err(OpError::invalid(format!(
                    "a VM named {name:?} already exists; choose another name"
                )));
            }
        }
        let mut ready: Vec<(String, i64)> = vms
            .iter()
            .filter(|(_, r)| r.pooled.as_deref() == Some(template.as_str()))
            .filter(|(_, r)| r.pool_ready == Some(true))
            // One the watcher is ending (its pool unkept too long) is not handed out.
            .filter(|(_, r)| r.ending.is_none())
            .filter(|(_, r)| runs(r))
            .map(|(n, r)| (n.clone(), r.pooled_at.unwrap_or(0)))
            .collect();
        ready.sort_by_key(|(n, at)| (*at, n.clone()));
        let Some((old, _)) = ready.into_iter().next() else {
            return Ok(None);
        };
        let Some(rec) = vms.remove(&old) else {
            return Ok(None);
        };
        let mut moved = move_folders(&old, &name, rec)?;
        // Handed out, it lives as the sandbox asked, its idle clock from now.
        moved.lifetime = lifetime.clone();
        crate::ops::vm::lifetime::running_again(&mut moved, crate::clock::now_secs());
        vms.insert(name.clone(), moved.clone());
        Ok(Some((old, moved)))
    })
}

/// Renames a VM's state and runtime folders from `old`'s to `new`'s and rewrites every path
/// in its record to match. QEMU keeps its open files; its sockets move with their folder.
fn move_folders(old: &str, new: &str, rec: Record) -> Result<Record, OpError> {
    let pairs = [
        (vm::state_dir(old), vm::state_dir(new)),
        (vm::runtime_dir(old), vm::runtime_dir(new)),
    ];
    for (from, to) in &pairs {
        if to.exists() {
            // A dead VM of that name left its folders: they go (it was checked not alive).
            let _ = std::fs::remove_dir_all(to);
        }
        std::fs::rename(from, to).map_err(|e| {
            OpError::host(format!(
                "cannot move the pooled clone's folder {} to {}: {e}",
                from.display(),
                to.display()
            ))
        })?;
    }
    let mut map = Map::new();
    for (k, v) in rec.to_map() {
        map.insert(k, rewrite(v, &pairs));
    }
    let mut out = Record::from_map(map);
    out.name = Some(new.to_string());
    // The QEMU still names its monitor by the old path on its command line: the identity check
    // of a PID reads it from there.
    if out.launch_qmp_socket.is_none() {
        out.launch_qmp_socket = text(&out.qmp_socket).map(|sock| unrewrite(sock, &pairs));
    }
    out.pooled = None;
    out.pool_ready = None;
    out.pooled_at = None;
    Ok(out)
}

fn replace_prefix(s: &str, from: &Path, to: &Path) -> Option<String> {
    let f = from.to_string_lossy();
    s.strip_prefix(f.as_ref())
        .filter(|rest| rest.is_empty() || rest.starts_with('/'))
        .map(|rest| format!("{}{rest}", to.to_string_lossy()))
}

fn rewrite(v: Value, pairs: &[(PathBuf, PathBuf)]) -> Value {
    match v {
        Value::String(s) => Value::String(
            pairs
                .iter()
                .find_map(|(f, t)| replace_prefix(&s, f, t))
                .unwrap_or(s),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(|x| rewrite(x, pairs)).collect()),
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, x)| {
                    let k = pairs
                        .iter()
                        .find_map(|(f, t)| replace_prefix(&k, f, t))
                        .unwrap_or(k);
                    (k, rewrite(x, pairs))
                })
                .collect(),
        ),
        other => other,
    }
}

fn unrewrite(s: &str, pairs: &[(PathBuf, PathBuf)]) -> String {
    pairs
        .iter()
        .find_map(|(f, t)| replace_prefix(s, t, f))
        .unwrap_or_else(|| s.to_string())
}

// ---- the keeper

fn signal() -> &'static (Mutex<bool>, Condvar) {
    static S: OnceLock<(Mutex<bool>, Condvar)> = OnceLock::new();
    S.get_or_init(|| (Mutex::new(false), Condvar::new()))
}

/// Wakes the keeper now (a take, a pool size change).
pub fn wake() {
    let (m, c) = signal();
    if let Ok(mut w) = m.lock() {
        *w = true;
        c.notify_all();
    }
}

/// Starts the keeper thread of this server (once).
pub fn start_keeper() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let _ = std::thread::Builder::new()
            .name("pool-keeper".into())
            .spawn(|| loop {
                keep_all();
                let (m, c) = signal();
                if let Ok(mut w) = m.lock() {
                    if !*w {
                        if let Ok((g, _)) = c.wait_timeout(w, KEEPER_PERIOD) {
                            w = g;
                        } else {
                            continue;
                        }
                    }
                    *w = false;
                }
            });
    });
}

/// One round over every template folder and every pooled record.
pub fn keep_all() {
    let ctx = crate::ops::work::Detached;
    // Pooled clones that died, froze, or whose template is gone or no longer pooled.
    for (name, rec) in crate::state::registry::shared().load() {
        let Some(t) = rec.pooled.as_deref() else {
            continue;
        };
        // A pool a server keeps is busy: its clones idle only once no server keeps it.
        crate::ops::vm::lifetime::touch(&name);
        let status = vm::measure_process(&rec).map(|m| m.status);
        // A guest that crashed inside a QEMU that still runs: its agent stops answering.
        let silent = rec.pool_ready == Some(true)
            && status.is_none()
            && text(&rec.qga_socket).is_some_and(|s| {
                let bound = qga::IDLE_KEEP + Duration::from_secs(1);
                let ping = qga::with_agent(Path::new(s), bound, |q| {
                    crate::qemu::agent_calls::ping(q, bound)
                });
                // Leave the agent's one channel free for whoever takes the clone.
                qga::release_idle(Path::new(s));
                ping.is_err()
            });
        let broken = silent || matches!(status, Some(Status::Stopped) | Some(Status::Frozen));
        let unwanted = templates::load(t).is_err()
            || pooled(t)
                .iter()
                .position(|n| *n == name)
                .is_some_and(|i| i as u64 >= size(t));
        if broken || unwanted {
            destroy::destroy_quietly(&ctx, &name);
        }
    }
    let Ok(entries) = std::fs::read_dir(templates::templates_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let t = e.file_name().to_string_lossy().into_owned();
        let want = size(&t);
        if want == 0 || templates::load(&t).is_err() {
            continue;
        }
        if let Err(err) = refill(&ctx, &t, want) {
            crate::log::stderr("warn", &format!("pool of template {t}: {err}"));
        }
    }
}

/// Starts clones of `template` until `want` are pooled, under the template's pool lock (two
/// servers never overfill one pool).
fn refill(ctx: &dyn Work, template: &str, want: u64) -> Result<(), OpError> {
    let lock_path = templates::dir_of(template).join(".pool.lock");
    let Some(lock) = crate::state::lockfile::try_lock(&lock_path)
        .map_err(|e| OpError::host(format!("cannot lock {}: {e}", lock_path.display())))?
    else {
        return Ok(()); // another server is refilling it now
    };
    while (pooled(template).len() as u64) < want && size(template) >= want {
        let name = format!("pool-{}", &crate::cloudinit::new_instance_id()[11..23]);
        let mut req = SandboxRequest {
            name: Some(name.clone()),
            root: Some(Root::Template(template.to_string())),
            ..SandboxRequest::default()
        };
        // Kept busy by this keeper; ended that long after no server keeps the pool.
        req.launch.lifetime.idle_s = Some(idle_s(template));
        // Marked from its launch on, so list_vms never shows it and a take never sees it
        // before its agent answers.
        let fields = Record {
            pooled: Some(template.to_string()),
            pool_ready: Some(false),
            pooled_at: Some(crate::clock::now_secs()),
            ..Record::default()
        };
        match clone::start_with(ctx, &req, template, fields) {
            Ok((out, Some(clock))) if out.agent_ready => {
                // A pooled clone is handed out with its clock already right.
                if let Ok(Err(why)) = clock.join() {
                    crate::log::stderr("warn", &format!("pooled clone {name}: {why}"));
                }
                // Its agent is free for whoever takes it (the taker reaches it by a new path).
                qga::release_idle(Path::new(&out.launched.qga_socket));
                mark_ready(&name)?
            }
            Ok(_) => {
                destroy::destroy_quietly(ctx, &name);
                return Err(OpError::timed_out("a pooled clone's agent did not answer"));
            }
            Err(e) => {
                let _ = crate::state::registry::shared().update(|vms| {
                    vms.remove(&name);
                    Ok::<_, RegistryError>(())
                });
                return Err(e);
            }
        }
    }
    drop(lock);
    Ok(())
}

/// Marks pooled clone `name` ready to be taken.
fn mark_ready(name: &str) -> Result<(), OpError> {
    let name = name.to_string();
    crate::state::registry::shared().update(move |vms| {
        if let Some(rec) = vms.get_mut(&name) {
            rec.pool_ready = Some(true);
        }
        Ok::<_, RegistryError>(())
    })?;
    Ok(())
}

/// True when a record's QEMU is there and neither frozen nor exited (judged from the process:
/// [`vm::measure_process`] settles nothing for a QEMU that looks alive).
fn runs(rec: &Record) -> bool {
    vm::pid(rec).is_some() && vm::measure_process(rec).is_none()
}

/// The number of pooled clones of `template` ready to be taken.
pub fn ready(template: &str) -> usize {
    crate::state::registry::shared()
        .load()
        .values()
        .filter(|r| r.pooled.as_deref() == Some(template))
        .filter(|r| r.pool_ready == Some(true))
        .filter(|r| runs(r))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pooled_clone_fits_only_a_plain_request() {
        let plain = SandboxRequest {
            root: Some(Root::Template("t".into())),
            name: Some("c".into()),
            wait_agent_s: Some(5.0),
            ..SandboxRequest::default()
        };
        assert!(fits(&plain));
        let open = SandboxRequest {
            allow_network: true,
            ..plain.clone()
        };
        assert!(!fits(&open));
        let mut forwards = plain.clone();
        forwards.launch.port_forwards = Some(Vec::new());
        assert!(!fits(&forwards), "an explicit [] is not the pool's auto:22");
        let mut seeded = plain.clone();
        seeded.launch.cloud_init = Some(json!({"hostname": "x"}));
        assert!(!fits(&seeded));
        seeded.launch.cloud_init = Some(Value::Null);
        assert!(fits(&seeded), "a null cloud_init is none");
    }

    #[test]
    fn paths_move_with_their_folder_and_nothing_else_does() {
        let pairs = [(PathBuf::from("/s/vms/pool-1"), PathBuf::from("/s/vms/box"))];
        let v = json!({
            "serial_log": "/s/vms/pool-1/serial.log",
            "disks": ["/s/vms/pool-1/overlay.qcow2"],
            "disk_formats": {"/s/vms/pool-1/overlay.qcow2": "qcow2"},
            "base": "/s/vms/pool-10/x", "other": "/t/pool-1/y"
        });
        let r = rewrite(v, &pairs);
        assert_eq!(r["serial_log"], "/s/vms/box/serial.log");
        assert_eq!(r["disks"][0], "/s/vms/box/overlay.qcow2");
        assert_eq!(r["disk_formats"]["/s/vms/box/overlay.qcow2"], "qcow2");
        assert_eq!(r["base"], "/s/vms/pool-10/x");
        assert_eq!(r["other"], "/t/pool-1/y");
        assert_eq!(
            unrewrite("/s/vms/box/qmp.sock", &pairs),
            "/s/vms/pool-1/qmp.sock"
        );
    }
}
