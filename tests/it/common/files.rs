//! Temporary folders, folder listings, and test data: pseudo-random bytes and their SHA-256.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A fresh folder, removed (with everything in it) on drop.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates a new, empty, uniquely named folder under the system temp dir.
    pub fn new(label: &str) -> TempDir {
        TempDir::try_new(label).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`TempDir::new`], with an error instead of a panic.
    pub fn try_new(label: &str) -> Result<TempDir, String> {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "mcqemu-test-{label}-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path)
            .map_err(|e| format!("cannot create the folder {}: {e}", path.display()))?;
        Ok(TempDir { path })
    }

    /// Makes `path` a fresh, empty folder (removing whatever was there) owned by the guard.
    pub fn at(path: PathBuf) -> Result<TempDir, String> {
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)
            .map_err(|e| format!("cannot create the folder {}: {e}", path.display()))?;
        Ok(TempDir { path })
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A path inside the folder.
    pub fn join(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }

    /// A path inside the folder as a string (for tool arguments).
    pub fn file(&self, rel: &str) -> String {
        self.join(rel)
            .to_str()
            .expect("utf-8 temp path")
            .to_string()
    }

    /// Creates (if needed) and returns a subfolder.
    pub fn subdir(&self, rel: &str) -> PathBuf {
        self.try_subdir(rel).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`TempDir::subdir`], with an error instead of a panic.
    pub fn try_subdir(&self, rel: &str) -> Result<PathBuf, String> {
        let p = self.join(rel);
        std::fs::create_dir_all(&p).map_err(|e| format!("cannot create {}: {e}", p.display()))?;
        Ok(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The names in a folder, sorted (hidden files included).
pub fn list_dir(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// Deterministic pseudo-random bytes (xorshift), so bodies do not compress to nothing.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// SHA-256 of `data` as lower-case hex (with `ring`, the crate's own digest implementation).
pub fn sha256_hex(data: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
