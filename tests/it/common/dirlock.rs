//! The lock the client installers share (tests/sdk_clients.rs and tests/inspector.rs install
//! into target/sdk-clients under the same `.install.lock`, so npm never runs twice at once).

use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

/// Bound on waiting for another process's installation (one holds the lock for up to three
/// 300 s steps).
pub const LOCK_WAIT: Duration = Duration::from_secs(3 * 300 + 60);

/// A cross-process lock: a directory only one process can create, holding
/// its owner's pid. A lock whose owner is gone (no /proc entry), or that is
/// older than any installation can last, is taken over.
pub struct DirLock(PathBuf);

impl DirLock {
    pub fn acquire(path: PathBuf) -> Result<DirLock, String> {
        let start = Instant::now();
        loop {
            match std::fs::create_dir(&path) {
                Ok(()) => {
                    let lock = DirLock(path);
                    std::fs::write(lock.0.join("pid"), std::process::id().to_string())
                        .map_err(|e| format!("cannot write {:?}/pid: {e}", lock.0))?;
                    return Ok(lock);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    if Self::stale(&path) {
                        let _ = std::fs::remove_dir_all(&path);
                        continue;
                    }
                    if start.elapsed() > LOCK_WAIT {
                        return Err(format!(
                            "gave up after {LOCK_WAIT:?} waiting for another test process to finish \
                             installing (lock {path:?}; remove it if no such process runs)"
                        ));
                    }
                    thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(format!("cannot create lock {path:?}: {e}")),
            }
        }
    }

    fn stale(path: &Path) -> bool {
        let owner_gone = std::fs::read_to_string(path.join("pid"))
            .ok()
            .and_then(|pid| pid.trim().parse::<u32>().ok())
            .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
        let age = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok());
        owner_gone || age.is_some_and(|a| a > LOCK_WAIT)
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
