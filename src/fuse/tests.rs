//! The file server and the guest's relay against this host's own kernel: a real FUSE mount
//! (root and /dev/fuse needed; skipped otherwise), the two joined by a socket pair in place of
//! the virtio port. The same checks run in real guests in `tests/it/mounts.rs`.

use std::fs::File;
use std::os::unix::io::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::helper::{serve_on, Config};

struct Mounted {
    dir: PathBuf,
    mnt: PathBuf,
    share: PathBuf,
    host_end: UnixStream,
    threads: Vec<std::thread::JoinHandle<()>>,
}

fn can_mount() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root && Path::new("/dev/fuse").exists()
}

fn mount(tag: &str, writable: bool) -> Mounted {
    let dir = std::env::temp_dir().join(format!("mcqemu-fusetest-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (share, mnt) = (dir.join("share"), dir.join("mnt"));
    std::fs::create_dir_all(&share).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::write(dir.join("outside"), b"secret").unwrap();
    std::fs::write(share.join("hello.txt"), b"hello from the host\n").unwrap();
    let (a, b) = UnixStream::pair().unwrap();
    let host_end = a.try_clone().unwrap();
    let c = Config {
        socket: dir.join("unused.sock"),
        guest: mnt.to_string_lossy().into_owned(),
        writable,
        status: dir.join("status.json"),
    };
    let root = OwnedFd::from(File::open(&share).unwrap());
    let host = std::thread::spawn(move || {
        let _ = serve_on(a, &c, &root);
    });
    let guest = std::thread::spawn(move || {
        let _ = crate::agent::mounts::relay_on(File::from(OwnedFd::from(b)));
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = std::fs::read_to_string(dir.join("status.json")).unwrap_or_default();
        if s.contains("\"mounted\"") {
            break;
        }
        assert!(Instant::now() < deadline, "never mounted: {s}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Mounted {
        dir,
        mnt,
        share,
        host_end,
        threads: vec![host, guest],
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let p = std::ffi::CString::new(self.mnt.to_string_lossy().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
        let _ = self.host_end.shutdown(std::net::Shutdown::Both);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn sh(dir: &Path, script: &str) -> (bool, String) {
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), text)
}

#[test]
fn a_read_only_share_reads_and_refuses_every_change() {
    if !can_mount() {
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    let m = mount("ro", false);
    let got = std::fs::read_to_string(m.mnt.join("hello.txt")).unwrap();
    assert_eq!(got, "hello from the host\n");
    for script in [
        "echo x > new.txt",
        "echo x >> hello.txt",
        "mkdir d",
        "rm hello.txt",
        "mv hello.txt h2",
        "chmod 777 hello.txt",
        "ln -s /etc link",
    ] {
        let (ok, out) = sh(&m.mnt, script);
        assert!(!ok, "{script} worked on a read-only share: {out}");
    }
    assert_eq!(
        std::fs::read_dir(&m.share).unwrap().count(),
        1,
        "the share changed"
    );
    // A host change is seen within a second.
    std::fs::write(m.share.join("hello.txt"), b"changed\n").unwrap();
    std::fs::write(m.share.join("later.txt"), b"new\n").unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(
        std::fs::read_to_string(m.mnt.join("hello.txt")).unwrap(),
        "changed\n"
    );
    assert!(m.mnt.join("later.txt").exists());
}

#[test]
fn a_writable_share_keeps_the_guest_inside_it() {
    if !can_mount() {
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    let m = mount("rw", true);
    let (ok, out) = sh(
        &m.mnt,
        "set -e; echo data > f; mkdir -p a/b; mv f a/b/g; cat a/b/g; ln -s ../../outside esc; \
         ln a/b/g hard; chmod 4755 a/b/g; ls -la",
    );
    assert!(ok, "{out}");
    assert_eq!(
        std::fs::read_to_string(m.share.join("a/b/g")).unwrap(),
        "data\n"
    );
    // Escapes: the symlink is stored as a symlink and never followed by the server; its
    // target outside is untouched. `..` at the root stays at the root (the guest's kernel).
    let (_, out) = sh(&m.mnt, "echo pwned > esc; cat esc; cat ../outside 2>&1");
    assert_eq!(
        std::fs::read_to_string(m.dir.join("outside")).unwrap(),
        "secret",
        "{out}"
    );
    // No setuid bit reaches the host; no device file can be made.
    let mode = std::fs::metadata(m.share.join("a/b/g")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.permissions().mode() & 0o7000, 0);
    let (ok, _) = sh(&m.mnt, "mknod dev c 1 3");
    assert!(!ok && !m.share.join("dev").exists());
    // A hard link within the share works; one to a file outside cannot be named.
    assert!(m.share.join("hard").exists());
    // git works in the share.
    if sh(&m.mnt, "command -v git").0 {
        let (ok, out) = sh(
            &m.mnt,
            "set -e; git init -q repo; cd repo; echo hi > x; git add x; \
             git -c user.email=t@t -c user.name=t commit -qm one; git log --oneline; git status --short",
        );
        assert!(ok, "{out}");
        assert!(m.share.join("repo/.git/HEAD").exists());
    }
}

#[test]
fn a_tree_walk_asks_the_server_little() {
    if !can_mount() {
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    let dir = std::env::temp_dir().join(format!("mcqemu-fusewalk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (share, mnt) = (dir.join("share"), dir.join("mnt"));
    for i in 0..2000 {
        let sub = share.join(format!("d{:02}", i / 100));
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join(format!("f{i}")), b"x").unwrap();
    }
    std::fs::create_dir_all(&mnt).unwrap();
    let root = OwnedFd::from(File::open(&share).unwrap());
    let mut server = super::server::Server::new(root, false, (0, 0)).unwrap();
    let (a, b) = UnixStream::pair().unwrap();
    let guest = std::thread::spawn(move || {
        let _ = crate::agent::mounts::relay_on(File::from(OwnedFd::from(b)));
    });
    let mut sock = a.try_clone().unwrap();
    let mut out = a.try_clone().unwrap();
    use std::io::{Read, Write};
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\n") {
        sock.read_exact(&mut byte).unwrap();
        line.push(byte[0]);
    }
    writeln!(out, "MCQFS mount ro {}", mnt.display()).unwrap();
    line.clear();
    while !line.ends_with(b"\n") {
        sock.read_exact(&mut byte).unwrap();
        line.push(byte[0]);
    }
    assert_eq!(line, b"MCQFS ok 0 0\n");
    let walker = {
        let mnt = mnt.clone();
        std::thread::spawn(move || {
            sh(
                &mnt,
                "find . -type f | wc -l; ls -lR . | wc -l; busybox find . -type f | wc -l",
            )
            .1
        })
    };
    let mut buf = vec![0u8; super::server::MAX_REQUEST];
    sock.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    while !walker.is_finished() {
        if sock.read_exact(&mut buf[..4]).is_err() {
            continue;
        }
        let len = u32::from_le_bytes(buf[..4].try_into().unwrap()) as usize;
        sock.read_exact(&mut buf[4..len]).unwrap();
        if let Some(r) = server.handle(&buf[..len]) {
            out.write_all(&r).unwrap();
        }
    }
    let listed = walker.join().unwrap();
    assert!(listed.starts_with("2000\n"), "{listed}");
    let counts = server.counts();
    eprintln!("requests for two walks of 2,000 files: {counts:?}");
    let total: u64 = counts.iter().map(|(_, n)| n).sum();
    // READDIRPLUS carries every entry's attributes: no request per file.
    assert!(total < 600, "{total} requests: {counts:?}");
    let p = std::ffi::CString::new(mnt.to_string_lossy().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
    let _ = a.shutdown(std::net::Shutdown::Both);
    let _ = guest.join();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The helper's conversation finds its place again: after garbage in place of a request (a
/// relay that died mid-request), and after a second hello in place of an answer.
#[test]
fn the_helper_resyncs_on_a_new_hello() {
    use std::io::{BufRead, BufReader, Write};
    let dir = std::env::temp_dir().join(format!("mcqemu-fuseresync-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) = UnixStream::pair().unwrap();
    let c = Config {
        socket: dir.join("unused.sock"),
        guest: "/g".into(),
        writable: false,
        status: dir.join("status.json"),
    };
    let root = OwnedFd::from(File::open(&dir).unwrap());
    let host = std::thread::spawn(move || serve_on(a, &c, &root));
    b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut guest = b.try_clone().unwrap();
    let mut lines = BufReader::new(b.try_clone().unwrap());
    let mut line = String::new();
    let mut expect_mount = |lines: &mut BufReader<UnixStream>| {
        line.clear();
        lines.read_line(&mut line).unwrap();
        assert_eq!(line, "MCQFS mount ro /g\n");
    };
    // A hello, then a second one before answering: both get a mount line.
    guest.write_all(b"MCQFS relay 1\n").unwrap();
    expect_mount(&mut lines);
    guest.write_all(b"MCQFS relay 1\n").unwrap();
    expect_mount(&mut lines);
    guest.write_all(b"MCQFS ok 0 0\n").unwrap();
    // Garbage where a request belongs, cut mid-way, then a hello: found again.
    guest.write_all(&[0xff, 0xff, 0xff, 0x7f, 1, 2, 3]).unwrap();
    guest.write_all(&[b'x'; 5000]).unwrap();
    guest.write_all(b"MCQFS relay 1\n").unwrap();
    expect_mount(&mut lines);
    guest.shutdown(std::net::Shutdown::Both).unwrap();
    assert!(host.join().unwrap().is_ok());
    let status = std::fs::read_to_string(dir.join("status.json")).unwrap();
    assert!(status.contains("\"ended\""), "{status}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A hostile CREATE naming a FIFO or a device that exists: refused at once, never opened in
/// a way that blocks the server.
#[test]
fn create_over_a_fifo_is_refused_without_blocking() {
    let dir = std::env::temp_dir().join(format!("mcqemu-fusefifo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = std::ffi::CString::new(dir.join("fifo").to_string_lossy().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let root = OwnedFd::from(File::open(&dir).unwrap());
    let mut server = super::server::Server::new(root, true, (0, 0)).unwrap();
    let body: Vec<u8> = [
        (libc::O_RDWR as u32).to_le_bytes(),
        0o644u32.to_le_bytes(),
        0u32.to_le_bytes(),
        0u32.to_le_bytes(),
    ]
    .concat();
    let name = b"fifo\0";
    let len = (40 + body.len() + name.len()) as u32;
    let mut msg = Vec::new();
    msg.extend_from_slice(&len.to_le_bytes());
    msg.extend_from_slice(&35u32.to_le_bytes()); // CREATE
    msg.extend_from_slice(&9u64.to_le_bytes()); // unique
    msg.extend_from_slice(&1u64.to_le_bytes()); // the root
    msg.extend_from_slice(&[0u8; 16]);
    msg.extend_from_slice(&body);
    msg.extend_from_slice(name);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(server.handle(&msg));
    });
    let reply = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the server blocked on a FIFO")
        .expect("a reply");
    let errno = i32::from_le_bytes(reply[4..8].try_into().unwrap());
    assert_eq!(errno, -libc::EACCES, "{reply:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
