//! Files the server writes itself, opened without following any symlink beneath the root that
//! holds them: the folder is opened from its root with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)` where the kernel has it (Linux 5.6), otherwise by a walk of
//! `O_NOFOLLOW` opens one component at a time; the file is then created, renamed or removed
//! relative to that folder's descriptor. A symlink swapped in after the roots check can no
//! longer redirect the write.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Component, Path};

use super::roots;

/// A folder opened beneath its root.
pub struct Dir {
    fd: OwnedFd,
}

fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn open_dir_at(dirfd: libc::c_int, name: &CString) -> io::Result<OwnedFd> {
    let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid descriptor and a NUL-terminated name; the result is owned below.
    let fd = check(unsafe { libc::openat(dirfd, name.as_ptr(), flags) })?;
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Dir {
    /// Opens `dir` (resolved, inside a root) from the deepest root that holds it, following no
    /// symlink on the way.
    pub fn open(dir: &Path) -> io::Result<Dir> {
        let root = roots::current()
            .into_iter()
            .find(|r| dir.starts_with(&r.path))
            .ok_or_else(|| io::Error::new(io::ErrorKind::PermissionDenied, "outside the roots"))?;
        let root_c = cstr(root.path.as_os_str())?;
        let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
        // SAFETY: a NUL-terminated path; the result is owned below.
        let rfd = check(unsafe { libc::open(root_c.as_ptr(), flags) })?;
        // SAFETY: `rfd` was just opened and is owned by nobody else.
        let root_fd = unsafe { OwnedFd::from_raw_fd(rfd) };
        let rel = dir.strip_prefix(&root.path).unwrap_or(Path::new(""));
        if rel.as_os_str().is_empty() {
            return Ok(Dir { fd: root_fd });
        }
        match Self::openat2_beneath(&root_fd, rel) {
            Ok(d) => Ok(d),
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => Self::walk(root_fd, rel),
            Err(e) => Err(e),
        }
    }

    fn openat2_beneath(root: &OwnedFd, rel: &Path) -> io::Result<Dir> {
        let rel_c = cstr(rel.as_os_str())?;
        // SAFETY: open_how is plain old data; zeroed is a valid initial value.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
        how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS;
        // SAFETY: openat2 with a valid dirfd, a NUL-terminated path and a correctly sized
        // open_how; the result is owned below.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                root.as_raw_fd(),
                rel_c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        let fd = check(fd as libc::c_int)?;
        // SAFETY: `fd` was just opened and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Dir { fd })
    }

    fn walk(root: OwnedFd, rel: &Path) -> io::Result<Dir> {
        let mut cur = root;
        for c in rel.components() {
            let Component::Normal(name) = c else {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "not beneath the root",
                ));
            };
            cur = open_dir_at(cur.as_raw_fd(), &cstr(name)?)?;
        }
        Ok(Dir { fd: cur })
    }

    /// The folder's `O_PATH` descriptor, for a server that works relative to it.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// Creates `name` in this folder for writing; fails if it exists or is a symlink.
    pub fn create_new(&self, name: &OsStr) -> io::Result<File> {
        let flags =
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: a valid descriptor and a NUL-terminated name; the result is owned below.
        let fd = check(unsafe {
            libc::openat(self.fd.as_raw_fd(), cstr(name)?.as_ptr(), flags, 0o644)
        })?;
        // SAFETY: `fd` was just opened and is owned by nobody else.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Renames `from` to `to`, both in this folder (replacing `to`).
    pub fn rename(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        let (f, t) = (cstr(from)?, cstr(to)?);
        let d = self.fd.as_raw_fd();
        // SAFETY: valid descriptors and NUL-terminated names.
        check(unsafe { libc::renameat(d, f.as_ptr(), d, t.as_ptr()) }).map(|_| ())
    }

    /// Removes `name` from this folder (never what a symlink there points at).
    pub fn remove(&self, name: &OsStr) -> io::Result<()> {
        // SAFETY: a valid descriptor and a NUL-terminated name.
        check(unsafe { libc::unlinkat(self.fd.as_raw_fd(), cstr(name)?.as_ptr(), 0) }).map(|_| ())
    }
}

/// Writes `data` to `path` (resolved, inside a root) through a temporary file in the same
/// folder, renamed into place; nothing is followed beneath the root, and a failure leaves
/// nothing behind.
pub fn write_replace(path: &Path, data: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("/"));
    let leaf = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let d = Dir::open(dir)?;
    let tmp = format!(".{}.tmp-{}", leaf.to_string_lossy(), std::process::id());
    let tmp = OsStr::new(&tmp);
    let written = d.create_new(tmp).and_then(|mut f| {
        f.write_all(data)?;
        f.sync_all()
    });
    let placed = written.and_then(|()| d.rename(tmp, leaf));
    if placed.is_err() {
        let _ = d.remove(tmp);
    }
    placed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_inside_and_never_through_a_symlinked_folder() {
        let base = std::env::temp_dir().join(format!("mcq-beneath-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (inside, outside) = (base.join("in"), base.join("out"));
        for d in [&inside, &outside] {
            assert!(std::fs::create_dir_all(d).is_ok());
        }
        let inside = std::fs::canonicalize(&inside).unwrap_or(inside);
        assert!(write_replace(&inside.join("a.png"), b"png").is_ok());
        assert_eq!(
            std::fs::read(inside.join("a.png")).ok().as_deref(),
            Some(&b"png"[..])
        );
        // A folder swapped for a symlink after the roots check is not followed.
        let _ = std::os::unix::fs::symlink(&outside, inside.join("swapped"));
        assert!(write_replace(&inside.join("swapped").join("b.png"), b"x").is_err());
        assert!(!outside.join("b.png").exists());
        let _ = std::fs::remove_dir_all(&base);
    }
}
