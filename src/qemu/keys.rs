//! The key table: QEMU qcodes, friendly aliases, chords, and the US layout for typing text.

use super::qmp_calls::InputEvent;

/// Every qcode QEMU's QKeyCode enum defines that a user may want to press.
const QCODES: &[&str] = &[
    "shift",
    "shift_r",
    "alt",
    "alt_r",
    "ctrl",
    "ctrl_r",
    "menu",
    "esc",
    "1",
    "2",
    "3",
    "4",
    "5",
    "6",
    "7",
    "8",
    "9",
    "0",
    "minus",
    "equal",
    "backspace",
    "tab",
    "q",
    "w",
    "e",
    "r",
    "t",
    "y",
    "u",
    "i",
    "o",
    "p",
    "bracket_left",
    "bracket_right",
    "ret",
    "a",
    "s",
    "d",
    "f",
    "g",
    "h",
    "j",
    "k",
    "l",
    "semicolon",
    "apostrophe",
    "grave_accent",
    "backslash",
    "z",
    "x",
    "c",
    "v",
    "b",
    "n",
    "m",
    "comma",
    "dot",
    "slash",
    "asterisk",
    "spc",
    "caps_lock",
    "f1",
    "f2",
    "f3",
    "f4",
    "f5",
    "f6",
    "f7",
    "f8",
    "f9",
    "f10",
    "num_lock",
    "scroll_lock",
    "kp_divide",
    "kp_multiply",
    "kp_subtract",
    "kp_add",
    "kp_enter",
    "kp_decimal",
    "sysrq",
    "kp_0",
    "kp_1",
    "kp_2",
    "kp_3",
    "kp_4",
    "kp_5",
    "kp_6",
    "kp_7",
    "kp_8",
    "kp_9",
    "less",
    "f11",
    "f12",
    "print",
    "home",
    "pgup",
    "pgdn",
    "end",
    "left",
    "up",
    "down",
    "right",
    "insert",
    "delete",
    "meta_l",
    "meta_r",
    "compose",
    "pause",
    "power",
    "sleep",
    "wake",
    "audionext",
    "audioprev",
    "audiostop",
    "audioplay",
    "audiomute",
    "volumeup",
    "volumedown",
    "kp_equals",
    "kp_comma",
    "help",
];

const ALIASES: &[(&str, &str)] = &[
    ("enter", "ret"),
    ("return", "ret"),
    ("escape", "esc"),
    ("space", "spc"),
    ("bksp", "backspace"),
    ("del", "delete"),
    ("ins", "insert"),
    ("win", "meta_l"),
    ("super", "meta_l"),
    ("meta", "meta_l"),
    ("cmd", "meta_l"),
    ("lwin", "meta_l"),
    ("rwin", "meta_r"),
    ("pageup", "pgup"),
    ("pagedown", "pgdn"),
    ("pgdown", "pgdn"),
    ("arrowup", "up"),
    ("arrowdown", "down"),
    ("arrowleft", "left"),
    ("arrowright", "right"),
    ("control", "ctrl"),
    ("lctrl", "ctrl"),
    ("ctrl_l", "ctrl"),
    ("rctrl", "ctrl_r"),
    ("lalt", "alt"),
    ("alt_l", "alt"),
    ("ralt", "alt_r"),
    ("altgr", "alt_r"),
    ("lshift", "shift"),
    ("shift_l", "shift"),
    ("rshift", "shift_r"),
    ("capslock", "caps_lock"),
    ("caps", "caps_lock"),
    ("numlock", "num_lock"),
    ("scrolllock", "scroll_lock"),
    ("printscreen", "print"),
    ("prtsc", "print"),
    ("break", "pause"),
    ("-", "minus"),
    ("=", "equal"),
    ("[", "bracket_left"),
    ("]", "bracket_right"),
    (";", "semicolon"),
    ("'", "apostrophe"),
    ("`", "grave_accent"),
    ("\\", "backslash"),
    (",", "comma"),
    (".", "dot"),
    ("/", "slash"),
    ("*", "kp_multiply"),
    ("period", "dot"),
    ("grave", "grave_accent"),
    ("quote", "apostrophe"),
];

/// A key press or release by qcode, as QMP's `input-send-event` takes it.
pub fn key_event(qcode: &str, down: bool) -> InputEvent {
    InputEvent::Key {
        qcode: qcode.to_string(),
        down,
    }
}

/// Maps one key name (qcode or alias, case-insensitive) to its qcode.
pub fn qcode(name: &str) -> Option<&'static str> {
    let lower = name.trim().to_ascii_lowercase();
    if let Some(q) = QCODES.iter().find(|q| **q == lower) {
        return Some(q);
    }
    ALIASES.iter().find(|(a, _)| *a == lower).map(|(_, q)| *q)
}

/// A key, chord or character that cannot be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// The spec has an empty part, e.g. `ctrl-` or `a--b`.
    NotAChord(String),
    /// A part names no qcode or alias.
    UnknownKey {
        /// The unknown part.
        key: String,
        /// The whole spec it was in.
        spec: String,
    },
    /// A character with no key on the US layout.
    Untypable {
        /// The character.
        c: char,
        /// Its position in the text, in characters.
        position: usize,
    },
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyError::NotAChord(spec) => write!(
                f,
                "key {spec:?} is not a key or chord; write chords like \"ctrl-alt-del\""
            ),
            KeyError::UnknownKey { key, spec } => write!(
                f,
                "unknown key {key:?} in {spec:?}; use QEMU qcodes (a, ret, f1, ctrl, ...) or \
                 aliases (enter, esc, space, win, pgup, ...)"
            ),
            KeyError::Untypable { c, position } => write!(
                f,
                "character {c:?} at position {position} cannot be typed on a US keyboard \
                 layout; type ASCII text, and use vm_send_keys for special keys"
            ),
        }
    }
}

