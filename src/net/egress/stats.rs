//! The proxy's counters (allowed and refused requests, the last refused names), kept in memory
//! and written atomically to a small JSON file vm_info reads, at most a few times a second.

use crate::kind::Failed;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How many refused names are kept.
pub const LAST_REFUSED: usize = 10;

/// The file's name in the VM's state folder.
pub const FILE: &str = "egress-stats.json";

/// What the proxy has done so far for its VM.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Stats {
    /// Requests let through (tunnels opened, requests forwarded).
    pub allowed: u64,
    /// Requests refused (not in the rules, malformed, over the limits).
    pub refused: u64,
    /// The last refused `host:port` (or what was asked), newest last, with the reason.
    pub last_refused: Vec<String>,
    /// Bytes relayed both ways.
    pub bytes: u64,
    /// When this was written (Unix seconds).
    pub updated_at: i64,
}

/// Counters shared by the proxy's threads; a writer thread saves them when they change.
#[derive(Clone)]
pub struct Counters {
    inner: Arc<(Mutex<(Stats, bool)>, Condvar)>,
    path: PathBuf,
}

impl Counters {
    /// Counters saved to `dir/`[`FILE`], starting from what an earlier proxy of this VM saved.
    pub fn new(dir: &Path) -> Counters {
        let path = dir.join(FILE);
        let start = read(&path).unwrap_or_default();
        Counters {
            inner: Arc::new((Mutex::new((start, true)), Condvar::new())),
            path,
        }
    }

    fn change(&self, f: impl FnOnce(&mut Stats)) {
        let (lock, cv) = &*self.inner;
        if let Ok(mut g) = lock.lock() {
            f(&mut g.0);
            g.1 = true;
            cv.notify_one();
        }
    }

    /// One request let through.
    pub fn allowed(&self) {
        self.change(|s| s.allowed += 1);
    }

    /// One request refused: what was asked and why.
    pub fn refused(&self, what: &str, why: &str) {
        let entry: String = format!("{what} ({why})").chars().take(300).collect();
        self.change(|s| {
            s.refused += 1;
            s.last_refused.push(entry);
            let over = s.last_refused.len().saturating_sub(LAST_REFUSED);
            s.last_refused.drain(..over);
        });
    }

    /// Bytes relayed.
    pub fn bytes(&self, n: u64) {
        self.change(|s| s.bytes += n);
    }

    /// Saves the counters whenever they changed, at most every `every`; never returns.
    pub fn writer(&self, every: Duration) {
        loop {
            self.save_if_changed();
            std::thread::sleep(every);
            let (lock, cv) = &*self.inner;
            if let Ok(g) = lock.lock() {
                let _ = cv.wait_timeout_while(g, Duration::from_secs(60), |g| !g.1);
            }
        }
    }

    /// Saves now if anything changed since the last save.
    pub fn save_if_changed(&self) {
        let (lock, _) = &*self.inner;
        let snapshot = match lock.lock() {
            Ok(mut g) if g.1 => {
                g.1 = false;
                g.0.updated_at = crate::clock::now_secs();
                g.0.clone()
            }
            _ => return,
        };
        if let Err(e) = write_atomic(&self.path, &snapshot) {
            crate::log::stderr("warn", &format!("egress proxy: {e}"));
        }
    }
}

fn write_atomic(path: &Path, s: &Stats) -> Result<(), Failed> {
    let text = serde_json::to_vec_pretty(s).map_err(|e| Failed::host(e.to_string()))?;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Failed::host(format!("cannot write {}: {e}", path.display()))
        })
}

/// The counters saved at `path` (None when absent or unreadable).
pub fn read(path: &Path) -> Option<Stats> {
    use std::io::Read;
    let mut text = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(256 * 1024)
        .read_to_end(&mut text)
        .ok()?;
    serde_json::from_slice(&text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_saved_atomically_and_keep_the_last_refusals() {
        let dir = std::env::temp_dir().join(format!("mcq-egress-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = Counters::new(&dir);
        c.allowed();
        for i in 0..LAST_REFUSED + 3 {
            c.refused(&format!("h{i}:80"), "not allowed");
        }
        c.save_if_changed();
        let s = read(&dir.join(FILE)).unwrap();
        assert_eq!((s.allowed, s.refused), (1, LAST_REFUSED as u64 + 3));
        assert_eq!(s.last_refused.len(), LAST_REFUSED);
        assert!(s.last_refused.last().unwrap().starts_with("h12:80"));
        assert_eq!(Counters::new(&dir).inner.0.lock().unwrap().0.refused, 13);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
