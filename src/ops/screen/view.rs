//! The live view's own operations: a frame of a VM's screen as soon as it differs from the one
//! the view shows (a long poll: nothing is sent while the screen holds still or only a cursor
//! blinks, see [`crate::ops::screen::blinks`]), and a batch of
//! the person's input (clicks on the scaled image, typed text, key chords, console text),
//! which passes a hold only with its secret.

use crate::ops::vm::serial_write::By;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ops::error::OpError;
use crate::ops::screen::{self, Wait};
use crate::ops::vm::hold::{self, Held};
use crate::ops::work::Work;
use crate::qemu::screen::Bounds;
use crate::qemu::{keys, vm};

crate::described! {
    /// Where the live view of a VM is.
    #[derive(Debug, Clone, serde::Serialize)]
    pub struct Opened {
        /// The VM.
        pub name: String,
        /// Its run state now.
        pub status: String,
        /// The view's resource.
        pub view: String,
        /// A person's hold, if one stands.
        pub held: Option<Held>,
        /// The same view from a shell.
        pub cli: String,
    }
}

/// The live view of VM `name` (resource `uri`), with its state now.
pub fn open(name: &str, uri: &str) -> Result<Opened, OpError> {
    let rec = crate::ops::vm::records::lookup(name)?;
    Ok(Opened {
        name: name.to_string(),
        status: crate::ops::vm::records::status_within(&rec, Duration::from_secs(2)),
        view: uri.to_string(),
        held: hold::of(&rec),
        cli: format!("mcqemu view {name}"),
    })
}

/// The longest one frame request waits for a change.
pub const MAX_WAIT: Duration = Duration::from_secs(25);
/// How often the screen is looked at while it holds still.
const POLL: Duration = Duration::from_millis(60);

/// A frame request.
#[derive(Debug, Clone)]
pub struct FrameRequest {
    /// The VM.
    pub name: String,
    /// The digest of the frame the view shows (None: any frame will do).
    pub since: Option<u64>,
    /// How long to wait for a change (at most [`MAX_WAIT`]).
    pub wait: Duration,
    /// The widest image the view can show (the image is scaled down to it).
    pub max_width: Option<u32>,
}

crate::described! {
    /// A frame, or word that the screen held still for the whole wait.
    #[derive(Debug, Clone, serde::Serialize)]
    pub struct Frame {
        /// The VM.
        pub name: String,
        /// Its run state now.
        pub status: String,
        /// The screen differs from `since` (false: no image, the view keeps its own).
        pub changed: bool,
        /// The screen's digest (the next request's `since`).
        pub hash: String,
        /// The image's width.
        pub width: u32,
        /// The image's height.
        pub height: u32,
        /// Image pixels per screen pixel.
        pub scale: f64,
        /// The screen's size.
        pub screen_width: u32,
        /// The screen's height.
        pub screen_height: u32,
        /// A person's hold on the VM, if one stands.
        pub held: Option<Held>,
        /// How long the request waited, in ms.
        pub waited_ms: u64,
        /// The PNG (empty when unchanged).
        #[serde(skip)]
        pub png: Vec<u8>,
    }
}

