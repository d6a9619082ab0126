//! An image read from an OCI image layout (`oci:DIR[:tag]`, what `skopeo copy … oci:DIR` and
//! umoci write): its index, the manifest for the guest's platform, the config (the defaults a
//! guest program gets) and the layers to apply. Every JSON blob is read under a size cap and
//! checked against its digest and size before it is parsed; layers are checked as they are
//! unpacked ([`Layer::digest`]).

use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::error::OciError;
use crate::net::digest::hex;
use crate::state::tree::Folder;

/// Largest index, manifest or config read (real ones are a few KiB).
const MAX_JSON: u64 = 4 << 20;
/// How deep indexes may nest (an index naming an index naming a manifest).
const MAX_NESTING: usize = 4;
/// The annotation that names an image in a layout's index.
const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// A layer's compression, from its media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar.
    None,
    /// gzip.
    Gzip,
}

/// One layer of an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    /// Its blob's digest (`sha256:…`), checked while it is unpacked.
    pub digest: String,
    /// Its blob's size in bytes.
    pub size: u64,
    /// How its tar is compressed.
    pub compression: Compression,
    /// The layout holding its blob.
    pub layout: PathBuf,
}

impl Layer {
    /// Opens its blob ([`open_blob`]).
    pub fn open(&self) -> Result<File, OciError> {
        open_blob(&self.layout, &self.digest)
    }
}

crate::described! {
    /// What a guest program gets from the image: the defaults guest_exec applies and what runs
    /// when asked (image_pull's result shows it as it is).
    #[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
    pub struct RunConfig {
        /// `NAME=value` pairs.
        pub env: Vec<String>,
        /// The working folder (empty: `/`).
        pub working_dir: String,
        /// The user (`name`, `uid`, `uid:gid`; empty: root).
        pub user: String,
        /// The entrypoint.
        pub entrypoint: Vec<String>,
        /// The command (the entrypoint's arguments, or the program when there is none).
        pub cmd: Vec<String>,
        /// Ports the image declares, as `80/tcp`.
        pub exposed_ports: Vec<String>,
    }
}

/// An image chosen from a layout, ready to unpack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The manifest's digest: the image's identity (what a built root is cached by).
    pub manifest_digest: String,
    /// The platform of its config (`linux/amd64`).
    pub platform: String,
    /// The program defaults.
    pub config: RunConfig,
    /// The layers, lowest first.
    pub layers: Vec<Layer>,
}

#[derive(Deserialize, Clone)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize, Clone)]
struct Platform {
    architecture: String,
    os: String,
    #[serde(default)]
    variant: Option<String>,
}

