//! An image's layers applied in order into one folder, as a container runtime would: later
//! files replace earlier ones, `.wh.NAME` removes NAME, `.wh..wh..opq` empties its folder of
//! what lower layers put there. Every entry is written through folder descriptors opened with
//! `O_NOFOLLOW` below the root, so a hostile layer gets nothing outside it: absolute names,
//! `..`, entries under a symlink and hard links out of the root are refused; device nodes and
//! fifos are never made; a size and an entry cap stop a tar bomb.
//!
//! Owners, modes (setuid included) and `security.capability` are not applied on the host (an
//! unprivileged server could not): they are kept per path ([`Unpacked::meta`]) and written into
//! the file system image the folder becomes ([`super::ext4`]).

use std::collections::{BTreeMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use crate::state::tar::{Entry, Kind, Reader};
use crate::state::tree::{Folder, Type};

use super::error::OciError;
use super::layout::{Compression, Layer};
use crate::net::digest::hex;

/// Most entries one image may hold.
const MAX_ENTRIES: u64 = 2_000_000;
/// Deepest path accepted.
const MAX_DEPTH: usize = 128;
const WHITEOUT: &[u8] = b".wh.";
const OPAQUE: &[u8] = b".wh..wh..opq";

/// What an entry is, as the image file system must make it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    /// A regular file.
    File,
    /// A folder.
    Dir,
    /// A symbolic link.
    Symlink,
}

/// An entry's owner, mode and the extended attributes kept for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    /// Its type.
    pub kind: FileType,
    /// Owner.
    pub uid: u64,
    /// Group.
    pub gid: u64,
    /// Permission bits with setuid, setgid and sticky.
    pub mode: u32,
    /// Kept extended attributes (only `security.capability`).
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// What an unpack produced.
#[derive(Debug, Default)]
pub struct Unpacked {
    /// Every path below the root (relative, `/`-separated) with what the image says of it.
    pub meta: BTreeMap<Vec<u8>, Meta>,
    /// Bytes of file content written.
    pub bytes: u64,
    /// Entries left out, and why (device nodes, fifos).
    pub skipped: Vec<String>,
}

/// Applies layers into a root folder.
pub struct Unpacker {
    root: Folder,
    cap: u64,
    entries: u64,
    out: Unpacked,
    /// Paths this layer wrote (an opaque folder keeps them).
    this_layer: HashSet<Vec<u8>>,
}

fn refuse(path: &[u8], why: &str) -> OciError {
    OciError::Refused(format!(
        "layer entry {:?} refused: {why}",
        String::from_utf8_lossy(path)
    ))
}

/// A host failure while writing `path` (the disk, not the layer).
fn host(path: &[u8], e: io::Error) -> OciError {
    OciError::Host(format!(
        "cannot write layer entry {:?}: {e}",
        String::from_utf8_lossy(path)
    ))
}

impl Unpacker {
    /// An unpacker into `root` (an empty folder), writing at most `cap` bytes of content.
    pub fn new(root: Folder, cap: u64) -> Self {
        Unpacker {
            root,
            cap,
            entries: 0,
            out: Unpacked::default(),
            this_layer: HashSet::new(),
        }
    }

    /// Applies one layer blob, checking it against its digest as it is read; a layer that
    /// does not match fails (the caller discards the folder).
    /// `watch` hears the blob bytes read so far every few MiB, and stops the unpack by
    /// answering false (the caller cancelled).
    pub fn apply(&mut self, layer: &Layer, watch: &dyn Fn(u64) -> bool) -> Result<(), OciError> {
        let file = io::BufReader::with_capacity(1 << 16, layer.open()?);
        let mut hashed = Hashing::new(file, watch);
        let applied = match layer.compression {
            Compression::None => self.layer(&mut hashed),
            Compression::Gzip => self.layer(flate2::read::GzDecoder::new(&mut hashed)),
        };
        if hashed.stopped {
            return Err(OciError::Cancelled(format!(
                "cancelled by the client while applying the layer {}",
                layer.digest
            )));
        }
        // The tar's end need not be the blob's: hash what is left.
        io::copy(&mut hashed, &mut io::sink())
            .map_err(|e| OciError::Host(format!("cannot read the layer {}: {e}", layer.digest)))?;
        let (got, size) = hashed.finish();
        // A blob that is not the image's is named as such, whatever its tar did.
        if format!("sha256:{got}") != layer.digest || size != layer.size {
            return Err(OciError::Refused(format!(
                "the layer {} does not match its digest ({size} bytes hashing to sha256:{got}); \
                 nothing of it is used",
                layer.digest
            )));
        }
        applied
    }

