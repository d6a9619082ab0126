//! image_catalog: the built-in catalog of cloud images image_pull takes by name, each with
//! whether it is already pulled into the default folder (and what its record says).

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use super::pull::{images_dir, sidecar, url_file_name};
use crate::net::catalog;

/// The catalog's entry names, for image_pull's schema.
pub use crate::net::catalog::names;

crate::described! {
    /// A catalog entry's pinned source.
    #[derive(Debug, Clone, Serialize)]
    pub struct PinnedSource {
        /// The dated URL.
        pub url: &'static str,
        /// Its digest, `algorithm:hex`.
        pub digest: &'static str,
        /// The publisher's checksum file that lists it, where there is one.
        pub checksums_url: Option<&'static str>,
    }
}

crate::described! {
    /// A catalog entry's moving source.
    #[derive(Debug, Clone, Serialize)]
    pub struct LatestSource {
        /// The moving URL.
        pub url: &'static str,
        /// The checksum file that lists it (without one it is not pulled by name).
        pub checksums_url: Option<&'static str>,
    }
}

crate::described! {
    /// One catalog entry and whether it is pulled (image_catalog's item, in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct CatalogImage {
        /// The name image_pull takes.
        pub name: &'static str,
        /// What it is.
        pub title: &'static str,
        /// x86_64 or aarch64.
        pub arch: &'static str,
        /// The firmware it boots with.
        pub firmware: &'static str,
        /// The dated source.
        pub pinned: Option<PinnedSource>,
        /// The moving source.
        pub latest: Option<LatestSource>,
        /// Whether it is in the default folder.
        pub pulled: bool,
        /// Which source it was pulled from.
        pub source: Option<&'static str>,
        /// Where it is.
        pub path: Option<String>,
        /// Its size.
        pub size: Option<u64>,
        /// The digest verified at pull time (from its record).
        pub digest: Option<Value>,
        /// That digest's algorithm.
        pub algorithm: Option<Value>,
        /// When it was pulled.
        pub pulled_at: Option<Value>,
    }
}

crate::described! {
    /// The whole catalog (image_catalog's result).
    #[derive(Debug, Clone, Serialize)]
    pub struct Catalog {
        /// Every entry, in the catalog's order.
        pub images: Vec<CatalogImage>,
    }
}

/// The image pulled from `url` into `dir`, when its record says so: path, size and record.
fn pulled_from(dir: &Path, url: &str) -> Option<(PathBuf, u64, Value)> {
    let file = dir.join(url_file_name(url)?);
    let meta = std::fs::metadata(&file).ok()?;
    let record: Value = serde_json::from_slice(&std::fs::read(sidecar(&file)).ok()?).ok()?;
    let ours = record["url"] == url || record["catalog_url"] == url;
    ours.then_some((file, meta.len(), record))
}

/// The catalog, each entry with what the default folder holds of it.
pub fn list() -> Catalog {
    let dir = images_dir();
    let images = catalog::ENTRIES
        .iter()
        .map(|e| {
            let found = [
                e.pinned.map(|p| ("pinned", p.url)),
                e.latest.map(|l| ("latest", l.url)),
            ]
            .into_iter()
            .flatten()
            .find_map(|(kind, url)| pulled_from(&dir, url).map(|f| (kind, f)));
            let (source, path, size, record) = match found {
                Some((kind, (file, size, record))) => (
                    Some(kind),
                    Some(file.display().to_string()),
                    Some(size),
                    Some(record),
                ),
                None => (None, None, None, None),
            };
            let field = |k: &str| record.as_ref().and_then(|r| r.get(k).cloned());
            CatalogImage {
                name: e.name,
                title: e.title,
                arch: e.arch,
                firmware: e.firmware,
                pinned: e.pinned.map(|p| PinnedSource {
                    url: p.url,
                    digest: p.digest,
                    checksums_url: p.checksums_url,
                }),
                latest: e.latest.map(|l| LatestSource {
                    url: l.url,
                    checksums_url: l.checksums_url,
                }),
                pulled: source.is_some(),
                source,
                path,
                size,
                digest: field("digest"),
                algorithm: field("algorithm"),
                pulled_at: field("pulled_at"),
            }
        })
        .collect();
    Catalog { images }
}
