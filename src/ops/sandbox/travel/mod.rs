//! Saved guests that travel between hosts as OCI artifacts ([`crate::oci::artifact`]):
//! templates ([`template`]) and running sandboxes ([`sandbox`]). Both go to a registry
//! (`REG/NAME:TAG`) or an OCI layout on the host (`oci:DIR[:TAG]`), and come back checked
//! against their digests and against what this host's QEMU can load before anything is
//! written. What they share is here: where an artifact goes and where it comes from.

pub mod sandbox;
pub mod template;

use std::path::{Path, PathBuf};

use crate::host::{self, binaries, decide};
use crate::oci::artifact::{self, Opened};
use crate::oci::origins::Origins;
use crate::oci::push::{self, Watch};
use crate::oci::reference::{self, Source};
use crate::ops::container::pull::locked_store;
use crate::ops::error::OpError;
use crate::ops::work::Work;
use crate::state::config::Accel;
use crate::state::roots::{self, Access};

crate::described! {
    /// What a push sent, whatever it pushed.
    #[derive(Debug, Clone, serde::Serialize)]
    pub struct Sent {
        /// Where it went.
        pub reference: String,
        /// The artifact's manifest digest: pull by it to get exactly this.
        pub digest: String,
        /// The files it holds.
        pub files: Vec<String>,
        /// Bytes sent.
        pub uploaded: u64,
        /// Bytes the destination already held (not sent again).
        pub skipped: u64,
        /// Bytes the registry mounted from another of its repositories (not sent again).
        pub mounted: u64,
        /// Times an upload cut off on the way was resumed from what the registry held.
        pub resumed: u32,
    }
}

/// Who pushed, for an artifact's config.
pub fn pushed_by() -> String {
    format!("mcqemu {}", env!("CARGO_PKG_VERSION"))
}

/// Builds an artifact of `types` (its own type and its config's) from `config` and `parts`,
/// and sends it to `reference`.
pub fn send(
    work: &dyn Work,
    reference: &str,
    types: (&str, &str),
    config: &[u8],
    parts: &[artifact::Part],
) -> Result<Sent, OpError> {
    let source = reference::parse(reference)?;
    let layout = match &source {
        Source::Registry(_) => None,
        Source::Layout { dir, tag } => Some((layout_dir(dir, Access::Write)?, tag.clone())),
        Source::DockerArchive(_) => {
            return Err(OpError::invalid(
                "a saved guest goes to a registry (REG/NAME:TAG) or an OCI layout \
                 (oci:DIR[:TAG]), not a docker-archive",
            ))
        }
    };
    let (store, _lock) = locked_store(work)?;
    let progress = |done: u64, total: u64, what: &str| {
        work.progress(done as f64, Some(total as f64), what);
    };
    let cancelled = || work.cancelled();
    let watch = Watch {
        progress: &progress,
        cancelled: &cancelled,
    };
    work.progress_phase("hashing the files");
    let built = artifact::build(&store, types.0, types.1, config, parts, &watch)?;
    work.progress_phase("sending");
    let done = match (&source, layout) {
        (_, Some((dir, tag))) => push::to_layout(
            &dir,
            tag.as_deref().unwrap_or("latest"),
            &built.manifest,
            artifact::MANIFEST_TYPE,
            &built.digest,
            &built.blobs,
            &watch,
        )?,
        (Source::Registry(r), None) => {
            let mut origins = Origins::load(&store);
            let done = push::to_registry(
                r,
                r.tag.as_deref().unwrap_or("latest"),
                &built.manifest,
                artifact::MANIFEST_TYPE,
                &built.blobs,
                &origins,
                &watch,
            )?;
            origins.add(
                built.blobs.iter().map(|b| b.digest.as_str()),
                r.api_host(),
                &r.repository,
            );
            // Losing what is remembered costs bytes on a later push, never this one.
            let _ = origins.save();
            done
        }
        (_, None) => return Err(OpError::invalid("nowhere to send the saved guest")),
    };
    Ok(Sent {
        reference: reference.to_string(),
        digest: built.digest,
        files: parts.iter().map(|p| p.title.clone()).collect(),
        uploaded: done.uploaded,
        skipped: done.skipped,
        mounted: done.mounted,
        resumed: done.resumed,
    })
}