    /// Applies one layer's tar stream.
    pub fn layer<R: Read>(&mut self, r: R) -> Result<(), OciError> {
        self.this_layer.clear();
        let mut tr = Reader::new(r);
        let failed =
            |e: io::Error| OciError::Invalid(format!("a layer is not a readable tar: {e}"));
        while let Some(e) = tr.next_entry().map_err(failed)? {
            self.entries += 1;
            if self.entries > MAX_ENTRIES {
                return Err(OciError::Refused(format!(
                    "the image has more than {MAX_ENTRIES} entries"
                )));
            }
            if let Some(parts) = split(&e.path)? {
                self.entry(&e, &parts, &mut tr)?;
            }
        }
        Ok(())
    }

    /// Applies entry `e` at `parts` below the root; `tr` is the layer positioned at its data.
    fn entry<R: Read>(
        &mut self,
        e: &Entry,
        parts: &[Vec<u8>],
        tr: &mut Reader<R>,
    ) -> Result<(), OciError> {
        let leaf = &parts[parts.len() - 1];
        let dir_path = parts[..parts.len() - 1].join(&b'/');
        let dir = self.folder_of(&e.path, &parts[..parts.len() - 1])?;
        let leaf_os = OsStr::from_bytes(leaf);
        if leaf == OPAQUE {
            return self.opaque(&dir, &dir_path);
        }
        let err = |x: io::Error| host(&e.path, x);
        if let Some(name) = leaf.strip_prefix(WHITEOUT) {
            dir.remove_all(OsStr::from_bytes(name)).map_err(err)?;
            self.forget(&join(&dir_path, name));
            return Ok(());
        }
        let path = parts.join(&b'/');
        let kind = match &e.kind {
            Kind::Dir => {
                match dir.meta(leaf_os) {
                    Ok(m) if m.kind == Type::Dir => {}
                    Ok(_) => {
                        self.clear(&dir, leaf_os, &path).map_err(err)?;
                        dir.mkdir(leaf_os).map_err(err)?;
                    }
                    Err(_) => dir.mkdir(leaf_os).map_err(err)?,
                }
                dir.sub(leaf_os)
                    .and_then(|d| d.chmod_self(0o755))
                    .map_err(err)?;
                FileType::Dir
            }
            Kind::File => {
                if self.out.bytes + e.size > self.cap {
                    return Err(OciError::Refused(format!(
                        "the image unpacks to more than {} MiB (MCQEMU_MAX_IMAGE_MB)",
                        self.cap >> 20
                    )));
                }
                self.clear(&dir, leaf_os, &path).map_err(err)?;
                let mut f = dir.create(leaf_os).map_err(err)?;
                self.out.bytes += tr.data(&mut f).map_err(|x| {
                    OciError::Invalid(format!("a layer is not a readable tar: {x}"))
                })?;
                use std::os::unix::fs::PermissionsExt;
                f.set_permissions(std::fs::Permissions::from_mode(0o644))
                    .map_err(err)?;
                FileType::File
            }
            Kind::Symlink => {
                self.clear(&dir, leaf_os, &path).map_err(err)?;
                dir.symlink(&e.link, leaf_os).map_err(err)?;
                FileType::Symlink
            }
            Kind::HardLink => return self.hard_link(e, &dir, leaf_os, path),
            Kind::Other(t) => {
                self.out.skipped.push(format!(
                    "{}: tar type {:?} (devices and fifos are never made)",
                    String::from_utf8_lossy(&e.path),
                    *t as char
                ));
                return Ok(());
            }
        };
        let xattrs = e
            .xattrs
            .iter()
            .filter(|(k, _)| k == b"security.capability")
            .cloned()
            .collect();
        let m = Meta {
            kind,
            uid: e.uid,
            gid: e.gid,
            mode: e.mode & 0o7777,
            xattrs,
        };
        self.note(path, m);
        Ok(())
    }

