//! The built-in catalog of distribution cloud images, as Lima pins them: each entry has a
//! pinned source (a dated URL and the digest recorded for that build, `sha256:` or
//! `sha512:`) and, where the publisher keeps one, a moving source (an undated "latest" URL and
//! the checksum file that lists it). image_pull tries the pinned URL first and verifies it
//! against the pinned digest; publishers remove dated folders after a few months, so when the
//! pinned URL answers HTTP 404 or 410 it pulls the moving URL and verifies it against the
//! checksum file fetched at pull time. The digests pin one build: a catalog update moves them
//! to a newer one.
//!
//! The URLs, digests and checksum file layouts come from the project's reference notes on
//! cloud images (gathered from Lima's templates): Debian's `SHA512SUMS` beside each image
//! (GNU style), Ubuntu's `SHA256SUMS` in the release folder (GNU style, `*` binary marker),
//! Fedora's `Fedora-Cloud-<N>-<build>-<arch>-CHECKSUM` beside the image (BSD style), Alpine's
//! `<image>.sha512` per file (a bare digest). Rocky, AlmaLinux, CentOS Stream and Arch Linux
//! publish checksum files whose names and formats were not checked: their entries carry the
//! pinned digest only, and their moving URL without a checksum file (not pulled by name).
//!
//! `MCQEMU_CATALOG_MIRROR=URL` fetches every catalog URL `https://HOST/PATH` as
//! `URL/HOST/PATH` instead (a local mirror laid out by host; the tests' HTTP server). The
//! pinned digests still apply.

use super::download::Algo;

mod entries;
pub use entries::ENTRIES;

/// Where a mirror of the catalog's hosts is, when the operator has one.
pub const MIRROR_ENV: &str = "MCQEMU_CATALOG_MIRROR";

/// A dated URL and the digest recorded for that build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pinned {
    /// The dated (or versioned) image, which the publisher does not replace.
    pub url: &'static str,
    /// `sha256:HEX` or `sha512:HEX`: what a pull by name checks the image against.
    pub digest: &'static str,
    /// The publisher's checksum file listing `url`, when its name is known (for reference:
    /// a pull of the pinned URL needs only the digest).
    pub checksums_url: Option<&'static str>,
}

impl Pinned {
    /// The digest's algorithm and lower-case hex (None for a malformed table entry, which a
    /// unit test rules out).
    pub fn algo_and_hex(&self) -> Option<(Algo, String)> {
        parse_digest(self.digest)
    }
}

/// `sha256:HEX` (64 digits) or `sha512:HEX` (128 digits) as its algorithm and lower-case hex.
pub fn parse_digest(digest: &str) -> Option<(Algo, String)> {
    let (algo, hex) = digest.split_once(':')?;
    let want = match algo {
        "sha256" => Algo::Sha256,
        "sha512" => Algo::Sha512,
        _ => return None,
    };
    let ok = hex.bytes().all(|b| b.is_ascii_hexdigit());
    (ok && Algo::from_hex_len(hex.len()) == Some(want)).then(|| (want, hex.to_ascii_lowercase()))
}

/// An undated URL the publisher replaces with each build, and the checksum file listing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Latest {
    /// The moving image.
    pub url: &'static str,
    /// The publisher's checksum file listing it; None when its name and format were not
    /// checked (then this URL is shown, not pulled by name).
    pub checksums_url: Option<&'static str>,
}

/// One catalog entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The name image_pull takes (`image`).
    pub name: &'static str,
    /// What it is.
    pub title: &'static str,
    /// Architecture.
    pub arch: &'static str,
    /// How it boots: "bios" or "uefi". aarch64 images and Alpine's `uefi` builds need UEFI;
    /// the other x86_64 images are marked "bios" (Debian's, Ubuntu's and Fedora's boot with
    /// UEFI too).
    pub firmware: &'static str,
    /// The dated URL and its digest, tried first.
    pub pinned: Option<Pinned>,
    /// The moving URL and its checksum file, pulled when the pinned URL is gone.
    pub latest: Option<Latest>,
}

