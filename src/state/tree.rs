//! Host folder trees read into a tar stream and written out of one, through folder descriptors
//! opened one component at a time with `O_NOFOLLOW`: a symlink on the host is read as a link
//! and never followed, and an archive entry never lands under a symlink (whether the archive
//! made it or someone swapped it in) or outside the folder it is extracted into.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Component, Path};

use super::tar::Writer;

/// Deepest folder nesting walked or extracted: each level holds one descriptor.
pub const MAX_DEPTH: usize = 128;

/// A folder opened without following symlinks.
pub struct Folder {
    fd: OwnedFd,
}

fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a name"))
}

fn rc(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// What a directory entry is, from `lstat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    /// A regular file.
    File,
    /// A folder.
    Dir,
    /// A symlink (never followed).
    Symlink,
    /// A device, fifo or socket: never copied.
    Other,
}

/// An entry's `lstat`: type, permission bits, size, mtime.
#[derive(Clone, Copy, Debug)]
pub struct Meta {
    /// What it is.
    pub kind: Type,
    /// Permission bits with setuid, setgid, sticky.
    pub mode: u32,
    /// Bytes (regular files).
    pub size: u64,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
}

impl Folder {
    /// Opens a resolved absolute folder from `/`, one component at a time, refusing any
    /// symlink on the way (the path was resolved by the roots check; a symlink now means it
    /// was swapped since).
    pub fn open(path: &Path) -> io::Result<Folder> {
        let root = cstr(OsStr::new("/"))?;
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
        // SAFETY: a NUL-terminated path; the descriptor is owned right after.
        let fd = rc(unsafe { libc::open(root.as_ptr(), flags) })?;
        // SAFETY: just opened, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut cur = Folder { fd };
        for c in path.components() {
            match c {
                Component::RootDir => {}
                Component::Normal(n) => cur = cur.sub(n)?,
                _ => {
                    return Err(io::Error::other(format!(
                        "{} is not resolved",
                        path.display()
                    )))
                }
            }
        }
        Ok(cur)
    }

    /// Opens a folder by a path that may hold symlinks (the guest's side of a copy, where the
    /// path is the guest's own, as its `tar -C` would take it).
    pub fn open_following(path: &Path) -> io::Result<Folder> {
        let f = std::fs::File::open(path)?;
        if !f.metadata()?.is_dir() {
            return Err(io::Error::other(format!(
                "{} is not a folder",
                path.display()
            )));
        }
        Ok(Folder { fd: f.into() })
    }

    fn raw(&self) -> libc::c_int {
        self.fd.as_raw_fd()
    }

