//! Image references as users write them: `python:3.12-slim` (Docker Hub, with its `library/`
//! rule), `ghcr.io/org/img:tag`, `REG/NAME@sha256:…`, `127.0.0.1:5000/x:y`, and the local
//! sources by skopeo's transport names, `oci:DIR[:tag]` (an OCI image layout) and
//! `docker-archive:FILE` (a `docker save` tarball). Names follow the distribution spec's
//! grammar; anything else is refused with what was wrong, before any network or file access.

use crate::kind::Failed;
use std::fmt;
use std::path::PathBuf;

/// Docker Hub's name in references.
const DOCKER_HUB: &str = "docker.io";
/// The host Docker Hub's registry API answers on.
const DOCKER_HUB_API: &str = "registry-1.docker.io";
/// Longest reference accepted (the distribution spec caps a name at 255 characters).
const MAX_LEN: usize = 512;

/// Where an image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A registry, over the OCI distribution API.
    Registry(Reference),
    /// An OCI image layout on the host: its folder, and the tag of the image in its index
    /// (None: the index's only image).
    Layout {
        /// The layout's folder.
        dir: PathBuf,
        /// `org.opencontainers.image.ref.name` of the wanted image.
        tag: Option<String>,
    },
    /// A `docker save` tarball on the host.
    DockerArchive(PathBuf),
}

/// An image in a registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The registry as written (`docker.io` for Docker Hub), with its port.
    pub registry: String,
    /// The repository (`library/python`, `org/img`).
    pub repository: String,
    /// The tag (`latest` when neither a tag nor a digest was given).
    pub tag: Option<String>,
    /// A pinned manifest digest (`sha256:` and 64 hex digits).
    pub digest: Option<String>,
}

impl Reference {
    /// The host and port the registry's API answers on.
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }

    /// True for a registry on this machine, the only kind plain http is used for.
    pub fn is_loopback(&self) -> bool {
        let host = match self.registry.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => &self.registry,
        };
        host == "localhost"
            || host == "[::1]"
            || host
                .parse::<std::net::Ipv4Addr>()
                .is_ok_and(|a| a.is_loopback())
    }

    /// What the manifest is asked for by: the digest when pinned, else the tag.
    pub fn manifest_ref(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// Parses `text` into a source; Err says what is wrong with it.
pub fn parse(text: &str) -> Result<Source, Failed> {
    if text.is_empty() || text.len() > MAX_LEN {
        return Err(Failed::invalid(format!(
            "an image reference must be 1-{MAX_LEN} characters, like python:3.12-slim"
        )));
    }
    if let Some(rest) = text.strip_prefix("oci:") {
        let (dir, tag) = match rest.split_once(':') {
            Some((d, t)) => (d, Some(t)),
            None => (rest, None),
        };
        if dir.is_empty() {
            return Err(Failed::invalid(format!(
                "{text:?}: oci: needs a folder, as in oci:/images/app:v1"
            )));
        }
        if let Some(t) = tag {
            check_tag(t).map_err(|e| Failed::invalid(format!("{text:?}: {e}")))?;
        }
        return Ok(Source::Layout {
            dir: PathBuf::from(dir),
            tag: tag.map(str::to_string),
        });
    }
    if let Some(file) = text.strip_prefix("docker-archive:") {
        if file.is_empty() {
            return Err(Failed::invalid(format!(
                "{text:?}: docker-archive: needs a file, as in docker-archive:/tmp/app.tar"
            )));
        }
        return Ok(Source::DockerArchive(PathBuf::from(file)));
    }
    registry_reference(text).map(Source::Registry)
}

/// A registry reference: `[REGISTRY/]REPOSITORY[:TAG][@DIGEST]`.
fn registry_reference(text: &str) -> Result<Reference, Failed> {
    let bad = |why: Failed| Failed::invalid(format!("{text:?} is not an image reference: {why}"));
    let (name, digest) = match text.split_once('@') {
        Some((n, d)) => (n, Some(check_digest(d).map_err(bad)?)),
        None => (text, None),
    };
    // A tag is after the last ':' that follows the last '/' (a registry's port comes before).
    let slash = name.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match name[slash..].rfind(':') {
        Some(i) => (&name[..slash + i], Some(&name[slash + i + 1..])),
        None => (name, None),
    };
    if let Some(t) = tag {
        check_tag(t).map_err(bad)?;
    }
    let (registry, repository) = match name.split_once('/') {
        Some((first, rest)) if is_registry(first) => (first.to_string(), rest.to_string()),
        _ => (DOCKER_HUB.to_string(), name.to_string()),
    };
    let registry = match registry.as_str() {
        "index.docker.io" | "registry-1.docker.io" => DOCKER_HUB.to_string(),
        _ => registry,
    };
    let repository = if registry == DOCKER_HUB && !repository.contains('/') {
        format!("library/{repository}")
    } else {
        repository
    };
    check_repository(&repository).map_err(bad)?;
    Ok(Reference {
        registry,
        repository,
        tag: tag
            .map(str::to_string)
            .or_else(|| digest.is_none().then(|| "latest".to_string())),
        digest,
    })
}

/// True when a reference's first component names a registry rather than a namespace (it has
/// a dot or a port, or is `localhost`), as Docker decides.
fn is_registry(first: &str) -> bool {
    first.contains('.') || first.contains(':') || first == "localhost"
}

fn check_tag(tag: &str) -> Result<(), Failed> {
    let ok = !tag.is_empty()
        && tag.len() <= 128
        && tag
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Failed::invalid(format!(
            "the tag {tag:?} must be 1-128 characters from A-Z a-z 0-9 _ . -, not starting \
             with . or -"
        )))
    }
}

