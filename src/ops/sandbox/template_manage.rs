//! The templates on disk, as template_list shows them (with their clones alive and their warm
//! pools), and template_delete: the pool ended first, refused while a caller's clone stands on
//! the template's disk.

use std::path::Path;

use serde::Serialize;

use super::pool;
use super::templates::{clones_of, dir_of, load, meta_of, remove_dir, templates_dir};
use crate::ops::error::OpError;
use crate::ops::work::Work;

crate::described! {
    /// A template clones can be made of.
    #[derive(Debug, Clone, Serialize)]
    pub struct Usable {
        /// Its name.
        pub name: String,
        /// Always true.
        pub usable: bool,
        /// The image it was made from (none for a kernel-only guest).
        pub base_image: Option<String>,
        /// Each clone's memory.
        pub memory_mb: u64,
        /// Each clone's vCPUs.
        pub cpus: u64,
        /// When it was saved.
        pub created_at: String,
        /// Its files' allocated bytes.
        pub size_on_disk: u64,
        /// The clones callers hold (its pool's are counted apart).
        pub clones: Vec<String>,
        /// Its warm pool's size.
        pub pool: u64,
        /// Pooled clones ready to hand out.
        pub pool_ready: usize,
    }
}

crate::described! {
    /// A template that cannot be used (half-made or damaged): shown, never offered as usable.
    #[derive(Debug, Clone, Serialize)]
    pub struct Damaged {
        /// Its name.
        pub name: String,
        /// Always false.
        pub usable: bool,
        /// What is wrong.
        pub problem: String,
        /// Its files' allocated bytes.
        pub size_on_disk: u64,
        /// Clones that still stand on it.
        pub clones: Vec<String>,
    }
}

/// One template as listed.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Listed {
    /// A template clones can be made of.
    Usable(Usable),
    /// A template that cannot be used.
    Damaged(Damaged),
}

impl crate::schema::Schema for Listed {
    fn schema() -> serde_json::Value {
        crate::schema::any_of(vec![Usable::schema(), Damaged::schema()])
    }
}

crate::described! {
    /// template_list's answer.
    #[derive(Debug, Clone, Serialize)]
    pub struct Templates {
        /// Every template folder, by name.
        pub templates: Vec<Listed>,
    }
}

crate::described! {
    /// What template_delete did.
    #[derive(Debug, Clone, Serialize)]
    pub struct Deleted {
        /// The template.
        pub name: String,
        /// Every file went.
        pub deleted: bool,
        /// The files that could not be removed.
        pub errors: Vec<String>,
    }
}

/// The allocated bytes of a template folder's files.
fn folder_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.blocks() * 512)
                .sum()
        })
        .unwrap_or(0)
}

/// The live clones of a template that callers hold (its pool's are counted apart).
fn own_clones(template: &str) -> Vec<String> {
    let pooled = pool::pooled(template);
    clones_of(template)
        .into_iter()
        .filter(|c| !pooled.contains(c))
        .collect()
}

/// Every template folder, by name.
pub fn list() -> Templates {
    let mut names: Vec<String> = std::fs::read_dir(templates_dir())
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    let mut out = Vec::new();
    for n in names {
        let dir = dir_of(&n);
        match load(&n) {
            Ok(t) => out.push(Listed::Usable(Usable {
                name: t.name,
                usable: true,
                base_image: t.base_image,
                memory_mb: t.memory_mb,
                cpus: t.cpus,
                created_at: t.created_at,
                size_on_disk: folder_bytes(&dir),
                clones: own_clones(&n),
                pool: pool::size(&n),
                pool_ready: pool::ready(&n),
            })),
            // Half-made (interrupted) or damaged: shown, never offered as usable.
            Err(e) if meta_of(&dir).exists() => out.push(Listed::Damaged(Damaged {
                name: n.clone(),
                usable: false,
                problem: e.msg,
                size_on_disk: folder_bytes(&dir),
                clones: own_clones(&n),
            })),
            Err(_) => {}
        }
    }
    Templates { templates: out }
}

/// Deletes template `name` and every file it has; its pool ends first. Refused while a
/// clone (or a fork of one, running or suspended) stands on its disk.
pub fn delete(ctx: &dyn Work, name: &str) -> Result<Deleted, OpError> {
    let dir = dir_of(name);
    if !dir.is_dir() {
        return Err(OpError::not_found(format!(
            "no template named {name:?}; template_list shows the templates"
        )));
    }
    // Its pool ends first: pooled clones are the server's, not anyone's work.
    pool::end(ctx, name);
    let clones = clones_of(name);
    if !clones.is_empty() {
        return Err(OpError::refused(format!(
            "template {name:?} still has clones (or forks of them, running or suspended) that \
             stand on its disk: {clones:?}; sandbox_destroy them first"
        )));
    }
    let errors = remove_dir(&dir);
    Ok(Deleted {
        name: name.to_string(),
        deleted: errors.is_empty(),
        errors,
    })
}
