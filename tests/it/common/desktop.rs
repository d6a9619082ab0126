//! The desktop test image: Debian 12 with Xorg (modesetting on QEMU's std VGA through
//! bochs-drm, libinput for the PS/2 keyboard and the virtio tablet), openbox and a full-screen
//! Tk program (`tests/cloud/desktop_app.py`) that logs every input event it receives as JSON
//! lines to [`DesktopImage::events`]; built by `tests/cloud/build_desktop.py` and booted
//! directly from its kernel and initramfs.
//!
//! X starts at boot from a systemd unit; the mode is 1280x800 unless the kernel command line
//! has `mcqemu.mode=WxH`, and `desktop-mode WxH` in the guest switches it (xrandr) and
//! restarts the program, which then logs a new `ready` record with its widgets' rectangles.
//! Measured under TCG (1 vCPU, 512 MiB or 1 GiB alike, 2 host cores, load 2-7 from other
//! tests): the agent answers 36-122 s after launch, the program is ready 60-170 s after
//! launch (about 25 s after the agent); wait for its `ready` record, not for a fixed time.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::server::Server;

/// Longest wait for the desktop-image build, its lock included (about 2 minutes when nothing
/// is cached).
pub const DESKTOP_BUILD_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// Longest guest_file_read of the program's log.
const EVENT_READ: Duration = Duration::from_secs(60);
/// Longest wait for the program to record what a gesture did.
pub const EVENT_SEEN: Duration = Duration::from_secs(30);

/// The desktop test image. Boot an overlay of `disk` (sandbox_vm does), never `disk` itself.
#[derive(Clone, Debug)]
pub struct DesktopImage {
    /// The root file system: qcow2, ext4 on the whole device; `manifest.json` beside it lists
    /// the package versions and the build times.
    pub disk: PathBuf,
    /// The Debian kernel.
    pub kernel: PathBuf,
    /// Its initramfs (virtio-blk and ext4).
    pub initrd: PathBuf,
    /// The kernel command line (`root=/dev/vda ...`).
    pub append: String,
    /// `manifest.json`.
    pub manifest: PathBuf,
    /// The program's event log in the guest.
    pub events: String,
}

/// The desktop test image, built once per process; fails the test when it cannot be built.
pub fn test_desktop_image() -> DesktopImage {
    try_test_desktop_image().unwrap_or_else(|e| panic!("{e}"))
}

/// Builds the desktop image once per process into `<workspace>/target/test-desktop/<key>/`
/// (cached there across runs, keyed by the scripts and the package versions), under the
/// builders' lock; an `Err` when it cannot be built (not root, a tool missing).
pub fn try_test_desktop_image() -> Result<DesktopImage, String> {
    static IMAGE: OnceLock<Result<DesktopImage, String>> = OnceLock::new();
    IMAGE.get_or_init(build).clone()
}

fn build() -> Result<DesktopImage, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = desktop_dir();
    let script = root.join("tests").join("cloud").join("build_desktop.py");
    let v =
        super::cli::run_locked_builder("desktop test image", &script, &out, DESKTOP_BUILD_TIMEOUT)?;
    let field = |k: &str| {
        v[k].as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("build_desktop.py output lacks {k}: {v}"))
    };
    let image = DesktopImage {
        disk: field("disk")?.into(),
        kernel: field("kernel")?.into(),
        initrd: field("initrd")?.into(),
        append: field("append")?,
        manifest: field("manifest")?.into(),
        events: field("events")?,
    };
    for f in [&image.disk, &image.kernel, &image.initrd, &image.manifest] {
        if !f.is_file() {
            return Err(format!(
                "build_desktop.py reported {} but it is missing",
                f.display()
            ));
        }
    }
    Ok(image)
}

fn desktop_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("test-desktop")
}

/// `MCQEMU_ROOTS` for a server that boots the desktop image: the test roots plus its cache.
pub fn desktop_roots() -> String {
    let dir = desktop_dir();
    let _ = std::fs::create_dir_all(&dir);
    format!("{}:{}", super::server::test_roots(), dir.display())
}

/// The program's event log, read through guest_file_read from where the last read ended.
pub struct Events {
    vm: String,
    path: String,
    offset: u64,
    partial: String,
    seen: Vec<Value>,
}

impl Events {
    /// The log at `path` in the guest `vm`.
    pub fn new(vm: &str, path: &str) -> Events {
        Events {
            vm: vm.to_string(),
            path: path.to_string(),
            offset: 0,
            partial: String::new(),
            seen: Vec::new(),
        }
    }

