//! Screen captures: QEMU's `screendump` writes a PPM into a memory file passed to it as a
//! file descriptor (or, where QEMU takes none, into a temporary file), parsed with a strict
//! header parser and a dimension cap, scaled down by area averaging ([`super::scale`]) and
//! encoded as PNG.
//!
//! Why PPM into a memory file: measured on QEMU 7.2 with a 1920x1080 screen, a PPM
//! screendump takes 2.6 ms into /dev/null (QEMU's own work), 6 ms into a memory file, 10-20 ms
//! into a new file on a disk-backed file system (the page-cache work of 6 MB), and QEMU's own
//! PNG encoder 50-65 ms. A memory file also leaves nothing behind on any path.
//!
//! The PNG is compressed in segments, one thread per core ([`super::encode`]): zlib at the
//! size-optimized release profile takes 20 ms for a 1568x882 desktop on one core.

use std::io::Read;
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

pub use super::encode::{encode, scale_encode};
pub use super::frame::{ppm_header, Frame, Png, Rect, ScreenError, MAX_DIM};
use super::qmp::{Qmp, QmpError};

/// The longer edge an inline screenshot is scaled down to by default: hosts reject or shrink
/// larger images (some break sessions on images over 2000 px, others downscale past 1568).
pub const DEFAULT_MAX_EDGE: u32 = 1568;

/// The default byte budget of an inline screenshot's PNG: its base64 (4/3 of it) then stays
/// within 1,000,000 characters, under the 1 MB per-result limits of some hosts.
pub const DEFAULT_MAX_BYTES: usize = 750_000;

/// The smallest longer edge the byte budget may shrink an image to.
pub const MIN_EDGE: u32 = 32;

/// Bounds on a returned image. Size bounds scale it down (never up) to fit them all, keeping
/// its aspect ratio; a byte budget scales it down further until its PNG fits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bounds {
    /// Largest width.
    pub max_width: Option<u32>,
    /// Largest height.
    pub max_height: Option<u32>,
    /// Largest longer edge.
    pub max_edge: Option<u32>,
    /// Largest PNG, in bytes.
    pub max_bytes: Option<usize>,
}

/// Rounds a scale down to 4 decimals: short to read back, and never past a bound.
fn floor4(s: f64) -> f64 {
    (s * 10_000.0).floor() / 10_000.0
}

/// The scale (at most 1, 4 decimals, rounded down) at which a `width` x `height` screen fits
/// the size bounds.
pub fn fit_scale(width: u32, height: u32, b: &Bounds) -> f64 {
    let (w, h) = (f64::from(width.max(1)), f64::from(height.max(1)));
    let mut s: f64 = 1.0;
    if let Some(m) = b.max_width {
        s = s.min(f64::from(m) / w);
    }
    if let Some(m) = b.max_height {
        s = s.min(f64::from(m) / h);
    }
    if let Some(m) = b.max_edge {
        s = s.min(f64::from(m) / w.max(h));
    }
    if s >= 1.0 {
        1.0
    } else {
        floor4(s).max(0.0001)
    }
}

/// The image size of a `width` x `height` screen at `scale`: each edge rounded, at least 1 and
/// at most the screen's. vm_click maps coordinates back through the same sizes.
pub fn scaled_size(width: u32, height: u32, scale: f64) -> (u32, u32) {
    if scale >= 1.0 {
        return (width, height);
    }
    let edge = |n: u32| ((f64::from(n) * scale).round() as u32).clamp(1, n.max(1));
    (edge(width), edge(height))
}

/// A screenshot ready to return: the PNG and how it relates to the screen.
pub struct Shot {
    /// The PNG.
    pub png: Png,
    /// The image's size divided by the screen's (1: not scaled).
    pub scale: f64,
    /// How many times it was scaled and encoded (more than 1: the byte budget shrank it).
    pub encodes: u32,
}

