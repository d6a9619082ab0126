//! Exclusive locks across processes on a lock file (flock(2)), in one place: the registry's,
//! a template pool's refill, a VM's data channel, a resumable download, QEMU's supervisor's
//! (which a look waits on). The lock goes with the descriptor: dropping the [`FileLock`] (or
//! the process dying) releases it, so a crashed holder never leaves a stale lock behind.

use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

/// A held lock; released when dropped.
#[derive(Debug)]
pub struct FileLock {
    _file: File,
}

/// Takes the lock on `path` (created if missing, never through a symlink) if nobody holds
/// it: None when another descriptor (this process's or another's) does.
pub fn try_lock(path: &Path) -> io::Result<Option<FileLock>> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    // SAFETY: flock(2) on a descriptor owned here; the lock lives as long as it does.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(Some(FileLock { _file: file }));
    }
    let e = io::Error::last_os_error();
    if e.kind() == io::ErrorKind::WouldBlock {
        Ok(None)
    } else {
        Err(e)
    }
}

/// Takes the lock on `path`, waiting up to `wait` (polling from 5 ms up to every 100 ms) while
/// `give_up` says no; None when it is still held then.
pub fn lock_within(
    path: &Path,
    wait: Duration,
    give_up: &dyn Fn() -> bool,
) -> io::Result<Option<FileLock>> {
    poll(wait, give_up, || try_lock(path))
}

/// Waits up to `wait` (polling as [`lock_within`] does) while another descriptor holds the
/// lock on `path`, which is never created here nor followed through a symlink: a reader's look
/// leaves no file behind. True once it is free (or the file is gone), false when still held.
pub fn wait_free(path: &Path, wait: Duration) -> bool {
    let Ok(file) = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    else {
        return true;
    };
    // SAFETY: flock(2) on a descriptor owned here; a shared lock, dropped with it.
    let free = || unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0;
    matches!(
        poll(wait, &|| false, || Ok(free().then_some(()))),
        Ok(Some(()))
    )
}

/// Tries `attempt` until it gives something, `wait` has passed or `give_up` says so, pausing
/// from 5 ms up to 100 ms between tries.
fn poll<T>(
    wait: Duration,
    give_up: &dyn Fn() -> bool,
    mut attempt: impl FnMut() -> io::Result<Option<T>>,
) -> io::Result<Option<T>> {
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(got) = attempt()? {
            return Ok(Some(got));
        }
        let now = Instant::now();
        if now >= deadline || give_up() {
            return Ok(None);
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_dropping_releases() {
        let path = std::env::temp_dir().join(format!("mcq-lockfile-{}", std::process::id()));
        let held = try_lock(&path).unwrap().expect("free at first");
        assert!(
            try_lock(&path).unwrap().is_none(),
            "a second descriptor waits"
        );
        let t = Instant::now();
        assert!(lock_within(&path, Duration::from_millis(50), &|| false)
            .unwrap()
            .is_none());
        assert!(t.elapsed() >= Duration::from_millis(50));
        assert!(!wait_free(&path, Duration::from_millis(20)), "held");
        drop(held);
        assert!(wait_free(&path, Duration::ZERO), "free once dropped");
        assert!(lock_within(&path, Duration::from_secs(1), &|| false)
            .unwrap()
            .is_some());
        let _ = std::fs::remove_file(&path);
        assert!(wait_free(&path, Duration::ZERO), "a missing file is free");
        assert!(!path.exists(), "and is not made");
    }

    #[test]
    fn a_symlink_is_never_followed() {
        let dir = std::env::temp_dir().join(format!("mcq-lockfile-l-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(dir.join("target"), dir.join("lock")).unwrap();
        assert!(try_lock(&dir.join("lock")).is_err());
        assert!(!dir.join("target").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
