//! A small tar writer and streaming reader, so that a whole folder tree crosses the guest
//! agent as one file instead of a round trip per file. The writer emits GNU-format headers
//! (long names and link targets in 'L'/'K' records), which GNU tar and busybox tar both read.
//! The reader takes what those two produce: ustar (with its prefix field), GNU long names,
//! pax 'x' headers (path, linkpath, size, mtime; 'g' is skipped), base-256 numbers, and hard
//! links. Paths stay bytes: names need not be UTF-8.

use std::io::{self, Read, Write};

const BLOCK: usize = 512;
/// Longest GNU long name or pax header accepted: a bound on what untrusted input allocates.
const MAX_META: u64 = 1024 * 1024;

/// What an entry is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file; its `size` bytes of data follow.
    File,
    /// A folder.
    Dir,
    /// A symbolic link to `link`.
    Symlink,
    /// A hard link to the earlier entry named `link`.
    HardLink,
    /// Anything else (devices, fifos, sockets, sparse files): the type byte.
    Other(u8),
}

/// One entry's header, with any long name or pax record already applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The path inside the archive, as written (no leading `./` removed).
    pub path: Vec<u8>,
    /// What the entry is.
    pub kind: Kind,
    /// Permission bits (with setuid, setgid, sticky).
    pub mode: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// Bytes of data that follow (regular files only; zero otherwise).
    pub size: u64,
    /// A link's target (symlinks and hard links).
    pub link: Vec<u8>,
    /// The owner's user and group IDs (a pax record's when it has one).
    pub uid: u64,
    /// The group ID.
    pub gid: u64,
    /// Extended attributes from pax `SCHILY.xattr.NAME` records (a container image's file
    /// capabilities travel so), in archive order.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn padding(size: u64) -> usize {
    ((BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64) as usize
}

// ---------------------------------------------------------------------------------------------
// Writer

/// Writes a tar stream to `W`.
pub struct Writer<W: Write> {
    out: W,
}

/// Writes `value` as a NUL-terminated octal field, or base-256 when it does not fit.
fn put_num(field: &mut [u8], value: u64) {
    let digits = field.len() - 1;
    let octal = format!("{value:0digits$o}");
    if octal.len() <= digits {
        field[..digits].copy_from_slice(octal.as_bytes());
        field[digits] = 0;
    } else {
        let mut v = value;
        for b in field.iter_mut().rev() {
            *b = (v & 0xff) as u8;
            v >>= 8;
        }
        field[0] = 0x80;
    }
}

fn header(name: &[u8], kind: u8, mode: u32, mtime: i64, size: u64, link: &[u8]) -> [u8; BLOCK] {
    let mut h = [0u8; BLOCK];
    let n = name.len().min(100);
    h[..n].copy_from_slice(&name[..n]);
    put_num(&mut h[100..108], u64::from(mode & 0o7777));
    put_num(&mut h[108..116], 0);
    put_num(&mut h[116..124], 0);
    put_num(&mut h[124..136], size);
    put_num(&mut h[136..148], mtime.max(0) as u64);
    h[156] = kind;
    let l = link.len().min(100);
    h[157..157 + l].copy_from_slice(&link[..l]);
    h[257..265].copy_from_slice(b"ustar  \0");
    h[265..269].copy_from_slice(b"root");
    h[297..301].copy_from_slice(b"root");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    put_num(&mut h[148..155], u64::from(sum));
    h[155] = b' ';
    h
}

impl<W: Write> Writer<W> {
    /// A writer on `out`.
    pub fn new(out: W) -> Self {
        Writer { out }
    }

    fn long(&mut self, kind: u8, value: &[u8]) -> io::Result<()> {
        let mut data = value.to_vec();
        data.push(0);
        let h = header(b"././@LongLink", kind, 0o644, 0, data.len() as u64, b"");
        self.out.write_all(&h)?;
        self.out.write_all(&data)?;
        self.out
            .write_all(&[0u8; BLOCK][..padding(data.len() as u64)])
    }

    fn head(
        &mut self,
        path: &[u8],
        kind: u8,
        mode: u32,
        mtime: i64,
        size: u64,
        link: &[u8],
    ) -> io::Result<()> {
        if path.len() > 100 {
            self.long(b'L', path)?;
        }
        if link.len() > 100 {
            self.long(b'K', link)?;
        }
        self.out
            .write_all(&header(path, kind, mode, mtime, size, link))
    }

