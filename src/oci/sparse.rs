//! A sparse file as one blob: its length, then only the runs that are not zero, each with its
//! offset. Guest memory saved by a template or a suspend is mostly zeros (a 256 MiB guest that
//! booted a small system holds a few dozen MiB), so this is what travels instead of the whole
//! file, and the file it is unpacked to is sparse again.
//!
//! The form: `MCQSPARS`, a version (u32, 1), a reserved u32 (0), the file's length (u64); then
//! records of an offset (u64), a length (u64) and that many bytes, in rising order, none
//! overlapping, all within the length. Numbers are little-endian. A blob from a registry is
//! untrusted: [`unpack`] refuses any other shape before it writes past what it checked.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use super::error::OciError;
use crate::net::digest::Sha256;

/// The first bytes of a sparse blob.
const MAGIC: &[u8; 8] = b"MCQSPARS";
/// The form's version.
const VERSION: u32 = 1;
/// The header's length.
const HEADER: usize = 24;
/// Runs are found and written in pieces of this size.
const PIECE: usize = 1 << 16;
/// The largest file a blob may unpack to (a guest's memory: 1 TiB).
pub const MAX_LEN: u64 = 1 << 40;

/// Writes the sparse form of the file at `src` to `out`; returns the bytes written and their
/// digest.
pub fn pack(src: &Path, out: &mut dyn Write) -> Result<(u64, String), OciError> {
    let len = std::fs::metadata(src)
        .map_err(|e| OciError::Host(format!("cannot read {}: {e}", src.display())))?
        .len();
    pack_window(src, 0, len, out).map(|(n, d, _)| (n, d))
}

/// Writes the sparse form of the `len` bytes of the file at `src` from `start` (a window of
/// it, its offsets counted from `start`) to `out`; returns the bytes written, their digest,
/// and whether the window holds anything but zeros.
pub fn pack_window(
    src: &Path,
    start: u64,
    len: u64,
    out: &mut dyn Write,
) -> Result<(u64, String, bool), OciError> {
    let host = |e: std::io::Error| OciError::Host(format!("cannot read {}: {e}", src.display()));
    let mut f = File::open(src).map_err(host)?;
    let file_len = f.metadata().map_err(host)?.len();
    let end = start.saturating_add(len).min(file_len);
    let mut any = false;
    let mut sink = Hashed::new(out);
    let mut header = Vec::with_capacity(HEADER);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&VERSION.to_le_bytes());
    header.extend_from_slice(&0u32.to_le_bytes());
    header.extend_from_slice(&(end.saturating_sub(start)).to_le_bytes());
    sink.write(&header)?;
    let mut buf = vec![0u8; PIECE];
    let mut at = start;
    // Pending run: where it starts (from `start`), and its bytes.
    let mut run: Option<(u64, Vec<u8>)> = None;
    while at < end {
        // Holes are skipped without reading them.
        let data = next_data(&f, at).unwrap_or(at);
        if data >= end {
            break;
        }
        if data > at {
            flush(&mut sink, &mut run)?;
            at = data;
        }
        f.seek(SeekFrom::Start(at)).map_err(host)?;
        let want = (end - at).min(PIECE as u64) as usize;
        f.read_exact(&mut buf[..want]).map_err(host)?;
        if buf[..want].iter().all(|b| *b == 0) {
            flush(&mut sink, &mut run)?;
        } else {
            any = true;
            match &mut run {
                Some((_, bytes)) => bytes.extend_from_slice(&buf[..want]),
                None => run = Some((at - start, buf[..want].to_vec())),
            }
            // Runs are written in pieces of at most 16 MiB.
            if run.as_ref().is_some_and(|(_, b)| b.len() >= PIECE * 256) {
                flush(&mut sink, &mut run)?;
            }
        }
        at += want as u64;
    }
    flush(&mut sink, &mut run)?;
    Ok((sink.written, sink.hash.finish(), any))
}

/// The next offset at or after `at` that holds data (SEEK_DATA), when the file system says.
fn next_data(f: &File, at: u64) -> Option<u64> {
    let off = i64::try_from(at).ok()?;
    // SAFETY: lseek on a descriptor this function borrows; no memory is touched.
    let r = unsafe { libc::lseek(f.as_raw_fd(), off, libc::SEEK_DATA) };
    // ENXIO: no data after `at` (the rest is a hole).
    if r < 0 {
        let end = std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO);
        return end.then_some(u64::MAX);
    }
    u64::try_from(r).ok()
}

