//! The agent's request reader: the bytes from the host's channel, cut into requests the way
//! qemu-ga cuts them. A request is one JSON object (newlines optional); a 0xFF byte, which the
//! host sends before `guest-sync-delimited`, throws away whatever was partly read; anything
//! that is not an object, or grows past [`MAX_REQUEST`], becomes one error and reading goes on
//! after it. Nothing here blocks or allocates past the cap: it is fed what a read returned.

use super::json::{self, Json};

/// The largest request taken (a guest-file-write of 1 MiB is ~1.4 MB of base64; qemu-ga's
/// own parser allows 64 MiB, the host never sends more than a few MB).
pub const MAX_REQUEST: usize = 32 << 20;

/// What one request turned out to be.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// A parsed object.
    Request(Json),
    /// Bytes that are not a request: why (answered with qemu-ga's GenericError shape).
    Bad(String),
}

/// Cuts a byte stream into requests.
#[derive(Debug, Default)]
pub struct Reader {
    buf: Vec<u8>,
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// Skipping the rest of an oversized request, up to its end.
    skipping: bool,
}

impl Reader {
    /// A reader with nothing buffered.
    pub fn new() -> Reader {
        Reader::default()
    }

    /// Takes `bytes` as read; returns the requests they completed, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Incoming> {
        let mut out = Vec::new();
        for &b in bytes {
            if b == 0xFF {
                // The sync marker: a fresh start, whatever came before.
                self.reset();
                continue;
            }
            if self.depth == 0 && !self.in_string {
                match b {
                    b' ' | b'\t' | b'\r' | b'\n' => continue,
                    b'{' | b'[' => {}
                    _ => {
                        out.push(Incoming::Bad(format!(
                            "JSON parse error, invalid character 0x{b:02x} outside a request"
                        )));
                        continue;
                    }
                }
            }
            if !self.skipping {
                self.buf.push(b);
            }
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
            } else {
                match b {
                    b'"' => self.in_string = true,
                    b'{' | b'[' => self.depth += 1,
                    b'}' | b']' => self.depth = self.depth.saturating_sub(1),
                    _ => {}
                }
            }
            if self.buf.len() > MAX_REQUEST && !self.skipping {
                self.skipping = true;
                self.buf = Vec::new();
                out.push(Incoming::Bad(format!(
                    "JSON parse error, a request larger than {MAX_REQUEST} bytes"
                )));
            }
            if self.depth == 0 && !self.in_string {
                if !self.skipping {
                    out.push(match json::parse(&self.buf) {
                        Ok(v @ Json::Obj(_)) => Incoming::Request(v),
                        Ok(_) => Incoming::Bad("Expected 'object' (a request)".into()),
                        Err(e) => Incoming::Bad(format!("JSON parse error, {e}")),
                    });
                }
                self.reset();
            }
        }
        out
    }

    fn reset(&mut self) {
        self.buf.clear();
        self.depth = 0;
        self.in_string = false;
        self.escaped = false;
        self.skipping = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requests(chunks: &[&[u8]]) -> Vec<Incoming> {
        let mut r = Reader::new();
        chunks.iter().flat_map(|c| r.push(c)).collect()
    }

    #[test]
    fn cuts_requests_across_reads_and_resyncs_on_0xff() {
        let got = requests(&[
            b"{\"execute\":\"guest-ping\"}\n{\"exec",
            b"ute\":\"a}\\\"{\"}",
            b"{\"partial\": [1, 2\xff{\"execute\":\"guest-sync-delimited\",\"arguments\":{\"id\":7}}",
        ]);
        assert_eq!(got.len(), 3, "{got:?}");
        let name = |i: &Incoming| match i {
            Incoming::Request(v) => v.get("execute").and_then(Json::as_str).map(str::to_string),
            Incoming::Bad(_) => None,
        };
        assert_eq!(name(&got[0]).as_deref(), Some("guest-ping"));
        assert_eq!(name(&got[1]).as_deref(), Some("a}\"{"));
        assert_eq!(name(&got[2]).as_deref(), Some("guest-sync-delimited"));
    }

    #[test]
    fn junk_and_non_objects_are_errors_and_reading_goes_on() {
        let got = requests(&[b"x[1]{\"a\":}{\"execute\":\"guest-ping\"}"]);
        assert!(matches!(got[0], Incoming::Bad(_)));
        assert!(matches!(got[1], Incoming::Bad(_)));
        assert!(matches!(got[2], Incoming::Bad(_)));
        assert!(matches!(got[3], Incoming::Request(_)));
    }

    #[test]
    fn an_oversized_request_is_one_error_then_reading_goes_on() {
        let mut r = Reader::new();
        let mut big = b"{\"a\":\"".to_vec();
        big.resize(MAX_REQUEST + 10, b'x');
        let got = r.push(&big);
        assert_eq!(got.len(), 1);
        let got = r.push(b"\"}{\"execute\":\"guest-ping\"}");
        assert_eq!(got.len(), 1);
        assert!(matches!(got[0], Incoming::Request(_)));
    }
}