    /// A folder entry (`path` without a trailing slash; one is added).
    pub fn dir(&mut self, path: &[u8], mode: u32, mtime: i64) -> io::Result<()> {
        let mut p = path.to_vec();
        p.push(b'/');
        self.head(&p, b'5', mode, mtime, 0, b"")
    }

    /// A symlink entry pointing at `target`, never followed.
    pub fn symlink(&mut self, path: &[u8], target: &[u8], mtime: i64) -> io::Result<()> {
        self.head(path, b'2', 0o777, mtime, 0, target)
    }

    /// A regular file of exactly `size` bytes read from `data`; a source that ends early or
    /// grows is an error, so the archive never lies about its sizes.
    pub fn file(
        &mut self,
        path: &[u8],
        mode: u32,
        mtime: i64,
        size: u64,
        data: &mut dyn Read,
    ) -> io::Result<()> {
        self.file_with(path, (mode, mtime, size), |out| {
            copy_big(&mut data.take(size), out)
        })
    }

    /// A regular file whose `size` bytes of content `body` writes to the output itself (and
    /// says how many it wrote): for a writer that can move them faster than a copy through
    /// memory (sendfile).
    pub fn file_with(
        &mut self,
        path: &[u8],
        (mode, mtime, size): (u32, i64, u64),
        body: impl FnOnce(&mut W) -> io::Result<u64>,
    ) -> io::Result<()> {
        self.head(path, b'0', mode, mtime, size, b"")?;
        let copied = body(&mut self.out)?;
        if copied != size {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{} shrank while it was copied",
                    String::from_utf8_lossy(path)
                ),
            ));
        }
        self.out.write_all(&[0u8; BLOCK][..padding(size)])
    }

    /// Ends the archive (two zero blocks) and returns the output.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.write_all(&[0u8; 2 * BLOCK])?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Copies in 128 KiB pieces: under TCG each system call is dear, and `io::copy`'s 8 KiB
/// stack buffer makes a large file cost thousands of reads (a buffered writer passes a piece
/// this large straight through).
fn copy_big(from: &mut dyn Read, to: &mut dyn Write) -> io::Result<u64> {
    let mut buf = vec![0u8; 128 << 10];
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
        total += n as u64;
    }
}

// ---------------------------------------------------------------------------------------------
// Reader

/// Reads entries one at a time from `R`; data is read with [`Reader::data`] or skipped.
pub struct Reader<R: Read> {
    inner: R,
    /// Data bytes of the current entry not read yet, then its padding.
    left: u64,
    pad: usize,
    done: bool,
}

fn field_str(f: &[u8]) -> &[u8] {
    let end = f.iter().position(|&b| b == 0).unwrap_or(f.len());
    &f[..end]
}

fn num(f: &[u8]) -> io::Result<u64> {
    if f.first().is_some_and(|b| b & 0x80 != 0) {
        let mut v: u64 = u64::from(f[0] & 0x7f);
        for &b in &f[1..] {
            v = v
                .checked_mul(256)
                .and_then(|v| v.checked_add(u64::from(b)))
                .ok_or_else(|| bad("a base-256 number is too large"))?;
        }
        return Ok(v);
    }
    let s = field_str(f);
    let s = std::str::from_utf8(s).map_err(|_| bad("a numeric field is not octal"))?;
    let s = s.trim_matches(|c: char| c == ' ' || c == '\0');
    if s.is_empty() {
        return Ok(0);
    }
    u64::from_str_radix(s, 8).map_err(|_| bad(format!("a numeric field is not octal: {s:?}")))
}

