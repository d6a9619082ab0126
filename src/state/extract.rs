//! Extraction of a tar stream on the host, one entry at a time, through [`Folder`]s: every
//! folder on an entry's way is opened with `O_NOFOLLOW`, so an entry under a symlink (one the
//! archive made, or one swapped in) is refused, as are `..`, absolute paths and anything not
//! below the copied folder; hidden names are left out, as the roots rule.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::ffi::OsStringExt;

use super::tar::{Entry, Kind, Reader};
use super::tree::{hidden, Counts, Folder, Type, MAX_DEPTH};

/// Extracts an archive whose entries lie under `top` into `parent`/`tmp`, one entry at a time.
pub struct Extract<'a> {
    parent: &'a Folder,
    tmp: OsString,
    top: Vec<u8>,
    /// Folders made, with their final mode and mtime, set last (deepest first).
    dirs: Vec<(Vec<OsString>, u32, i64)>,
    /// What was written so far.
    pub counts: Counts,
    /// Whether `tmp` exists yet (so a failure knows whether to clean up).
    pub started: bool,
    /// Write hidden names too (a guest's own copy; the roots rule is the host's).
    keep_hidden: bool,
}

fn refuse(path: &[u8], why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "archive entry {:?} refused: {why}",
            String::from_utf8_lossy(path)
        ),
    )
}

impl<'a> Extract<'a> {
    /// An extraction into `parent`/`tmp` of the archive's `top` (its first path component).
    pub fn new(parent: &'a Folder, tmp: OsString, top: &[u8]) -> Self {
        Extract {
            parent,
            tmp,
            top: top.to_vec(),
            dirs: Vec::new(),
            counts: Counts::default(),
            started: false,
            keep_hidden: false,
        }
    }

    /// The same, writing hidden names too: for the guest's side of a copy in, where the
    /// host's roots rule does not apply (a `.git` sent in arrives whole).
    pub fn keeping_hidden(mut self) -> Self {
        self.keep_hidden = true;
        self
    }

