//! The lifetime watcher: `mcqemu watch`, one per state folder (it holds `watcher.lock`), started
//! when a lifetime is written or a server starts, in a session of its own so that it survives
//! whoever started it. Each second it reads the registry and ends the VMs whose deadline has
//! passed or that have been idle too long, through the tools' own operations
//! ([`act`]). A VM a person holds is never ended. When nothing is left to watch it lets go of
//! its lock, looks once more (a lifetime written meanwhile found the lock taken), and exits.

mod act;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::ops::guest::background;
use crate::ops::vm::activity::now_f;
use crate::ops::vm::ends;
use crate::ops::vm::lifetime;
use crate::qemu::vm::{self, Status};
use crate::state::lockfile::{self, FileLock};
use crate::state::record::{Record, Sandbox};
use crate::state::registry::Vms;

/// How often the watcher looks at the registry file's identity while it sleeps (a stat): a
/// change (a lifetime written, a hold released, a VM's end) wakes it at once.
const PERIOD: Duration = Duration::from_secs(1);
/// The longest it sleeps with nothing due sooner: activity only ever moves an end later, so
/// between looks it waits for the earliest end its last look saw, or a registry change.
const LONGEST: Duration = Duration::from_secs(30);
/// How often a VM idle but for background processes has them asked about.
const BACKGROUND_RECHECK: Duration = Duration::from_secs(30);
/// How often the host's connections are asked about for the forwards' activity. The kernel
/// keeps each connection's own clock, so a look says when data last moved however old it
/// is; but each look walks the kernel's whole connection table (~1 ms with 256 Ki buckets), so
/// an idle watcher looks every 10 s, and once more right before it would end a VM with
/// forwards.
const TCP_PERIOD: Duration = Duration::from_secs(10);

/// Runs the watcher until nothing is left to watch; its exit code.
pub fn run() -> i32 {
    let path = lifetime::watcher_lock();
    let mut lock = match take_lock() {
        Ok(Some(l)) => l,
        Ok(None) => {
            crate::log::stderr(
                "info",
                "another watcher runs for this state folder; exiting",
            );
            return 0;
        }
        Err(e) => {
            crate::log::stderr("error", &format!("cannot lock {}: {e}", path.display()));
            return 1;
        }
    };
    crate::log::stderr(
        "info",
        &format!(
            "lifetime watcher {} started for {}",
            std::process::id(),
            crate::state::paths::state_dir().display()
        ),
    );
    let mut w = Watcher::default();
    loop {
        match w.tick() {
            Some(next) => w.sleep(next.clamp(Duration::from_millis(100), LONGEST)),
            None => {
                // The PID file first: once the lock is free, a new watcher may write its own.
                let _ = std::fs::remove_file(pid_file());
                drop(lock);
                // A lifetime written while this one decided to go found the lock taken: look
                // once more, now that it is free.
                if !watched(&crate::state::registry::shared().load()) {
                    crate::log::stderr("info", "nothing left to watch; the watcher exits");
                    return 0;
                }
                match take_lock() {
                    Ok(Some(l)) => lock = l,
                    _ => return 0,
                }
            }
        }
    }
}

/// The file holding the running watcher's PID (for `mcqemu ps` and tests).
pub fn pid_file() -> std::path::PathBuf {
    crate::state::paths::state_dir().join("watcher.pid")
}

/// The running watcher's PID, when one holds the lock.
pub fn running_pid() -> Option<i32> {
    if lockfile::try_lock(&lifetime::watcher_lock())
        .ok()?
        .is_some()
    {
        return None;
    }
    std::fs::read_to_string(pid_file())
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn take_lock() -> std::io::Result<Option<FileLock>> {
    let l = lockfile::try_lock(&lifetime::watcher_lock())?;
    if l.is_some() {
        let _ = std::fs::write(pid_file(), format!("{}\n", std::process::id()));
    }
    Ok(l)
}

/// True when some VM has a lifetime left to carry out: one running (or starting) with one, or
/// a suspended one whose deadline will destroy it.
fn watched(vms: &Vms) -> bool {
    vms.values()
        .any(|r| r.lifetime.is_some() && !matches!(state_of(r), Seen::Gone))
}

/// How the watcher sees a record's QEMU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// Being launched: nothing to do yet, but watched.
    Starting,
    /// Running (or paused, or frozen): its lifetime applies.
    Alive,
    /// Suspended with a deadline that destroys it.
    SuspendedDue,
    /// Nothing left to carry out.
    Gone,
}