    /// A hard link at `path` (`dir`/`leaf`) to an earlier file of the image, kept a link.
    fn hard_link(
        &mut self,
        e: &Entry,
        dir: &Folder,
        leaf: &OsStr,
        path: Vec<u8>,
    ) -> Result<(), OciError> {
        let Some(target) = split(&e.link)? else {
            return Err(refuse(&e.path, "a hard link to the root"));
        };
        let m = self
            .out
            .meta
            .get(&target.join(&b'/'))
            .cloned()
            .ok_or_else(|| refuse(&e.path, "its target is no file of the image"))?;
        let tdir = self.folder_of(&e.link, &target[..target.len() - 1])?;
        let tname = OsString::from_vec(target[target.len() - 1].clone());
        self.clear(dir, leaf, &path).map_err(|x| host(&e.path, x))?;
        dir.link_from(&tdir, &tname, leaf)
            .map_err(|x| refuse(&e.path, &format!("its target cannot be linked: {x}")))?;
        self.note(path, m);
        Ok(())
    }

    /// What was unpacked.
    pub fn finish(self) -> Unpacked {
        self.out
    }

    fn note(&mut self, path: Vec<u8>, m: Meta) {
        self.this_layer.insert(path.clone());
        self.out.meta.insert(path, m);
    }

    /// Forgets `path` and everything below it.
    fn forget(&mut self, path: &[u8]) {
        self.out.meta.remove(path);
        let mut below = path.to_vec();
        below.push(b'/');
        let doomed: Vec<Vec<u8>> = self
            .out
            .meta
            .range(below.clone()..)
            .take_while(|(k, _)| k.starts_with(&below))
            .map(|(k, _)| k.clone())
            .collect();
        for k in doomed {
            self.out.meta.remove(&k);
        }
    }

    /// Removes whatever is at `name` before a file, link or hard link takes its place.
    fn clear(&mut self, dir: &Folder, name: &OsStr, path: &[u8]) -> io::Result<()> {
        dir.remove_all(name)?;
        self.forget(path);
        Ok(())
    }

    /// Empties `dir` (at `dir_path`) of what lower layers put there.
    fn opaque(&mut self, dir: &Folder, dir_path: &[u8]) -> Result<(), OciError> {
        let names = dir.names().map_err(|e| host(dir_path, e))?;
        for n in names {
            let p = join(dir_path, n.as_bytes());
            if self.this_layer.contains(&p) {
                continue;
            }
            dir.remove_all(&n).map_err(|e| host(&p, e))?;
            self.forget(&p);
        }
        Ok(())
    }

    /// Opens the folder `parts` below the root, making missing ones and refusing symlinks
    /// and non-folders on the way.
    fn folder_of(&mut self, path: &[u8], parts: &[Vec<u8>]) -> Result<Folder, OciError> {
        let mut cur = Folder::dup(&self.root).map_err(|e| host(path, e))?;
        for (i, c) in parts.iter().enumerate() {
            let name = OsStr::from_bytes(c);
            match cur.meta(name) {
                Ok(m) if m.kind == Type::Dir => {}
                Ok(m) if m.kind == Type::Symlink => {
                    return Err(refuse(path, "it lies under a symlink"));
                }
                Ok(_) => return Err(refuse(path, "it lies under something that is not a folder")),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    cur.mkdir(name).map_err(|e| host(path, e))?;
                    let p = parts[..=i].join(&b'/');
                    self.note(
                        p,
                        Meta {
                            kind: FileType::Dir,
                            uid: 0,
                            gid: 0,
                            mode: 0o755,
                            xattrs: Vec::new(),
                        },
                    );
                    cur.sub(name)
                        .and_then(|d| d.chmod_self(0o755))
                        .map_err(|e| host(path, e))?;
                }
                Err(e) => return Err(host(path, e)),
            }
            cur = cur.sub(name).map_err(|e| host(path, e))?;
        }
        Ok(cur)
    }
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        name.to_vec()
    } else {
        [dir, b"/", name].concat()
    }
}