#[derive(Deserialize)]
struct Index {
    #[serde(default)]
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Manifest {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct ConfigBlob {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
    #[serde(default)]
    config: Option<ContainerConfig>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct ContainerConfig {
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    working_dir: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    cmd: Option<Vec<String>>,
    #[serde(default)]
    exposed_ports: Option<std::collections::BTreeMap<String, serde_json::Value>>,
}

/// The OCI platform architecture of a QEMU guest architecture.
pub fn platform_arch(guest_arch: &str) -> &str {
    match guest_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "i386" => "386",
        other => other,
    }
}

/// Reads the image `tag` (None: the only one) of the layout at `dir`, for a guest of
/// `guest_arch`.
pub fn read(dir: &Path, tag: Option<&str>, guest_arch: &str) -> Result<Image, OciError> {
    let not_layout = |why: String| {
        OciError::Invalid(format!(
            "{} is not an OCI image layout (its oci-layout file: {why})",
            dir.display()
        ))
    };
    let marker =
        read_capped(dir, &[], "oci-layout", 4096).map_err(|e| not_layout(e.to_string()))?;
    if !String::from_utf8_lossy(&marker).contains("imageLayoutVersion") {
        return Err(not_layout("no imageLayoutVersion".into()));
    }
    let index: Index = parse(
        &read_capped(dir, &[], "index.json", MAX_JSON)?,
        "index.json",
    )?;
    let arch = platform_arch(guest_arch);
    let mut desc = pick_tag(&index.manifests, tag, dir)?.clone();
    for _ in 0..MAX_NESTING {
        match desc.media_type.as_str() {
            "application/vnd.oci.image.index.v1+json"
            | "application/vnd.docker.distribution.manifest.list.v2+json" => {
                let inner: Index = parse(&blob(dir, &desc)?, &desc.digest)?;
                desc = pick_platform(inner.manifests, arch).ok_or_else(|| {
                    OciError::NotFound(format!("the image has no linux/{arch} variant"))
                })?;
            }
            _ => return manifest(dir, &desc, arch),
        }
    }
    Err(OciError::Invalid(format!(
        "the image's indexes nest deeper than {MAX_NESTING}"
    )))
}

/// The index entry named `tag`, or the only one.
fn pick_tag<'a>(
    entries: &'a [Descriptor],
    tag: Option<&str>,
    dir: &Path,
) -> Result<&'a Descriptor, OciError> {
    let names = || {
        entries
            .iter()
            .filter_map(|d| d.annotations.get(REF_NAME).cloned())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match tag {
        Some(t) => entries
            .iter()
            .find(|d| d.annotations.get(REF_NAME).map(String::as_str) == Some(t))
            .ok_or_else(|| {
                OciError::NotFound(format!(
                    "the layout {} has no image tagged {t:?} (it has: {})",
                    dir.display(),
                    names()
                ))
            }),
        None => match entries {
            [one] => Ok(one),
            [] => Err(OciError::NotFound(format!(
                "the layout {} holds no image",
                dir.display()
            ))),
            _ => Err(OciError::Invalid(format!(
                "the layout {} holds {} images; name one as oci:DIR:TAG (tags: {})",
                dir.display(),
                entries.len(),
                names()
            ))),
        },
    }
}

/// The index entry for linux on `arch` (a v8 variant for arm64 when several).
fn pick_platform(entries: Vec<Descriptor>, arch: &str) -> Option<Descriptor> {
    let mut fit: Vec<Descriptor> = entries
        .into_iter()
        .filter(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == arch)
        })
        .collect();
    fit.sort_by_key(|d| {
        d.platform
            .as_ref()
            .and_then(|p| p.variant.clone())
            .is_some_and(|v| v != "v8")
    });
    fit.into_iter().next()
}

/// The image of manifest `desc`.
fn manifest(dir: &Path, desc: &Descriptor, arch: &str) -> Result<Image, OciError> {
    let m: Manifest = parse(&blob(dir, desc)?, &desc.digest)?;
    if !m.media_type.is_empty()
        && m.media_type != "application/vnd.oci.image.manifest.v1+json"
        && m.media_type != "application/vnd.docker.distribution.manifest.v2+json"
    {
        return Err(OciError::Invalid(format!(
            "the manifest's media type {:?} is not an image's",
            m.media_type
        )));
    }
    let c: ConfigBlob = parse(&blob(dir, &m.config)?, &m.config.digest)?;
    if c.os != "linux" || c.architecture != arch {
        return Err(OciError::NotFound(format!(
            "the image is for {}/{}, not linux/{arch}; pick its linux/{arch} variant",
            c.os, c.architecture
        )));
    }
    let layers = m
        .layers
        .iter()
        .map(|d| {
            blob_name(&d.digest)?;
            Ok(Layer {
                digest: d.digest.clone(),
                size: d.size,
                compression: compression(&d.media_type)?,
                layout: dir.to_path_buf(),
            })
        })
        .collect::<Result<Vec<_>, OciError>>()?;
    let cc = c.config.unwrap_or_default();
    Ok(Image {
        manifest_digest: desc.digest.clone(),
        platform: format!("{}/{}", c.os, c.architecture),
        config: RunConfig {
            env: cc.env.unwrap_or_default(),
            working_dir: cc.working_dir.unwrap_or_default(),
            user: cc.user.unwrap_or_default(),
            entrypoint: cc.entrypoint.unwrap_or_default(),
            cmd: cc.cmd.unwrap_or_default(),
            exposed_ports: cc.exposed_ports.unwrap_or_default().into_keys().collect(),
        },
        layers,
    })
}

