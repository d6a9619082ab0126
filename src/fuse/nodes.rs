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

/// Most nodes held at once (each keeps its name: at most about 300 MB in all).
pub const MAX_NODES: usize = 1_000_000;

/// One looked-up file.
pub struct Node {
    /// `O_PATH | O_NOFOLLOW`: the inode itself, a symlink included. None once closed to stay
    /// within the open-file limit; opened again from `parent` and `name`.
    fd: Option<OwnedFd>,
    /// The file type bits of its mode when looked up (`S_IFMT`).
    pub kind: u32,
    /// The folder it was last looked up in, and its name there.
    parent: u64,
    name: CString,
    /// How many lookups the guest's kernel holds (FORGET gives them back).
    lookups: u64,
    key: (u64, u64),
    /// When it was last used (a counter), for closing the least recently used first.
    used: u64,
}

/// The node table.
pub struct Nodes {
    map: HashMap<u64, Node>,
    by_inode: HashMap<(u64, u64), u64>,
    next: u64,
    clock: u64,
    /// Descriptors held now, and the most that may stay open between requests.
    open: usize,
    cap: usize,
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

fn estale() -> io::Error {
    io::Error::from_raw_os_error(libc::ESTALE)
}

impl Nodes {
    /// A table whose root is `root` (an open folder), keeping at most `cap` descriptors open
    /// between requests.
    pub fn new(root: OwnedFd, cap: usize) -> io::Result<Nodes> {
        let st = fstat(root.as_raw_fd())?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        let key = (st.st_dev, st.st_ino);
        let mut map = HashMap::new();
        map.insert(
            ROOT_ID,
            Node {
                fd: Some(root),
                kind: libc::S_IFDIR,
                parent: ROOT_ID,
                name: CString::default(),
                lookups: 1,
                key,
                used: 0,
            },
        );
        Ok(Nodes {
            map,
            by_inode: HashMap::from([(key, ROOT_ID)]),
            next: ROOT_ID + 1,
            clock: 0,
            open: 1,
            cap: cap.max(16),
        })
    }

    /// Node `id`'s descriptor and file type, opened again from its folder if it was closed
    /// (and checked to be the same inode: ESTALE if the host moved or replaced it).
    pub fn get(&mut self, id: u64) -> io::Result<(RawFd, u32)> {
        self.clock += 1;
        let clock = self.clock;
        let n = self.map.get_mut(&id).ok_or_else(estale)?;
        n.used = clock;
        if let Some(fd) = &n.fd {
            return Ok((fd.as_raw_fd(), n.kind));
        }
        // The closed nodes from this one up to the nearest open folder, walked without
        // recursion (a guest can nest folders deeply) and never twice (a loop of parents left
        // by renames is ESTALE, not a hang).
        let mut chain = vec![id];
        let mut seen = std::collections::HashSet::from([id]);
        let mut at = id;
        let top = loop {
            let parent = self.map.get(&at).ok_or_else(estale)?.parent;
            if parent == at || !seen.insert(parent) {
                return Err(estale());
            }
            let p = self.map.get(&parent).ok_or_else(estale)?;
            if p.kind != libc::S_IFDIR {
                return Err(estale());
            }
            match &p.fd {
                Some(fd) => break fd.as_raw_fd(),
                None => {
                    chain.push(parent);
                    at = parent;
                }
            }
        };
        let mut dir = top;
        while let Some(node) = chain.pop() {
            dir = self.reopen_in(dir, node)?;
        }
        let kind = self.map.get(&id).map_or(0, |n| n.kind);
        Ok((dir, kind))
    }

