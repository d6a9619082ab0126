//! The file server: answers one FUSE request at a time from the guest's kernel, on the shared
//! folder's nodes ([`super::nodes`]). Every file is reached relative to its folder's
//! descriptor, one checked name at a time; a regular file is opened again through
//! `/proc/self/fd` from its node (the way virtiofsd does), so no path is ever resolved. A
//! read-only share refuses every change with EROFS; a writable one creates files as the host
//! user, with no setuid, setgid or device files.
//!
//! Here: the requests read and answered, files opened, read and written; [`listing`]: folder
//! listings; [`changes`]: what changes the share.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::abi::{self, Attr, Cursor, InHeader, Reply};
use super::nodes::{self, fstat, Nodes};

mod changes;
mod listing;

/// The largest read or write the server takes (the kernel splits larger ones): 1 MiB, 256
/// pages, so a big file moves in few round trips.
pub const MAX_WRITE: u32 = 1 << 20;
/// The largest request the guest may send (a write and its header).
pub const MAX_REQUEST: usize = MAX_WRITE as usize + 4096;
/// How long the guest's kernel may trust a name or attributes: a change made on the host is
/// seen within this.
const VALID: (u64, u32) = (0, 800_000_000);
/// Most open files and folder listings at once.
const MAX_HANDLES: usize = 65_536;
/// Most entries a folder listing holds.
const MAX_DIR_ENTRIES: usize = 1_000_000;
/// Most entries all open listings hold together (a guest opening a big folder many times
/// gets EMFILE, not the host's memory).
const MAX_LISTED: usize = 4_000_000;
/// Opcodes counted one by one (FUSE's are below 64).
const COUNTED: usize = 64;

/// A folder's entries as listed when the guest opened it.
struct Listing {
    fd: OwnedFd,
    /// The folder's node.
    dir: u64,
    entries: Vec<(Vec<u8>, u64, u8)>,
}

/// One share's server.
pub struct Server {
    nodes: Nodes,
    files: HashMap<u64, std::fs::File>,
    dirs: HashMap<u64, Listing>,
    next_fh: u64,
    writable: bool,
    /// The owner the guest sees for every file.
    owner: (u32, u32),
    /// DESTROY came: the guest unmounted the share.
    ended: bool,
    /// Requests answered, by opcode (opcodes past [`COUNTED`] share the last slot).
    counts: [u64; COUNTED],
    /// Entries held by all open folder listings together.
    listed: usize,
}

