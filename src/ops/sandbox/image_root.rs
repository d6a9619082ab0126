//! A sandbox whose root is a container image (`oci`): the image pulled and built once
//! ([`crate::ops::container::pull`]), then booted like any base image, with the kernel and initrd of
//! [`crate::ops::container::boot`] (the user's `kernel` and `initrd` when both are given).
//! sandbox_vm and template_create both take `oci`.

use crate::ops::container::boot;
use crate::ops::container::pull::{pull, OciPulled, OciRequest};
use crate::ops::error::OpError;
use crate::ops::guest::background::Started;
use crate::ops::guest::exec::{start, ExecRequest};
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
        Some(a) => format!("{} {a}", boot::append(&arch)),
        None => boot::append(&arch),
    });
    Ok((pulled, l))
}

/// The TCP ports of an image's ExposedPorts (`8080/tcp`, `53/udp`: only the first).
fn exposed_tcp(ports: &[String]) -> impl Iterator<Item = u16> + '_ {
    ports.iter().filter_map(|p| {
        let (n, proto) = p.split_once('/').unwrap_or((p, "tcp"));
        (proto == "tcp").then(|| n.parse().ok()).flatten()
    })
}

/// Starts the image's program in the background in the ready sandbox `name`.
pub fn run_program(name: &str, command: &[String]) -> Result<Started, OpError> {
    let Some((program, args)) = command.split_first() else {
        return Err(OpError::invalid(
            "run: the image has neither Entrypoint nor Cmd; start a program with guest_exec",
        ));
    };
    start(&ExecRequest {
        name: name.to_string(),
        command: program.clone(),
        args: args.to_vec(),
        ..ExecRequest::default()
    })
}

/// `req` with the image's root as its base image, booted as [`resolve`] says.
pub fn request(
    work: &dyn Work,
    req: &SandboxRequest,
    reference: &str,
) -> Result<SandboxRequest, OpError> {
    let (pulled, mut launch) = resolve(work, req.base_image.as_deref(), &req.launch, reference)?;
    if req.expose {
        let mut forwards = launch
            .port_forwards
            .clone()
            .unwrap_or_else(|| vec!["auto:22".to_string()]);
        forwards.extend(exposed_tcp(&pulled.config.exposed_ports).map(|p| format!("auto:{p}")));
        launch.port_forwards = Some(forwards);
    }
    let c = &pulled.config;
    Ok(SandboxRequest {
        base_image: Some(pulled.path.clone()),
        oci_digest: Some(pulled.digest.clone()),
        oci_command: c.entrypoint.iter().chain(&c.cmd).cloned().collect(),
        launch,
        ..req.clone()
    })
}