/// An entry's path as components (`./` and empty parts dropped); None for the root itself.
fn split(path: &[u8]) -> Result<Option<Vec<Vec<u8>>>, OciError> {
    if path.starts_with(b"/") {
        return Err(refuse(path, "absolute names are never unpacked"));
    }
    let parts: Vec<Vec<u8>> = path
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(<[u8]>::to_vec)
        .collect();
    if parts.iter().any(|c| c == b"..") {
        return Err(refuse(path, "'..' would leave the root"));
    }
    if parts.len() > MAX_DEPTH {
        return Err(refuse(path, "it is nested too deep"));
    }
    Ok((!parts.is_empty()).then_some(parts))
}

/// A reader that hashes (SHA-256) and counts what passes through it.
struct Hashing<'a, R> {
    inner: R,
    ctx: ring::digest::Context,
    n: u64,
    /// Told the count every [`WATCH_EVERY`] bytes; false stops the reads.
    watch: &'a dyn Fn(u64) -> bool,
    next_watch: u64,
    /// The watcher said stop.
    stopped: bool,
}

/// How often an unpack reports and looks for a cancel: every 4 MiB of blob.
const WATCH_EVERY: u64 = 4 << 20;

impl<'a, R: Read> Hashing<'a, R> {
    fn new(inner: R, watch: &'a dyn Fn(u64) -> bool) -> Self {
        Hashing {
            inner,
            ctx: ring::digest::Context::new(&ring::digest::SHA256),
            n: 0,
            watch,
            next_watch: WATCH_EVERY,
            stopped: false,
        }
    }

    /// The hex digest and the byte count.
    fn finish(self) -> (String, u64) {
        (hex(self.ctx.finish().as_ref()), self.n)
    }
}

