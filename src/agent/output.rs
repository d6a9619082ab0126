//! One output stream of a program the agent started: kept from its start up to
//! [`MAX_OUTPUT`] (qemu-ga's way), or in a window of its latest bytes (a background program),
//! with offsets counted from the program's first byte either way.

/// Output kept per stream without a window (qemu-ga's own cap).
pub const MAX_OUTPUT: usize = 16 << 20;

/// One stream's capture. Offsets count from the program's first byte: with a window, the
/// oldest output is dropped (`dropped` says how much) and the latest is kept.
#[derive(Debug, Default)]
pub struct Stream {
    /// The bytes kept.
    pub data: Vec<u8>,
    /// Output past [`MAX_OUTPUT`] was dropped (no window).
    pub truncated: bool,
    /// The pipe reached its end.
    pub closed: bool,
    /// Bytes dropped from the front (window mode).
    pub dropped: usize,
    /// Keep (at least) the last this many bytes instead of the first [`MAX_OUTPUT`].
    pub window: Option<usize>,
}

impl Stream {
    /// Takes a chunk the program wrote.
    pub fn add(&mut self, chunk: &[u8]) {
        match self.window {
            Some(w) => {
                self.data.extend_from_slice(chunk);
                // Dropped in batches, so a chatty program costs no quadratic shifting.
                if self.data.len() > w.saturating_mul(2) {
                    let cut = self.data.len() - w;
                    self.data.drain(..cut);
                    self.dropped += cut;
                }
            }
            None => {
                let room = MAX_OUTPUT - self.data.len();
                if chunk.len() > room {
                    self.truncated = true;
                }
                self.data.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
        }
    }

    /// Up to `max` bytes from offset `at` (or from the oldest kept, if `at` was dropped):
    /// (first offset returned, the bytes).
    pub fn from(&self, at: usize, max: usize) -> (usize, &[u8]) {
        let start = at.max(self.dropped).min(self.end());
        let i = start - self.dropped;
        let j = i.saturating_add(max).min(self.data.len());
        (start, &self.data[i..j])
    }

    /// Every byte written so far.
    pub fn end(&self) -> usize {
        self.dropped + self.data.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_keeps_the_latest_output_and_says_what_was_dropped() {
        let mut s = Stream {
            window: Some(4),
            ..Stream::default()
        };
        for c in [b"abc".as_slice(), b"def", b"ghi"] {
            s.add(c);
        }
        assert_eq!(s.end(), 9);
        assert!(s.dropped > 0 && s.data.len() >= 4);
        let (start, data) = s.from(0, usize::MAX);
        assert_eq!(start, s.dropped);
        assert!(b"abcdefghi".ends_with(data));
        assert_eq!(s.from(7, 1), (7, &b"h"[..]));
        assert_eq!(s.from(50, 10).1, b"");
    }
}
