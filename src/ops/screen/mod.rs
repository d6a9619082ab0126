//! A VM's screen and input: captures, the memory of the last screen returned, waits for a
//! change (`wait`, `watch`), keys and pointer gestures as QMP input events, a person's hold,
//! and the live view's frames.
//!
//! A VM's screen as a bounded PNG: the one capture `vm_screenshot` and the screen resource
//! share. The monitor is held for the capture only; scaling and encoding happen after it.

pub mod blinks;
pub mod consoles;
pub mod input;
pub mod keyboard;
pub mod memory;
pub mod mouse;
pub mod pointer;
pub mod view;
pub mod wait;
pub mod watch;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ops::error::OpError;
use crate::ops::session::SessionError;
use crate::qemu::qmp::{self, Qmp, QmpError};
use crate::qemu::screen::{self, CaptureError, Frame, ScreenError, Shot};
use crate::qemu::vm;
use crate::state::registry::Record;

/// The image bounds and their limits, as the screen tools' parameters state them.
pub use crate::qemu::screen::{
    Bounds, Rect, DEFAULT_MAX_BYTES, DEFAULT_MAX_EDGE, MAX_DIM, MIN_EDGE,
};

/// How long a capture may wait for the VM's monitor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Behind this process's other sessions with the VM for as long as they take, then QEMU's
    /// greeting and each command within their own timeouts (`vm_screenshot`).
    Queue,
    /// For a read that must answer in time whatever QEMU does: the session lock and QEMU's
    /// greeting within `monitor`, the whole capture within `all`.
    Within {
        /// The longest wait for the session lock and the greeting together.
        monitor: Duration,
        /// The longest the capture takes, the wait for the monitor included.
        all: Duration,
    },
}

/// The bounds of an image handed to a model as it is: `vm_screenshot`'s inline defaults
/// (longer edge [`screen::DEFAULT_MAX_EDGE`], PNG [`screen::DEFAULT_MAX_BYTES`]).
pub const INLINE: Bounds = Bounds {
    max_width: None,
    max_height: None,
    max_edge: Some(screen::DEFAULT_MAX_EDGE),
    max_bytes: Some(screen::DEFAULT_MAX_BYTES),
};

/// A captured screen: its size, its digest, and the PNG within the bounds asked for.
pub struct Capture {
    /// The captured frame, full size.
    pub frame: Arc<Frame>,
    /// The frame's digest ([`Frame::digest`] of the whole screen): what `hash` reports.
    pub hash: u64,
    /// The screen's width in pixels.
    pub screen_width: u32,
    /// The screen's height in pixels.
    pub screen_height: u32,
    /// The image, scaled down to the bounds.
    pub shot: Shot,
}

/// Captures the screen of VM `name` (record `rec`) within `bounds`, waiting for its monitor as
/// `wait` says. A temporary capture file, where QEMU needs one, goes into the VM's state
/// folder and is removed on every path. A monitor failure is [`CaptureError::Qmp`], for the
/// caller to explain in terms of the VM.
pub fn capture(
    name: &str,
    rec: &Record,
    bounds: &Bounds,
    wait: Wait,
) -> Result<Capture, CaptureError> {
    let frame = grab(name, rec, wait)?;
    finish(Arc::new(frame), bounds).map_err(CaptureError::Screen)
}

/// The screen of VM `name` as QEMU dumps it, unscaled and unencoded (see [`capture`]).
pub fn grab(name: &str, rec: &Record, wait: Wait) -> Result<Frame, CaptureError> {
    let dir = vm::state_dir(name);
    let socket = vm::qmp_socket(rec);
    match wait {
        Wait::Queue => qmp::with_session(&socket, |q| screen::capture(q, &dir)),
        Wait::Within { monitor, all } => {
            let deadline = Instant::now() + all;
            qmp::with_session_within(&socket, monitor.min(all), |q| {
                screen::capture_by(q, &dir, Some(deadline))
            })
        }
    }
}

/// A captured frame made into a [`Capture`]: scaled and encoded within `bounds`, and digested.
pub fn finish(frame: Arc<Frame>, bounds: &Bounds) -> Result<Capture, ScreenError> {
    let shot = screen::render(&frame, bounds)?;
    Ok(Capture {
        screen_width: frame.width,
        screen_height: frame.height,
        hash: frame.digest(None),
        frame,
        shot,
    })
}

