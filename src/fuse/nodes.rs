//! The file server's nodes: every file the guest has looked up, held as an `O_PATH` descriptor
//! opened relative to its folder's descriptor with `O_NOFOLLOW`, one name at a time. So the
//! server never resolves a path: a folder renamed or swapped for a symlink on the host after a
//! lookup leaves the node on the inode it was, and nothing the guest names can lead outside
//! the shared folder (virtiofsd's and QEMU 9p's answer to their escapes). Node IDs are never
//! reused; a host inode seen twice (a hard link) is one node.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::unix::io::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::abi::ROOT_ID;

/// Most nodes held at once: each is a descriptor (the helper raises its own limit to match).
pub const MAX_NODES: usize = 500_000;

/// One looked-up file.
pub struct Node {
    /// `O_PATH | O_NOFOLLOW`: the inode itself, a symlink included.
    pub fd: OwnedFd,
    /// The file type bits of its mode when looked up (`S_IFMT`).
    pub kind: u32,
    /// How many lookups the guest's kernel holds (FORGET gives them back).
    lookups: u64,
    key: (u64, u64),
}

/// The node table.
pub struct Nodes {
    map: HashMap<u64, Node>,
    by_inode: HashMap<(u64, u64), u64>,
    next: u64,
}

/// A name from the guest, checked: one component, not `.` or `..`, no `/`, at most 255 bytes.
pub fn name(raw: &[u8]) -> io::Result<CString> {
    if raw.is_empty() || raw == b"." || raw == b".." || raw.contains(&b'/') || raw.len() > 255 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    CString::new(raw).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `fstat` of a descriptor (an `O_PATH` one too).
pub fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value; fstat fills it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer for the call's duration.
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// Opens `name` in folder `dir` as an `O_PATH` node, never following a symlink.
pub fn open_path(dir: RawFd, name: &CString) -> io::Result<OwnedFd> {
    let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid descriptor and a NUL-terminated name.
    let fd = unsafe { libc::openat(dir, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Nodes {
    /// A table whose root is `root` (an open folder).
    pub fn new(root: OwnedFd) -> io::Result<Nodes> {
        let st = fstat(root.as_raw_fd())?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        let key = (st.st_dev, st.st_ino);
        let mut map = HashMap::new();
        map.insert(
            ROOT_ID,
            Node {
                fd: root,
                kind: libc::S_IFDIR,
                lookups: 1,
                key,
            },
        );
        Ok(Nodes {
            map,
            by_inode: HashMap::from([(key, ROOT_ID)]),
            next: ROOT_ID + 1,
        })
    }

    /// The node `id`, or ESTALE for one the guest should not hold.
    pub fn get(&self, id: u64) -> io::Result<&Node> {
        self.map
            .get(&id)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ESTALE))
    }

    /// The descriptor of folder node `id` (ENOTDIR for another kind).
    pub fn dir(&self, id: u64) -> io::Result<RawFd> {
        let n = self.get(id)?;
        if n.kind != libc::S_IFDIR {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        Ok(n.fd.as_raw_fd())
    }

    /// Looks `name` up in folder `parent`: the node (one more lookup held) and its stat.
    pub fn lookup(&mut self, parent: u64, name: &CString) -> io::Result<(u64, libc::stat)> {
        let dir = self.dir(parent)?;
        let fd = open_path(dir, name)?;
        let st = fstat(fd.as_raw_fd())?;
        Ok((self.hold(fd, &st)?, st))
    }

    /// Records `fd` (with its stat) as a node, or adds a lookup to the node of the same inode.
    pub fn hold(&mut self, fd: OwnedFd, st: &libc::stat) -> io::Result<u64> {
        let key = (st.st_dev, st.st_ino);
        if let Some(&id) = self.by_inode.get(&key) {
            if let Some(n) = self.map.get_mut(&id) {
                n.lookups += 1;
                return Ok(id);
            }
        }
        if self.map.len() >= MAX_NODES {
            return Err(io::Error::from_raw_os_error(libc::ENFILE));
        }
        let id = self.next;
        self.next += 1;
        self.map.insert(
            id,
            Node {
                fd,
                kind: st.st_mode & libc::S_IFMT,
                lookups: 1,
                key,
            },
        );
        self.by_inode.insert(key, id);
        Ok(id)
    }

    /// The guest's kernel gives back `n` lookups of node `id`; at none it is closed.
    pub fn forget(&mut self, id: u64, n: u64) {
        if id == ROOT_ID {
            return;
        }
        let gone = match self.map.get_mut(&id) {
            Some(node) => {
                node.lookups = node.lookups.saturating_sub(n);
                node.lookups == 0
            }
            None => false,
        };
        if gone {
            if let Some(node) = self.map.remove(&id) {
                self.by_inode.remove(&node.key);
            }
        }
    }

    /// How many nodes are held (the root included).
    pub fn count(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn tmpdir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("mcqemu-fuse-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn root(dir: &std::path::Path) -> OwnedFd {
        let f = std::fs::File::open(dir).unwrap();
        OwnedFd::from(f)
    }

    #[test]
    fn names_are_one_component() {
        for bad in [&b""[..], b".", b"..", b"a/b", b"/etc", &[b'x'; 256]] {
            assert!(name(bad).is_err(), "{bad:?}");
        }
        assert!(name(b"...").is_ok());
        assert!(name(&[b'y'; 255]).is_ok());
    }

    #[test]
    fn hard_links_are_one_node_and_forget_closes() {
        let t = tmpdir("links");
        std::fs::write(t.join("a"), b"x").unwrap();
        std::fs::hard_link(t.join("a"), t.join("b")).unwrap();
        let mut n = Nodes::new(root(&t)).unwrap();
        let (a, _) = n.lookup(ROOT_ID, &name(b"a").unwrap()).unwrap();
        let (b, _) = n.lookup(ROOT_ID, &name(b"b").unwrap()).unwrap();
        assert_eq!(a, b);
        n.forget(a, 1);
        assert!(n.get(a).is_ok());
        n.forget(a, 1);
        assert!(n.get(a).is_err());
        assert_eq!(n.count(), 1);
    }

    #[test]
    fn a_symlink_is_a_node_of_its_own_never_followed() {
        let t = tmpdir("symlink");
        std::os::unix::fs::symlink("/etc", t.join("out")).unwrap();
        let mut n = Nodes::new(root(&t)).unwrap();
        let (id, st) = n.lookup(ROOT_ID, &name(b"out").unwrap()).unwrap();
        assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFLNK);
        let e = n.lookup(id, &name(b"passwd").unwrap()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR));
    }
}