/// Finds an entry by name.
pub fn find(name: &str) -> Option<&'static Entry> {
    ENTRIES.iter().find(|e| e.name == name)
}

/// The names, for messages and the schema.
pub fn names() -> Vec<&'static str> {
    ENTRIES.iter().map(|e| e.name).collect()
}

/// The URL a catalog URL is fetched from: itself, or under `$MCQEMU_CATALOG_MIRROR`.
pub fn fetch_url(url: &str) -> String {
    match std::env::var(MIRROR_ENV) {
        Ok(mirror) if !mirror.trim().is_empty() => mirrored(mirror.trim(), url),
        _ => url.to_string(),
    }
}

/// `https://HOST/PATH` under `mirror`: `MIRROR/HOST/PATH`.
fn mirrored(mirror: &str, url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    format!("{}/{rest}", mirror.trim_end_matches('/'))
}

/// The name of the CHECKSUM file that lists a Fedora Cloud image:
/// `Fedora-Cloud-Base-Generic-44-1.7.x86_64.qcow2` → `Fedora-Cloud-44-1.7-x86_64-CHECKSUM`.
#[cfg(test)]
fn fedora_checksum_name(image: &str) -> Option<String> {
    let rest = image
        .strip_prefix("Fedora-Cloud-Base-Generic-")?
        .strip_suffix(".qcow2")?;
    let (version, arch) = rest.rsplit_once('.')?;
    let (release, build) = version.split_once('-')?;
    let ok = !release.is_empty()
        && release.bytes().all(|b| b.is_ascii_digit())
        && !build.is_empty()
        && build.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    ok.then(|| format!("Fedora-Cloud-{release}-{build}-{arch}-CHECKSUM"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(url: &str) -> &str {
        url.rsplit_once('/').unwrap().0
    }

    fn file(url: &str) -> &str {
        url.rsplit_once('/').unwrap().1
    }

    #[test]
    fn names_are_unique_and_every_entry_is_pullable() {
        let mut names = names();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "duplicate names");
        for e in ENTRIES {
            assert!(["x86_64", "aarch64"].contains(&e.arch), "{}", e.name);
            assert!(["bios", "uefi"].contains(&e.firmware), "{}", e.name);
            if e.arch == "aarch64" {
                assert_eq!(e.firmware, "uefi", "{}", e.name);
                assert!(e.name.ends_with("-arm64"), "{}", e.name);
            }
            let latest_pullable = e.latest.is_some_and(|l| l.checksums_url.is_some());
            assert!(
                e.pinned.is_some() || latest_pullable,
                "{}: nothing to pull",
                e.name
            );
            let urls = e
                .pinned
                .iter()
                .flat_map(|p| [Some(p.url), p.checksums_url])
                .chain(e.latest.iter().flat_map(|l| [Some(l.url), l.checksums_url]))
                .flatten();
            for url in urls {
                assert!(url.starts_with("https://"), "{}: {url}", e.name);
                assert!(!file(url).is_empty(), "{}: {url}", e.name);
            }
        }
    }

    #[test]
    fn pinned_digests_are_well_formed() {
        for e in ENTRIES {
            let Some(p) = e.pinned else { continue };
            let (algo, hex) = p.algo_and_hex().unwrap_or_else(|| panic!("{}", e.name));
            assert_eq!(format!("{}:{hex}", algo.name()), p.digest, "{}", e.name);
        }
        let h256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(
            parse_digest(&format!("sha256:{}", h256.to_uppercase())),
            Some((Algo::Sha256, h256.to_string()))
        );
        assert_eq!(parse_digest(h256), None);
        assert_eq!(parse_digest(&format!("sha512:{h256}")), None);
        assert_eq!(parse_digest(&format!("md5:{h256}")), None);
        assert_eq!(parse_digest("sha256:zz"), None);
    }

    #[test]
    fn checksum_files_follow_each_publishers_layout() {
        for e in ENTRIES {
            let p = e.pinned.unwrap();
            let sums = p.checksums_url;
            let latest = e.latest;
            match e.name.split('-').next().unwrap() {
                "debian" => {
                    // SHA512SUMS beside the image, in the dated and the latest folder.
                    assert_eq!(sums.unwrap(), format!("{}/SHA512SUMS", folder(p.url)));
                    let l = latest.unwrap();
                    assert_eq!(
                        l.checksums_url.unwrap(),
                        format!("{}/SHA512SUMS", folder(l.url))
                    );
                    assert!(p.digest.starts_with("sha512:"), "{}", e.name);
                }
                "ubuntu" => {
                    // SHA256SUMS in release-YYYYMMDD/ and release/; one file name in both.
                    assert!(folder(p.url).contains("/release-"), "{}", p.url);
                    assert_eq!(sums.unwrap(), format!("{}/SHA256SUMS", folder(p.url)));
                    let l = latest.unwrap();
                    assert!(folder(l.url).ends_with("/release"), "{}", l.url);
                    assert_eq!(
                        l.checksums_url.unwrap(),
                        format!("{}/SHA256SUMS", folder(l.url))
                    );
                    assert_eq!(file(p.url), file(l.url));
                    assert!(p.digest.starts_with("sha256:"), "{}", e.name);
                }
                "fedora" => {
                    let want = fedora_checksum_name(file(p.url)).unwrap();
                    assert_eq!(sums.unwrap(), format!("{}/{want}", folder(p.url)));
                    assert!(latest.is_none(), "{}", e.name);
                }
                "alpine" => {
                    assert_eq!(sums.unwrap(), format!("{}.sha512", p.url));
                    assert!(file(p.url).contains("-uefi-"), "{}", p.url);
                    assert_eq!(e.firmware, "uefi", "{}", e.name);
                    assert!(latest.is_none(), "{}", e.name);
                    assert!(p.digest.starts_with("sha512:"), "{}", e.name);
                }
                _ => {
                    // Checksum files not checked for these publishers.
                    assert_eq!(sums, None, "{}", e.name);
                    assert_eq!(latest.and_then(|l| l.checksums_url), None, "{}", e.name);
                }
            }
        }
    }

    #[test]
    fn fedora_checksum_names_are_derived_from_the_image_name() {
        assert_eq!(
            fedora_checksum_name("Fedora-Cloud-Base-Generic-44-1.7.x86_64.qcow2").as_deref(),
            Some("Fedora-Cloud-44-1.7-x86_64-CHECKSUM")
        );
        assert_eq!(
            fedora_checksum_name("Fedora-Cloud-Base-Generic-43-1.6.aarch64.qcow2").as_deref(),
            Some("Fedora-Cloud-43-1.6-aarch64-CHECKSUM")
        );
        assert_eq!(
            fedora_checksum_name("Fedora-Cloud-Base-43-1.6.x86_64.raw.xz"),
            None
        );
    }

    #[test]
    fn the_catalog_has_the_releases_asked_for() {
        for name in [
            "debian-12",
            "debian-12-arm64",
            "debian-13",
            "debian-13-arm64",
            "ubuntu-22.04",
            "ubuntu-24.04-arm64",
            "ubuntu-26.04",
            "ubuntu-26.04-arm64",
            "fedora-43",
            "fedora-44",
            "fedora-44-arm64",
            "alpine-3.22",
            "alpine-3.23",
            "alpine-3.23-arm64",
        ] {
            assert!(find(name).is_some(), "{name} missing");
        }
        assert!(find("fedora-cloud").is_none());
        let u = find("ubuntu-26.04-arm64").unwrap();
        assert_eq!(u.arch, "aarch64");
        assert!(u
            .pinned
            .unwrap()
            .url
            .contains("/resolute/release-20260720/"));
    }

    #[test]
    fn a_mirror_keeps_host_and_path() {
        assert_eq!(
            mirrored(
                "http://127.0.0.1:8080/",
                "https://cloud.debian.org/images/a.qcow2"
            ),
            "http://127.0.0.1:8080/cloud.debian.org/images/a.qcow2"
        );
        assert_eq!(
            mirrored("http://m/base", "https://h/x"),
            "http://m/base/h/x"
        );
    }
}