impl<R: Read> Read for Hashing<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.stopped {
            return Err(io::Error::other("cancelled by the client"));
        }
        let n = self.inner.read(buf)?;
        self.ctx.update(&buf[..n]);
        self.n += n as u64;
        if self.n >= self.next_watch {
            self.next_watch = self.n + WATCH_EVERY;
            if !(self.watch)(self.n) {
                self.stopped = true;
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::tar::Writer;

    fn tmp(label: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("mcq-unpack-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn put(w: &mut Writer<&mut Vec<u8>>, path: &[u8], mode: u32, data: &[u8]) -> io::Result<()> {
        w.file(path, mode, 0, data.len() as u64, &mut &data[..])
    }

    fn tar(build: impl FnOnce(&mut Writer<&mut Vec<u8>>)) -> Vec<u8> {
        let mut v = Vec::new();
        {
            let mut w = Writer::new(&mut v);
            build(&mut w);
            w.finish().unwrap();
        }
        v
    }

    #[test]
    fn layers_replace_whiteouts_remove_and_opaque_folders_empty() {
        let d = tmp("layers");
        let mut u = Unpacker::new(Folder::open(&d).unwrap(), 1 << 30);
        u.layer(
            &tar(|w| {
                w.dir(b"etc", 0o755, 0).unwrap();
                put(w, b"etc/a", 0o644, b"one").unwrap();
                put(w, b"etc/gone", 0o644, b"x").unwrap();
                w.dir(b"opt/keep", 0o755, 0).unwrap();
                put(w, b"opt/keep/old", 0o644, b"old").unwrap();
                w.symlink(b"lnk", b"etc/a", 0).unwrap();
            })[..],
        )
        .unwrap();
        u.layer(
            &tar(|w| {
                put(w, b"etc/a", 0o4755, b"two").unwrap();
                put(w, b"etc/.wh.gone", 0o644, b"").unwrap();
                put(w, b"opt/keep/new", 0o644, b"new").unwrap();
                put(w, b"opt/keep/.wh..wh..opq", 0o644, b"").unwrap();
                put(w, b"lnk", 0o644, b"now a file").unwrap();
            })[..],
        )
        .unwrap();
        let out = u.finish();
        assert_eq!(std::fs::read(d.join("etc/a")).unwrap(), b"two");
        assert!(!d.join("etc/gone").exists());
        assert!(
            !d.join("opt/keep/old").exists(),
            "the opaque folder lost the lower layer's file"
        );
        assert_eq!(
            std::fs::read(d.join("opt/keep/new")).unwrap(),
            b"new",
            "and kept its own"
        );
        assert_eq!(std::fs::read(d.join("lnk")).unwrap(), b"now a file");
        assert_eq!(
            out.meta[&b"etc/a".to_vec()].mode,
            0o4755,
            "setuid kept for the image"
        );
        assert!(!out.meta.contains_key(b"etc/gone".as_slice()));
        assert!(!out.meta.contains_key(b"opt/keep/old".as_slice()));
        assert_eq!(out.meta[&b"lnk".to_vec()].kind, FileType::File);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn hostile_entries_get_nothing_outside_the_root() {
        let d = tmp("hostile");
        let root = d.join("root");
        std::fs::create_dir(&root).unwrap();
        let unpack = |t: Vec<u8>| {
            let mut u = Unpacker::new(Folder::open(&root).unwrap(), 1 << 20);
            u.layer(&t[..])
        };
        assert!(unpack(tar(|w| put(w, b"../evil", 0o644, b"x").unwrap()))
            .unwrap_err()
            .msg()
            .contains("'..'"));
        assert!(unpack(tar(|w| put(w, b"/evil", 0o644, b"x").unwrap()))
            .unwrap_err()
            .msg()
            .contains("absolute"));
        let e = unpack(tar(|w| {
            w.symlink(b"out", b"..", 0).unwrap();
            put(w, b"out/evil", 0o644, b"x").unwrap();
        }))
        .unwrap_err();
        assert!(e.msg().contains("under a symlink"), "{e}");
        assert!(matches!(e, OciError::Refused(_)), "{e}");
        let e = unpack(tar(|w| put(w, b"big", 0o644, &vec![0u8; 2 << 20]).unwrap())).unwrap_err();
        assert!(e.msg().contains("MCQEMU_MAX_IMAGE_MB"), "{e}");
        assert!(matches!(e, OciError::Refused(_)), "{e}");
        assert_eq!(
            std::fs::read_dir(&d).unwrap().count(),
            1,
            "nothing was written beside the root"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A layer blob is hashed as it is applied, its progress heard every few MiB, and a
    /// watcher that says stop ends it as cancelled.
    #[test]
    fn a_layer_blob_reports_progress_and_stops_when_told() {
        use crate::oci::layout::sha256_hex;
        let d = tmp("apply");
        let blob = tar(|w| put(w, b"big", 0o644, &vec![7u8; 9 << 20]).unwrap());
        std::fs::create_dir_all(d.join("layout/blobs/sha256")).unwrap();
        let hex = sha256_hex(&blob);
        std::fs::write(d.join("layout/blobs/sha256").join(&hex), &blob).unwrap();
        let layer = Layer {
            digest: format!("sha256:{hex}"),
            size: blob.len() as u64,
            compression: Compression::None,
            layout: d.join("layout"),
        };
        let heard = std::cell::Cell::new(0);
        for (name, go) in [("stopped", false), ("whole", true)] {
            std::fs::create_dir(d.join(name)).unwrap();
            let mut u = Unpacker::new(Folder::open(&d.join(name)).unwrap(), 1 << 30);
            let watch = |n: u64| {
                heard.set(n);
                go
            };
            let r = u.apply(&layer, &watch);
            if go {
                r.unwrap();
                assert_eq!(
                    std::fs::metadata(d.join("whole/big")).unwrap().len(),
                    9 << 20
                );
            } else {
                assert!(matches!(r, Err(OciError::Cancelled(_))), "{r:?}");
            }
        }
        assert!(
            heard.get() >= 8 << 20,
            "progress was heard: {}",
            heard.get()
        );
        let mut bad = layer;
        bad.digest = format!("sha256:{}", "0".repeat(64));
        std::fs::create_dir(d.join("bad")).unwrap();
        let mut u = Unpacker::new(Folder::open(&d.join("bad")).unwrap(), 1 << 30);
        let e = u.apply(&bad, &|_| true).unwrap_err();
        assert!(
            matches!(e, OciError::Invalid(_)),
            "no such blob in the layout: {e}"
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