    /// Reads what is new; a missing file (X not up yet) reads as nothing.
    pub fn poll(&mut self, s: &mut Server) {
        let r = s.call_tool_within(
            "guest_file_read",
            json!({"name": self.vm, "path": self.path, "offset": self.offset}),
            EVENT_READ,
        );
        if r["isError"] == json!(true) {
            return;
        }
        let sc = &r["structuredContent"];
        let text = sc["content"].as_str().unwrap_or_default();
        self.offset += sc["size"].as_u64().unwrap_or(0);
        self.partial.push_str(text);
        while let Some(nl) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=nl).collect();
            let v: Value = serde_json::from_str(line.trim())
                .unwrap_or_else(|e| panic!("bad event line {line:?}: {e}"));
            self.seen.push(v);
        }
    }

    /// A mark: records after it are "new".
    pub fn mark(&self) -> usize {
        self.seen.len()
    }

    /// Waits for a record after `mark` that `pred` accepts; returns it.
    pub fn wait(
        &mut self,
        s: &mut Server,
        mark: usize,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        self.wait_within(s, mark, what, EVENT_SEEN, pred)
    }

    pub fn wait_within(
        &mut self,
        s: &mut Server,
        mark: usize,
        what: &str,
        limit: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let t = Instant::now();
        loop {
            if let Some(v) = self.seen[mark..].iter().find(|v| pred(v)) {
                return v.clone();
            }
            assert!(
                t.elapsed() < limit,
                "{what}: not recorded within {limit:?}; the program recorded since: {:#?}",
                &self.seen[mark..]
            );
            std::thread::sleep(Duration::from_millis(250));
            self.poll(s);
        }
    }

    /// Waits until `n` records after `mark` are ones `pred` accepts (the program writes each
    /// as it handles it: on a loaded host the last can come long after the first).
    pub fn wait_count(
        &mut self,
        s: &mut Server,
        mark: usize,
        what: &str,
        n: usize,
        pred: impl Fn(&Value) -> bool,
    ) {
        let t = Instant::now();
        loop {
            if self.seen[mark..].iter().filter(|v| pred(v)).count() >= n {
                return;
            }
            assert!(
                t.elapsed() < EVENT_SEEN,
                "{what}: not {n} recorded within {EVENT_SEEN:?}; the program recorded since: {:#?}",
                &self.seen[mark..]
            );
            std::thread::sleep(Duration::from_millis(250));
            self.poll(s);
        }
    }

    /// The records after `mark` (after a short settle, so that late ones are in).
    pub fn since(&mut self, s: &mut Server, mark: usize) -> Vec<Value> {
        std::thread::sleep(Duration::from_millis(500));
        self.poll(s);
        self.seen[mark..].to_vec()
    }
}

pub fn is(v: &Value, event: &str, widget: &str) -> bool {
    v["event"] == event && (widget.is_empty() || v["widget"] == widget)
}

pub fn has_mod(v: &Value, m: &str) -> bool {
    v["mods"]
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x == m))
}

/// A widget's rectangle from a `ready` record: (x, y, w, h) in screen pixels.
pub fn rect(ready: &Value, widget: &str) -> (i64, i64, i64, i64) {
    let r = &ready["widgets"][widget];
    let n = |i: usize| {
        r[i].as_i64()
            .unwrap_or_else(|| panic!("{widget} rect: {ready}"))
    };
    (n(0), n(1), n(2), n(3))
}

/// A widget's centre from a `ready` record.
pub fn centre(ready: &Value, widget: &str) -> (i64, i64) {
    let (x, y, w, h) = rect(ready, widget);
    (x + w / 2, y + h / 2)
}

/// The guest's wall clock minus the host's, in ms (the guest's `date` read through guest_exec,
/// the quickest of five round trips; its error is at most half that trip): turns the program's
/// `t` into host time.
pub fn guest_clock_offset_ms(s: &mut Server, vm: &str) -> Result<f64, String> {
    let mut best: Option<(f64, f64)> = None;
    for _ in 0..5 {
        let sent = epoch_ms();
        let r = s.try_call_tool_within(
            "guest_exec",
            json!({"name": vm, "command": "date", "args": ["+%s.%N"]}),
            EVENT_READ,
        )?;
        let back = epoch_ms();
        let out = r["structuredContent"]["stdout"]
            .as_str()
            .unwrap_or_default();
        let guest: f64 = out
            .trim()
            .parse()
            .map_err(|e| format!("the guest's date printed {out:?}: {e}"))?;
        let trip = back - sent;
        if best.is_none_or(|(t, _)| trip < t) {
            best = Some((trip, guest * 1000.0 - (sent + back) / 2.0));
        }
    }
    best.map(|(_, off)| off)
        .ok_or_else(|| "no clock sample".into())
}

/// The host's wall clock in ms.
pub fn epoch_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}