    /// Opens closed node `id` again in folder `dir`: the same inode of the same type, or
    /// ESTALE (the host moved or replaced it).
    fn reopen_in(&mut self, dir: RawFd, id: u64) -> io::Result<RawFd> {
        let n = self.map.get(&id).ok_or_else(estale)?;
        let fd = open_path(dir, &n.name).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP) => estale(),
            _ => e,
        })?;
        let st = fstat(fd.as_raw_fd())?;
        if (st.st_dev, st.st_ino) != n.key || st.st_mode & libc::S_IFMT != n.kind {
            return Err(estale());
        }
        let raw = fd.as_raw_fd();
        if let Some(n) = self.map.get_mut(&id) {
            n.fd = Some(fd);
            n.used = self.clock;
            self.open += 1;
        }
        Ok(raw)
    }

    /// The descriptor of folder node `id` (ENOTDIR for another kind).
    pub fn dir(&mut self, id: u64) -> io::Result<RawFd> {
        let (fd, kind) = self.get(id)?;
        if kind != libc::S_IFDIR {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        Ok(fd)
    }

    /// Looks `name` up in folder `parent`: the node (one more lookup held) and its stat.
    pub fn lookup(&mut self, parent: u64, name: &CString) -> io::Result<(u64, libc::stat)> {
        let dir = self.dir(parent)?;
        let fd = open_path(dir, name)?;
        let st = fstat(fd.as_raw_fd())?;
        Ok((self.hold(fd, &st, parent, name)?, st))
    }

    /// Records `fd` (with its stat), found as `name` in `parent`, as a node, or adds a lookup
    /// to the node of the same inode (which is then known by this name).
    pub fn hold(
        &mut self,
        fd: OwnedFd,
        st: &libc::stat,
        parent: u64,
        name: &CString,
    ) -> io::Result<u64> {
        self.clock += 1;
        let key = (st.st_dev, st.st_ino);
        let kind = st.st_mode & libc::S_IFMT;
        if let Some(&id) = self.by_inode.get(&key) {
            // The same inode number of another type: the old file is gone and its number
            // reused; the old node is left to be forgotten, the new file gets a node of its own.
            if self.map.get(&id).is_some_and(|n| n.kind != kind) {
                self.by_inode.remove(&key);
            }
        }
        if let Some(&id) = self.by_inode.get(&key) {
            if let Some(n) = self.map.get_mut(&id) {
                n.lookups += 1;
                n.used = self.clock;
                if id != ROOT_ID {
                    n.parent = parent;
                    n.name = name.clone();
                }
                if n.fd.is_none() {
                    n.fd = Some(fd);
                    self.open += 1;
                }
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
                fd: Some(fd),
                kind: st.st_mode & libc::S_IFMT,
                parent,
                name: name.clone(),
                lookups: 1,
                key,
                used: self.clock,
            },
        );
        self.open += 1;
        self.by_inode.insert(key, id);
        Ok(id)
    }

    /// The guest renamed `from` (in folder `olddir`) to `to` (in `newdir`): a node held for
    /// it is known by its new name. `inode` is what `from` was before the rename.
    pub fn renamed(&mut self, inode: (u64, u64), newdir: u64, to: &CString) {
        if let Some(n) = self
            .by_inode
            .get(&inode)
            .and_then(|id| self.map.get_mut(id))
        {
            n.parent = newdir;
            n.name = to.clone();
        }
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
                if self.by_inode.get(&node.key) == Some(&id) {
                    self.by_inode.remove(&node.key);
                }
                if node.fd.is_some() {
                    self.open -= 1;
                }
            }
        }
    }

    /// Closes the least recently used descriptors (never the root's) once more than the cap
    /// are open, down to three quarters of it. Called between requests, so a descriptor a
    /// request is using is never closed under it.
    pub fn trim(&mut self) {
        if self.open <= self.cap {
            return;
        }
        let mut held: Vec<(u64, u64)> = self
            .map
            .iter()
            .filter(|(id, n)| **id != ROOT_ID && n.fd.is_some())
            .map(|(id, n)| (n.used, *id))
            .collect();
        held.sort_unstable();
        let target = self.cap * 3 / 4;
        for (_, id) in held {
            if self.open <= target {
                break;
            }
            if let Some(n) = self.map.get_mut(&id) {
                n.fd = None;
                self.open -= 1;
            }
        }
    }

    /// How many nodes are held (the root included).
    pub fn count(&self) -> usize {
        self.map.len()
    }

    /// How many descriptors the nodes hold open.
    #[cfg(test)]
    pub fn open_count(&self) -> usize {
        self.open
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
        let mut n = Nodes::new(root(&t), 100).unwrap();
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
        let mut n = Nodes::new(root(&t), 100).unwrap();
        let (id, st) = n.lookup(ROOT_ID, &name(b"out").unwrap()).unwrap();
        assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFLNK);
        let e = n.lookup(id, &name(b"passwd").unwrap()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR));
    }
}

#[cfg(test)]
mod cap_tests {
    use super::*;

    #[test]
    fn closed_nodes_open_again_and_a_replaced_one_is_stale() {
        let t = super::tests::tmpdir("cap");
        std::fs::create_dir_all(t.join("d/e")).unwrap();
        for i in 0..40 {
            std::fs::write(t.join(format!("d/e/f{i}")), b"x").unwrap();
        }
        let root = OwnedFd::from(std::fs::File::open(&t).unwrap());
        let mut n = Nodes::new(root, 16).unwrap();
        let (d, _) = n.lookup(ROOT_ID, &name(b"d").unwrap()).unwrap();
        let (e, _) = n.lookup(d, &name(b"e").unwrap()).unwrap();
        let ids: Vec<u64> = (0..40)
            .map(|i| {
                n.lookup(e, &name(format!("f{i}").as_bytes()).unwrap())
                    .unwrap()
                    .0
            })
            .collect();
        n.trim();
        assert!(n.open_count() <= 16, "{}", n.open_count());
        // The oldest were closed (their folders too): each opens again through its folders.
        for id in &ids[..30] {
            n.get(*id).unwrap();
            n.trim();
        }
        // f35 was closed long ago; replaced on the host by another inode (written beside it,
        // renamed over it), it is stale, never the new file.
        n.trim();
        std::fs::write(t.join("d/e/f35.new"), b"new").unwrap();
        std::fs::rename(t.join("d/e/f35.new"), t.join("d/e/f35")).unwrap();
        let e = n.get(ids[35]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESTALE));
        // A rename by the guest keeps the node reachable by its new name.
        let st = {
            let (fd, _) = n.get(ids[36]).unwrap();
            fstat(fd).unwrap()
        };
        std::fs::rename(t.join("d/e/f36"), t.join("d/moved")).unwrap();
        n.renamed((st.st_dev, st.st_ino), d, &name(b"moved").unwrap());
        for id in &ids[..20] {
            n.get(*id).unwrap();
        }
        n.trim();
        assert!(n.get(ids[36]).is_ok());
    }
}
