//! The requests that change the share: creating files, folders, links and symlinks, removing
//! and renaming them, and their attributes. Each refuses on a read-only share; names are
//! checked and resolved in their folder's descriptor only.

use std::ffi::CString;
use std::io;
use std::os::unix::io::{AsRawFd, FromRawFd, RawFd};

use super::{err, proc_path, rc, regular_only, short, Server, VALID};
use crate::fuse::abi::{self, Attr, Cursor, InHeader, Reply};
use crate::fuse::nodes::{self, fstat, open_path};

/// The SETATTR changes a read-only share refuses (owners are ignored, not refused).
const FATTR_CHANGES: u32 = abi::FATTR_MODE | abi::FATTR_SIZE | abi::FATTR_ATIME | abi::FATTR_MTIME;

impl Server {
    /// A name in folder `parent` that the guest wants to create.
    pub(super) fn new_name(&mut self, parent: u64, c: &mut Cursor) -> io::Result<(RawFd, CString)> {
        self.need_writable()?;
        let dir = self.nodes.dir(parent)?;
        Ok((dir, nodes::name(c.cstr().ok_or_else(short)?)?))
    }

    pub(super) fn lookup_new(
        &mut self,
        u: u64,
        parent: u64,
        name: &CString,
    ) -> io::Result<Vec<u8>> {
        let (id, st) = self.nodes.lookup(parent, name)?;
        Ok(self.entry(u, id, &st))
    }

    pub(super) fn create(&mut self, u: u64, parent: u64, c: &mut Cursor) -> io::Result<Vec<u8>> {
        let flags = c.u32().ok_or_else(short)?;
        let mode = c.u32().ok_or_else(short)? & 0o777;
        c.take(8).ok_or_else(short)?; // umask (applied by the kernel), open_flags
        let (dir, name) = self.new_name(parent, c)?;
        let flags = self.open_flags(flags)? | (flags as i32 & libc::O_EXCL);
        let all = flags | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
        // An existing name is opened too (no O_EXCL asked): non-blocking, and only a regular
        // file is kept (a FIFO would hang the server, a device file must never be opened).
        // SAFETY: a folder descriptor and a NUL-terminated name; owned below.
        let fd = unsafe { libc::openat(dir, name.as_ptr(), all, mode) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just opened, owned by nobody else.
        let file = regular_only(unsafe { std::fs::File::from_raw_fd(fd) }, flags)?;
        let (id, st) = self.nodes.lookup(parent, &name)?;
        let fh = match self.add_file(file) {
            Ok(fh) => fh,
            Err(e) => {
                self.nodes.forget(id, 1);
                return Err(e);
            }
        };
        let mut r = Reply::ok(u);
        r.entry(id, VALID, &Attr::from_stat(&st), self.owner);
        r.u64(fh).u32(0).u32(0);
        Ok(r.finish())
    }

    pub(super) fn mknod(&mut self, u: u64, parent: u64, c: &mut Cursor) -> io::Result<Vec<u8>> {
        let mode = c.u32().ok_or_else(short)?;
        c.take(12).ok_or_else(short)?; // rdev, umask, padding
        let (dir, name) = self.new_name(parent, c)?;
        let kind = mode & libc::S_IFMT;
        if ![libc::S_IFREG, libc::S_IFIFO, libc::S_IFSOCK].contains(&kind) {
            return Err(err(libc::EPERM)); // no device files on the host
        }
        // SAFETY: a folder descriptor and a NUL-terminated name.
        rc(unsafe { libc::mknodat(dir, name.as_ptr(), kind | (mode & 0o777), 0) })?;
        self.lookup_new(u, parent, &name)
    }

    pub(super) fn mkdir(&mut self, u: u64, parent: u64, c: &mut Cursor) -> io::Result<Vec<u8>> {
        let mode = c.u32().ok_or_else(short)? & 0o1777;
        c.take(4).ok_or_else(short)?;
        let (dir, name) = self.new_name(parent, c)?;
        // SAFETY: a folder descriptor and a NUL-terminated name.
        rc(unsafe { libc::mkdirat(dir, name.as_ptr(), mode) })?;
        self.lookup_new(u, parent, &name)
    }

    pub(super) fn symlink(&mut self, u: u64, parent: u64, c: &mut Cursor) -> io::Result<Vec<u8>> {
        let (dir, name) = self.new_name(parent, c)?;
        let target = c.cstr().ok_or_else(short)?;
        if target.is_empty() || target.len() > 4095 {
            return Err(err(libc::EINVAL));
        }
        let target = CString::new(target).map_err(|_| short())?;
        // SAFETY: NUL-terminated strings and a folder descriptor. The link is written as
        // given and never followed by the server.
        rc(unsafe { libc::symlinkat(target.as_ptr(), dir, name.as_ptr()) })?;
        self.lookup_new(u, parent, &name)
    }

    pub(super) fn link(&mut self, u: u64, parent: u64, c: &mut Cursor) -> io::Result<Vec<u8>> {
        let old = c.u64().ok_or_else(short)?;
        let (dir, name) = self.new_name(parent, c)?;
        let (fd, kind) = self.node_fd(old)?;
        if kind != libc::S_IFREG {
            return Err(err(libc::EPERM));
        }
        let path = proc_path(fd);
        // SAFETY: NUL-terminated paths and a folder descriptor; the source is a regular file
        // node of this share, reached through its descriptor.
        rc(unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                path.as_ptr(),
                dir,
                name.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        })?;
        self.lookup_new(u, parent, &name)
    }

