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
use crate::ops::vm::launch_args::{LaunchArgs, PortSpec};
use crate::ops::work::Work;
use crate::state::roots::Access;

/// The image pulled (its root is the base image to put an overlay on) and `launch` with its
/// kernel, initrd and command line set.
pub fn resolve(
    work: &dyn Work,
    launch: &LaunchArgs,
    reference: &str,
) -> Result<(OciPulled, LaunchArgs), OpError> {
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
        l.modules = kit.modules_disk;
    }
    let mut append = boot::append(&arch);
    if l.modules.is_some() {
        append.push_str(" mcqemu.modules=1");
    }
    l.append = Some(match &l.append {
        Some(a) => format!("{append} {a}"),
        None => append,
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
pub fn run_program(ctx: &dyn Work, name: &str, command: &[String]) -> Result<Started, OpError> {
    let Some((program, args)) = command.split_first() else {
        return Err(OpError::invalid(
            "run: the image has neither Entrypoint nor Cmd; start a program with guest_exec",
        ));
    };
    start(
        ctx,
        &ExecRequest {
            name: name.to_string(),
            command: program.clone(),
            args: args.to_vec(),
            ..ExecRequest::default()
        },
    )
}

/// A container image made a sandbox's root: where the root is, what it is, and the launch that
/// boots it.
#[derive(Debug, Clone)]
pub struct ImageRoot {
    /// The reference as the call gave it.
    pub reference: String,
    /// The pulled image: its root's path, digest and program defaults.
    pub pulled: OciPulled,
    /// The sandbox's launch with the image's kernel, command line and forwards.
    pub launch: LaunchArgs,
}

impl ImageRoot {
    /// The image's program: its Entrypoint, then its Cmd.
    pub fn command(&self) -> Vec<String> {
        let c = &self.pulled.config;
        c.entrypoint.iter().chain(&c.cmd).cloned().collect()
    }
}

/// The root `reference` names for sandbox `req`, booted as [`resolve`] says (with `expose`,
/// its TCP ports forwarded too).
pub fn request(
    work: &dyn Work,
    req: &SandboxRequest,
    reference: &str,
) -> Result<ImageRoot, OpError> {
    let (pulled, mut launch) = resolve(work, &req.launch, reference)?;
    if req.expose {
        let mut forwards = launch
            .port_forwards
            .clone()
            .unwrap_or_else(|| vec![PortSpec::auto(22)]);
        forwards.extend(exposed_tcp(&pulled.config.exposed_ports).map(PortSpec::auto));
        launch.port_forwards = Some(forwards);
    }
    Ok(ImageRoot {
        reference: reference.to_string(),
        pulled,
        launch,
    })
}