    /// The components below `top`, or None for an entry left out (hidden).
    fn split(&mut self, path: &[u8]) -> io::Result<Option<Vec<OsString>>> {
        if path.starts_with(b"/") {
            return Err(refuse(path, "absolute paths are never extracted"));
        }
        let mut parts = path
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".");
        if parts.next() != Some(&self.top[..]) {
            return Err(refuse(path, "it is not below the copied folder"));
        }
        let mut out = Vec::new();
        for c in parts {
            if c == b".." {
                return Err(refuse(path, "'..' would leave the destination"));
            }
            if hidden(c) && !self.keep_hidden {
                self.counts
                    .skip(path, "hidden names are never written below a root");
                return Ok(None);
            }
            out.push(OsString::from_vec(c.to_vec()));
        }
        Ok(Some(out))
    }

    /// Opens the folder holding `parts`' last component, creating missing folders and
    /// refusing any symlink on the way.
    fn folder_of(&mut self, path: &[u8], parts: &[OsString]) -> io::Result<Folder> {
        let mut cur = self.parent.sub(&self.tmp)?;
        for c in &parts[..parts.len().saturating_sub(1)] {
            match cur.meta(c) {
                Ok(m) if m.kind == Type::Dir => {}
                Ok(m) if m.kind == Type::Symlink => {
                    return Err(refuse(path, "it lies under a symlink the archive made"))
                }
                Ok(_) => return Err(refuse(path, "it lies under something that is not a folder")),
                Err(e) if e.kind() == io::ErrorKind::NotFound => cur.mkdir(c)?,
                Err(e) => return Err(e),
            }
            cur = cur
                .sub(c)
                .map_err(|e| refuse(path, &format!("its folder cannot be opened: {e}")))?;
        }
        Ok(cur)
    }

    /// Writes one entry; `data` is the archive positioned at its content.
    pub fn entry<R: Read>(&mut self, e: &Entry, data: &mut Reader<R>) -> io::Result<()> {
        let Some(parts) = self.split(&e.path)? else {
            return Ok(());
        };
        if parts.len() > MAX_DEPTH {
            return Err(refuse(&e.path, "it is nested too deep"));
        }
        let (dir, leaf) = if parts.is_empty() {
            self.started = true;
            (Folder::dup(self.parent)?, self.tmp.clone())
        } else {
            if !self.started {
                return Err(refuse(&e.path, "it comes before the copied folder itself"));
            }
            let leaf = parts[parts.len() - 1].clone();
            (self.folder_of(&e.path, &parts)?, leaf)
        };
        match &e.kind {
            Kind::Dir => {
                match dir.meta(&leaf) {
                    Ok(m) if m.kind == Type::Dir => {}
                    Ok(_) => return Err(refuse(&e.path, "a folder over an earlier entry")),
                    Err(_) => dir.mkdir(&leaf)?,
                }
                self.dirs.push((parts, e.mode & 0o777, e.mtime));
                self.counts.dirs += 1;
            }
            Kind::File => {
                let _ = dir.unlink(&leaf);
                let mut f = dir.create(&leaf)?;
                self.counts.bytes += data.data(&mut f)?;
                finish_file(&f, e.mode)?;
                dir.set_mtime(&leaf, e.mtime)?;
                self.counts.files += 1;
            }
            Kind::Symlink => {
                let _ = dir.unlink(&leaf);
                dir.symlink(&e.link, &leaf)?;
                dir.set_mtime(&leaf, e.mtime)?;
                self.counts.symlinks += 1;
            }
            Kind::HardLink => self.hard_link(e, &dir, &leaf)?,
            Kind::Other(t) => self
                .counts
                .skip(&e.path, &format!("tar type {:?} is not copied", *t as char)),
        }
        Ok(())
    }

    /// A hard link becomes a copy of the earlier file it names.
    fn hard_link(&mut self, e: &Entry, dir: &Folder, leaf: &OsStr) -> io::Result<()> {
        let Some(target) = self.split(&e.link)? else {
            self.counts.skip(&e.path, "a hard link to a hidden file");
            return Ok(());
        };
        if target.is_empty() {
            return Err(refuse(&e.path, "a hard link to the copied folder itself"));
        }
        let src_dir = self.folder_of(&e.link, &target)?;
        let mut src = src_dir
            .open_file(&target[target.len() - 1])
            .map_err(|err| {
                refuse(
                    &e.path,
                    &format!("its hard-link target cannot be opened: {err}"),
                )
            })?;
        let _ = dir.unlink(leaf);
        let mut f = dir.create(leaf)?;
        self.counts.bytes += io::copy(&mut src, &mut f)?;
        let m = src_dir.meta(&target[target.len() - 1])?;
        finish_file(&f, m.mode)?;
        dir.set_mtime(leaf, m.mtime)?;
        self.counts.files += 1;
        Ok(())
    }

    /// Sets the folders' modes and mtimes, deepest first (so a read-only folder was writable
    /// while it was filled, and setting a child's time leaves its parent's alone).
    pub fn finish(&mut self) -> io::Result<()> {
        self.dirs.sort_by_key(|d| std::cmp::Reverse(d.0.len()));
        for (parts, mode, mtime) in std::mem::take(&mut self.dirs) {
            let (holder, leaf) = match parts.last() {
                None => (Folder::dup(self.parent)?, self.tmp.clone()),
                Some(l) => (self.folder_of(b"", &parts)?, l.clone()),
            };
            holder.sub(&leaf)?.chmod_self(mode)?;
            holder.set_mtime(&leaf, mtime)?;
        }
        Ok(())
    }
}

