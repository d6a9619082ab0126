//! The FUSE wire format (Linux's `include/uapi/linux/fuse.h`, protocol 7.31 and later) as the
//! file server needs it: the opcodes, the fixed structs it reads from a request (through a
//! bounds-checked [`Cursor`]) and the replies it writes ([`Reply`]). Little-endian: both sides
//! of a mount are (x86_64 and aarch64 guests). Every length comes from an untrusted guest, so a
//! short or malformed request is an error, never a panic.

/// The protocol's major version; the minor one the server speaks (max_pages arrived in 28).
pub const MAJOR: u32 = 7;
pub const MINOR: u32 = 31;
/// The root folder's node ID.
pub const ROOT_ID: u64 = 1;
/// The size of a request's header.
pub const IN_HEADER: usize = 40;
/// The size of a reply's header.
pub const OUT_HEADER: usize = 16;

pub const LOOKUP: u32 = 1;
pub const FORGET: u32 = 2;
pub const GETATTR: u32 = 3;
pub const SETATTR: u32 = 4;
pub const READLINK: u32 = 5;
pub const SYMLINK: u32 = 6;
pub const MKNOD: u32 = 8;
pub const MKDIR: u32 = 9;
pub const UNLINK: u32 = 10;
pub const RMDIR: u32 = 11;
pub const RENAME: u32 = 12;
pub const LINK: u32 = 13;
pub const OPEN: u32 = 14;
pub const READ: u32 = 15;
pub const WRITE: u32 = 16;
pub const STATFS: u32 = 17;
pub const RELEASE: u32 = 18;
pub const FSYNC: u32 = 20;
pub const FLUSH: u32 = 25;
pub const INIT: u32 = 26;
pub const OPENDIR: u32 = 27;
pub const READDIR: u32 = 28;
pub const RELEASEDIR: u32 = 29;
pub const FSYNCDIR: u32 = 30;
pub const CREATE: u32 = 35;
pub const INTERRUPT: u32 = 36;
pub const DESTROY: u32 = 38;
pub const BATCH_FORGET: u32 = 42;
pub const FALLOCATE: u32 = 43;
pub const READDIRPLUS: u32 = 44;
pub const RENAME2: u32 = 45;

/// INIT flags the server asks for.
pub const ASYNC_READ: u32 = 1 << 0;
pub const ATOMIC_O_TRUNC: u32 = 1 << 3;
pub const BIG_WRITES: u32 = 1 << 5;
pub const AUTO_INVAL_DATA: u32 = 1 << 12;
pub const DO_READDIRPLUS: u32 = 1 << 13;
pub const PARALLEL_DIROPS: u32 = 1 << 18;
pub const MAX_PAGES: u32 = 1 << 22;
pub const CACHE_SYMLINKS: u32 = 1 << 23;

/// SETATTR's `valid` bits.
pub const FATTR_MODE: u32 = 1 << 0;
pub const FATTR_SIZE: u32 = 1 << 3;
pub const FATTR_ATIME: u32 = 1 << 4;
pub const FATTR_MTIME: u32 = 1 << 5;
pub const FATTR_FH: u32 = 1 << 6;
pub const FATTR_ATIME_NOW: u32 = 1 << 7;
pub const FATTR_MTIME_NOW: u32 = 1 << 8;

/// FSYNC's flag for fdatasync.
pub const FSYNC_DATASYNC: u32 = 1;

/// A request's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InHeader {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
}

impl InHeader {
    /// Reads the header at the start of `b` (at least [`IN_HEADER`] bytes).
    pub fn parse(b: &[u8]) -> Option<InHeader> {
        let mut c = Cursor::new(b);
        let h = InHeader {
            len: c.u32()?,
            opcode: c.u32()?,
            unique: c.u64()?,
            nodeid: c.u64()?,
        };
        c.take(16)?; // uid, gid, pid, extension length, padding
        Some(h)
    }
}

/// Reads little-endian fields from a request's body, each checked against its end.
pub struct Cursor<'a> {
    b: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub fn new(b: &'a [u8]) -> Cursor<'a> {
        Cursor { b }
    }

    /// The next `n` bytes, if there are that many.
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.b.len() < n {
            return None;
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Some(head)
    }

    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    /// A NUL-terminated string (a file name or a symlink's target), without its NUL.
    pub fn cstr(&mut self) -> Option<&'a [u8]> {
        let end = self.b.iter().position(|&x| x == 0)?;
        let s = self.take(end)?;
        self.take(1)?;
        Some(s)
    }
}

/// A file's attributes as FUSE carries them (`struct fuse_attr`, 88 bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub mode: u32,
    pub nlink: u32,
    pub rdev: u32,
    pub blksize: u32,
}