/// How the watcher sees record `r`: from its process, or (no PID: attached) its monitor.
fn state_of(r: &Record) -> Seen {
    match vm::measure_process(r) {
        Some(m) if m.status == Status::Starting => Seen::Starting,
        Some(m) if m.status == Status::Suspended => {
            let destroys = r.lifetime.as_ref().is_some_and(|l| {
                l.deadline.is_some() && act::action(l.on_ttl.as_deref()) == act::DESTROY
            });
            if destroys {
                Seen::SuspendedDue
            } else {
                Seen::Gone
            }
        }
        Some(m) if !m.alive() => Seen::Gone,
        Some(_) => Seen::Alive,
        None if vm::pid(r).is_none() => {
            if crate::qemu::sock::is_listening(&vm::qmp_socket(r)) {
                Seen::Alive
            } else {
                Seen::Gone
            }
        }
        None => Seen::Alive,
    }
}

/// Why a deadline ended a VM, in words.
fn ran_out(l: &crate::state::record::Lifetime, deadline: i64) -> String {
    format!(
        "its time to live ({} s) ran out at {}",
        l.ttl_s.unwrap_or(0),
        crate::clock::iso8601(deadline)
    )
}

/// A file's identity and time: inode, length, modification (s, ns).
type FileStamp = (u64, u64, i64, i64);

/// The registry file's identity and time now (it is replaced by a rename at every change).
fn registry_stamp() -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(crate::state::registry::shared().path())
        .ok()
        .map(|m| (m.ino(), m.len(), m.mtime(), m.mtime_nsec()))
}

/// What the watcher remembers between looks.
#[derive(Default)]
struct Watcher {
    /// When each VM's background processes were last asked about.
    background_asked: HashMap<String, Instant>,
    /// The ends under way, each on a thread of its own.
    ending: act::Ending,
    /// The registry as last read, and the file's identity then: read again only when it
    /// changed (it is replaced by a rename at every change), which keeps an idle watcher's
    /// look to a stat.
    cached: Option<(FileStamp, std::sync::Arc<Vms>)>,
    /// When data last moved on each forwarded port (seconds since the epoch), and when the
    /// connections were last asked.
    tcp: Option<(Instant, HashMap<u16, f64>)>,
    /// The last look at the connections failed (said once in the log): VMs with forwards are
    /// not ended for idleness meanwhile.
    tcp_unknown: bool,
    /// VMs whose background processes are being asked about now, on threads of their own.
    asking: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

impl Watcher {
    /// One look: ends what is due; returns how long until the next one is worth taking, or
    /// None when nothing is left to watch.
    fn tick(&mut self) -> Option<Duration> {
        let vms = self.registry();
        let ports: Vec<u16> = vms
            .values()
            .filter(|r| r.lifetime.as_ref().is_some_and(|l| l.idle_s.is_some()))
            .flat_map(lifetime::forward_ports)
            .collect();
        if self
            .tcp
            .as_ref()
            .is_none_or(|t| t.0.elapsed() >= TCP_PERIOD)
        {
            self.look_at_connections(&ports);
        }
        let now = crate::clock::now_secs();
        let now_f = now_f();
        let mut watching = false;
        let mut next = LONGEST;
        let mut soon = |d: Duration| next = next.min(d);
        let mut looked = false;
        for (name, rec) in vms.iter() {
            let Some(l) = &rec.lifetime else { continue };
            let seen = state_of(rec);
            match seen {
                Seen::Gone => continue,
                Seen::Starting => {
                    watching = true;
                    soon(PERIOD);
                    continue;
                }
                Seen::Alive | Seen::SuspendedDue => {}
            }
            watching = true;
            if let Some(d) = l.deadline.filter(|d| *d > now) {
                soon(Duration::from_secs((d - now) as u64));
            }
            if seen == Seen::SuspendedDue {
                // Only its deadline applies: a suspended sandbox is not idle, it is asleep.
                if let Some(d) = l.deadline.filter(|d| now >= *d) {
                    if !self.ending.is_ending(name) {
                        let detail = format!("{} while it was suspended", ran_out(l, d));
                        self.ending
                            .start(name, rec, act::DESTROY, ends::TTL, detail, None);
                    }
                }
                continue;
            }
            if rec.hold.is_some() {
                continue;
            }
            if self.ending.is_ending(name) {
                soon(PERIOD);
                continue;
            }
            if let Some(d) = l.deadline.filter(|d| now >= *d) {
                let action = act::action(l.on_ttl.as_deref());
                self.ending
                    .start(name, rec, action, ends::TTL, ran_out(l, d), None);
                continue;
            }
            if let Some(d) = self.check_idle(name, rec, &ports, &mut looked, now_f) {
                soon(d);
            }
        }
        // An end under way keeps the watcher (and its thread) alive to its end.
        if self.ending.any() {
            soon(PERIOD);
        }
        (watching || self.ending.any()).then_some(next)
    }