impl std::error::Error for KeyError {}

/// Parses a chord such as `ctrl-alt-del`, `ctrl+c` or `shift-a` into qcodes.
pub fn chord(spec: &str) -> Result<Vec<&'static str>, KeyError> {
    let s = spec.trim();
    if let Some(q) = qcode(s) {
        return Ok(vec![q]);
    }
    let sep = if s.contains('+') { '+' } else { '-' };
    let mut parts: Vec<&str> = s.split(sep).collect();
    // A trailing separator means the separator key itself, e.g. "ctrl--" or "ctrl++".
    if parts.len() >= 2 && parts[parts.len() - 1].is_empty() && parts[parts.len() - 2].is_empty() {
        parts.truncate(parts.len() - 2);
        parts.push(if sep == '-' { "minus" } else { "equal" });
    }
    if parts.iter().any(|p| p.is_empty()) {
        return Err(KeyError::NotAChord(spec.to_string()));
    }
    let mut out: Vec<&'static str> = Vec::new();
    for p in &parts {
        let keys = part_keys(p).ok_or_else(|| KeyError::UnknownKey {
            key: p.to_string(),
            spec: spec.to_string(),
        })?;
        for k in keys {
            if !out.contains(&k) {
                out.push(k);
            }
        }
    }
    Ok(out)
}

/// The keys of one chord part: a qcode or alias, or a character of the US layout, with shift
/// before it when the character needs it (`ctrl-!` is ctrl, shift and 1, as pressed).
fn part_keys(part: &str) -> Option<Vec<&'static str>> {
    if let Some(q) = qcode(part) {
        return Some(vec![q]);
    }
    let mut chars = part.chars();
    let (c, None) = (chars.next()?, chars.next()) else {
        return None;
    };
    let (q, shift) = us_key(c)?;
    Some(if shift { vec!["shift", q] } else { vec![q] })
}

/// The US-layout key for a character: (qcode, shift held).
pub fn us_key(c: char) -> Option<(&'static str, bool)> {
    const UNSHIFTED: &str = "`1234567890-=[]\\;',./";
    const SHIFTED: &str = "~!@#$%^&*()_+{}|:\"<>?";
    const NAMES: &[&str] = &[
        "grave_accent",
        "1",
        "2",
        "3",
        "4",
        "5",
        "6",
        "7",
        "8",
        "9",
        "0",
        "minus",
        "equal",
        "bracket_left",
        "bracket_right",
        "backslash",
        "semicolon",
        "apostrophe",
        "comma",
        "dot",
        "slash",
    ];
    match c {
        'a'..='z' => QCODES
            .iter()
            .find(|q| q.len() == 1 && q.starts_with(c))
            .map(|q| (*q, false)),
        'A'..='Z' => us_key(c.to_ascii_lowercase()).map(|(q, _)| (q, true)),
        ' ' => Some(("spc", false)),
        '\n' => Some(("ret", false)),
        '\t' => Some(("tab", false)),
        _ => {
            if let Some(i) = UNSHIFTED.chars().position(|u| u == c) {
                return Some((NAMES[i], false));
            }
            SHIFTED
                .chars()
                .position(|u| u == c)
                .map(|i| (NAMES[i], true))
        }
    }
}

/// One key press or release for `input-send-event`.
pub type KeyEvent = (&'static str, bool);

/// The events that type `text` on a US layout, or the first character that cannot be typed.
pub fn type_events(text: &str) -> Result<Vec<Vec<KeyEvent>>, KeyError> {
    text.chars()
        .enumerate()
        .map(|(i, c)| {
            let (q, shift) = us_key(c).ok_or(KeyError::Untypable { c, position: i })?;
            Ok(if shift {
                vec![("shift", true), (q, true), (q, false), ("shift", false)]
            } else {
                vec![(q, true), (q, false)]
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chords_and_aliases() {
        assert_eq!(
            chord("ctrl-alt-del").unwrap(),
            vec!["ctrl", "alt", "delete"]
        );
        assert_eq!(chord("Ctrl+C").unwrap(), vec!["ctrl", "c"]);
        assert_eq!(chord("enter").unwrap(), vec!["ret"]);
        assert_eq!(chord("-").unwrap(), vec!["minus"]);
        assert_eq!(chord("ctrl--").unwrap(), vec!["ctrl", "minus"]);
        assert_eq!(chord("win").unwrap(), vec!["meta_l"]);
        assert!(chord("ctrl-bogus").is_err());
        assert!(chord("").is_err());
        // A chord as a person presses it: shift kept, punctuation by its key.
        assert_eq!(chord("ctrl-shift-a").unwrap(), vec!["ctrl", "shift", "a"]);
        assert_eq!(chord("ctrl-!").unwrap(), vec!["ctrl", "shift", "1"]);
        assert_eq!(chord("ctrl-shift-1").unwrap(), vec!["ctrl", "shift", "1"]);
        assert_eq!(chord("alt-?").unwrap(), vec!["alt", "shift", "slash"]);
        assert!(chord("ctrl-é").is_err());
    }

    #[test]
    fn us_layout_covers_printable_ascii() {
        for c in (32u8..127).map(char::from) {
            assert!(us_key(c).is_some(), "{c:?}");
        }
        assert_eq!(us_key('A'), Some(("a", true)));
        assert_eq!(us_key('"'), Some(("apostrophe", true)));
        assert_eq!(us_key('\\'), Some(("backslash", false)));
        assert!(us_key('é').is_none());
        assert!(type_events("héllo")
            .unwrap_err()
            .to_string()
            .contains("position 1"));
    }
}
