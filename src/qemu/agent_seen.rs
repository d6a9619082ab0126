//! Whether the guest agent behind a socket answered the QEMU process that serves it: a look
//! (vm_info's guest memory) asks an agent only when it is known to answer, so a VM without one
//! (an installer, a firmware screen, a guest still booting) costs no wait.
//!
//! The fact is a stamp beside the socket (`qga.sock.answered`), written when a session syncs
//! and removed when one fails, so a one-shot `mcqemu call` knows what the server learned. It
//! counts only while it is newer than the socket: QEMU binds the socket when it starts, so a
//! stamp older than that was about an earlier process. Sockets outside mcqemu's runtime
//! folder (an attached VM's) get no file; this process remembers them instead.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::SystemTime;

/// The stamp for the agent socket `sock`, when that socket is one of mcqemu's own (removed
/// with the VM's other runtime files).
pub fn stamp(sock: &Path) -> Option<PathBuf> {
    if !sock.starts_with(crate::state::paths::runtime_dir()) {
        return None;
    }
    let mut name = sock.file_name()?.to_os_string();
    name.push(".answered");
    Some(sock.with_file_name(name))
}

fn remembered() -> &'static Mutex<HashMap<PathBuf, SystemTime>> {
    static SEEN: OnceLock<Mutex<HashMap<PathBuf, SystemTime>>> = OnceLock::new();
    SEEN.get_or_init(|| Mutex::new(HashMap::new()))
}

fn modified(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).ok()?.modified().ok()
}

/// Notes that the agent on `sock` answered now.
pub fn answered(sock: &Path) {
    match stamp(sock) {
        Some(s) => crate::state::paths::touch(&s),
        None => {
            let mut m = remembered().lock().unwrap_or_else(|e| e.into_inner());
            if m.len() > 1024 {
                m.clear();
            }
            m.insert(sock.to_path_buf(), SystemTime::now());
        }
    }
}

/// Notes that no agent answered on `sock`: the next look does not wait for it.
pub fn silent(sock: &Path) {
    match stamp(sock) {
        Some(s) => {
            let _ = std::fs::remove_file(s);
        }
        None => {
            remembered()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(sock);
        }
    }
}

/// True when the agent on `sock` answered the QEMU process that bound the socket, and no
/// session has failed since.
pub fn known(sock: &Path) -> bool {
    let Some(bound) = modified(sock) else {
        return false;
    };
    let seen = match stamp(sock) {
        Some(s) => modified(&s),
        None => remembered()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(sock)
            .copied(),
    };
    seen.is_some_and(|t| t >= bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_counts_until_a_silence_and_only_for_the_socket_it_was_about() {
        let dir = std::env::temp_dir().join(format!("mcq-seen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("qga.sock");
        std::fs::write(&sock, b"").unwrap();
        assert!(!known(&sock), "never answered");
        answered(&sock);
        assert!(known(&sock));
        silent(&sock);
        assert!(!known(&sock));
        answered(&sock);
        // A new QEMU binds the socket again: the old answer was about another process.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::remove_file(&sock).unwrap();
        std::fs::write(&sock, b"").unwrap();
        assert!(!known(&sock), "an answer from before the socket was bound");
        assert!(!known(&dir.join("none.sock")), "no socket, no agent");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
