//! Reading a guest's input events back: `od -An -v -tx1` of /dev/input/eventN parsed into
//! evdev records, and the event nodes /proc/bus/input/devices names. Shared by the tests that
//! check keys, clicks and motion arrived (see_and_drive, screenshots, arm64).

/// One evdev record: (type, code, value).
pub type Ev = (u16, u16, i32);

/// Event types and the left button.
pub const EV_KEY: u16 = 1;
pub const EV_REL: u16 = 2;
pub const EV_ABS: u16 = 3;
pub const BTN_LEFT: u16 = 0x110;

/// Parses `od -An -v -tx1` output into 24-byte input_event records (64-bit guests).
pub fn parse_events(hex: &str) -> Vec<Ev> {
    let bytes: Vec<u8> = hex
        .split_whitespace()
        .map(|t| u8::from_str_radix(t, 16).expect("od hex byte"))
        .collect();
    assert_eq!(bytes.len() % 24, 0, "partial input_event records");
    bytes
        .chunks(24)
        .map(|r| {
            (
                u16::from_le_bytes([r[16], r[17]]),
                u16::from_le_bytes([r[18], r[19]]),
                i32::from_le_bytes([r[20], r[21], r[22], r[23]]),
            )
        })
        .collect()
}

/// /dev/input/eventN of every device in `devices` (/proc/bus/input/devices) whose name
/// matches `pred`.
pub fn event_nodes(devices: &str, pred: impl Fn(&str) -> bool) -> Vec<String> {
    let mut out = Vec::new();
    for block in devices.split("\n\n") {
        let name = block
            .lines()
            .find_map(|l| l.strip_prefix("N: Name=\""))
            .map(|n| n.trim_end_matches('"'));
        if !name.is_some_and(&pred) {
            continue;
        }
        let handlers = block.lines().find_map(|l| l.strip_prefix("H: Handlers="));
        if let Some(ev) =
            handlers.and_then(|h| h.split_whitespace().find(|h| h.starts_with("event")))
        {
            out.push(format!("/dev/input/{ev}"));
        }
    }
    out
}

/// The first of [`event_nodes`].
pub fn event_node(devices: &str, pred: impl Fn(&str) -> bool) -> Option<String> {
    event_nodes(devices, pred).into_iter().next()
}