/// A layer's compression from its media type; zstd and foreign layers are refused by name.
fn compression(media_type: &str) -> Result<Compression, OciError> {
    match media_type {
        "application/vnd.oci.image.layer.v1.tar"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar" => Ok(Compression::None),
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip"
        | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Ok(Compression::Gzip),
        t if t.ends_with("+zstd") => Err(OciError::Invalid(format!(
            "the image has a zstd layer ({t}), which mcqemu does not unpack yet; convert it \
             with skopeo copy --dest-compress-format gzip"
        ))),
        t => Err(OciError::Invalid(format!(
            "the image has a layer of an unknown type {t:?}"
        ))),
    }
}

/// The file name blob `digest` has under `blobs/sha256/` (only sha256 digests name a file).
pub fn blob_name(digest: &str) -> Result<&str, OciError> {
    match digest.strip_prefix("sha256:") {
        Some(hex)
            if hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) =>
        {
            Ok(hex)
        }
        _ => Err(OciError::Invalid(format!(
            "the blob digest {digest:?} is not a sha256 digest"
        ))),
    }
}

/// Opens blob `digest` of the layout at `dir` through its folders, none of them a symlink
/// (a layout the caller names may hold links that point out of it).
pub fn open_blob(dir: &Path, digest: &str) -> Result<File, OciError> {
    let name = blob_name(digest)?;
    open_beneath(dir, &["blobs", "sha256"], name)
        .map_err(|e| OciError::Invalid(format!("the layout has no readable blob {digest}: {e}")))
}

/// `dir`/`folders`/`name`, each step opened with `O_NOFOLLOW`.
fn open_beneath(dir: &Path, folders: &[&str], name: &str) -> std::io::Result<File> {
    let mut cur = Folder::open_following(dir)?;
    for f in folders {
        cur = cur.sub(OsStr::new(f))?;
    }
    let file = cur.open_file(OsStr::new(name))?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("it is not a regular file"));
    }
    Ok(file)
}

/// A JSON blob's bytes, checked against its descriptor's size and digest.
fn blob(dir: &Path, d: &Descriptor) -> Result<Vec<u8>, OciError> {
    if d.size > MAX_JSON {
        return Err(OciError::Refused(format!(
            "the blob {} is {} bytes, more than a manifest or config may be",
            d.digest, d.size
        )));
    }
    let bytes = read_capped(dir, &["blobs", "sha256"], blob_name(&d.digest)?, MAX_JSON)?;
    if bytes.len() as u64 != d.size {
        return Err(OciError::Refused(format!(
            "the blob {} is {} bytes, not the {} its descriptor says",
            d.digest,
            bytes.len(),
            d.size
        )));
    }
    let got = sha256_hex(&bytes);
    if d.digest != format!("sha256:{got}") {
        return Err(OciError::Refused(format!(
            "the blob {} does not match its digest (its content hashes to sha256:{got})",
            d.digest
        )));
    }
    Ok(bytes)
}

/// The lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

fn parse<T: for<'de> Deserialize<'de>>(bytes: &[u8], what: &str) -> Result<T, OciError> {
    serde_json::from_slice(bytes)
        .map_err(|e| OciError::Invalid(format!("{what} is not valid JSON of its kind: {e}")))
}

