//! The end of a log that grows without bound (a VM's serial console): at most a given number
//! of bytes of it are read, never the whole file, so one read costs the same however large the
//! log has grown.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Bytes read from the end of a log, and where they sit in it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tail {
    /// The bytes, starting at a character boundary when the read cut the log short.
    pub data: Vec<u8>,
    /// The log offset of the first byte.
    pub start: u64,
    /// The log's size when it was opened.
    pub size: u64,
}

/// Opens a log for reading without following a symlink or blocking on a FIFO, and refuses
/// anything but a regular file: the path comes from the registry, which a guest does not
/// write, but a log must never become a way to read or hang on something else.
fn open(path: &Path) -> std::io::Result<(File, u64)> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok((f, meta.len()))
}

/// How many leading bytes of `data` continue a character that began before it (at most 3).
fn partial_char(data: &[u8]) -> usize {
    data.iter()
        .take(3)
        .take_while(|b| (**b & 0b1100_0000) == 0b1000_0000)
        .count()
}

/// Reads the bytes of the log at `path` from offset `from` up to `to` (None: its size), but
/// only the last `max` of them: a longer span is cut at its start, to a character boundary.
/// A log shorter than `to` gives what there is.
pub fn read_span(path: &Path, from: u64, to: Option<u64>, max: u64) -> std::io::Result<Tail> {
    let (mut f, size) = open(path)?;
    let to = to.unwrap_or(size);
    let start = from.max(to.saturating_sub(max));
    let mut data = Vec::new();
    if to > start {
        f.seek(SeekFrom::Start(start))?;
        data.reserve((to - start).min(size.saturating_sub(start)) as usize);
        f.take(to - start).read_to_end(&mut data)?;
    }
    let mut tail = Tail { data, start, size };
    if start > from {
        let skip = partial_char(&tail.data);
        tail.data.drain(..skip);
        tail.start += skip as u64;
    }
    Ok(tail)
}

/// The last `max` bytes of the log at `path` (all of it when shorter).
pub fn read_last(path: &Path, max: u64) -> std::io::Result<Tail> {
    read_span(path, 0, None, max)
}

impl Tail {
    /// The log's offset just after the last byte read.
    pub fn end(&self) -> u64 {
        self.start + self.data.len() as u64
    }

    /// The bytes as text (invalid UTF-8 replaced; a character the writer has not finished yet
    /// may end it as a replacement).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.data).into_owned()
    }

    /// Drops a first line the read cut short (up to and including its newline), so the text
    /// starts at a line; nothing when the read began at the log's start.
    pub fn from_line(mut self) -> Tail {
        if self.start > 0 {
            if let Some(nl) = self.data.iter().position(|b| *b == b'\n') {
                self.data.drain(..=nl);
                self.start += nl as u64 + 1;
            }
        }
        self
    }

    /// The last `n` lines, without their line endings (`\n` or `\r\n`); a final newline
    /// starts no empty line.
    pub fn last_lines(&self, n: usize) -> Vec<String> {
        let text = self.text();
        let mut all: Vec<&str> = text.split('\n').collect();
        if all.last() == Some(&"") {
            all.pop();
        }
        all[all.len().saturating_sub(n)..]
            .iter()
            .map(|l| l.trim_end_matches('\r').to_string())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir(std::path::PathBuf);

    impl Dir {
        fn new(tag: &str) -> Dir {
            let d = std::env::temp_dir().join(format!("mcq-tail-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Dir(d)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_short_log_is_read_whole_and_a_long_one_only_at_its_end() {
        let dir = Dir::new("len");
        let log = dir.0.join("serial.log");
        assert_eq!(
            read_last(&log, 64).map_err(|e| e.kind()),
            Err(std::io::ErrorKind::NotFound)
        );
        std::fs::write(&log, "boot\nlogin: ").unwrap();
        let t = read_last(&log, 64).unwrap();
        assert_eq!(
            (t.text().as_str(), t.start, t.size),
            ("boot\nlogin: ", 0, 12)
        );
        assert_eq!(t.clone().from_line(), t, "a whole log keeps its first line");
        let mut big = Vec::new();
        for i in 0..40_000 {
            big.extend_from_slice(format!("line {i}\n").as_bytes());
        }
        std::fs::write(&log, &big).unwrap();
        let t = read_last(&log, 1000).unwrap();
        assert_eq!((t.data.len(), t.end()), (1000, big.len() as u64));
        let t = t.from_line();
        assert!(t.text().starts_with("line "), "{}", t.text());
        assert!(t.text().ends_with("line 39999\n"));
        assert_eq!(&big[t.start as usize..], t.data.as_slice());
        assert_eq!(t.last_lines(2), ["line 39998", "line 39999"]);
    }

    #[test]
    fn a_cut_starts_at_a_character_and_a_span_at_its_offset() {
        let dir = Dir::new("utf8");
        let log = dir.0.join("serial.log");
        // "é" is two bytes, "€" three: windows of every size begin at a character.
        std::fs::write(&log, "aé€\r\nz").unwrap();
        for max in 1..=8 {
            let t = read_last(&log, max).unwrap();
            assert!(std::str::from_utf8(&t.data).is_ok(), "{max}: {:?}", t.data);
            assert_eq!(t.end(), 9);
        }
        let t = read_last(&log, 6).unwrap();
        assert_eq!((t.text().as_str(), t.start), ("€\r\nz", 3));
        assert_eq!(t.last_lines(5), ["€", "z"]);
        // A span from an offset the caller knows is not cut, and is capped at `to`.
        let t = read_span(&log, 1, Some(3), 64).unwrap();
        assert_eq!((t.data.as_slice(), t.start), ("é".as_bytes(), 1));
        let t = read_span(&log, 9, None, 64).unwrap();
        assert_eq!((t.data.len(), t.start), (0, 9));
    }

    #[test]
    fn only_a_regular_file_is_read() {
        let dir = Dir::new("kind");
        let log = dir.0.join("serial.log");
        std::fs::write(&log, "secret").unwrap();
        let link = dir.0.join("link.log");
        std::os::unix::fs::symlink(&log, &link).unwrap();
        assert!(read_last(&link, 64).is_err(), "a symlink is not followed");
        assert!(read_last(&dir.0, 64).is_err(), "a folder is not a log");
        let fifo = dir.0.join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo takes a NUL-terminated path and a mode.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let t = std::time::Instant::now();
        assert!(read_last(&fifo, 64).is_err(), "a FIFO is not a log");
        assert!(
            t.elapsed() < std::time::Duration::from_secs(1),
            "a FIFO blocked"
        );
    }
}