/// What pax and GNU records set for the next entry.
#[derive(Default)]
struct Pending {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
    mtime: Option<i64>,
    uid: Option<u64>,
    gid: Option<u64>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Applies the records of a pax 'x' header.
fn parse_pax(data: &[u8], p: &mut Pending) -> io::Result<()> {
    let mut rest = data;
    while !rest.is_empty() {
        let sp = rest
            .iter()
            .position(|&b| b == b' ')
            .ok_or_else(|| bad("a pax record has no length"))?;
        let len: usize = std::str::from_utf8(&rest[..sp])
            .ok()
            .and_then(|s| s.parse().ok())
            .filter(|&l| l > sp + 1 && l <= rest.len())
            .ok_or_else(|| bad("a pax record has a bad length"))?;
        let rec = &rest[sp + 1..len];
        let rec = rec.strip_suffix(b"\n").unwrap_or(rec);
        if let Some(eq) = rec.iter().position(|&b| b == b'=') {
            let (k, v) = (&rec[..eq], &rec[eq + 1..]);
            let text = || std::str::from_utf8(v).ok();
            match k {
                b"path" => p.path = Some(v.to_vec()),
                b"linkpath" => p.link = Some(v.to_vec()),
                b"size" => p.size = text().and_then(|s| s.parse().ok()),
                b"mtime" => {
                    p.mtime = text()
                        .and_then(|s| s.split('.').next())
                        .and_then(|s| s.parse().ok())
                }
                b"uid" => p.uid = text().and_then(|s| s.parse().ok()),
                b"gid" => p.gid = text().and_then(|s| s.parse().ok()),
                _ => {
                    if let Some(name) = k.strip_prefix(b"SCHILY.xattr.") {
                        p.xattrs.push((name.to_vec(), v.to_vec()));
                    }
                }
            }
        }
        rest = &rest[len..];
    }
    Ok(())
}

impl<R: Read> Reader<R> {
    /// A reader on `inner`.
    pub fn new(inner: R) -> Self {
        Reader {
            inner,
            left: 0,
            pad: 0,
            done: false,
        }
    }

    fn skip_rest(&mut self) -> io::Result<()> {
        let n = self.left + self.pad as u64;
        let skipped = io::copy(&mut (&mut self.inner).take(n), &mut io::sink())?;
        if skipped != n {
            return Err(bad("the archive ends inside an entry"));
        }
        self.left = 0;
        self.pad = 0;
        Ok(())
    }