/// Waits (at most `req.wait`, or until the caller cancels; with progress) until the screen
/// differs from `since`, then returns it scaled to `max_width`.
pub fn frame(ctx: &dyn Work, req: &FrameRequest) -> Result<Frame, OpError> {
    let start = Instant::now();
    let deadline = start + req.wait.min(MAX_WAIT);
    let rec = crate::ops::vm::records::lookup_live(&req.name, "launch it first")?;
    let wait = Wait::Within {
        monitor: Duration::from_secs(2),
        all: Duration::from_secs(5),
    };
    loop {
        let grabbed = screen::grab(&req.name, &rec, wait).map_err(|e| {
            OpError::host(format!(
                "the screen of VM {:?} could not be read: {e}",
                req.name
            ))
        })?;
        let digest = grabbed.digest(None);
        // Only a cursor's blink since the view's frame is no change: no image goes out.
        let same = crate::ops::screen::blinks::observe(&req.name, digest, req.since);
        let changed = !same;
        let now = Instant::now();
        if changed || now >= deadline || ctx.cancelled() {
            let status = vm::measure_within(&rec, Duration::from_secs(1)).status;
            let held = crate::state::registry::shared()
                .load()
                .get(&req.name)
                .and_then(hold::of);
            let (w, h) = (grabbed.width, grabbed.height);
            let mut out = Frame {
                name: req.name.clone(),
                status: status.to_string(),
                changed,
                // Unchanged (or blinking): the view keeps the frame it has, and its hash.
                hash: screen::hash_text(if changed {
                    digest
                } else {
                    req.since.unwrap_or(digest)
                }),
                width: w,
                height: h,
                scale: 1.0,
                screen_width: w,
                screen_height: h,
                held,
                waited_ms: start.elapsed().as_millis() as u64,
                png: Vec::new(),
            };
            if changed {
                let bounds = Bounds {
                    max_width: req.max_width,
                    max_height: None,
                    max_edge: None,
                    max_bytes: None,
                };
                let cap = screen::finish(Arc::new(grabbed), &bounds)
                    .map_err(|e| OpError::host(format!("encoding the screen failed: {e}")))?;
                out.width = cap.shot.png.width;
                out.height = cap.shot.png.height;
                out.scale = cap.shot.scale;
                out.png = cap.shot.png.data;
            }
            return Ok(out);
        }
        ctx.progress(
            start.elapsed().as_secs_f64(),
            Some(req.wait.min(MAX_WAIT).as_secs_f64()),
            "the screen holds still",
        );
        std::thread::sleep(POLL.min(deadline - now));
    }
}

/// One input event of the person, as the view sends it.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Event {
    /// A click at (x, y) of the image the view shows, scaled by `scale` from a screen of
    /// `screen_width` x `screen_height` (vm_click's mapping).
    Click {
        /// Image pixel column.
        x: i64,
        /// Image pixel row.
        y: i64,
        /// The frame's scale.
        scale: f64,
        /// The frame's screen width.
        screen_width: u32,
        /// The frame's screen height.
        screen_height: u32,
        /// left, right or middle.
        #[serde(default)]
        button: Option<String>,
        /// Clicks (2: a double click).
        #[serde(default)]
        count: Option<u32>,
    },
    /// Text typed on a US layout (vm_type_text's path).
    Text {
        /// The text.
        text: String,
    },
    /// Key chords by vm_send_keys' names ("ctrl-a", "ret", "f2").
    Keys {
        /// The chords.
        keys: Vec<String>,
    },
    /// Text for the serial console.
    Serial {
        /// The text (a newline is sent as it is).
        text: String,
    },
}

/// An event's schema is an object's: its variants (by `type`) are the view's own, and serde
/// checks them.
impl crate::schema::Param for Event {
    fn param() -> serde_json::Value {
        <serde_json::Map<String, serde_json::Value> as crate::schema::Param>::param()
    }
}

/// Most events one batch may carry.
pub const MAX_EVENTS: usize = 64;

crate::described! {
    /// What a batch did.
    #[derive(Debug, Clone, Default, serde::Serialize)]
    pub struct Done {
        /// The VM.
        pub name: String,
        /// Clicks made.
        pub clicks: u32,
        /// Characters typed.
        pub characters: usize,
        /// Chords pressed.
        pub chords: usize,
        /// Bytes written to the serial console.
        pub serial_bytes: usize,
        /// The characters of the text events that have no key on the US layout, in order: left
        /// out, the rest typed around them (a person's typing is never dropped whole).
        pub not_typed: String,
    }
}

/// Sends the person's `events` to VM `name`, in order; a hold must be passed with its secret.
/// A cancel stops between events (and releases any key a chord held).
pub fn input(
    ctx: &dyn Work,
    name: &str,
    secret: Option<&str>,
    events: &[Event],
) -> Result<Done, OpError> {
    if events.len() > MAX_EVENTS {
        return Err(OpError::invalid(format!(
            "{} events in one batch; at most {MAX_EVENTS}",
            events.len()
        )));
    }
    hold::check_view(name, secret)?;
    let rec = crate::ops::vm::records::lookup_live(name, "launch it first")?;
    let mut done = Done {
        name: name.to_string(),
        ..Done::default()
    };
    for e in events {
        ctx.check_cancel()?;
        if let Event::Serial { text } = e {
            done.serial_bytes += crate::ops::vm::serial_write::write(name, text, By::View)?.bytes;
            continue;
        }
        let plan = plan(e, &mut done)?;
        crate::ops::session::monitor(name, &rec, |q| {
            Ok(crate::ops::screen::input::run(q, &plan, rec.pid, ctx)?)
        })?;
    }
    Ok(done)
}

