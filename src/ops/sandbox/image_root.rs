//! A sandbox whose root is a container image (`oci`): the image pulled and built once
//! ([`crate::ops::container::pull`]), then booted like any base image, with the kernel and initrd of
//! [`crate::ops::container::boot`] (the user's `kernel` and `initrd` when both are given).
//! sandbox_vm and template_create both take `oci`.

use crate::ops::container::boot::{self, APPEND};
use crate::ops::container::pull::{pull, OciPulled, OciRequest};
use crate::ops::error::OpError;
use crate::ops::sandbox::request::SandboxRequest;
use crate::ops::vm::checks::checked_path;
use crate::ops::vm::launch_args::LaunchArgs;
use crate::ops::work::Work;
use crate::state::roots::Access;

/// The image pulled (its root is the base image to put an overlay on) and `launch` with its kernel,
/// initrd and command line set; `base_image` must be absent.
pub fn resolve(
    work: &dyn Work,
    base_image: Option<&str>,
    launch: &LaunchArgs,
    reference: &str,
) -> Result<(OciPulled, LaunchArgs), OpError> {
    if base_image.is_some() {
        return Err(OpError::invalid(
            "give oci or base_image, not both: the image's root is the base",
        ));
    }
    let arch = launch
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
    let mut l = launch.clone();
    if l.kernel.is_none() || l.initrd.is_none() {
        let kernel = match &l.kernel {
            Some(k) => Some(checked_path(k, "kernel", Access::Read)?),
            None => None,
        };
        work.progress_phase("preparing the image's kernel and initrd");
        let kit = boot::kit(work, &arch, kernel.as_deref())?;
        l.kernel = Some(kit.kernel.display().to_string());
        l.initrd = Some(kit.initrd.display().to_string());
    }
    l.append = Some(match &l.append {
        Some(a) => format!("{APPEND} {a}"),
        None => APPEND.to_string(),
    });
    Ok((pulled, l))
}

/// `req` with the image's root as its base image, booted as [`resolve`] says.
pub fn request(
    work: &dyn Work,
    req: &SandboxRequest,
    reference: &str,
) -> Result<SandboxRequest, OpError> {
    let (pulled, launch) = resolve(work, req.base_image.as_deref(), &req.launch, reference)?;
    Ok(SandboxRequest {
        base_image: Some(pulled.path),
        oci_digest: Some(pulled.digest),
        launch,
        ..req.clone()
    })
}
