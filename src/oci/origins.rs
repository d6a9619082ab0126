//! Where blobs are known to be: for each blob this host pushed or pulled, the registry
//! repositories that hold it (`HOST/REPO`), kept beside the store. A push to another
//! repository of the same registry then asks the registry to mount the blob from one of them
//! (the distribution API's cross-repository mount) instead of uploading it again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::error::OciError;

/// Repositories remembered per blob (the newest kept).
const PER_BLOB: usize = 4;
/// Largest file read back (about 40,000 blobs).
const MAX_FILE: u64 = 8 << 20;

/// The blobs' known repositories.
#[derive(Debug, Default)]
pub struct Origins {
    path: PathBuf,
    map: BTreeMap<String, Vec<String>>,
}

impl Origins {
    /// What the store at `store` remembers; nothing when the file is missing or damaged (it
    /// only saves uploads: losing it costs bytes, never correctness).
    pub fn load(store: &Path) -> Origins {
        let path = store.join("blob-origins.json");
        let map = std::fs::metadata(&path)
            .ok()
            .filter(|m| m.len() <= MAX_FILE)
            .and_then(|_| std::fs::read(&path).ok())
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        Origins { path, map }
    }

    /// A repository of registry `host` other than `repo` that holds `digest`.
    pub fn elsewhere(&self, digest: &str, host: &str, repo: &str) -> Option<String> {
        let prefix = format!("{host}/");
        self.map
            .get(digest)?
            .iter()
            .filter_map(|o| o.strip_prefix(&prefix))
            .find(|r| *r != repo)
            .map(str::to_string)
    }

    /// Remembers that `host`/`repo` holds each of `digests`.
    pub fn add<'a>(&mut self, digests: impl IntoIterator<Item = &'a str>, host: &str, repo: &str) {
        let at = format!("{host}/{repo}");
        for d in digests {
            let list = self.map.entry(d.to_string()).or_default();
            list.retain(|o| *o != at);
            list.insert(0, at.clone());
            list.truncate(PER_BLOB);
        }
    }

    /// Writes the file (whole, then renamed into place).
    pub fn save(&self) -> Result<(), OciError> {
        let bytes = serde_json::to_vec(&self.map)
            .map_err(|e| OciError::Host(format!("cannot write the blobs' origins: {e}")))?;
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, &self.path))
            .map_err(|e| OciError::Host(format!("cannot write {}: {e}", self.path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blob_is_found_in_another_repository_of_the_same_registry() {
        let dir = std::env::temp_dir().join(format!("mcq-origins-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut o = Origins::load(&dir);
        o.add(["sha256:a", "sha256:b"], "reg:5000", "team/one");
        o.add(["sha256:a"], "other:443", "team/one");
        assert_eq!(
            o.elsewhere("sha256:a", "reg:5000", "team/two").as_deref(),
            Some("team/one")
        );
        assert_eq!(o.elsewhere("sha256:a", "reg:5000", "team/one"), None);
        assert_eq!(o.elsewhere("sha256:c", "reg:5000", "team/two"), None);
        for i in 0..10 {
            o.add(["sha256:a"], "reg:5000", &format!("r{i}"));
        }
        assert_eq!(o.map["sha256:a"].len(), PER_BLOB);
        o.save().unwrap();
        let back = Origins::load(&dir);
        assert_eq!(
            back.elsewhere("sha256:b", "reg:5000", "x").as_deref(),
            Some("team/one")
        );
        std::fs::write(dir.join("blob-origins.json"), "not json").unwrap();
        assert_eq!(Origins::load(&dir).map.len(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