fn err(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

fn rc(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `/proc/self/fd/N`: reopens a node's inode without resolving any path inside the share.
fn proc_path(fd: RawFd) -> CString {
    CString::new(format!("/proc/self/fd/{fd}")).unwrap_or_default()
}

fn short() -> io::Error {
    err(libc::EINVAL)
}

impl Server {
    /// A server for the folder `root` (already opened, inside the roots), as `writable` asks,
    /// showing its files as owned by `owner` in the guest.
    pub fn new(root: OwnedFd, writable: bool, owner: (u32, u32)) -> io::Result<Server> {
        Ok(Server {
            nodes: Nodes::new(root, node_cap())?,
            files: HashMap::new(),
            dirs: HashMap::new(),
            next_fh: 1,
            writable,
            owner,
            ended: false,
            counts: [0; COUNTED],
            listed: 0,
        })
    }

    /// True once the guest's kernel sent DESTROY (the share was unmounted).
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Requests answered so far: (opcode, count) for those seen.
    pub fn counts(&self) -> Vec<(u32, u64)> {
        (0..COUNTED as u32)
            .zip(self.counts)
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// How many nodes the guest holds (for tests and the status file).
    pub fn node_count(&self) -> usize {
        self.nodes.count()
    }

    /// Answers one request (a whole message as the guest's kernel wrote it); None for the
    /// requests that take no answer (FORGET, INTERRUPT) and for garbage too short to answer.
    pub fn handle(&mut self, msg: &[u8]) -> Option<Vec<u8>> {
        let h = InHeader::parse(msg)?;
        self.counts[(h.opcode as usize).min(COUNTED - 1)] += 1;
        self.nodes.trim();
        let body = msg.get(abi::IN_HEADER..(h.len as usize).min(msg.len()))?;
        match h.opcode {
            abi::FORGET => {
                let n = Cursor::new(body).u64().unwrap_or(0);
                self.nodes.forget(h.nodeid, n);
                None
            }
            abi::BATCH_FORGET => {
                self.batch_forget(body);
                None
            }
            abi::INTERRUPT => None,
            _ => Some(match self.dispatch(&h, body) {
                Ok(reply) => reply,
                Err(e) => Reply::error(h.unique, errno_of(&e)),
            }),
        }
    }

    fn batch_forget(&mut self, body: &[u8]) {
        let mut c = Cursor::new(body);
        let count = c.u32().unwrap_or(0);
        c.u32();
        for _ in 0..count {
            match (c.u64(), c.u64()) {
                (Some(id), Some(n)) => self.nodes.forget(id, n),
                _ => break,
            }
        }
    }

    fn dispatch(&mut self, h: &InHeader, body: &[u8]) -> io::Result<Vec<u8>> {
        let mut c = Cursor::new(body);
        let u = h.unique;
        match h.opcode {
            abi::INIT => self.init(u, &mut c),
            abi::DESTROY => {
                self.ended = true;
                Ok(Reply::ok(u).finish())
            }
            abi::LOOKUP => {
                let name = nodes::name(c.cstr().ok_or_else(short)?)?;
                let (id, st) = self.nodes.lookup(h.nodeid, &name)?;
                Ok(self.entry(u, id, &st))
            }
            abi::GETATTR => {
                let st = fstat(self.nodes.get(h.nodeid)?.0)?;
                Ok(self.attr_out(u, &st))
            }
            abi::SETATTR => self.setattr(u, h.nodeid, &mut c),
            abi::READLINK => self.readlink(u, h.nodeid),
            abi::OPEN => self.open(u, h.nodeid, &mut c),
            abi::READ => self.read(u, &mut c),
            abi::WRITE => self.write(u, &mut c),
            abi::RELEASE => {
                let fh = c.u64().ok_or_else(short)?;
                self.files.remove(&fh);
                Ok(Reply::ok(u).finish())
            }
            // Writes go through at once: nothing to flush. ENOSYS makes the kernel stop
            // sending FLUSH at every close (a round trip each).
            abi::FLUSH => Err(err(libc::ENOSYS)),
            abi::FSYNCDIR => Ok(Reply::ok(u).finish()),
            abi::FSYNC => self.fsync(u, &mut c),
            abi::OPENDIR => self.opendir(u, h.nodeid),
            abi::READDIR => self.readdir(u, &mut c, false),
            abi::READDIRPLUS => self.readdir(u, &mut c, true),
            abi::RELEASEDIR => {
                let fh = c.u64().ok_or_else(short)?;
                if let Some(l) = self.dirs.remove(&fh) {
                    self.listed -= l.entries.len();
                }
                Ok(Reply::ok(u).finish())
            }
            abi::STATFS => self.statfs(u),
            abi::CREATE => self.create(u, h.nodeid, &mut c),
            abi::MKNOD => self.mknod(u, h.nodeid, &mut c),
            abi::MKDIR => self.mkdir(u, h.nodeid, &mut c),
            abi::SYMLINK => self.symlink(u, h.nodeid, &mut c),
            abi::LINK => self.link(u, h.nodeid, &mut c),
            abi::UNLINK | abi::RMDIR => self.remove(u, h, &mut c),
            abi::RENAME => self.rename(u, h.nodeid, &mut c, false),
            abi::RENAME2 => self.rename(u, h.nodeid, &mut c, true),
            abi::FALLOCATE => self.fallocate(u, &mut c),
            // Locks stay in the guest's kernel (not asked for at INIT); xattrs, ioctls, polls,
            // lseek, copy_file_range and the rest: the kernel falls back or reports them
            // unsupported once, then stops asking.
            _ => Err(err(libc::ENOSYS)),
        }
    }

    fn init(&mut self, u: u64, c: &mut Cursor) -> io::Result<Vec<u8>> {
        let major = c.u32().ok_or_else(short)?;
        let minor = c.u32().ok_or_else(short)?;
        let readahead = c.u32().ok_or_else(short)?;
        let flags = c.u32().ok_or_else(short)?;
        let mut r = Reply::ok(u);
        if major > abi::MAJOR {
            // The kernel asks again with ours.
            r.u32(abi::MAJOR).u32(abi::MINOR);
            return Ok(r.finish());
        }
        if major < abi::MAJOR || minor < 23 {
            return Err(err(libc::EPROTO));
        }
        let want = abi::ASYNC_READ
            | abi::ATOMIC_O_TRUNC
            | abi::BIG_WRITES
            | abi::AUTO_INVAL_DATA
            | abi::DO_READDIRPLUS
            | abi::PARALLEL_DIROPS
            | abi::MAX_PAGES
            | abi::CACHE_SYMLINKS;
        r.u32(abi::MAJOR).u32(abi::MINOR.min(minor)).u32(readahead);
        r.u32(flags & want);
        r.u16(16).u16(12); // max_background, congestion_threshold
        r.u32(MAX_WRITE).u32(1); // max_write, time_gran (1 ns)
        r.u16((MAX_WRITE / 4096) as u16).u16(0).u32(0);
        r.bytes(&[0u8; 28]);
        Ok(r.finish())
    }

    fn entry(&self, u: u64, id: u64, st: &libc::stat) -> Vec<u8> {
        let mut r = Reply::ok(u);
        r.entry(id, VALID, &Attr::from_stat(st), self.owner);
        r.finish()
    }

    fn attr_out(&self, u: u64, st: &libc::stat) -> Vec<u8> {
        let mut r = Reply::ok(u);
        r.u64(VALID.0).u32(VALID.1).u32(0);
        r.attr(&Attr::from_stat(st), self.owner.0, self.owner.1);
        r.finish()
    }

    fn need_writable(&self) -> io::Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(err(libc::EROFS))
        }
    }

    fn node_fd(&mut self, id: u64) -> io::Result<(RawFd, u32)> {
        self.nodes.get(id)
    }

    /// Opens regular file node `id` afresh with `flags` (checked by the caller).
    fn reopen(&mut self, id: u64, flags: i32) -> io::Result<std::fs::File> {
        let (fd, kind) = self.node_fd(id)?;
        if kind != libc::S_IFREG {
            return Err(err(if kind == libc::S_IFDIR {
                libc::EISDIR
            } else {
                libc::EACCES
            }));
        }
        let path = proc_path(fd);
        // Non-blocking until checked: a FIFO that took a reused inode number must not hang the
        // server (it answers one request at a time).
        // SAFETY: a NUL-terminated path; the result is owned below.
        let f = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC | libc::O_NONBLOCK) };
        if f < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just opened, owned by nobody else.
        regular_only(unsafe { std::fs::File::from_raw_fd(f) }, flags)
    }

    /// The open flags a guest may ask for, checked against a read-only share.
    fn open_flags(&self, flags: u32) -> io::Result<i32> {
        let flags = flags as i32;
        let acc = flags & libc::O_ACCMODE;
        if !self.writable && (acc != libc::O_RDONLY || flags & libc::O_TRUNC != 0) {
            return Err(err(libc::EROFS));
        }
        Ok(acc | (flags & (libc::O_APPEND | libc::O_TRUNC | libc::O_NONBLOCK)))
    }

    fn add_file(&mut self, f: std::fs::File) -> io::Result<u64> {
        if self.files.len() + self.dirs.len() >= MAX_HANDLES {
            return Err(err(libc::EMFILE));
        }
        let fh = self.next_fh;
        self.next_fh += 1;
        self.files.insert(fh, f);
        Ok(fh)
    }

    fn file(&self, fh: u64) -> io::Result<&std::fs::File> {
        self.files.get(&fh).ok_or_else(|| err(libc::EBADF))
    }

    fn open(&mut self, u: u64, id: u64, c: &mut Cursor) -> io::Result<Vec<u8>> {
        let flags = self.open_flags(c.u32().ok_or_else(short)?)?;
        let f = self.reopen(id, flags)?;
        let fh = self.add_file(f)?;
        let mut r = Reply::ok(u);
        r.u64(fh).u32(0).u32(0);
        Ok(r.finish())
    }

    fn read(&mut self, u: u64, c: &mut Cursor) -> io::Result<Vec<u8>> {
        let fh = c.u64().ok_or_else(short)?;
        let offset = c.u64().ok_or_else(short)?;
        let size = c.u32().ok_or_else(short)?.min(MAX_WRITE) as usize;
        let f = self.file(fh)?;
        let mut r = Reply::ok(u);
        let start = r.buf.len();
        r.buf.resize(start + size, 0);
        let mut got = 0;
        while got < size {
            match f.read_at(&mut r.buf[start + got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        r.buf.truncate(start + got);
        Ok(r.finish())
    }

    fn write(&mut self, u: u64, c: &mut Cursor) -> io::Result<Vec<u8>> {
        self.need_writable()?;
        let fh = c.u64().ok_or_else(short)?;
        let offset = c.u64().ok_or_else(short)?;
        let size = c.u32().ok_or_else(short)? as usize;
        c.take(20).ok_or_else(short)?; // write_flags, lock_owner, flags, padding
        let data = c.take(size).ok_or_else(short)?;
        self.file(fh)?.write_all_at(data, offset)?;
        let mut r = Reply::ok(u);
        r.u32(size as u32).u32(0);
        Ok(r.finish())
    }

    fn fsync(&mut self, u: u64, c: &mut Cursor) -> io::Result<Vec<u8>> {
        let fh = c.u64().ok_or_else(short)?;
        let flags = c.u32().ok_or_else(short)?;
        let f = self.file(fh)?;
        if flags & abi::FSYNC_DATASYNC != 0 {
            f.sync_data()?;
        } else {
            f.sync_all()?;
        }
        Ok(Reply::ok(u).finish())
    }

    fn fallocate(&mut self, u: u64, c: &mut Cursor) -> io::Result<Vec<u8>> {
        self.need_writable()?;
        let fh = c.u64().ok_or_else(short)?;
        let offset = c.u64().ok_or_else(short)? as i64;
        let length = c.u64().ok_or_else(short)? as i64;
        let mode = c.u32().ok_or_else(short)? as i32;
        let fd = self.file(fh)?.as_raw_fd();
        // SAFETY: an open descriptor; the kernel checks the range and mode.
        rc(unsafe { libc::fallocate(fd, mode, offset, length) })?;
        Ok(Reply::ok(u).finish())
    }

    fn readlink(&mut self, u: u64, id: u64) -> io::Result<Vec<u8>> {
        let (fd, kind) = self.node_fd(id)?;
        if kind != libc::S_IFLNK {
            return Err(err(libc::EINVAL));
        }
        let mut buf = vec![0u8; 4096];
        // SAFETY: an O_PATH symlink descriptor with an empty path reads that link itself.
        let n = unsafe { libc::readlinkat(fd, c"".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut r = Reply::ok(u);
        r.bytes(&buf[..n as usize]);
        Ok(r.finish())
    }

    fn statfs(&mut self, u: u64) -> io::Result<Vec<u8>> {
        let (fd, _) = self.node_fd(abi::ROOT_ID)?;
        // SAFETY: zeroed statvfs is valid; fstatvfs fills it.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: an open descriptor and a valid out-pointer.
        rc(unsafe { libc::fstatvfs(fd, &mut s) })?;
        let mut r = Reply::ok(u);
        r.u64(s.f_blocks as u64)
            .u64(s.f_bfree as u64)
            .u64(s.f_bavail as u64);
        r.u64(s.f_files as u64).u64(s.f_ffree as u64);
        r.u32(s.f_bsize as u32)
            .u32(s.f_namemax as u32)
            .u32(s.f_frsize as u32);
        r.u32(0).bytes(&[0u8; 24]);
        Ok(r.finish())
    }
}

/// Keeps `f` only if it is a regular file, its `O_NONBLOCK` set back to what `flags` asked.
fn regular_only(f: std::fs::File, flags: i32) -> io::Result<std::fs::File> {
    let st = fstat(f.as_raw_fd())?;
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => {}
        libc::S_IFDIR => return Err(err(libc::EISDIR)),
        _ => return Err(err(libc::EACCES)),
    }
    if flags & libc::O_NONBLOCK == 0 {
        // SAFETY: an open descriptor; F_SETFL with its flags less O_NONBLOCK.
        unsafe {
            let now = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
            if now >= 0 {
                libc::fcntl(f.as_raw_fd(), libc::F_SETFL, now & !libc::O_NONBLOCK);
            }
        }
    }
    Ok(f)
}

/// How many node descriptors stay open between requests: a share of the open-file limit
/// (raised to its hard maximum by the helper), leaving room for open files and listings.
fn node_cap() -> usize {
    // SAFETY: a zeroed rlimit is valid; getrlimit fills it.
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    let limit = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 {
        r.rlim_cur.min(1 << 22) as usize
    } else {
        1024
    };
    (limit.saturating_sub(256) / 2).max(64)
}
