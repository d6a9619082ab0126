//! What QMP and the guest agent have in common: one JSON message per line, read with a deadline
//! and a size cap, and replies that carry either `return` or `error`. Both clients decode
//! through here, so a reply means the same thing whichever channel it came from.

use std::time::Instant;

use serde_json::Value;

use super::sock::{LineError, LineStream};

/// Why no message could be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// The deadline passed first.
    Timeout,
    /// The peer closed the connection.
    Closed,
    /// A message grew past the cap.
    TooLarge,
    /// A line that is not JSON (its start, for the message).
    Garbage(String),
}

impl From<LineError> for WireError {
    fn from(e: LineError) -> Self {
        match e {
            LineError::Timeout => WireError::Timeout,
            LineError::Closed => WireError::Closed,
            LineError::TooLarge => WireError::TooLarge,
        }
    }
}

/// A decoded reply to a command.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// The command's `return` value.
    Return(Value),
    /// The command failed: QEMU's (or the agent's) error class and description.
    Error {
        /// Error class, e.g. `GenericError`.
        class: String,
        /// Human-readable description.
        desc: String,
    },
}

/// Reads the next non-blank line before `deadline` and parses it as JSON. `strip` removes
/// bytes the protocol uses as delimiters (the agent's 0xFF resync marker) before parsing.
pub fn read_message(
    conn: &mut LineStream,
    deadline: Instant,
    strip: Option<u8>,
) -> Result<Value, WireError> {
    loop {
        let mut line = conn.read_line(deadline)?;
        if let Some(b) = strip {
            line.retain(|c| *c != b);
        }
        match parse_line(&line)? {
            Some(v) => return Ok(v),
            None => continue,
        }
    }
}

/// Parses one line: Ok(None) when it is blank, the JSON value otherwise.
pub fn parse_line(line: &[u8]) -> Result<Option<Value>, WireError> {
    let text = line.trim_ascii();
    if text.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice(text)
        .map(Some)
        .map_err(|_| WireError::Garbage(truncate(&String::from_utf8_lossy(text))))
}

/// The reply a message carries, or None when it has neither `return` nor `error` (an event,
/// a greeting, or something unexpected).
pub fn decode_reply(m: &Value) -> Option<Reply> {
    if let Some(r) = m.get("return") {
        return Some(Reply::Return(r.clone()));
    }
    let e = m.get("error")?;
    Some(Reply::Error {
        class: e
            .get("class")
            .and_then(Value::as_str)
            .unwrap_or("GenericError")
            .to_string(),
        desc: e
            .get("desc")
            .and_then(Value::as_str)
            .unwrap_or("unknown error")
            .to_string(),
    })
}

/// The first 200 characters of `s`, marked when cut: enough to recognise garbage in a message.
pub fn truncate(s: &str) -> String {
    let cut: String = s.chars().take(200).collect();
    if cut.len() < s.len() {
        format!("{cut}...")
    } else {
        cut
    }
}

/// A JSON value shortened for an error message.
pub fn brief(v: &Value) -> String {
    truncate(&v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lines_parse_to_json_or_garbage() {
        assert_eq!(parse_line(b"  \r"), Ok(None));
        assert_eq!(parse_line(b"{\"a\":1}\r"), Ok(Some(json!({"a": 1}))));
        assert!(matches!(parse_line(b"oops"), Err(WireError::Garbage(g)) if g == "oops"));
        let long = vec![b'x'; 500];
        assert!(matches!(parse_line(&long), Err(WireError::Garbage(g)) if g.ends_with("...")));
    }

    #[test]
    fn replies_decode_return_error_or_neither() {
        assert_eq!(
            decode_reply(&json!({"return": {}, "id": 1})),
            Some(Reply::Return(json!({})))
        );
        assert_eq!(
            decode_reply(&json!({"error": {"class": "CommandNotFound", "desc": "no"}})),
            Some(Reply::Error {
                class: "CommandNotFound".into(),
                desc: "no".into()
            })
        );
        assert_eq!(
            decode_reply(&json!({"error": 5})),
            Some(Reply::Error {
                class: "GenericError".into(),
                desc: "unknown error".into()
            })
        );
        assert_eq!(decode_reply(&json!({"event": "STOP"})), None);
    }
}
