//! Real QEMUs: a per-binary limit on concurrent guests, short runtime folders, a kill-on-drop
//! guard, /proc helpers for the processes, pidfiles, and `qemu-img info` run directly.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::cli::try_run;
use super::files::TempDir;

/// How many QEMU guests one test binary runs at once (CI has 2 cores and no KVM).
pub const QEMU_SLOTS: usize = 2;

/// A held slot for one QEMU guest; released on drop.
pub struct QemuSlot(());

fn qemu_slot_state() -> &'static (Mutex<usize>, Condvar) {
    static STATE: OnceLock<(Mutex<usize>, Condvar)> = OnceLock::new();
    STATE.get_or_init(|| (Mutex::new(0), Condvar::new()))
}

/// Waits for one of the [`QEMU_SLOTS`] guest slots of this test binary. Hold it for the whole
/// life of one guest, and never ask for a second slot while holding one (that can deadlock):
/// a test needing two guests at once runs them one after the other instead.
pub fn qemu_slot() -> QemuSlot {
    let (m, cv) = qemu_slot_state();
    let mut used = m.lock().unwrap_or_else(|p| p.into_inner());
    while *used >= QEMU_SLOTS {
        used = cv.wait(used).unwrap_or_else(|p| p.into_inner());
    }
    *used += 1;
    QemuSlot(())
}

/// Waits until `n` guest slots are free and takes them all at once (never one by one, so two
/// tests each wanting two cannot deadlock). For a test that needs `n` QEMUs running together;
/// `n` must not exceed [`QEMU_SLOTS`].
pub fn qemu_slots(n: usize) -> Vec<QemuSlot> {
    assert!(n <= QEMU_SLOTS, "asked for {n} of {QEMU_SLOTS} QEMU slots");
    let (m, cv) = qemu_slot_state();
    let mut used = m.lock().unwrap_or_else(|p| p.into_inner());
    while *used + n > QEMU_SLOTS {
        // Bounded so that a wakeup lost to another waiter only delays, never hangs.
        used = cv
            .wait_timeout(used, Duration::from_millis(200))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
    *used += n;
    (0..n).map(|_| QemuSlot(())).collect()
}

impl Drop for QemuSlot {
    fn drop(&mut self) {
        let (m, cv) = qemu_slot_state();
        let mut used = m.lock().unwrap_or_else(|p| p.into_inner());
        *used = used.saturating_sub(1);
        cv.notify_all();
    }
}

/// A short, fresh folder directly under /tmp for `MCQEMU_RUNTIME_DIR` (unix socket paths must
/// stay within 107 bytes whatever TMPDIR is); removed on drop.
pub fn short_runtime_dir(label: &str) -> TempDir {
    static N: AtomicU64 = AtomicU64::new(0);
    let path = PathBuf::from(format!(
        "/tmp/mcq-{label}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    TempDir::at(path).unwrap_or_else(|e| panic!("short runtime dir: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Processes

/// The arguments of a live process, from /proc (None when it is gone or a zombie).
pub fn cmdline(pid: i32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
    )
}

/// True when `pid` is a live QEMU system emulator (checked before signalling it).
fn is_qemu_process(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            let argv0 = c.split(|b| *b == 0).next().unwrap_or(&[]);
            String::from_utf8_lossy(argv0).contains("qemu-system")
        })
        .unwrap_or(false)
}

/// The state letter of /proc/PID/stat (R, S, D, Z, ...), or None when the PID is gone.
pub fn pid_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.trim_start().chars().next()
}

/// True when `pid` exists and is not a zombie. A zombie thread-group leader whose other
/// threads are still exiting (they still hold its sockets open) counts as alive.
pub fn pid_alive(pid: i32) -> bool {
    let live = |c: char| c != 'Z' && c != 'X';
    match pid_state(pid) {
        None => false,
        Some('Z') => std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|t| {
                std::fs::read_to_string(t.path().join("stat"))
                    .ok()
                    .and_then(|st| {
                        let after = &st[st.rfind(')')? + 1..];
                        after.trim_start().chars().next()
                    })
                    .is_some_and(live)
            }),
        Some(c) => live(c),
    }
}