    pub(super) fn remove(&mut self, u: u64, h: &InHeader, c: &mut Cursor) -> io::Result<Vec<u8>> {
        let (dir, name) = self.new_name(h.nodeid, c)?;
        let flag = if h.opcode == abi::RMDIR {
            libc::AT_REMOVEDIR
        } else {
            0
        };
        // SAFETY: a folder descriptor and a NUL-terminated name.
        rc(unsafe { libc::unlinkat(dir, name.as_ptr(), flag) })?;
        Ok(Reply::ok(u).finish())
    }

    pub(super) fn rename(
        &mut self,
        u: u64,
        parent: u64,
        c: &mut Cursor,
        two: bool,
    ) -> io::Result<Vec<u8>> {
        let newdir = c.u64().ok_or_else(short)?;
        let flags = if two {
            let f = c.u32().ok_or_else(short)?;
            c.u32().ok_or_else(short)?;
            f
        } else {
            0
        };
        // RENAME_NOREPLACE and RENAME_EXCHANGE only: RENAME_WHITEOUT makes a device file.
        if flags & !3 != 0 {
            return Err(err(libc::EINVAL));
        }
        let (dir, old) = self.new_name(parent, c)?;
        let new = nodes::name(c.cstr().ok_or_else(short)?)?;
        let to = self.nodes.dir(newdir)?;
        let inode_at = |d: RawFd, n: &CString| {
            open_path(d, n)
                .and_then(|f| fstat(f.as_raw_fd()))
                .map(|st| (st.st_dev, st.st_ino))
                .ok()
        };
        let (moving, replaced) = (inode_at(dir, &old), inode_at(to, &new));
        // SAFETY: folder descriptors and NUL-terminated names, both within the share.
        let r = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                dir,
                old.as_ptr(),
                to,
                new.as_ptr(),
                flags,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        if let Some(k) = moving {
            self.nodes.renamed(k, newdir, &new);
        }
        if let Some(k) = replaced.filter(|_| flags & 2 != 0) {
            self.nodes.renamed(k, parent, &old);
        }
        Ok(Reply::ok(u).finish())
    }

    pub(super) fn setattr(&mut self, u: u64, id: u64, c: &mut Cursor) -> io::Result<Vec<u8>> {
        let valid = c.u32().ok_or_else(short)?;
        c.u32();
        let fh = c.u64().ok_or_else(short)?;
        let size = c.u64().ok_or_else(short)?;
        c.u64(); // lock_owner
        let atime = c.u64().ok_or_else(short)?;
        let mtime = c.u64().ok_or_else(short)?;
        c.u64(); // ctime
        let atimensec = c.u32().ok_or_else(short)?;
        let mtimensec = c.u32().ok_or_else(short)?;
        c.u32(); // ctimensec
        let mode = c.u32().ok_or_else(short)?;
        let changes = FATTR_CHANGES & valid;
        if changes != 0 {
            self.need_writable()?;
        }
        let (fd, kind) = self.node_fd(id)?;
        let path = proc_path(fd);
        if valid & abi::FATTR_MODE != 0 && kind != libc::S_IFLNK {
            let keep = if kind == libc::S_IFDIR { 0o1777 } else { 0o777 };
            // SAFETY: a NUL-terminated path to the node's own inode (not a symlink).
            rc(unsafe { libc::chmod(path.as_ptr(), mode & keep) })?;
        }
        if valid & abi::FATTR_SIZE != 0 {
            match self.files.get(&fh).filter(|_| valid & abi::FATTR_FH != 0) {
                Some(f) => f.set_len(size)?,
                None => self.reopen(id, libc::O_WRONLY)?.set_len(size)?,
            }
        }
        let times = abi::FATTR_ATIME | abi::FATTR_MTIME;
        if valid & times != 0 && kind != libc::S_IFLNK {
            let ts = |set: bool, now: bool, s: u64, ns: u32| libc::timespec {
                tv_sec: s as _,
                tv_nsec: if now {
                    libc::UTIME_NOW
                } else if set {
                    ns.min(999_999_999) as _
                } else {
                    libc::UTIME_OMIT
                },
            };
            let t = [
                ts(
                    valid & abi::FATTR_ATIME != 0,
                    valid & abi::FATTR_ATIME_NOW != 0,
                    atime,
                    atimensec,
                ),
                ts(
                    valid & abi::FATTR_MTIME != 0,
                    valid & abi::FATTR_MTIME_NOW != 0,
                    mtime,
                    mtimensec,
                ),
            ];
            // SAFETY: a NUL-terminated path to the node's inode and two timespecs.
            rc(unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), t.as_ptr(), 0) })?;
        }
        // Owners (FATTR_UID/GID) are not changed: files on the host stay the host user's.
        let st = fstat(fd)?;
        Ok(self.attr_out(u, &st))
    }
}