/// Scales and encodes `frame` within `bounds`: first at the scale the size bounds give, then,
/// while the PNG exceeds the byte budget, smaller (each edge by the square root of the
/// excess, with a margin), down to a longer edge of [`MIN_EDGE`].
pub fn render(frame: &Frame, bounds: &Bounds) -> Result<Shot, ScreenError> {
    let (w, h) = (frame.width, frame.height);
    let mut scale = fit_scale(w, h, bounds);
    // Rounded up, so that the smallest image still has a longer edge of MIN_EDGE.
    let min_scale = ((f64::from(MIN_EDGE) / f64::from(w.max(h))) * 10_000.0).ceil() / 10_000.0;
    let mut encodes = 0;
    loop {
        let (dw, dh) = scaled_size(w, h, scale);
        let png = scale_encode(frame, dw, dh)?;
        encodes += 1;
        match bounds.max_bytes {
            Some(max) if png.data.len() > max && scale > min_scale => {
                let shrink = (max as f64 / png.data.len() as f64).sqrt() * 0.95;
                scale = floor4(scale * shrink).min(scale - 0.0001).max(min_scale);
            }
            _ => {
                return Ok(Shot {
                    png,
                    scale,
                    encodes,
                })
            }
        }
    }
}

/// Converts a binary PPM (P6, maxval 255) into PNG at its own size.
pub fn ppm_to_png(data: &[u8]) -> Result<Png, ScreenError> {
    let frame = Frame::from_ppm(data.to_vec())?;
    scale_encode(&frame, frame.width, frame.height)
}

// ---------------------------------------------------------------------------------------------
// Capturing

/// Largest PPM read: the header and [`MAX_DIM`] x [`MAX_DIM`] pixels.
const MAX_PPM: usize = 32 + (MAX_DIM as usize) * (MAX_DIM as usize) * 3;

/// Why a capture failed.
#[derive(Debug)]
pub enum CaptureError {
    /// The monitor failed.
    Qmp(QmpError),
    /// The memory file or the temporary file failed.
    Io(String),
    /// QEMU's PPM is not one.
    Screen(ScreenError),
}

impl From<QmpError> for CaptureError {
    fn from(e: QmpError) -> Self {
        CaptureError::Qmp(e)
    }
}

impl std::fmt::Display for CaptureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CaptureError::Qmp(e) => write!(f, "{e}"),
            CaptureError::Io(m) => f.write_str(m),
            CaptureError::Screen(e) => write!(f, "{e}"),
        }
    }
}

/// How long a capture's command may wait for its reply: its own `limit`, or less when the
/// capture must end by `deadline`.
fn reply_wait(limit: Duration, deadline: Option<Instant>) -> Duration {
    deadline.map_or(limit, |d| {
        d.saturating_duration_since(Instant::now())
            .clamp(Duration::from_millis(1), limit)
    })
}

/// Captures the screen: into a memory file ([`capture_memfd`]), or through a temporary file in
/// `dir` (removed on every path) when this QEMU refuses the descriptor, or when it is older
/// than 9.0 and the guest is not running: those keep a removed fd set open until the guest
/// runs again, which would hold a descriptor (and the memory file's pages) in QEMU for every
/// screenshot of a paused VM.
pub fn capture(q: &mut Qmp, dir: &Path) -> Result<Frame, CaptureError> {
    capture_by(q, dir, None)
}

/// [`capture`], ending by `deadline` when one is given: each command waits for its reply at
/// most until then (a wedged monitor times out instead of holding the caller).
pub fn capture_by(
    q: &mut Qmp,
    dir: &Path,
    deadline: Option<Instant>,
) -> Result<Frame, CaptureError> {
    let closes_while_paused =
        crate::host::binaries::parse_version(&q.version).is_some_and(|v| v >= (9, 0, 0));
    if !closes_while_paused {
        let wait = reply_wait(super::qmp::COMMAND_TIMEOUT, deadline);
        let status = q.execute_within("query-status", None, wait)?;
        if status["running"] != json!(true) {
            return capture_file(q, dir, deadline);
        }
    }
    match capture_memfd(q, deadline)? {
        Some(frame) => Ok(frame),
        None => capture_file(q, dir, deadline),
    }
}

