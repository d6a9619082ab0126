//! The data channel's framing as the host reads it: the nonce's opening line (whatever came
//! before it skipped, within a bound) and the end marker after a guest's archive. Pure
//! functions over a buffered reader, so that a fuzz target feeds them what a hostile guest
//! could write (`fuzz/fuzz_targets/channel_frames.rs`).

use std::io::{self, BufRead};

/// Most stale or foreign bytes skipped before the nonce's line.
pub const MAX_SKIP: u64 = 64 << 20;
/// Zero bytes allowed between the guest's archive and its end marker (tar pads to records).
pub const MAX_TAIL: u64 = 64 * 1024;
/// The longest tail of a line kept while looking for the nonce (longer lines are garbage).
const KEEP: usize = 512;

/// Reads up to the end of the line that ends with `want` (the nonce's), or has `want` and a
/// space then the rest; returns that rest. Bytes before it on the same line are stale ones
/// that lacked a newline, and are skipped like earlier lines.
pub fn sync<R: BufRead + ?Sized>(r: &mut R, want: &str) -> io::Result<String> {
    let want = want.as_bytes();
    let mut line: Vec<u8> = Vec::new();
    let mut skipped = 0u64;
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the data channel ended before the copy began",
            ));
        }
        let (chunk, ended) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], true),
            None => (buf, false),
        };
        line.extend_from_slice(chunk);
        if line.len() > KEEP {
            line.drain(..line.len() - KEEP);
        }
        let used = chunk.len() + usize::from(ended);
        r.consume(used);
        skipped += used as u64;
        if ended {
            if let Some(rest) = after(&line, want) {
                return Ok(rest);
            }
            line.clear();
        }
        if skipped > MAX_SKIP {
            return Err(io::Error::other(
                "the guest sent too much before the copy began",
            ));
        }
    }
}

/// What follows the last `want` in `line`, when `want` ends it or a space follows it.
fn after(line: &[u8], want: &[u8]) -> Option<String> {
    if want.is_empty() || line.len() < want.len() {
        return None;
    }
    let at = line.windows(want.len()).rposition(|w| w == want)?;
    match &line[at + want.len()..] {
        [] => Some(String::new()),
        [b' ', rest @ ..] => Some(String::from_utf8_lossy(rest).into_owned()),
        _ => None,
    }
}

/// Reads the end marker `MCQ-END <nonce> <tar's exit>` after an archive (zero padding before
/// it, within [`MAX_TAIL`]): Ok when tar exited 0.
pub fn trailer<R: BufRead + ?Sized>(r: &mut R, nonce: &str) -> io::Result<()> {
    let mut zeros = 0u64;
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the guest's archive ended without its end marker",
            ));
        }
        let n = buf.iter().take_while(|&&b| b == 0).count();
        let more = n < buf.len();
        r.consume(n);
        zeros += n as u64;
        if zeros > MAX_TAIL {
            return Err(io::Error::other("the guest's archive has a long tail"));
        }
        if more {
            break;
        }
    }
    let mut line = Vec::new();
    io::Read::take(&mut *r, 128).read_until(b'\n', &mut line)?;
    if line.pop() != Some(b'\n') {
        return Err(io::Error::other("the guest's archive ended in garbage"));
    }
    let text = String::from_utf8_lossy(&line);
    match text.strip_prefix(&format!("MCQ-END {nonce} ")) {
        Some("0") => Ok(()),
        Some(code) => Err(io::Error::other(format!(
            "tar in the guest exited with {code} (a file it could not read?)"
        ))),
        None => Err(io::Error::other(format!(
            "the guest's archive was followed by {text:?}, not its end marker"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nonce_line_is_found_after_stale_lines_and_glued_bytes() {
        let mut r: &[u8] = b"old\n\0\0junkMCQ-BEGIN abc 4096\nTAR";
        assert_eq!(sync(&mut r, "MCQ-BEGIN abc").unwrap(), "4096");
        assert_eq!(r, b"TAR");
        let mut r: &[u8] = b"MCQ-READY abc\n";
        assert_eq!(sync(&mut r, "MCQ-READY abc").unwrap(), "");
    }

    #[test]
    fn another_nonce_or_a_prefix_of_it_is_not_the_line() {
        let mut r: &[u8] = b"MCQ-BEGIN abcd 1\nMCQ-BEGIN ab\n";
        assert!(sync(&mut r, "MCQ-BEGIN abc").is_err());
    }

    #[test]
    fn the_end_marker_follows_zero_padding_and_carries_tars_exit() {
        let mut ok: &[u8] = b"\0\0\0MCQ-END n 0\n";
        trailer(&mut ok, "n").unwrap();
        let mut failed: &[u8] = b"MCQ-END n 2\n";
        assert!(trailer(&mut failed, "n")
            .unwrap_err()
            .to_string()
            .contains("2"));
        let mut other: &[u8] = b"MCQ-END m 0\n";
        assert!(trailer(&mut other, "n").is_err());
        let mut tail = vec![0u8; MAX_TAIL as usize + 1];
        tail.extend_from_slice(b"MCQ-END n 0\n");
        assert!(trailer(&mut &tail[..], "n").is_err());
    }
}