    fn open_at(&self, name: &OsStr, flags: libc::c_int, mode: libc::c_uint) -> io::Result<OwnedFd> {
        let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: a valid descriptor and a NUL-terminated name; the result is owned below.
        let fd = rc(unsafe { libc::openat(self.raw(), cstr(name)?.as_ptr(), flags, mode) })?;
        // SAFETY: just opened, owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The subfolder `name`; fails on a symlink.
    pub fn sub(&self, name: &OsStr) -> io::Result<Folder> {
        let fd = self.open_at(name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        Ok(Folder { fd })
    }

    /// `lstat` of `name`.
    pub fn meta(&self, name: &OsStr) -> io::Result<Meta> {
        // SAFETY: stat is plain old data; zeroed is a valid initial value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let flags = libc::AT_SYMLINK_NOFOLLOW;
        // SAFETY: a valid descriptor, a NUL-terminated name and a stat buffer.
        rc(unsafe { libc::fstatat(self.raw(), cstr(name)?.as_ptr(), &mut st, flags) })?;
        let kind = match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => Type::File,
            libc::S_IFDIR => Type::Dir,
            libc::S_IFLNK => Type::Symlink,
            _ => Type::Other,
        };
        Ok(Meta {
            kind,
            mode: st.st_mode & 0o7777,
            size: st.st_size.max(0) as u64,
            mtime: st.st_mtime,
        })
    }

    /// The names in this folder, sorted (for a stable archive order).
    pub fn names(&self) -> io::Result<Vec<OsString>> {
        // The descriptor's own /proc link names this very folder, whatever its path is now.
        let mut v: Vec<OsString> = std::fs::read_dir(format!("/proc/self/fd/{}", self.raw()))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<io::Result<_>>()?;
        v.sort();
        Ok(v)
    }

    /// Opens the regular file `name` for reading; fails on a symlink, never blocks on a fifo.
    pub fn open_file(&self, name: &OsStr) -> io::Result<File> {
        let fd = self.open_at(name, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY, 0)?;
        Ok(File::from(fd))
    }

    /// A symlink's target.
    pub fn readlink(&self, name: &OsStr) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
        // SAFETY: a valid descriptor, a NUL-terminated name and a buffer of that length.
        let n = unsafe {
            libc::readlinkat(
                self.raw(),
                cstr(name)?.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(buf)
    }

    /// Creates the folder `name` (private until [`Folder::finish_dir`] sets its mode).
    pub fn mkdir(&self, name: &OsStr) -> io::Result<()> {
        // SAFETY: a valid descriptor and a NUL-terminated name.
        rc(unsafe { libc::mkdirat(self.raw(), cstr(name)?.as_ptr(), 0o700) }).map(|_| ())
    }

    /// Creates the new file `name`, failing if anything is there.
    pub fn create(&self, name: &OsStr) -> io::Result<File> {
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
        Ok(File::from(self.open_at(name, flags, 0o600)?))
    }

    /// Creates the symlink `name` to `target`.
    pub fn symlink(&self, target: &[u8], name: &OsStr) -> io::Result<()> {
        let t = cstr(OsStr::from_bytes(target))?;
        // SAFETY: NUL-terminated strings and a valid descriptor.
        rc(unsafe { libc::symlinkat(t.as_ptr(), self.raw(), cstr(name)?.as_ptr()) }).map(|_| ())
    }

    /// Removes the file or symlink `name` (never a folder, never what a link points at).
    pub fn unlink(&self, name: &OsStr) -> io::Result<()> {
        // SAFETY: a valid descriptor and a NUL-terminated name.
        rc(unsafe { libc::unlinkat(self.raw(), cstr(name)?.as_ptr(), 0) }).map(|_| ())
    }

    /// Sets `name`'s mtime, on a symlink the link's own.
    pub fn set_mtime(&self, name: &OsStr, mtime: i64) -> io::Result<()> {
        let t = libc::timespec {
            tv_sec: mtime as libc::time_t,
            tv_nsec: 0,
        };
        let times = [
            libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            },
            t,
        ];
        let flags = libc::AT_SYMLINK_NOFOLLOW;
        // SAFETY: a valid descriptor, a NUL-terminated name and two timespecs.
        rc(unsafe { libc::utimensat(self.raw(), cstr(name)?.as_ptr(), times.as_ptr(), flags) })
            .map(|_| ())
    }

    /// Removes the empty folder `name`.
    pub fn rmdir(&self, name: &OsStr) -> io::Result<()> {
        // SAFETY: a valid descriptor and a NUL-terminated name.
        rc(unsafe { libc::unlinkat(self.raw(), cstr(name)?.as_ptr(), libc::AT_REMOVEDIR) })
            .map(|_| ())
    }

    /// Removes `name` whatever it is; a folder with everything in it, never following a
    /// symlink (each level is opened with `O_NOFOLLOW`). Missing is not an error.
    pub fn remove_all(&self, name: &OsStr) -> io::Result<()> {
        match self.meta(name) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
            Ok(m) if m.kind == Type::Dir => {
                let sub = self.sub(name)?;
                sub.chmod_self(0o700)?;
                for n in sub.names()? {
                    sub.remove_all(&n)?;
                }
                self.rmdir(name)
            }
            Ok(_) => self.unlink(name),
        }
    }

    /// Makes `name` here a hard link to `from`'s `src` (never following a symlink).
    pub fn link_from(&self, from: &Folder, src: &OsStr, name: &OsStr) -> io::Result<()> {
        // SAFETY: valid descriptors and NUL-terminated names.
        rc(unsafe {
            libc::linkat(
                from.raw(),
                cstr(src)?.as_ptr(),
                self.raw(),
                cstr(name)?.as_ptr(),
                0,
            )
        })
        .map(|_| ())
    }

    /// Sets this folder's own mode.
    pub fn chmod_self(&self, mode: u32) -> io::Result<()> {
        // SAFETY: a valid descriptor.
        rc(unsafe { libc::fchmod(self.raw(), mode as libc::mode_t) }).map(|_| ())
    }

    /// Renames `from` to `to` in this folder; with `replace` false, never over an existing
    /// `to` (RENAME_NOREPLACE, checked by the kernel).
    pub fn rename(&self, from: &OsStr, to: &OsStr, replace: bool) -> io::Result<()> {
        let (f, t) = (cstr(from)?, cstr(to)?);
        let flags: libc::c_uint = if replace { 0 } else { libc::RENAME_NOREPLACE };
        // SAFETY: valid descriptors and NUL-terminated names.
        let r = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                self.raw(),
                f.as_ptr(),
                self.raw(),
                t.as_ptr(),
                flags,
            )
        };
        rc(r as libc::c_int).map(|_| ())
    }
}