/// Waits (bounded) until `pid` is gone or a zombie; true when it is.
pub fn wait_pid_dead(pid: i32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while pid_alive(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Live QEMU system emulators whose command line mentions `dir` (e.g. a test's runtime folder).
pub fn qemu_pids_mentioning(dir: &Path) -> Vec<i32> {
    let needle = dir.to_string_lossy().into_owned();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if !is_qemu_process(pid) || !pid_alive(pid) {
            continue;
        }
        let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&raw).contains(&needle) {
            out.push(pid);
        }
    }
    out
}

/// Reads a pidfile written by `qemu -daemonize -pidfile`, waiting (bounded) for it.
pub fn read_pidfile(path: &Path, limit: Duration) -> i32 {
    try_read_pidfile(path, limit).unwrap_or_else(|e| panic!("{e}"))
}

/// [`read_pidfile`], with an error instead of a panic.
pub fn try_read_pidfile(path: &Path, limit: Duration) -> Result<i32, String> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(p) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            return Ok(p);
        }
        if Instant::now() >= deadline {
            return Err(format!("pidfile {} did not appear", path.display()));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// PIDs in the `*.pid` files under `dir`, down to `depth` levels of subfolders.
fn pid_files(dir: &Path, depth: usize, out: &mut Vec<i32>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() && depth > 0 {
            pid_files(&p, depth - 1, out);
        } else if ft.is_file() && p.extension().is_some_and(|x| x == "pid") {
            if let Some(pid) = std::fs::read_to_string(&p)
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
            {
                out.push(pid);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The kill-on-drop guard

/// How long a SIGKILLed QEMU may take to be gone.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Kills the QEMUs of a test (or of the bench) on drop, even when it panics: every PID it was
/// told about, and every PID in a `*.pid` file under the folder it watches (a runtime folder,
/// where the server keeps `NAME/qemu.pid`, or any folder holding such). Only processes that
/// are still QEMU system emulators are signalled (SIGKILL), then waited for (bounded) until
/// they are gone.
pub struct VmKiller {
    dir: PathBuf,
    pids: Mutex<Vec<i32>>,
}

impl VmKiller {
    /// Watches the pidfiles under `dir` (e.g. MCQEMU_RUNTIME_DIR), four levels down.
    pub fn new(dir: &Path) -> VmKiller {
        VmKiller {
            dir: dir.to_path_buf(),
            pids: Mutex::new(Vec::new()),
        }
    }

    /// Remembers the `pid` of a launch_vm / sandbox_vm result (its structured content).
    pub fn track(&self, launched: &Value) {
        if let Some(p) = launched["pid"].as_i64() {
            self.track_pid(p as i32);
        }
    }

    /// Remembers a PID.
    pub fn track_pid(&self, pid: i32) {
        self.pids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(pid);
    }

    /// SIGKILLs `pid` if it is a QEMU system emulator (true then); does not wait.
    fn signal(pid: i32) -> bool {
        if pid > 1 && is_qemu_process(pid) {
            // SAFETY: plain kill(2) on a PID just checked to be a QEMU process.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            return true;
        }
        false
    }

    /// Waits (bounded) until none of `pids` is a QEMU process any more.
    fn wait_gone(pids: &[i32]) {
        let deadline = Instant::now() + KILL_WAIT;
        while pids.iter().any(|&p| is_qemu_process(p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Kills one QEMU now and waits (bounded) until it is gone; false when `pid` was not a
    /// live QEMU.
    pub fn kill(&self, pid: i32) -> bool {
        let signalled = VmKiller::signal(pid);
        if signalled {
            VmKiller::wait_gone(&[pid]);
        }
        signalled
    }

    /// Kills every tracked QEMU now; returns the PIDs it signalled.
    pub fn kill_all(&self) -> Vec<i32> {
        let mut pids = self.pids.lock().unwrap_or_else(|p| p.into_inner()).clone();
        pid_files(&self.dir, 4, &mut pids);
        pids.sort_unstable();
        pids.dedup();
        let killed: Vec<i32> = pids
            .iter()
            .copied()
            .filter(|&p| VmKiller::signal(p))
            .collect();
        VmKiller::wait_gone(&pids);
        killed
    }
}

impl Drop for VmKiller {
    fn drop(&mut self) {
        self.kill_all();
    }
}

// ---------------------------------------------------------------------------------------------
// qemu-img, run directly

/// `qemu-img info --output=json` of a file, run directly (not through mcqemu).
pub fn qemu_img_info(path: &Path) -> Value {
    try_qemu_img_info("qemu-img", path).unwrap_or_else(|e| panic!("{e}"))
}

/// `QEMU_IMG info -U --output=json FILE`, bounded (60 s), with an error instead of a panic.
pub fn try_qemu_img_info(qemu_img: &str, path: &Path) -> Result<Value, String> {
    let os = OsStr::new;
    let out = try_run(
        qemu_img,
        &[os("info"), os("-U"), os("--output=json"), path.as_os_str()],
        Duration::from_secs(60),
    )
    .map_err(|e| format!("qemu-img info {} failed: {e}", path.display()))?;
    serde_json::from_slice(&out).map_err(|e| format!("qemu-img info gave no JSON: {e}"))
}

/// A live process that is not a QEMU (a `sleep`), standing in for the QEMU behind an attached
/// VM's fake monitor; killed and reaped on drop.
pub struct StandIn(std::process::Child);

impl StandIn {
    /// Starts one.
    pub fn start() -> StandIn {
        StandIn(
            std::process::Command::new("sleep")
                .arg("600")
                .stdin(std::process::Stdio::null())
                .spawn()
                .expect("spawn sleep"),
        )
    }

    /// Its PID.
    pub fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