/// A memory file (sealable) and a write-only descriptor of it: `screendump` opens its file
/// write-only, and an fd set hands out only descriptors of the access mode asked for. (A pipe
/// would spare QEMU the page allocations, but `screendump` truncates its file, which a pipe
/// refuses.)
fn memfd() -> std::io::Result<(std::fs::File, std::fs::File)> {
    // SAFETY: memfd_create takes a NUL-terminated name and flags; the descriptor it returns
    // is owned by the File below.
    let fd = unsafe {
        libc::memfd_create(
            c"mcqemu-screendump".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    let write_only = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/self/fd/{fd}"))?;
    Ok((file, write_only))
}

/// Seals `file` against writes and resizing. F_SEAL_WRITE fails with EBUSY while a page of
/// the file has an extra reference (a pin, or a page not yet out of another CPU's LRU batch;
/// seen once in ~800 screendumps of vm_screen_wait on a loaded 2-core host), so then
/// F_SEAL_FUTURE_WRITE takes its place: it refuses every later write(2) and writable mapping
/// just the same, and checks no page references.
fn seal(file: &std::fs::File) -> std::io::Result<()> {
    let base = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    for write_seal in [libc::F_SEAL_WRITE, libc::F_SEAL_FUTURE_WRITE] {
        // SAFETY: fcntl on a descriptor owned by `file`, with an integer argument.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, base | write_seal) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(e);
        }
    }
    Err(std::io::Error::from_raw_os_error(libc::EBUSY))
}

/// Reads the PPM QEMU wrote into `file`, sealed first (no more writes, no resizing): what is
/// read is what QEMU wrote, however QEMU behaves from then on.
fn read_memfd(mut file: std::fs::File) -> Result<Vec<u8>, CaptureError> {
    if let Err(e) = seal(&file) {
        return Err(CaptureError::Io(format!(
            "cannot seal the screen dump: {e}"
        )));
    }
    let io = |e: std::io::Error| CaptureError::Io(format!("reading the screen dump: {e}"));
    let len = file.metadata().map_err(io)?.len();
    if len > MAX_PPM as u64 {
        return Err(CaptureError::Io(format!(
            "the screen dump is {len} bytes, more than a {MAX_DIM}x{MAX_DIM} screen"
        )));
    }
    let mut data = Vec::with_capacity(len as usize);
    file.read_to_end(&mut data).map_err(io)?;
    Ok(data)
}

/// Captures the screen into a memory file: a write-only descriptor of it goes into a new fd
/// set (`add-fd`), which `screendump` opens as `/dev/fdset/N`; the set is removed afterwards
/// on every path. `None`: no memory file, or QEMU refused the descriptor (nothing was
/// captured; a file may still work). Each command ends by `deadline` when one is given.
pub fn capture_memfd(
    q: &mut Qmp,
    deadline: Option<Instant>,
) -> Result<Option<Frame>, CaptureError> {
    let Ok((file, write_only)) = memfd() else {
        return Ok(None);
    };
    let added = match q.execute_with_fd(
        "add-fd",
        Some(json!({"opaque": "mcqemu-screendump"})),
        write_only.as_raw_fd(),
        reply_wait(Duration::from_secs(5), deadline),
    ) {
        Ok(v) => v,
        Err(QmpError::Command { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    drop(write_only);
    let set = added["fdset-id"].as_i64().ok_or_else(|| {
        CaptureError::Qmp(QmpError::Garbage(format!(
            "add-fd gave no fdset-id: {added}"
        )))
    })?;
    // One round trip for both: the monitor runs them in order, the removal after the dump.
    let replies = q.execute_pipelined(
        &[
            (
                "screendump",
                Some(json!({"filename": format!("/dev/fdset/{set}")})),
            ),
            ("remove-fd", Some(json!({"fdset-id": set}))),
        ],
        reply_wait(super::qmp::COMMAND_TIMEOUT, deadline),
    )?;
    if let Some(Err(e)) = replies.into_iter().next() {
        return Err(e.into());
    }
    let data = read_memfd(file)?;
    Frame::from_ppm(data)
        .map(Some)
        .map_err(CaptureError::Screen)
}

/// Captures the screen through a temporary file in `dir`, removed on every path; the
/// command ends by `deadline` when one is given.
pub fn capture_file(
    q: &mut Qmp,
    dir: &Path,
    deadline: Option<Instant>,
) -> Result<Frame, CaptureError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| CaptureError::Io(format!("cannot create {}: {e}", dir.display())))?;
    let file = TempCapture::new(dir, "ppm");
    q.execute_within(
        "screendump",
        Some(json!({"filename": file.0.display().to_string()})),
        reply_wait(super::qmp::COMMAND_TIMEOUT, deadline),
    )?;
    let data = std::fs::read(&file.0)
        .map_err(|e| CaptureError::Io(format!("QEMU wrote no screenshot: {e}")))?;
    Frame::from_ppm(data).map_err(CaptureError::Screen)
}

/// A temporary capture file, removed when dropped (success, error or timeout alike).
pub struct TempCapture(pub PathBuf);

impl TempCapture {
    /// A unique file name in `dir` for one capture.
    pub fn new(dir: &Path, ext: &str) -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        TempCapture(dir.join(format!(".screenshot-{}-{n}.{ext}", std::process::id())))
    }
}

impl Drop for TempCapture {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qemu::frame::tests::{decode, noisy};

    #[test]
    fn converts_ppm_to_a_png_of_the_same_size() {
        let mut ppm = b"P6\n# c\n2 3\n255\n".to_vec();
        ppm.extend(std::iter::repeat_n(7u8, 2 * 3 * 3));
        let png = ppm_to_png(&ppm).unwrap();
        assert_eq!((png.width, png.height), (2, 3));
        let (w, h, px) = decode(&png.data);
        assert_eq!((w, h), (2, 3));
        assert!(px.iter().all(|v| *v == 7));
    }

    #[test]
    fn rejects_bad_ppm() {
        assert!(ppm_to_png(b"P3\n1 1\n255\n").is_err());
        assert!(ppm_to_png(b"P6\n99999999 1\n255\n").is_err());
        assert!(ppm_to_png(b"P6\n2 2\n255\nabc").is_err());
        assert!(ppm_to_png(b"P6\n0 2\n255\n").is_err());
    }

    #[test]
    fn fits_the_bounds_and_rounds_the_scale_down() {
        let edge = Bounds {
            max_edge: Some(1568),
            ..Bounds::default()
        };
        assert_eq!(fit_scale(1920, 1080, &edge), 0.8166);
        assert_eq!(scaled_size(1920, 1080, 0.8166), (1568, 882));
        assert_eq!(fit_scale(3840, 2160, &edge), 0.4083);
        assert_eq!(scaled_size(3840, 2160, 0.4083), (1568, 882));
        // Portrait: the longer edge is the height.
        assert_eq!(
            scaled_size(1080, 1920, fit_scale(1080, 1920, &edge)),
            (882, 1568)
        );
        // Never up.
        assert_eq!(fit_scale(720, 400, &edge), 1.0);
        assert_eq!(scaled_size(720, 400, 1.0), (720, 400));
        // Every bound holds; the tightest wins.
        let b = Bounds {
            max_width: Some(1000),
            max_height: Some(300),
            ..Bounds::default()
        };
        let s = fit_scale(1920, 1080, &b);
        let (w, h) = scaled_size(1920, 1080, s);
        assert!(w <= 1000 && (299..=300).contains(&h), "{w}x{h} at {s}");
        for (sw, sh, m) in [(1921, 1081, 1568), (4097, 17, 1000), (16384, 16384, 32)] {
            let b = Bounds {
                max_edge: Some(m),
                ..Bounds::default()
            };
            let (w, h) = scaled_size(sw, sh, fit_scale(sw, sh, &b));
            assert!(
                w.max(h) <= m && w.max(h) >= m - 1,
                "{sw}x{sh} to {m}: {w}x{h}"
            );
        }
    }

    #[test]
    fn the_byte_budget_shrinks_the_image_until_it_fits() {
        let frame = noisy(800, 600);
        let b = Bounds {
            max_bytes: Some(100_000),
            ..Bounds::default()
        };
        let shot = render(&frame, &b).unwrap();
        assert!(shot.png.data.len() <= 100_000, "{}", shot.png.data.len());
        assert!(shot.encodes >= 2);
        assert!(shot.scale < 1.0);
        assert_eq!(
            (shot.png.width, shot.png.height),
            scaled_size(800, 600, shot.scale)
        );
        // Noise needs about 3 bytes a pixel: the budget is used, not squandered.
        assert!(shot.png.data.len() > 50_000, "{}", shot.png.data.len());
        // An image within every bound is returned as it is.
        let small = noisy(40, 30);
        let shot = render(&small, &b).unwrap();
        assert_eq!((shot.scale, shot.encodes, shot.png.width), (1.0, 1, 40));
        // A budget no image meets stops at the smallest edge.
        let b = Bounds {
            max_bytes: Some(10),
            ..Bounds::default()
        };
        let shot = render(&frame, &b).unwrap();
        assert_eq!(shot.png.width.max(shot.png.height), MIN_EDGE);
        assert_eq!(shot.encodes, 2);
    }

    #[test]
    fn reads_back_what_was_written_into_the_memory_file_and_seals_it() {
        let (file, mut write_only) = memfd().unwrap();
        let mut ppm = b"P6\n400 300\n255\n".to_vec();
        ppm.extend((0..400 * 300 * 3).map(|i| (i % 251) as u8));
        std::io::Write::write_all(&mut write_only, &ppm).unwrap();
        let keep = write_only.try_clone().unwrap();
        drop(write_only);
        let got = read_memfd(file).unwrap();
        assert_eq!(got, ppm);
        let frame = Frame::from_ppm(got).unwrap();
        assert_eq!((frame.width, frame.height), (400, 300));
        // Sealed: a writer that kept its descriptor can no longer change it.
        let mut keep = keep;
        assert!(std::io::Write::write_all(&mut keep, b"more").is_err());
    }

    #[test]
    fn a_capture_with_a_deadline_ends_by_it_when_the_monitor_stalls() {
        use std::io::{BufRead, BufReader, Write};
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        // A QEMU 7.2 that greets, negotiates, and then never answers (query-status first).
        let qemu = std::thread::spawn(move || {
            let mut w = theirs.try_clone().unwrap();
            let greeting =
                r#"{"QMP": {"version": {"qemu": {"major": 7, "minor": 2, "micro": 0}}}}"#;
            writeln!(w, "{greeting}").unwrap();
            let mut lines = BufReader::new(theirs).lines();
            let negotiate: serde_json::Value =
                serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
            writeln!(w, "{}", json!({"return": {}, "id": negotiate["id"]})).unwrap();
            // Hold the connection until the client gives up.
            for _ in lines {}
        });
        let mut q = Qmp::from_stream(ours, Duration::from_secs(2)).unwrap();
        let dir = std::env::temp_dir().join(format!("mcq-shot-{}", std::process::id()));
        let t = Instant::now();
        let got = capture_by(&mut q, &dir, Some(t + Duration::from_millis(300)));
        let took = t.elapsed();
        assert!(
            matches!(got, Err(CaptureError::Qmp(QmpError::Timeout(_)))),
            "{:?}",
            got.err()
        );
        assert!(took < Duration::from_secs(2), "took {took:?}");
        drop(q);
        qemu.join().unwrap();
        assert!(!dir.exists(), "nothing was written");
    }
}