fn flush(sink: &mut Hashed, run: &mut Option<(u64, Vec<u8>)>) -> Result<(), OciError> {
    if let Some((at, bytes)) = run.take() {
        sink.write(&at.to_le_bytes())?;
        sink.write(&(bytes.len() as u64).to_le_bytes())?;
        sink.write(&bytes)?;
    }
    Ok(())
}

/// A writer that counts and hashes what passes.
struct Hashed<'a> {
    out: &'a mut dyn Write,
    hash: Sha256,
    written: u64,
}

impl<'a> Hashed<'a> {
    fn new(out: &'a mut dyn Write) -> Self {
        Hashed {
            out,
            hash: Sha256::default(),
            written: 0,
        }
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), OciError> {
        self.out
            .write_all(bytes)
            .map_err(|e| OciError::Host(format!("cannot write the packed file: {e}")))?;
        self.hash.update(bytes);
        self.written += bytes.len() as u64;
        Ok(())
    }
}

/// Unpacks the sparse blob read from `blob` into `dest` (created, sparse), checking its shape
/// as it goes; returns the blob's digest, for the caller to compare with the one it expected.
pub fn unpack(blob: &mut dyn Read, dest: &Path) -> Result<String, OciError> {
    let write = |e: std::io::Error| OciError::Host(format!("cannot write {}: {e}", dest.display()));
    let mut out = File::create(dest).map_err(write)?;
    let got = unpack_into(blob, &mut out, 0, None, &|len| out_len(dest, len))?;
    out.sync_all().map_err(write)?;
    Ok(got)
}

/// Sets a new file's length to the one its blob declares.
fn out_len(dest: &Path, len: u64) -> Result<(), OciError> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(dest)
        .and_then(|f| f.set_len(len))
        .map_err(|e| OciError::Host(format!("cannot write {}: {e}", dest.display())))
}

/// Unpacks the sparse blob read from `blob` into `out` at offset `base` (a window of a larger
/// file); with `room`, the blob may declare at most that many bytes. `declared` is told the
/// length the blob declares before anything is written. Returns the blob's digest.
pub fn unpack_into(
    blob: &mut dyn Read,
    out: &mut File,
    base: u64,
    room: Option<u64>,
    declared: &dyn Fn(u64) -> Result<(), OciError>,
) -> Result<String, OciError> {
    let bad = |why: &str| OciError::Refused(format!("the packed file is damaged: {why}"));
    let mut src = HashedReader {
        inner: blob,
        hash: Sha256::default(),
    };
    let mut header = [0u8; HEADER];
    src.read_exact(&mut header)
        .map_err(|_| bad("it is shorter than its header"))?;
    if &header[..8] != MAGIC {
        return Err(bad("it does not start with MCQSPARS"));
    }
    if u32::from_le_bytes(le4(&header[8..12])) != VERSION {
        return Err(bad("its version is not 1"));
    }
    let len = u64::from_le_bytes(le8(&header[16..24]));
    if len > MAX_LEN || room.is_some_and(|r| len > r) {
        return Err(bad("it says the file is longer than it may be"));
    }
    declared(len)?;
    let write = |e: std::io::Error| OciError::Host(format!("cannot write the unpacked file: {e}"));
    let mut end = 0u64;
    let mut buf = vec![0u8; PIECE];
    loop {
        let mut rec = [0u8; 16];
        match read_full(&mut src, &mut rec) {
            Ok(0) => break,
            Ok(16) => {}
            Ok(_) => return Err(bad("a record is cut short")),
            Err(e) => return Err(OciError::Host(format!("cannot read the packed file: {e}"))),
        }
        let at = u64::from_le_bytes(le8(&rec[..8]));
        let n = u64::from_le_bytes(le8(&rec[8..]));
        if at < end || n == 0 || at.checked_add(n).is_none_or(|e| e > len) {
            return Err(bad("a record overlaps another or lies outside the file"));
        }
        out.seek(SeekFrom::Start(base + at)).map_err(write)?;
        let mut left = n;
        while left > 0 {
            let want = left.min(PIECE as u64) as usize;
            src.read_exact(&mut buf[..want])
                .map_err(|_| bad("a record's bytes are cut short"))?;
            out.write_all(&buf[..want]).map_err(write)?;
            left -= want as u64;
        }
        end = at + n;
    }
    Ok(src.hash.finish())
}