/// At most `cap` bytes of `dir`/`folders`/`name` (more is an error), opened beneath `dir`.
fn read_capped(dir: &Path, folders: &[&str], name: &str, cap: u64) -> Result<Vec<u8>, OciError> {
    let shown = || {
        format!(
            "{}/{}",
            dir.display(),
            [folders, &[name]].concat().join("/")
        )
    };
    let f = open_beneath(dir, folders, name)
        .map_err(|e| OciError::Invalid(format!("cannot read {}: {e}", shown())))?;
    let mut out = Vec::new();
    f.take(cap + 1)
        .read_to_end(&mut out)
        .map_err(|e| OciError::Host(format!("cannot read {}: {e}", shown())))?;
    if out.len() as u64 > cap {
        return Err(OciError::Refused(format!(
            "{} is larger than {cap} bytes",
            shown()
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A layout under construction: blobs by content, an index at the end.
    struct Lay(PathBuf);

    impl Lay {
        fn new(label: &str) -> Lay {
            let d = std::env::temp_dir().join(format!("mcq-oci-{label}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(d.join("blobs/sha256")).unwrap();
            std::fs::write(d.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
            Lay(d)
        }

        fn blob(&self, bytes: &[u8], media_type: &str) -> serde_json::Value {
            let hex = sha256_hex(bytes);
            std::fs::write(self.0.join("blobs/sha256").join(&hex), bytes).unwrap();
            json!({"mediaType": media_type, "digest": format!("sha256:{hex}"), "size": bytes.len()})
        }

        fn image(&self, arch: &str, env: &[&str]) -> serde_json::Value {
            let config = json!({"architecture": arch, "os": "linux",
                "config": {"Env": env, "WorkingDir": "/app", "User": "1000:1000",
                           "Entrypoint": ["/bin/run"], "Cmd": ["--serve"],
                           "ExposedPorts": {"8080/tcp": {}}},
                "rootfs": {"type": "layers", "diff_ids": []}});
            let config = self.blob(
                config.to_string().as_bytes(),
                "application/vnd.oci.image.config.v1+json",
            );
            let l1 = self.blob(b"layer one", "application/vnd.oci.image.layer.v1.tar+gzip");
            let l2 = self.blob(b"layer two", "application/vnd.oci.image.layer.v1.tar");
            let m = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": config, "layers": [l1, l2]});
            self.blob(
                m.to_string().as_bytes(),
                "application/vnd.oci.image.manifest.v1+json",
            )
        }

        fn index(&self, entries: Vec<serde_json::Value>) {
            let idx = json!({"schemaVersion": 2, "manifests": entries});
            std::fs::write(self.0.join("index.json"), idx.to_string()).unwrap();
        }
    }

    impl Drop for Lay {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_tagged_image_reads_with_its_config_and_layers_in_order() {
        let l = Lay::new("tagged");
        let mut m = l.image("amd64", &["PATH=/usr/bin", "LANG=C.UTF-8"]);
        m["annotations"] = json!({REF_NAME: "v1"});
        l.index(vec![m.clone()]);
        let img = read(&l.0, Some("v1"), "x86_64").unwrap();
        assert_eq!(img.manifest_digest, m["digest"]);
        assert_eq!(img.platform, "linux/amd64");
        assert_eq!(img.config.env, ["PATH=/usr/bin", "LANG=C.UTF-8"]);
        assert_eq!(
            (img.config.working_dir.as_str(), img.config.user.as_str()),
            ("/app", "1000:1000")
        );
        assert_eq!(
            (img.config.entrypoint.clone(), img.config.cmd.clone()),
            (vec!["/bin/run".to_string()], vec!["--serve".to_string()])
        );
        assert_eq!(img.config.exposed_ports, ["8080/tcp"]);
        assert_eq!(img.layers.len(), 2);
        assert_eq!(img.layers[0].compression, Compression::Gzip);
        assert_eq!(img.layers[1].compression, Compression::None);
        let mut one = Vec::new();
        img.layers[0].open().unwrap().read_to_end(&mut one).unwrap();
        assert_eq!(one, b"layer one");
        assert!(
            read(&l.0, None, "x86_64").is_ok(),
            "the only image needs no tag"
        );
        let e = read(&l.0, Some("v2"), "x86_64").unwrap_err();
        assert!(
            e.msg().contains("no image tagged \"v2\"") && e.msg().contains("v1"),
            "{e}"
        );
        assert!(matches!(e, OciError::NotFound(_)), "{e}");
        let e = read(&l.0, None, "aarch64").unwrap_err();
        assert!(matches!(e, OciError::NotFound(_)), "{e}");
        assert!(e.msg().contains("linux/amd64, not linux/arm64"), "{e}");
    }

    #[test]
    fn an_index_gives_the_guests_platform() {
        let l = Lay::new("multi");
        let mut amd = l.image("amd64", &["A=amd"]);
        amd["platform"] = json!({"architecture": "amd64", "os": "linux"});
        let mut arm = l.image("arm64", &["A=arm"]);
        arm["platform"] = json!({"architecture": "arm64", "os": "linux", "variant": "v8"});
        let inner = json!({"schemaVersion": 2, "manifests": [amd, arm]});
        let mut idx = l.blob(
            inner.to_string().as_bytes(),
            "application/vnd.oci.image.index.v1+json",
        );
        idx["annotations"] = json!({REF_NAME: "latest"});
        l.index(vec![idx]);
        assert_eq!(read(&l.0, None, "x86_64").unwrap().config.env, ["A=amd"]);
        assert_eq!(
            read(&l.0, Some("latest"), "aarch64").unwrap().config.env,
            ["A=arm"]
        );
        let e = read(&l.0, None, "riscv64").unwrap_err();
        assert!(e.msg().contains("no linux/riscv64 variant"), "{e}");
    }

    #[test]
    fn a_blob_that_does_not_match_its_digest_or_size_is_refused() {
        let l = Lay::new("tampered");
        let m = l.image("amd64", &[]);
        l.index(vec![m.clone()]);
        let hex = m["digest"]
            .as_str()
            .unwrap()
            .trim_start_matches("sha256:")
            .to_string();
        let p = l.0.join("blobs/sha256").join(&hex);
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[10] ^= 1;
        std::fs::write(&p, &bytes).unwrap();
        let e = read(&l.0, None, "x86_64").unwrap_err();
        assert!(e.msg().contains("does not match its digest"), "{e}");
        assert!(matches!(e, OciError::Refused(_)), "{e}");
        bytes.push(b' ');
        std::fs::write(&p, &bytes).unwrap();
        let e = read(&l.0, None, "x86_64").unwrap_err();
        assert!(e.msg().contains("not the"), "{e}");
    }

    #[test]
    fn zstd_and_unknown_layers_and_non_layouts_are_refused_by_name() {
        assert!(compression("application/vnd.oci.image.layer.v1.tar+zstd")
            .unwrap_err()
            .msg()
            .contains("zstd"));
        assert!(compression("application/x-foo").is_err());
        assert!(blob_name("sha256:../../etc/passwd").is_err());
        let e = read(Path::new("/nonexistent-layout"), None, "x86_64").unwrap_err();
        assert!(e.msg().contains("not an OCI image layout"), "{e}");
        assert!(matches!(e, OciError::Invalid(_)), "{e}");
    }

    /// A layout's blobs folder that is a symlink out of it is not followed.
    #[test]
    fn a_symlinked_blobs_folder_is_not_followed() {
        let l = Lay::new("symlinked");
        let m = l.image("amd64", &[]);
        l.index(vec![m]);
        let elsewhere = l.0.with_extension("elsewhere");
        let _ = std::fs::remove_dir_all(&elsewhere);
        std::fs::rename(l.0.join("blobs"), &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, l.0.join("blobs")).unwrap();
        let e = read(&l.0, None, "x86_64").unwrap_err();
        assert!(e.msg().contains("cannot read"), "{e}");
        let _ = std::fs::remove_dir_all(&elsewhere);
    }
}