    /// A running VM's idle limit: ends it when it has been idle that long; else how long until
    /// it may be (None: nothing to wait for). `looked`: the connections were asked about
    /// afresh this tick already.
    fn check_idle(
        &mut self,
        name: &str,
        rec: &Record,
        ports: &[u16],
        looked: &mut bool,
        now_f: f64,
    ) -> Option<Duration> {
        let l = rec.lifetime.as_ref()?;
        let idle_s = l.idle_s?;
        let mut seen = lifetime::last_activity(name, rec, Some(&self.tcp_ago(now_f)));
        let forwards = !lifetime::forward_ports(rec).is_empty();
        if now_f - seen.at >= idle_s as f64 && forwards && !*looked {
            // About to end it: what its forwards carried since the last look counts.
            self.look_at_connections(ports);
            *looked = true;
            seen = lifetime::last_activity(name, rec, Some(&self.tcp_ago(now_f)));
        }
        if forwards && self.tcp_unknown {
            // The host's connections could not be read: its forwards may be busy.
            return Some(TCP_PERIOD);
        }
        let idle_for = now_f - seen.at;
        if idle_for < idle_s as f64 {
            return Some(Duration::from_secs_f64(idle_s as f64 - idle_for));
        }
        if lifetime::busy(rec).is_some() {
            self.ask_background(name, rec);
            return Some(BACKGROUND_RECHECK);
        }
        let action = act::action(l.on_idle.as_deref());
        let detail = format!(
            "idle for {:.0} s (limit {idle_s} s; last activity: {} at {})",
            idle_for,
            seen.what,
            crate::clock::iso8601(seen.at as i64)
        );
        self.ending
            .start(name, rec, action, ends::IDLE, detail, Some(idle_s));
        None
    }