fn check_digest(d: &str) -> Result<String, Failed> {
    match d.strip_prefix("sha256:") {
        Some(hex)
            if hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) =>
        {
            Ok(d.to_string())
        }
        _ => Err(Failed::invalid(format!(
            "the digest {d:?} must be sha256: and 64 lowercase hex digits"
        ))),
    }
}

/// The distribution spec's repository grammar: lowercase components of [a-z0-9] joined by
/// `.`, `_`, `__` or runs of `-`, separated by `/`.
fn check_repository(repo: &str) -> Result<(), Failed> {
    let why = || {
        Failed::invalid(format!(
            "the repository {repo:?} must be lowercase letters and digits, with . _ - inside \
             its parts and / between them"
        ))
    };
    if repo.is_empty() || repo.len() > 255 {
        return Err(why());
    }
    for part in repo.split('/') {
        let b = part.as_bytes();
        let edge = |c: Option<&u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if !edge(b.first()) || !edge(b.last()) {
            return Err(why());
        }
        if !b.iter().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-')
        }) || part.contains("..")
            || part.contains("___")
            || part.contains("._")
            || part.contains("_.")
        {
            return Err(why());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(text: &str) -> Reference {
        match parse(text) {
            Ok(Source::Registry(r)) => r,
            other => panic!("{text}: {other:?}"),
        }
    }

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn docker_hub_names_get_their_registry_and_library() {
        let r = reg("python:3.12-slim");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("docker.io", "library/python", Some("3.12-slim"))
        );
        assert_eq!(r.api_host(), "registry-1.docker.io");
        assert_eq!(r.to_string(), "docker.io/library/python:3.12-slim");
        assert_eq!(reg("node").tag.as_deref(), Some("latest"));
        assert_eq!(reg("bitnami/redis:7").repository, "bitnami/redis");
        assert_eq!(reg("docker.io/python").repository, "library/python");
        assert_eq!(
            reg("index.docker.io/library/alpine:3").registry,
            "docker.io"
        );
    }

    #[test]
    fn other_registries_ports_and_digests() {
        let r = reg("ghcr.io/org/img:tag");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("ghcr.io", "org/img", Some("tag"))
        );
        assert!(!r.is_loopback());
        let r = reg("127.0.0.1:5000/x:y");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("127.0.0.1:5000", "x")
        );
        assert_eq!(r.tag.as_deref(), Some("y"));
        assert!(r.is_loopback());
        assert!(reg("localhost:5000/a/b").is_loopback());
        let r = reg(&format!("quay.io/team/app@{D}"));
        assert_eq!((r.tag.as_deref(), r.digest.as_deref()), (None, Some(D)));
        assert_eq!(r.manifest_ref(), D);
        let r = reg(&format!("localhost:5000/app:v2@{D}"));
        assert_eq!(r.tag.as_deref(), Some("v2"));
        assert_eq!(
            r.manifest_ref(),
            D,
            "a digest pins the manifest, whatever the tag"
        );
    }

    #[test]
    fn local_sources_by_skopeos_transport_names() {
        assert_eq!(
            parse("oci:/images/app:v1"),
            Ok(Source::Layout {
                dir: "/images/app".into(),
                tag: Some("v1".into())
            })
        );
        assert_eq!(
            parse("oci:relative/dir"),
            Ok(Source::Layout {
                dir: "relative/dir".into(),
                tag: None
            })
        );
        assert_eq!(
            parse("docker-archive:/tmp/app.tar"),
            Ok(Source::DockerArchive("/tmp/app.tar".into()))
        );
        assert!(parse("oci:").is_err());
        assert!(parse("oci::v1").is_err());
        assert!(parse("oci:/d:bad tag").is_err());
        assert!(parse("docker-archive:").is_err());
    }

    #[test]
    fn what_is_not_a_reference_is_refused_and_named() {
        for bad in [
            "",
            "Python:3",
            "python:",
            "python:-x",
            "python@sha256:abc",
            "python@md5:0123",
            "org//img",
            "-org/img",
            "org/img-",
            "a b",
            "ghcr.io/",
            "x:y:z",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(!e.msg.is_empty(), "{bad:?}");
        }
        assert!(parse(&"a".repeat(600)).unwrap_err().msg.contains("1-512"));
    }
}
