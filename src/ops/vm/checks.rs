//! The checks every path and image from a call goes through before use: the roots, and the
//! untrusted-image check of its whole chain (with the format a VM's record pinned).

use std::path::{Path, PathBuf};

use crate::ops::error::OpError;
use crate::qemu::untrusted::{self, Checked};
use crate::state::roots;
/// How a path is used (read, write, ...): what the roots allow differs.
pub use crate::state::roots::Access;

/// Path parameter `param`'s text, checked against the roots for `access` and resolved (every
/// symlink and `..`): the caller must use the returned path from then on, never the text.
pub fn checked_path(raw: &str, param: &str, access: Access) -> Result<PathBuf, OpError> {
    roots::check_str(raw, access)
        .map_err(|e| OpError::from(e).context(format_args!("parameter '{param}'")))
}

/// An existing disk image, checked as untrusted data: its backing chain and external data
/// file must stay inside the roots. `format` pins how it is read (None probes it once).
pub fn checked_image(path: &Path, what: &str, format: Option<&str>) -> Result<Checked, OpError> {
    if !path.is_file() {
        return Err(OpError::not_found(format!(
            "{what} {} does not exist or is not a file",
            path.display()
        )));
    }
    // A disk a VM has used keeps the format recorded at its first launch: a guest that wrote
    // another format's header into it cannot change how the image tools read it either.
    let recorded = match format {
        Some(_) => None,
        None => recorded_format(path),
    };
    Ok(untrusted::check(path, format.or(recorded.as_deref()))?)
}

/// The format a VM's record pinned for the disk at `path`, if any VM used it.
fn recorded_format(path: &Path) -> Option<String> {
    let key = path.display().to_string();
    crate::state::registry::shared()
        .load()
        .values()
        .find_map(|rec| rec.disk_format(&key))
}

/// Ok when `path` is a regular file; else says how it is not, for `what`.
pub fn must_exist(path: &Path, what: &str) -> Result<(), OpError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(OpError::invalid(format!(
            "{what} {} is not a regular file",
            path.display()
        ))),
        Err(e) => {
            let msg = format!(
                "{what} {} cannot be read: {e}; check the path (image_info works on any \
                 existing image)",
                path.display()
            );
            Err(if e.kind() == std::io::ErrorKind::NotFound {
                OpError::not_found(msg)
            } else {
                OpError::host(msg)
            })
        }
    }
}

/// Refuses an image that a registered, running VM uses (a disk, or a live sandbox's base):
/// changing it under QEMU corrupts the guest's view of the disk.
pub fn refuse_in_use(path: &Path) -> Result<(), OpError> {
    match crate::qemu::vm::user_of(path) {
        Some(vm) => Err(OpError::refused(format!(
            "{} is in use by running VM {vm:?} (as a disk or as a sandbox's base image); stop it \
             (stop_vm or sandbox_destroy) first",
            path.display()
        ))),
        None => Ok(()),
    }
}