/// A digest as the tools show it: 16 lower-case hex digits.
pub fn hash_text(hash: u64) -> String {
    format!("{hash:016x}")
}

/// A digest from its text ([`hash_text`]); `None` when it is not 1-16 hex digits.
pub fn parse_hash(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(text, 16).ok()
}

/// Captures the screen within an open monitor session (a pipe, or a temporary file in the VM's
/// state folder, removed on every path): for the input tools that need its size first.
pub fn capture_in(q: &mut Qmp, name: &str) -> Result<Frame, SessionError<QmpError>> {
    screen::capture(q, &vm::state_dir(name)).map_err(|e| match e {
        CaptureError::Qmp(e) => SessionError::Channel(e),
        other => OpError::host(format!("screenshot of {name:?} failed: {other}")).into(),
    })
}

/// vm_screenshot's request: the VM, the image's bounds, and a file to save the PNG to (checked
/// against the roots) instead of returning it.
pub struct ScreenshotRequest {
    /// The VM.
    pub name: String,
    /// The image's bounds.
    pub bounds: Bounds,
    /// Save the PNG here (a temporary beside it renamed into place) instead of returning it.
    pub save_to: Option<std::path::PathBuf>,
}

crate::described! {
    /// A captured screen's image as the screen tools report it (vm_screenshot,
    /// vm_screen_wait): its size and scale, the screen's, and the screen's digest.
    #[derive(Debug, Clone, serde::Serialize)]
    pub struct Picture {
        /// The image's width.
        pub width: u32,
        /// The image's height.
        pub height: u32,
        /// The image's size divided by the screen's.
        pub scale: f64,
        /// The screen's width.
        pub screen_width: u32,
        /// The screen's height.
        pub screen_height: u32,
        /// The PNG's size.
        pub bytes: usize,
        /// Always "png".
        pub format: &'static str,
        /// A digest of the screen's pixels ([`hash_text`]): a later vm_screen_wait's `since`.
        pub hash: String,
    }
}

impl Picture {
    /// What `cap` shows.
    pub fn of(cap: &Capture) -> Picture {
        Picture {
            width: cap.shot.png.width,
            height: cap.shot.png.height,
            scale: cap.shot.scale,
            screen_width: cap.screen_width,
            screen_height: cap.screen_height,
            bytes: cap.shot.png.data.len(),
            format: "png",
            hash: hash_text(cap.hash),
        }
    }
}

crate::described! {
    /// What vm_screenshot reports (the tool's structured result).
    #[derive(Debug, Clone, serde::Serialize)]
    pub struct Screenshot {
        /// The VM.
        pub name: String,
        /// The image.
        #[serde(flatten)]
        pub picture: Picture,
        /// Where the PNG was saved, when it was.
        pub path: Option<String>,
    }
}

/// Takes a screenshot: the PNG back when it was not saved to a file. The screen is remembered
/// as the one last returned (vm_screen_wait's baseline).
pub fn screenshot(req: &ScreenshotRequest) -> Result<(Screenshot, Option<Vec<u8>>), OpError> {
    let name = &req.name;
    let rec = crate::ops::vm::records::lookup_live(name, "launch it first")?;
    // The one capture path (the screen resource takes it too): the monitor is held for the
    // capture only; scaling and encoding happen after it.
    let got = capture(name, &rec, &req.bounds, Wait::Queue).map_err(|e| match e {
        CaptureError::Qmp(e) => OpError::host(crate::ops::session::explain_qmp(name, &rec, &e)),
        other => OpError::host(format!("screenshot of {name:?} failed: {other}")),
    })?;
    memory::remember(name, vec![got.frame.clone()]);
    let mut out = Screenshot {
        name: name.clone(),
        picture: Picture::of(&got),
        path: None,
    };
    let png = got.shot.png.data;
    let Some(p) = &req.save_to else {
        return Ok((out, Some(png)));
    };
    // A temporary file beside the target, renamed into place, all relative to the folder
    // opened beneath its root: no symlink is followed, and a failed write leaves nothing.
    crate::state::beneath::write_replace(p, &png).map_err(|e| {
        OpError::host(format!(
            "cannot save the screenshot to {}: {e}",
            p.display()
        ))
    })?;
    out.path = Some(p.display().to_string());
    Ok((out, None))
}