    /// Sleeps `d`, or until the registry file changes (looked at each second).
    fn sleep(&self, d: Duration) {
        let until = Instant::now() + d;
        let at_start = registry_stamp();
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(PERIOD));
            if registry_stamp() != at_start {
                return;
            }
        }
    }

    /// Asks the kernel when data last moved on each of `ports`' connections.
    fn look_at_connections(&mut self, ports: &[u16]) {
        let now = now_f();
        let seen = match crate::host::tcp_diag::last_data_by_port(ports) {
            Ok(m) => {
                self.tcp_unknown = false;
                m.into_iter()
                    .map(|(p, ago)| (p, now - ago.as_secs_f64()))
                    .collect()
            }
            Err(e) => {
                if !self.tcp_unknown {
                    crate::log::stderr(
                        "warn",
                        &format!(
                            "cannot read the host's connections ({e}): VMs with port forwards \
                             are not ended for idleness until they can be read"
                        ),
                    );
                }
                self.tcp_unknown = true;
                HashMap::new()
            }
        };
        self.tcp = Some((Instant::now(), seen));
    }

    /// How long ago data last moved on each forwarded port, as of `now` (seconds since the
    /// epoch), from the last look.
    fn tcp_ago(&self, now: f64) -> HashMap<u16, Duration> {
        self.tcp
            .iter()
            .flat_map(|(_, m)| m.iter())
            .map(|(p, at)| (*p, Duration::from_secs_f64((now - at).max(0.0))))
            .collect()
    }

    /// The registry's VMs, read again only when the file changed (shared, not copied: a
    /// copy of 100 records each second was most of an idle watcher's work).
    fn registry(&mut self) -> std::sync::Arc<Vms> {
        let reg = crate::state::registry::shared();
        let stamp = registry_stamp();
        match (&self.cached, stamp) {
            (Some((was, vms)), Some(now)) if *was == now => vms.clone(),
            _ => {
                let vms: std::sync::Arc<Vms> =
                    std::sync::Arc::new(reg.load().into_iter().map(slim).collect());
                give_back_freed();
                self.cached = stamp.map(|s| (s, vms.clone()));
                vms
            }
        }
    }

    /// Asks the guest whether a VM's background processes still run (at most every 30 s, on a
    /// thread of its own: a wedged agent holds up no other VM): one that ended is recorded so,
    /// and stops keeping the VM busy.
    fn ask_background(&mut self, name: &str, rec: &Record) {
        if self
            .background_asked
            .get(name)
            .is_some_and(|t| t.elapsed() < BACKGROUND_RECHECK)
        {
            return;
        }
        let mut asking = self.asking.lock().unwrap_or_else(|p| p.into_inner());
        if !asking.insert(name.to_string()) {
            return;
        }
        drop(asking);
        self.background_asked
            .insert(name.to_string(), Instant::now());
        let handles: Vec<String> = rec
            .background
            .iter()
            .flatten()
            .filter(|(_, b)| b.ended.is_none())
            .map(|(h, _)| h.clone())
            .collect();
        let (name, asking) = (name.to_string(), self.asking.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("ask-{name}"))
            .spawn({
                let (name, asking) = (name.clone(), asking.clone());
                move || {
                    for handle in handles {
                        let req = background::StatusRequest {
                            name: name.clone(),
                            handle,
                            stdout_offset: 0,
                            stderr_offset: 0,
                            wait: Duration::ZERO,
                        };
                        let _ = background::status(&req, &|| false);
                    }
                    asking
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&name);
                }
            });
        if spawned.is_err() {
            asking
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&name);
        }
    }
}

/// Hands the heap pages a registry parse freed back to the kernel, which glibc keeps (the
/// static build's watcher allocates through musl's, which gives them back itself): a watcher
/// lives for hours (the bench's, with 100 records, went from 8.2-8.3 to 6.4-7.2 MB RSS).
fn give_back_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases memory that is already free; no pointer is touched.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// What the watcher keeps of a record: the parts its looks read (the process, the lifetime,
/// activity, the kind), not the launch config and the rest; an end reads the record afresh.
/// An idle watcher of 100 VMs holds a few KiB instead of a few hundred.
fn slim((name, r): (String, Record)) -> (String, Record) {
    let forwards = r.forwards();
    let mut slim = Record {
        name: r.name,
        source: r.source,
        pid: r.pid,
        qmp_socket: r.qmp_socket,
        launch_qmp_socket: r.launch_qmp_socket,
        launching: r.launching,
        suspended: r.suspended,
        hold: r.hold,
        background: r
            .background
            .map(|b| b.into_iter().filter(|(_, p)| p.ended.is_none()).collect()),
        pooled: r.pooled,
        sandbox: r.sandbox.map(|s| Sandbox {
            overlay: s.overlay,
            ..Sandbox::default()
        }),
        lifetime: r.lifetime,
        ..Record::default()
    };
    // Its forwards (forwarded traffic is activity) without the rest of its launch config.
    slim.set_forwards(forwards);
    (name, slim)
}