    /// A whole block, or None at a clean end of input.
    fn block(&mut self) -> io::Result<Option<[u8; BLOCK]>> {
        let mut b = [0u8; BLOCK];
        let mut got = 0;
        while got < BLOCK {
            match self.inner.read(&mut b[got..]) {
                Ok(0) if got == 0 => return Ok(None),
                Ok(0) => return Err(bad("the archive ends inside a header")),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Some(b))
    }

    fn meta(&mut self, size: u64) -> io::Result<Vec<u8>> {
        if size > MAX_META {
            return Err(bad(format!("a long-name or pax record of {size} bytes")));
        }
        let mut v = vec![0u8; size as usize];
        self.inner.read_exact(&mut v)?;
        let mut pad = vec![0u8; padding(size)];
        self.inner.read_exact(&mut pad)?;
        Ok(v)
    }

    /// The next entry, or None at the end of the archive. Unread data of the previous entry
    /// is skipped.
    pub fn next_entry(&mut self) -> io::Result<Option<Entry>> {
        self.skip_rest()?;
        let mut p = Pending::default();
        loop {
            if self.done {
                return Ok(None);
            }
            let Some(h) = self.block()? else {
                self.done = true;
                return Ok(None);
            };
            if h.iter().all(|&b| b == 0) {
                // The first zero block ends the archive; the second need not be read.
                self.done = true;
                return Ok(None);
            }
            let sum: u64 = h[..148]
                .iter()
                .chain([b' '; 8].iter())
                .chain(h[156..].iter())
                .map(|&b| u64::from(b))
                .sum();
            if num(&h[148..156])? != sum {
                return Err(bad("a tar header's checksum does not match"));
            }
            let size = num(&h[124..136])?;
            let kind = h[156];
            match kind {
                b'L' => p.path = Some(trim_nul(self.meta(size)?)),
                b'K' => p.link = Some(trim_nul(self.meta(size)?)),
                b'x' => parse_pax(&self.meta(size)?, &mut p)?,
                b'g' => {
                    self.meta(size)?;
                }
                _ => return self.entry(&h, kind, size, p).map(Some),
            }
        }
    }

    fn entry(&mut self, h: &[u8; BLOCK], kind: u8, size: u64, p: Pending) -> io::Result<Entry> {
        let size = p.size.unwrap_or(size);
        let path = match p.path {
            Some(path) => path,
            None => {
                let name = field_str(&h[..100]);
                let prefix = field_str(&h[345..500]);
                if &h[257..263] == b"ustar\0" && !prefix.is_empty() {
                    [prefix, b"/", name].concat()
                } else {
                    name.to_vec()
                }
            }
        };
        let kind = match kind {
            b'0' | b'\0' | b'7' if path.ends_with(b"/") => Kind::Dir,
            b'0' | b'\0' | b'7' => Kind::File,
            b'1' => Kind::HardLink,
            b'2' => Kind::Symlink,
            b'5' => Kind::Dir,
            other => Kind::Other(other),
        };
        // Only regular files and unknown types carry data (a hard link's size is ignored).
        self.left = match kind {
            Kind::File | Kind::Other(_) => size,
            _ => 0,
        };
        self.pad = padding(self.left);
        Ok(Entry {
            path,
            mode: (num(&h[100..108])? & 0o7777) as u32,
            mtime: p.mtime.unwrap_or(num(&h[136..148])? as i64),
            size: if kind == Kind::File { size } else { 0 },
            link: p.link.unwrap_or_else(|| field_str(&h[157..257]).to_vec()),
            kind,
            uid: p.uid.map_or_else(|| num(&h[108..116]), Ok)?,
            gid: p.gid.map_or_else(|| num(&h[116..124]), Ok)?,
            xattrs: p.xattrs,
        })
    }

    /// Copies the current entry's data to `out`; errors if the archive ends early.
    pub fn data(&mut self, out: &mut dyn Write) -> io::Result<u64> {
        let want = self.left;
        let n = io::copy(&mut (&mut self.inner).take(want), out)?;
        self.left -= n;
        if n != want {
            return Err(bad("the archive ends inside a file's data"));
        }
        Ok(n)
    }
}

fn trim_nul(mut v: Vec<u8>) -> Vec<u8> {
    while v.last() == Some(&0) {
        v.pop();
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(archive: &[u8]) -> Vec<(Entry, Vec<u8>)> {
        let mut r = Reader::new(archive);
        let mut out = Vec::new();
        while let Some(e) = r.next_entry().unwrap() {
            let mut d = Vec::new();
            r.data(&mut d).unwrap();
            out.push((e, d));
        }
        out
    }

    #[test]
    fn round_trip_files_dirs_links_modes_mtimes_and_long_names() {
        let long_name = format!("top/{}/file", "n".repeat(150));
        let long_target = "t".repeat(180);
        let mut w = Writer::new(Vec::new());
        w.dir(b"top", 0o755, 1_700_000_000).unwrap();
        w.file(b"top/run.sh", 0o4755, 1_600_000_000, 5, &mut &b"echo\n"[..])
            .unwrap();
        w.file(long_name.as_bytes(), 0o600, 0, 3, &mut &b"abc"[..])
            .unwrap();
        w.symlink(b"top/l", long_target.as_bytes(), 1).unwrap();
        w.symlink(b"top/e", b"/etc", 2).unwrap();
        let big = vec![7u8; 3 * BLOCK + 1];
        w.file(b"top/big", 0o644, 3, big.len() as u64, &mut &big[..])
            .unwrap();
        let ar = w.finish().unwrap();
        assert_eq!(ar.len() % BLOCK, 0);
        let got = entries(&ar);
        assert_eq!(got.len(), 6);
        assert_eq!(got[0].0.path, b"top/");
        assert_eq!(got[0].0.kind, Kind::Dir);
        assert_eq!(got[0].0.mtime, 1_700_000_000);
        assert_eq!(
            (got[1].0.mode, got[1].1.as_slice()),
            (0o4755, &b"echo\n"[..])
        );
        assert_eq!(got[2].0.path, long_name.as_bytes());
        assert_eq!(got[2].1, b"abc");
        assert_eq!(
            (got[3].0.kind.clone(), got[3].0.link.clone()),
            (Kind::Symlink, long_target.into_bytes())
        );
        assert_eq!(got[4].0.link, b"/etc");
        assert_eq!(got[5].1, big);
        // A writer that is lied to about a size fails instead of writing a false archive.
        let mut w = Writer::new(Vec::new());
        assert!(w.file(b"x", 0o644, 0, 10, &mut &b"short"[..]).is_err());
    }

    /// One header as another tar would write it (ustar magic, optional prefix).
    fn ustar(name: &str, prefix: &str, kind: u8, size: u64, link: &str) -> Vec<u8> {
        let mut h = header(name.as_bytes(), kind, 0o640, 42, size, link.as_bytes());
        h[257..265].copy_from_slice(b"ustar\x0000");
        h[345..345 + prefix.len()].copy_from_slice(prefix.as_bytes());
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        put_num(&mut h[148..155], u64::from(sum));
        h.to_vec()
    }

    #[test]
    fn reads_ustar_prefix_pax_headers_hard_links_and_a_single_end_block() {
        let mut ar = ustar("file.txt", "a/very/deep", b'0', 2, "");
        ar.extend_from_slice(b"hi");
        ar.resize(ar.len() + BLOCK - 2, 0);
        let pax = b"30 path=pax/name/that/is/long\n19 linkpath=target\n17 mtime=99.5000\n";
        ar.extend(ustar("PaxHeaders/x", "", b'x', pax.len() as u64, ""));
        ar.extend_from_slice(pax);
        ar.resize(ar.len() + padding(pax.len() as u64), 0);
        ar.extend(ustar("short", "", b'2', 0, "ignored"));
        ar.extend(ustar("hard", "", b'1', 0, "a/very/deep/file.txt"));
        ar.extend(ustar("fifo", "", b'6', 0, ""));
        ar.extend_from_slice(&[0u8; BLOCK]);
        let got = entries(&ar);
        assert_eq!(got[0].0.path, b"a/very/deep/file.txt");
        assert_eq!(got[0].1, b"hi");
        assert_eq!(got[0].0.mode, 0o640);
        assert_eq!(got[1].0.path, b"pax/name/that/is/long");
        assert_eq!(got[1].0.link, b"target");
        assert_eq!(got[1].0.mtime, 99);
        assert_eq!(got[2].0.kind, Kind::HardLink);
        assert_eq!(got[2].0.link, b"a/very/deep/file.txt");
        assert_eq!(got[3].0.kind, Kind::Other(b'6'));
        assert_eq!(got.len(), 4);
    }

    #[test]
    fn corrupt_or_cut_archives_are_errors_not_panics() {
        let mut w = Writer::new(Vec::new());
        w.file(b"f", 0o644, 0, 600, &mut &[1u8; 600][..]).unwrap();
        let ar = w.finish().unwrap();
        let mut flipped = ar.clone();
        flipped[10] ^= 1;
        assert!(Reader::new(&flipped[..]).next_entry().is_err());
        for cut in [100, BLOCK + 10, 2 * BLOCK] {
            let mut r = Reader::new(&ar[..cut]);
            let res = r
                .next_entry()
                .and_then(|e| e.map_or(Ok(0), |_| r.data(&mut Vec::new())));
            assert!(res.is_err(), "cut at {cut}");
        }
        assert_eq!(
            num(&[0x80, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]).unwrap(),
            1 << 32
        );
        let mut f = [0u8; 12];
        put_num(&mut f, 1 << 40);
        assert_eq!(num(&f).unwrap(), 1 << 40);
    }

    /// Archives made by the system's GNU tar, when it is there: long names, links, pax.
    #[test]
    fn reads_what_gnu_tar_writes() {
        let dir = std::env::temp_dir().join(format!("mcq-tar-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let deep = dir.join("src").join("d".repeat(120));
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("f"), b"content").unwrap();
        std::fs::hard_link(deep.join("f"), dir.join("src/hard")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join("src/link")).unwrap();
        for format in ["gnu", "pax", "ustar"] {
            let ar = dir.join(format!("{format}.tar"));
            let ok = std::process::Command::new("tar")
                .args(["-c", "--format", format, "-f"])
                .arg(&ar)
                .arg("-C")
                .arg(&dir)
                .arg("src")
                .stderr(std::process::Stdio::null())
                .status();
            let Ok(status) = ok else { return };
            if !status.success() {
                // ustar cannot hold a 120-character folder name; that is tar's refusal.
                continue;
            }
            let data = std::fs::read(&ar).unwrap();
            let got = entries(&data);
            let names: Vec<String> = got
                .iter()
                .map(|(e, _)| String::from_utf8_lossy(&e.path).into_owned())
                .collect();
            let f = got
                .iter()
                .find(|(e, _)| e.path.ends_with(b"/f") || e.path.ends_with(b"/hard"))
                .unwrap();
            assert!(
                f.1 == b"content" || f.0.kind == Kind::HardLink,
                "{format}: {names:?}"
            );
            assert!(
                got.iter().any(|(e, _)| e.kind == Kind::HardLink),
                "{format}: {names:?}"
            );
            let l = got.iter().find(|(e, _)| e.path.ends_with(b"link")).unwrap();
            assert_eq!(l.0.link, b"/etc/passwd", "{format}");
            assert!(names.iter().any(|n| n.len() > 120), "{format}: {names:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