/// The input-send-event plan of one event (not a serial one), counted into `done`.
fn plan(e: &Event, done: &mut Done) -> Result<Vec<crate::ops::screen::input::Step>, OpError> {
    Ok(match e {
        Event::Click {
            x,
            y,
            scale,
            screen_width,
            screen_height,
            button,
            count,
        } => {
            let (w, h) = (*screen_width, *screen_height);
            let at = crate::ops::screen::pointer::screen_point(*x, *y, *scale, w, h).ok_or_else(
                || OpError::invalid(format!("({x}, {y}) is outside the image at scale {scale}")),
            )?;
            let btn = match button.as_deref().unwrap_or("left") {
                b @ ("left" | "right" | "middle") => b.to_string(),
                other => return Err(OpError::invalid(format!("unknown button {other:?}"))),
            };
            done.clicks += 1;
            crate::ops::screen::pointer::click_plan(at, (w, h), &btn, count.unwrap_or(1), &[])
        }
        Event::Text { text } => {
            let typable: String = text
                .chars()
                .filter(|c| {
                    let ok = keys::us_key(*c).is_some();
                    if !ok {
                        done.not_typed.push(*c);
                    }
                    ok
                })
                .collect();
            let events =
                keys::type_events(&typable).map_err(|e| OpError::invalid(e.to_string()))?;
            done.characters += events.len();
            // vm_type_text's default pace: the guest drains the emulated keyboard in time
            // even on a loaded host.
            crate::ops::screen::keyboard::text_plan(&events, Duration::from_millis(30))
        }
        Event::Keys { keys: specs } => {
            let chords: Vec<Vec<&'static str>> = specs
                .iter()
                .map(|s| keys::chord(s).map_err(|e| OpError::invalid(e.to_string())))
                .collect::<Result<_, _>>()?;
            done.chords += chords.len();
            // vm_send_keys' default hold and delay.
            crate::ops::screen::keyboard::chord_plan(
                &chords,
                Duration::from_millis(100),
                Duration::from_millis(50),
            )
        }
        Event::Serial { .. } => Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_parse_in_their_own_shape_only() {
        let e: Event = serde_json::from_value(serde_json::json!(
            {"type": "click", "x": 3, "y": 4, "scale": 0.5, "screen_width": 800,
             "screen_height": 600}
        ))
        .unwrap();
        assert!(matches!(e, Event::Click { x: 3, .. }));
        let bad = serde_json::from_value::<Event>(serde_json::json!(
            {"type": "text", "text": "a", "extra": 1}
        ));
        assert!(bad.is_err());
        let mut done = Done::default();
        let p = plan(
            &Event::Keys {
                keys: vec!["ctrl-a".into()],
            },
            &mut done,
        )
        .unwrap();
        assert!(!p.is_empty());
        assert_eq!(done.chords, 1);
        // An untypable character is left out and reported; the rest is typed, in order.
        let p = plan(
            &Event::Text {
                text: "xéy".into()
            },
            &mut done,
        )
        .unwrap();
        assert_eq!(done.characters, 2);
        assert_eq!(done.not_typed, "é");
        let downs: Vec<String> = p
            .iter()
            .filter_map(|s| match s {
                crate::ops::screen::input::Step::Send(evs) => Some(format!("{evs:?}")),
                _ => None,
            })
            .collect();
        let all = downs.join(" ");
        let (x, y) = (all.find("\"x\"").unwrap(), all.find("\"y\"").unwrap());
        assert!(x < y, "{all}");
        let far = Event::Click {
            x: 900,
            y: 1,
            scale: 0.5,
            screen_width: 800,
            screen_height: 600,
            button: None,
            count: None,
        };
        assert!(plan(&far, &mut done).is_err());
    }
}
