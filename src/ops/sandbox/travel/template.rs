//! Templates that travel: template_push sends a template (its saved memory, device state,
//! disk, and every file it boots from) as one artifact; template_pull brings one back into
//! this host's template store under a name. A pulled template is a template like any other:
//! sandbox_vm {"template"} clones it and template_pool keeps clones of it warm.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::{fetch, loads_here, pushed_by, send, Needs, Sent};
use crate::oci::artifact::{self, Part};
use crate::ops::error::OpError;
use crate::ops::sandbox::templates::{self as template, Template};
use crate::ops::work::Work;
use crate::qemu::img;

/// The artifact type of a template.
pub const TEMPLATE_TYPE: &str = "application/vnd.mcqemu.template.v1";
/// Its config's media type.
const TEMPLATE_CONFIG: &str = "application/vnd.mcqemu.template.config.v1+json";

/// What a template artifact's config holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Config {
    /// The template's record (its machine, QEMU version, CPU model, boot files as named where
    /// it was made).
    template: Template,
    /// The mcqemu that pushed it.
    pushed_by: String,
}

/// The files a template artifact may carry, by title: where each goes in a template folder
/// (`boot/` for the files it boots from, which lived outside the folder where it was made).
const FILES: &[&str] = &[
    "disk.qcow2",
    "ram",
    "state",
    "seed.iso",
    "uefi-vars.fd",
    "kernel",
    "initrd",
    "modules",
    "base",
];

crate::described! {
    /// What template_push sent.
    #[derive(Debug, Clone, Serialize)]
    pub struct Pushed {
        /// The template.
        pub name: String,
        /// Where it went and what was sent.
        #[serde(flatten)]
        pub sent: Sent,
        /// How long it took.
        pub push_ms: u64,
    }
}

/// Pushes template `name` to `reference` (`REG/NAME:TAG`, or `oci:DIR[:TAG]`).
pub fn push(work: &dyn Work, name: &str, reference: &str) -> Result<Pushed, OpError> {
    let started = Instant::now();
    let t = template::load(name)?;
    travels(name, &t)?;
    let dir = template::dir_of(name);
    let parts = parts_of(&t, &dir);
    let config = serde_json::to_vec(&Config {
        template: t,
        pushed_by: pushed_by(),
    })
    .map_err(|e| OpError::host(format!("cannot write the template's config: {e}")))?;
    let sent = send(
        work,
        reference,
        (TEMPLATE_TYPE, TEMPLATE_CONFIG),
        &config,
        &parts,
    )?;
    Ok(Pushed {
        name: name.to_string(),
        sent,
        push_ms: started.elapsed().as_millis() as u64,
    })
}

/// Refuses a template that cannot start elsewhere, saying why.
fn travels(name: &str, t: &Template) -> Result<(), OpError> {
    if let Some(m) = t.mounts.first() {
        return Err(OpError::invalid(format!(
            "template {name:?} mounts the host folder {} at {}: host folders never travel. Make \
             a template without mounts to push",
            m.host, m.guest
        )));
    }
    if t.cpu.as_deref() == Some("host") {
        return Err(OpError::invalid(format!(
            "template {name:?} was saved with the host's own CPU model (-cpu host), which only \
             a machine with this CPU can load. Templates made under KVM on x86_64 by this \
             mcqemu get the named model {} and travel; an Arm KVM host has no named models, so \
             its templates stay on hosts like it",
            crate::host::decide::TRAVELLING_X86_CPU
        )));
    }
    Ok(())
}

/// The files of template `t` in folder `dir`, named as the artifact carries them.
fn parts_of(t: &Template, dir: &Path) -> Vec<Part> {
    let part = |title: &str, path: PathBuf, sparse: bool| Part {
        title: title.to_string(),
        path,
        sparse,
    };
    let mut parts = vec![
        part("disk.qcow2", template::disk_of(dir), false),
        part("ram", template::ram_of(dir), true),
        part("state", template::state_of(dir), false),
    ];
    if t.seed {
        parts.push(part("seed.iso", template::seed_of(dir), false));
    }
    if t.firmware == "uefi" {
        parts.push(part("uefi-vars.fd", template::vars_of(dir), false));
    }
    for (title, file) in [
        ("kernel", &t.kernel),
        ("initrd", &t.initrd),
        ("modules", &t.modules),
        ("base", &t.base_image),
    ] {
        if let Some(f) = file {
            parts.push(part(title, PathBuf::from(f), false));
        }
    }
    parts
}

