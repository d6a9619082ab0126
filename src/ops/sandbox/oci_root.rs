//! A sandbox whose root is a container image (`oci`): the image pulled and built once
//! ([`crate::ops::image::oci`]), then booted like any base image, with the kernel and initrd of
//! [`crate::ops::image::oci_boot`] (the user's `kernel` and `initrd` when both are given).

use crate::ops::error::OpError;
use crate::ops::image::oci::{pull, OciRequest};
use crate::ops::image::oci_boot::{self, APPEND};
use crate::ops::sandbox::request::SandboxRequest;
use crate::ops::vm::checks::checked_path;
use crate::ops::work::Work;
use crate::state::roots::Access;

/// `req` with the image's root as its base image and its kernel, initrd and command line set.
pub fn request(
    work: &dyn Work,
    req: &SandboxRequest,
    reference: &str,
) -> Result<SandboxRequest, OpError> {
    if req.base_image.is_some() {
        return Err(OpError::invalid(
            "give oci or base_image, not both: the image's root is the sandbox's base",
        ));
    }
    let arch = req
        .launch
        .arch
        .clone()
        .unwrap_or_else(|| crate::host::get().arch.clone());
    let pulled = pull(
        work,
        &OciRequest {
            reference: reference.to_string(),
            arch: arch.clone(),
        },
    )?;
    let mut out = req.clone();
    out.base_image = Some(pulled.path.clone());
    let l = &mut out.launch;
    if l.kernel.is_none() || l.initrd.is_none() {
        let kernel = match &l.kernel {
            Some(k) => Some(checked_path(k, "kernel", Access::Read)?),
            None => None,
        };
        work.progress_phase("preparing the image's kernel and initrd");
        let kit = oci_boot::kit(work, &arch, kernel.as_deref())?;
        l.kernel = Some(kit.kernel.display().to_string());
        l.initrd = Some(kit.initrd.display().to_string());
    }
    l.append = Some(match &l.append {
        Some(a) => format!("{APPEND} {a}"),
        None => APPEND.to_string(),
    });
    Ok(out)
}