/// A file's mode from the guest, without setuid, setgid or sticky: guest data must not
/// become a set-id program on the host.
fn finish_file(f: &File, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    f.set_permissions(std::fs::Permissions::from_mode(mode & 0o777))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::tar::Writer;
    use crate::state::tree::{archive_one, walk};
    use std::os::unix::ffi::OsStrExt;

    fn extract(parent: &Folder, archive: &[u8]) -> io::Result<Counts> {
        let mut x = Extract::new(parent, OsString::from("tmp"), b"top");
        let mut r = Reader::new(archive);
        while let Some(e) = r.next_entry()? {
            x.entry(&e, &mut r)?;
        }
        x.finish()?;
        Ok(x.counts)
    }

    #[test]
    fn a_tree_round_trips_and_links_stay_links() {
        let base = std::env::temp_dir().join(format!("mcq-tree-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let src = base.join("src/top");
        std::fs::create_dir_all(src.join("a/b")).unwrap();
        std::fs::write(src.join("a/b/f"), b"data").unwrap();
        std::fs::write(src.join(".hidden"), b"secret").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", src.join("link")).unwrap();
        let dst = base.join("dst");
        std::fs::create_dir_all(&dst).unwrap();
        let base = std::fs::canonicalize(&base).unwrap();
        let from = Folder::open(&base.join("src")).unwrap();
        let mut w = Writer::new(Vec::new());
        let mut counts = Counts::default();
        walk(
            &from,
            OsStr::new("top"),
            b"top",
            0,
            &mut counts,
            &mut |d, n, p, m, c| archive_one(&mut w, d, n, p, m, c),
        )
        .unwrap();
        assert_eq!(
            (
                counts.files,
                counts.dirs,
                counts.symlinks,
                counts.skipped_total
            ),
            (1, 3, 1, 1)
        );
        let ar = w.finish().unwrap();
        let to = Folder::open(&base.join("dst")).unwrap();
        let got = extract(&to, &ar).unwrap();
        assert_eq!((got.files, got.dirs, got.symlinks, got.bytes), (1, 3, 1, 4));
        assert_eq!(std::fs::read(base.join("dst/tmp/a/b/f")).unwrap(), b"data");
        let l = base.join("dst/tmp/link");
        assert!(std::fs::symlink_metadata(&l)
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(!base.join("dst/tmp/.hidden").exists());
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn entries_under_an_archived_symlink_or_outside_are_refused() {
        let base = std::env::temp_dir().join(format!("mcq-tree-bad-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("dst")).unwrap();
        std::fs::create_dir_all(base.join("outside")).unwrap();
        let base = std::fs::canonicalize(&base).unwrap();
        let outside = base.join("outside");
        let cases: Vec<Vec<u8>> = vec![
            {
                let mut w = Writer::new(Vec::new());
                w.dir(b"top", 0o755, 0).unwrap();
                w.symlink(b"top/l", outside.as_os_str().as_bytes(), 0)
                    .unwrap();
                w.file(b"top/l/pwned", 0o644, 0, 1, &mut &b"x"[..]).unwrap();
                w.finish().unwrap()
            },
            {
                let mut w = Writer::new(Vec::new());
                w.dir(b"top", 0o755, 0).unwrap();
                w.file(b"top/../outside/pwned", 0o644, 0, 1, &mut &b"x"[..])
                    .unwrap();
                w.finish().unwrap()
            },
            {
                let mut w = Writer::new(Vec::new());
                w.file(b"/tmp/pwned", 0o644, 0, 1, &mut &b"x"[..]).unwrap();
                w.finish().unwrap()
            },
            {
                let mut w = Writer::new(Vec::new());
                w.dir(b"top", 0o755, 0).unwrap();
                w.symlink(b"top/l", outside.as_os_str().as_bytes(), 0)
                    .unwrap();
                w.file(b"top/l", 0o644, 0, 1, &mut &b"x"[..]).unwrap();
                w.finish().unwrap()
            },
        ];
        for (i, ar) in cases.iter().enumerate() {
            let dst = base.join("dst");
            let _ = std::fs::remove_dir_all(dst.join("tmp"));
            let to = Folder::open(&dst).unwrap();
            let r = extract(&to, ar);
            assert!(
                std::fs::read_dir(&outside).unwrap().next().is_none(),
                "case {i}"
            );
            if i < 3 {
                assert!(r.is_err(), "case {i}: {r:?}");
            } else {
                // A later file of the same name replaces the link itself, not its target.
                assert!(r.is_ok(), "case {i}: {r:?}");
            }
        }
        let _ = std::fs::remove_dir_all(&base);
    }
}