crate::described! {
    /// What template_pull brought.
    #[derive(Debug, Clone, Serialize)]
    pub struct Pulled {
        /// The template's name here.
        pub name: String,
        /// Where it came from.
        pub reference: String,
        /// The artifact's manifest digest.
        pub digest: String,
        /// Its name where it was made.
        pub made_as: String,
        /// The QEMU version that saved it.
        pub qemu_version: String,
        /// Its architecture and machine type.
        pub machine: String,
        /// Bytes downloaded (0: all were held already).
        pub downloaded: u64,
        /// How long it took.
        pub pull_ms: u64,
    }
}

/// Pulls the template at `reference` into this host's store as `name` (None: the name it was
/// pushed with).
pub fn pull(work: &dyn Work, reference: &str, name: Option<&str>) -> Result<Pulled, OpError> {
    let started = Instant::now();
    let (opened, downloaded) = fetch(work, reference, TEMPLATE_TYPE)?;
    let config: Config = serde_json::from_slice(&opened.config).map_err(|e| {
        OpError::invalid(format!(
            "the template's config is not one mcqemu reads: {e}"
        ))
    })?;
    let mut t = config.template;
    let made_as = t.name.clone();
    let name = name.unwrap_or(&made_as).to_string();
    if !crate::state::registry::valid_name(&name) {
        return Err(OpError::invalid(crate::state::registry::invalid_name(
            "template", &name,
        )));
    }
    loads_here(
        "template",
        &Needs {
            arch: &t.arch,
            machine: &t.machine,
            accel: t.accel,
            qemu_version: &t.qemu_version,
            cpu: t.cpu.as_deref(),
            uefi_code: t.uefi_code.as_deref().map(Path::new),
        },
    )?;
    let dir = template::dir_of(&name);
    if template::meta_of(&dir).exists() {
        return Err(OpError::invalid(format!(
            "a template named {name:?} already exists; template_delete it first or pull under \
             another name"
        )));
    }
    let made = place(work, &opened, &mut t, &name, &dir);
    if made.is_err() {
        template::remove_dir(&dir.join("boot"));
        template::remove_dir(&dir);
    }
    made?;
    template::load(&name)?;
    Ok(Pulled {
        name,
        reference: reference.to_string(),
        digest: opened.digest,
        made_as,
        qemu_version: t.qemu_version.clone(),
        machine: format!("{} {}", t.arch, t.machine),
        downloaded,
        pull_ms: started.elapsed().as_millis() as u64,
    })
}

/// Writes the artifact's files into template folder `dir` and its record (named `name`, its
/// boot files' paths the new ones) last.
fn place(
    work: &dyn Work,
    opened: &artifact::Opened,
    t: &mut Template,
    name: &str,
    dir: &Path,
) -> Result<(), OpError> {
    std::fs::create_dir_all(dir.join("boot"))
        .map_err(|e| OpError::host(format!("cannot create {}: {e}", dir.display())))?;
    let titles = opened.titles();
    let total = titles.len() as f64;
    for (i, title) in titles.iter().copied().enumerate() {
        work.check_cancel()?;
        work.progress(i as f64, Some(total), &format!("writing {title}"));
        if !FILES.contains(&title) {
            return Err(OpError::refused(format!(
                "the template carries a file named {:?}, which a template does not have",
                title
            )));
        }
        let dest = match title {
            "kernel" | "initrd" | "modules" | "base" => dir.join("boot").join(title),
            other => dir.join(other),
        };
        opened.extract(title, &dest)?;
        let path = Some(dest.display().to_string());
        match title {
            "kernel" => t.kernel = path,
            "initrd" => t.initrd = path,
            "modules" => t.modules = path,
            "base" => t.base_image = path,
            _ => {}
        }
    }
    // The disk names its base where it was made: it names the copy now.
    if let Some(base) = &t.base_image {
        let format = img::info_as(Path::new(base), None)
            .ok()
            .and_then(|v| v["format"].as_str().map(str::to_string))
            .unwrap_or_else(|| "raw".into());
        img::rebase_unsafe(&template::disk_of(dir), Path::new(base), &format)
            .map_err(OpError::from)?;
    }
    t.name = name.to_string();
    let meta = serde_json::to_vec_pretty(&*t)
        .map_err(|e| OpError::host(format!("cannot write the template's record: {e}")))?;
    let tmp = dir.join(".template.json.tmp");
    std::fs::write(&tmp, meta)
        .and_then(|()| std::fs::rename(&tmp, template::meta_of(dir)))
        .map_err(|e| OpError::host(format!("cannot write {}: {e}", dir.display())))
}
