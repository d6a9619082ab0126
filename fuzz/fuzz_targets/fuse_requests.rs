//! The host's FUSE file server (`fuse::server`) against what a hostile guest may send: the
//! fuzz bytes are cut into requests by their own length fields (as the helper cuts the port's
//! stream) and answered by one read-only server over a small folder. Nothing may panic; every
//! reply's length field is its size, names its request, and nothing in the folder changes.
#![no_main]

use std::os::unix::io::OwnedFd;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use mcqemu::fuse::server::Server;

fn share() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("mcqemu-fuzz-fuse-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("file"), b"contents").unwrap();
        std::fs::write(d.join("sub/inner"), b"inner").unwrap();
        let _ = std::os::unix::fs::symlink("/etc", d.join("link"));
        d
    })
}

fuzz_target!(|data: &[u8]| {
    let dir = share();
    let root = OwnedFd::from(std::fs::File::open(dir).unwrap());
    let mut server = Server::new(root, false, (0, 0)).unwrap();
    let mut rest = data;
    while rest.len() >= 4 {
        let len = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
        let len = len.clamp(4, rest.len());
        let (msg, tail) = rest.split_at(len);
        rest = tail;
        if let Some(reply) = server.handle(msg) {
            assert!(reply.len() >= 16);
            let said = u32::from_le_bytes(reply[..4].try_into().unwrap()) as usize;
            assert_eq!(said, reply.len());
            assert_eq!(&reply[8..16], &msg[8..16], "a reply names its request");
        }
    }
    assert!(std::fs::read_dir(dir).unwrap().count() == 3, "the read-only folder changed");
});
