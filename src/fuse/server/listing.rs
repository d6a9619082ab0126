//! Folder listings: a folder read whole when the guest opens it (within the listing bounds),
//! served by offset, with READDIRPLUS's lookups (each counted as one the guest's kernel holds).

use std::os::unix::io::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::{
    err, short, Listing, Server, MAX_DIR_ENTRIES, MAX_HANDLES, MAX_LISTED, MAX_WRITE, VALID,
};
use crate::fuse::abi::{self, Attr, Cursor, Reply};
use crate::fuse::nodes::{self, fstat, open_path};
use std::io;

impl Server {
    pub(super) fn opendir(&mut self, u: u64, id: u64) -> io::Result<Vec<u8>> {
        let dir = self.nodes.dir(id)?;
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: a folder descriptor and a NUL-terminated name.
        let fd = unsafe { libc::openat(dir, c".".as_ptr(), flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just opened, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let entries = list(fd.as_raw_fd())?;
        if self.files.len() + self.dirs.len() >= MAX_HANDLES
            || self.listed + entries.len() > MAX_LISTED
        {
            return Err(err(libc::EMFILE));
        }
        self.listed += entries.len();
        let fh = self.next_fh;
        self.next_fh += 1;
        self.dirs.insert(
            fh,
            Listing {
                fd,
                dir: id,
                entries,
            },
        );
        let mut r = Reply::ok(u);
        r.u64(fh).u32(0).u32(0);
        Ok(r.finish())
    }

    pub(super) fn readdir(&mut self, u: u64, c: &mut Cursor, plus: bool) -> io::Result<Vec<u8>> {
        let fh = c.u64().ok_or_else(short)?;
        let offset = c.u64().ok_or_else(short)? as usize;
        let size = c.u32().ok_or_else(short)?.min(MAX_WRITE) as usize;
        let listing = self.dirs.get(&fh).ok_or_else(|| err(libc::EBADF))?;
        let (dirfd, dir) = (listing.fd.as_raw_fd(), listing.dir);
        let mut r = Reply::ok(u);
        let limit = abi::OUT_HEADER + size;
        let mut i = offset;
        while let Some((name, ino, kind)) = self.dirs.get(&fh).and_then(|l| l.entries.get(i)) {
            let (name, ino, kind) = (name.clone(), *ino, *kind);
            let base = if plus { abi::ENTRY_OUT } else { 0 };
            let rec = (base + 24 + name.len()).div_ceil(8) * 8;
            if r.buf.len() + rec > limit {
                break;
            }
            i += 1;
            if plus {
                let dot = name == b"." || name == b"..";
                let held = if dot {
                    None
                } else {
                    self.plus_lookup(dirfd, dir, &name)
                };
                match held {
                    Some((id, st)) => r.entry(id, VALID, &Attr::from_stat(&st), self.owner),
                    None if dot => r.entry(0, (0, 0), &Attr::default(), self.owner),
                    None => continue, // gone since the listing
                }
            }
            r.u64(ino)
                .u64(i as u64)
                .u32(name.len() as u32)
                .u32(kind as u32);
            r.bytes(&name).pad8();
        }
        Ok(r.finish())
    }

    /// READDIRPLUS's lookup of one entry (the kernel counts it as a lookup held).
    pub(super) fn plus_lookup(
        &mut self,
        dirfd: RawFd,
        dir: u64,
        name: &[u8],
    ) -> Option<(u64, libc::stat)> {
        let name = nodes::name(name).ok()?;
        let fd = open_path(dirfd, &name).ok()?;
        let st = fstat(fd.as_raw_fd()).ok()?;
        let id = self.nodes.hold(fd, &st, dir, &name).ok()?;
        Some((id, st))
    }
}

/// Lists the folder open on `fd` (rewound first): names, inode numbers, `d_type`s.
fn list(fd: RawFd) -> io::Result<Vec<(Vec<u8>, u64, u8)>> {
    // SAFETY: a duplicate for fdopendir, which takes ownership of it and closes it in closedir.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `dup` is an open folder descriptor; on failure it is still ours to close.
    let d = unsafe { libc::fdopendir(dup) };
    if d.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so `dup` is still ours.
        unsafe { libc::close(dup) };
        return Err(e);
    }
    // SAFETY: a valid DIR stream, rewound so a listing always starts at the beginning.
    unsafe { libc::rewinddir(d) };
    let mut out = Vec::new();
    let result = loop {
        // SAFETY: a valid DIR stream; the entry is read before the next call.
        let e = unsafe { libc::readdir(d) };
        if e.is_null() {
            break Ok(());
        }
        if out.len() >= MAX_DIR_ENTRIES {
            break Err(err(libc::EOVERFLOW));
        }
        // SAFETY: readdir returned a valid entry whose name is NUL-terminated.
        let (name, ino, kind) = unsafe {
            let e = &*e;
            (
                std::ffi::CStr::from_ptr(e.d_name.as_ptr())
                    .to_bytes()
                    .to_vec(),
                e.d_ino,
                e.d_type,
            )
        };
        out.push((name, ino, kind));
    };
    // SAFETY: the stream is closed once (it closes `dup`).
    unsafe { libc::closedir(d) };
    result.map(|_| out)
}