/// A reader that hashes what passes.
struct HashedReader<'a> {
    inner: &'a mut dyn Read,
    hash: Sha256,
}

impl Read for HashedReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// Reads until `buf` is full or the stream ends; the count read.
fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

fn le4(b: &[u8]) -> [u8; 4] {
    let mut a = [0u8; 4];
    a.copy_from_slice(b);
    a
}

fn le8(b: &[u8]) -> [u8; 8] {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("mcq-sparse-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_sparse_file_packs_small_and_unpacks_the_same() {
        let d = tmp("round");
        let src = d.join("ram");
        let f = File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        let mut f = std::fs::OpenOptions::new().write(true).open(&src).unwrap();
        f.seek(SeekFrom::Start(5 << 20)).unwrap();
        f.write_all(&[7u8; 100_000]).unwrap();
        f.seek(SeekFrom::Start(40 << 20)).unwrap();
        f.write_all(b"the end of something").unwrap();
        drop(f);
        let mut packed = Vec::new();
        let (n, digest) = pack(&src, &mut packed).unwrap();
        assert_eq!(n, packed.len() as u64);
        assert!(packed.len() < 400_000, "{} bytes for 64 MiB", packed.len());
        let out = d.join("again");
        let got = unpack(&mut packed.as_slice(), &out).unwrap();
        assert_eq!(got, digest);
        assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&src).unwrap());
    }

    #[test]
    fn windows_of_a_file_unpack_into_the_same_file() {
        let d = tmp("windows");
        let src = d.join("ram");
        let mut f = File::create(&src).unwrap();
        f.set_len(8 << 20).unwrap();
        f.seek(SeekFrom::Start((4 << 20) - 10)).unwrap();
        f.write_all(&[9u8; 40]).unwrap();
        drop(f);
        let out = d.join("again");
        let mut file = File::create(&out).unwrap();
        file.set_len(8 << 20).unwrap();
        let mut nonzero = 0;
        for w in 0..4u64 {
            let mut packed = Vec::new();
            let (_, digest, any) = pack_window(&src, w << 21, 2 << 20, &mut packed).unwrap();
            nonzero += usize::from(any);
            let got = unpack_into(
                &mut packed.as_slice(),
                &mut file,
                w << 21,
                Some(2 << 20),
                &|_| Ok(()),
            )
            .unwrap();
            assert_eq!(got, digest);
        }
        assert_eq!(nonzero, 2, "the run crosses one window's end");
        drop(file);
        assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&src).unwrap());
    }

    #[test]
    fn a_damaged_blob_is_refused() {
        let d = tmp("bad");
        let out = d.join("x");
        let mut head = Vec::new();
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&1u32.to_le_bytes());
        head.extend_from_slice(&0u32.to_le_bytes());
        head.extend_from_slice(&100u64.to_le_bytes());
        let with = |recs: &[(u64, u64, usize)]| {
            let mut b = head.clone();
            for (at, n, bytes) in recs {
                b.extend_from_slice(&at.to_le_bytes());
                b.extend_from_slice(&n.to_le_bytes());
                b.extend(std::iter::repeat_n(1u8, *bytes));
            }
            b
        };
        for (blob, why) in [
            (b"nope".to_vec(), "header"),
            (with(&[(90, 20, 20)]), "outside"),
            (with(&[(10, 10, 10), (15, 5, 5)]), "overlaps"),
            (with(&[(10, 10, 3)]), "cut short"),
        ] {
            let e = unpack(&mut blob.as_slice(), &out).unwrap_err();
            assert!(e.msg().contains(why), "{why}: {}", e.msg());
        }
        assert!(unpack(&mut with(&[(0, 10, 10), (50, 50, 50)]).as_slice(), &out).is_ok());
    }
}