/// Fetches (from a registry, into the image store) or finds (in a layout) the artifact of
/// `artifact_type` at `reference`; with the bytes downloaded.
pub fn fetch(
    work: &dyn Work,
    reference: &str,
    artifact_type: &str,
) -> Result<(Opened, u64), OpError> {
    let source = reference::parse(reference)?;
    let (store, _lock) = locked_store(work)?;
    let progress = |done: u64, total: u64, what: &str| {
        work.progress(done as f64, Some(total as f64), what);
    };
    let (layout, name, downloaded) = match &source {
        Source::Registry(r) => {
            work.progress_phase("fetching");
            let arch = host::get().arch.clone();
            let f = crate::oci::registry::fetch(r, &store, &arch, &progress, &|| work.cancelled())?;
            (store.clone(), Some(f.name), f.downloaded)
        }
        Source::Layout { dir, tag } => (layout_dir(dir, Access::Read)?, tag.clone(), 0),
        Source::DockerArchive(_) => {
            return Err(OpError::invalid(
                "a saved guest comes from a registry (REG/NAME:TAG) or an OCI layout \
                 (oci:DIR[:TAG]), not a docker-archive",
            ))
        }
    };
    Ok((
        artifact::open(&layout, name.as_deref(), artifact_type)?,
        downloaded,
    ))
}

/// An `oci:` layout folder, checked against the roots.
fn layout_dir(dir: &Path, access: Access) -> Result<PathBuf, OpError> {
    if access == Access::Write {
        std::fs::create_dir_all(dir)
            .map_err(|e| OpError::host(format!("cannot create {}: {e}", dir.display())))?;
    }
    roots::check(dir, access).map_err(|e| OpError::refused(e.to_string()))
}

/// What a saved guest needs of the QEMU that loads it.
pub struct Needs<'a> {
    /// Its architecture.
    pub arch: &'a str,
    /// Its concrete machine type.
    pub machine: &'a str,
    /// The accelerator it ran under.
    pub accel: Accel,
    /// The QEMU version that saved it.
    pub qemu_version: &'a str,
    /// Its CPU model.
    pub cpu: Option<&'a str>,
    /// The UEFI firmware file it booted, when it did.
    pub uefi_code: Option<&'a Path>,
}

/// Refuses a saved guest this host's QEMU cannot load, saying what differs and what to do;
/// the QEMU that will load it.
pub fn loads_here(what: &str, n: &Needs) -> Result<std::sync::Arc<binaries::Qemu>, OpError> {
    if n.cpu == Some("host") {
        return Err(OpError::refused(format!(
            "the {what} was saved with its host's own CPU model (-cpu host), which only that \
             machine can load"
        )));
    }
    let qemu = binaries::find(n.arch).map_err(|e| {
        OpError::from(e).context(format!(
            "the {what} is for {}, and this host has no QEMU for it",
            n.arch
        ))
    })?;
    let saved = decide::Saved {
        arch: n.arch,
        machine: n.machine,
        accel: n.accel,
        qemu_version: n.qemu_version,
    };
    decide::can_restore(&saved, host::get(), &qemu).map_err(|why| {
        OpError::from(why).context(format!("the {what} cannot start on this host"))
    })?;
    if let Some(code) = n.uefi_code {
        if !code.is_file() {
            return Err(OpError::refused(format!(
                "the {what} booted the UEFI firmware {}, which this host does not have; install \
                 the same firmware package",
                code.display()
            )));
        }
    }
    Ok(qemu)
}