impl Attr {
    /// From a host `stat`; owners are left to the caller (the guest sees its own).
    pub fn from_stat(st: &libc::stat) -> Attr {
        Attr {
            ino: st.st_ino,
            size: st.st_size.max(0) as u64,
            blocks: st.st_blocks.max(0) as u64,
            atime: (st.st_atime, st.st_atime_nsec.clamp(0, 999_999_999) as u32),
            mtime: (st.st_mtime, st.st_mtime_nsec.clamp(0, 999_999_999) as u32),
            ctime: (st.st_ctime, st.st_ctime_nsec.clamp(0, 999_999_999) as u32),
            mode: st.st_mode,
            nlink: st.st_nlink.min(u32::MAX as libc::nlink_t) as u32,
            rdev: 0,
            blksize: (st.st_blksize.clamp(512, 1 << 20)) as u32,
        }
    }
}

/// A reply under construction: the header's length is filled in by [`Reply::finish`].
pub struct Reply {
    pub buf: Vec<u8>,
}

impl Reply {
    /// A successful reply to request `unique`.
    pub fn ok(unique: u64) -> Reply {
        let mut buf = Vec::with_capacity(128);
        buf.extend_from_slice(&0u32.to_le_bytes());
        buf.extend_from_slice(&0i32.to_le_bytes());
        buf.extend_from_slice(&unique.to_le_bytes());
        Reply { buf }
    }

    /// An error reply: `errno` as a positive number.
    pub fn error(unique: u64, errno: i32) -> Vec<u8> {
        let mut r = Reply::ok(unique);
        r.buf[4..8].copy_from_slice(&(-errno.abs()).to_le_bytes());
        r.finish()
    }

    pub fn u16(&mut self, v: u16) -> &mut Reply {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u32(&mut self, v: u32) -> &mut Reply {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Reply {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn bytes(&mut self, b: &[u8]) -> &mut Reply {
        self.buf.extend_from_slice(b);
        self
    }

    /// Zero bytes up to the next multiple of 8 (dirents are 8-aligned).
    pub fn pad8(&mut self) -> &mut Reply {
        while !self.buf.len().is_multiple_of(8) {
            self.buf.push(0);
        }
        self
    }

    /// `struct fuse_attr`, owned by `uid`/`gid`.
    pub fn attr(&mut self, a: &Attr, uid: u32, gid: u32) -> &mut Reply {
        self.u64(a.ino).u64(a.size).u64(a.blocks);
        self.u64(a.atime.0 as u64)
            .u64(a.mtime.0 as u64)
            .u64(a.ctime.0 as u64);
        self.u32(a.atime.1).u32(a.mtime.1).u32(a.ctime.1);
        self.u32(a.mode).u32(a.nlink).u32(uid).u32(gid);
        self.u32(a.rdev).u32(a.blksize).u32(0)
    }

    /// `struct fuse_entry_out`: a node, its cache times (seconds, nanoseconds) and attributes.
    pub fn entry(&mut self, nodeid: u64, valid: (u64, u32), a: &Attr, owner: (u32, u32)) {
        self.u64(nodeid).u64(0).u64(valid.0).u64(valid.0);
        self.u32(valid.1).u32(valid.1);
        self.attr(a, owner.0, owner.1);
    }

    /// The reply's bytes, its length written into the header.
    pub fn finish(mut self) -> Vec<u8> {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_le_bytes());
        self.buf
    }
}

/// The size of a `fuse_entry_out`.
pub const ENTRY_OUT: usize = 40 + 88;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_have_the_kernel_s_sizes() {
        let mut r = Reply::ok(7);
        r.entry(5, (1, 0), &Attr::default(), (0, 0));
        let b = r.finish();
        assert_eq!(b.len(), OUT_HEADER + ENTRY_OUT);
        assert_eq!(
            u32::from_le_bytes(b[0..4].try_into().unwrap()) as usize,
            b.len()
        );
        assert_eq!(u64::from_le_bytes(b[8..16].try_into().unwrap()), 7);
        let e = Reply::error(9, libc::ENOENT);
        assert_eq!(e.len(), OUT_HEADER);
        assert_eq!(
            i32::from_le_bytes(e[4..8].try_into().unwrap()),
            -libc::ENOENT
        );
    }

    #[test]
    fn a_short_request_is_none_not_a_panic() {
        assert!(InHeader::parse(&[0u8; 39]).is_none());
        let mut c = Cursor::new(b"abc");
        assert!(c.u32().is_none());
        assert!(Cursor::new(b"no-nul").cstr().is_none());
        assert_eq!(Cursor::new(b"name\0rest").cstr(), Some(&b"name"[..]));
    }
}