crate::described! {
    /// Counts of what was copied.
    #[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
    pub struct Counts {
        /// Bytes of file content.
        pub bytes: u64,
        /// Regular files (hard links count as the copies they become).
        pub files: u64,
        /// Folders, the top one included.
        pub dirs: u64,
        /// Symlinks, copied as links.
        pub symlinks: u64,
        /// Entries left out, as `path (why)`, the first few only.
        pub skipped: Vec<String>,
        /// How many entries were left out in all.
        pub skipped_total: u64,
    }
}

impl Counts {
    /// Notes an entry left out, and why.
    pub fn skip(&mut self, path: &[u8], why: &str) {
        self.skipped_total += 1;
        if self.skipped.len() < 20 {
            self.skipped
                .push(format!("{} ({why})", String::from_utf8_lossy(path)));
        }
    }
}

/// What [`walk`] calls for each entry: the folder holding it, its name there, its path in
/// the archive, its `lstat`, and the counts so far.
pub type Visit<'a> = dyn FnMut(&Folder, &OsStr, &[u8], &Meta, &mut Counts) -> io::Result<()> + 'a;

/// A name that the roots never reach below a root: hidden (`.ssh`, `.git`) or not UTF-8.
pub fn hidden(name: &[u8]) -> bool {
    name.starts_with(b".") || std::str::from_utf8(name).is_err()
}

/// Visits `name` in `dir` and, for a folder, everything below it (hidden names skipped, as
/// the roots rule), calling `visit(folder, name, archive path, meta)` for each entry.
pub fn walk(
    dir: &Folder,
    name: &OsStr,
    path: &[u8],
    depth: usize,
    counts: &mut Counts,
    visit: &mut Visit,
) -> io::Result<()> {
    walk_tree(dir, name, path, (depth, false), counts, visit)
}

/// [`walk`] with hidden names visited too: a guest's own tree, where the host's roots rule
/// does not apply.
pub fn walk_all(
    dir: &Folder,
    name: &OsStr,
    path: &[u8],
    counts: &mut Counts,
    visit: &mut Visit,
) -> io::Result<()> {
    walk_tree(dir, name, path, (0, true), counts, visit)
}

fn walk_tree(
    dir: &Folder,
    name: &OsStr,
    path: &[u8],
    (depth, keep_hidden): (usize, bool),
    counts: &mut Counts,
    visit: &mut Visit,
) -> io::Result<()> {
    let meta = dir.meta(name)?;
    visit(dir, name, path, &meta, counts)?;
    if meta.kind != Type::Dir {
        return Ok(());
    }
    if depth >= MAX_DEPTH {
        return Err(io::Error::other(format!(
            "{} is nested more than {MAX_DEPTH} folders deep",
            String::from_utf8_lossy(path)
        )));
    }
    let sub = dir.sub(name)?;
    for child in sub.names()? {
        let child_path = [path, b"/", child.as_bytes()].concat();
        if !keep_hidden && hidden(child.as_bytes()) {
            counts.skip(&child_path, "hidden names are never reached below a root");
            continue;
        }
        walk_tree(
            &sub,
            &child,
            &child_path,
            (depth + 1, keep_hidden),
            counts,
            visit,
        )?;
    }
    Ok(())
}

/// Removes a file, link or folder tree, never following a link out of it; quietly (a
/// failed copy's temporary, best effort).
pub fn remove_quietly(path: &std::path::Path) {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            let _ = std::fs::remove_dir_all(path);
        }
        Ok(_) => {
            let _ = std::fs::remove_file(path);
        }
        Err(_) => {}
    }
}

/// Adds one walked entry to the archive and to the counts.
pub fn archive_one<W: Write>(
    w: &mut Writer<W>,
    dir: &Folder,
    name: &OsStr,
    path: &[u8],
    m: &Meta,
    counts: &mut Counts,
) -> io::Result<()> {
    match m.kind {
        Type::Dir => {
            w.dir(path, m.mode, m.mtime)?;
            counts.dirs += 1;
        }
        Type::Symlink => {
            w.symlink(path, &dir.readlink(name)?, m.mtime)?;
            counts.symlinks += 1;
        }
        Type::File => {
            let mut f = dir.open_file(name)?;
            w.file(path, m.mode, m.mtime, m.size, &mut f)?;
            counts.files += 1;
            counts.bytes += m.size;
        }
        Type::Other => counts.skip(path, "not a file, folder or symlink"),
    }
    Ok(())
}

impl Folder {
    /// Another descriptor of this same folder.
    pub fn dup(other: &Folder) -> io::Result<Folder> {
        Ok(Folder {
            fd: other.fd.try_clone()?,
        })
    }
}
