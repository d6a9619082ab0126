//! launch_vm as one operation: the disks checked, the VM started, its host folders plugged in
//! and, when asked, its agent and cloud-init awaited. It lives here, above `ops/vm`, because
//! the mounts and the cloud-init wait go through the guest.

use std::time::Duration;

use super::run::{agent_then_cloud_init, report_cloud_init};
use crate::ops::error::OpError;
use crate::ops::vm::launch::{launch, Launched};
use crate::ops::vm::launch_args::{checked_disks, request, LaunchArgs};
use crate::ops::work::Work;

/// What launch_vm asks for.
pub struct LaunchVm {
    /// The VM's name.
    pub name: String,
    /// Disk image paths as given (checked against the roots and as untrusted images here).
    pub disks: Vec<String>,
    /// The launch's other arguments.
    pub launch: LaunchArgs,
    /// Wait this long for the agent and then cloud-init (None: return once QEMU runs).
    pub wait_cloud_init: Option<Duration>,
}

/// Starts the VM. The mounts are checked before anything starts; one that cannot be plugged
/// in once QEMU runs is a warning, since the VM runs either way (vm_info shows the mounts that
/// were; vm_mount adds the rest).
pub fn launch_vm(ctx: &dyn Work, req: &LaunchVm) -> Result<Launched, OpError> {
    let disks = checked_disks(&req.name, &req.disks)?;
    crate::ops::vm::mounts::check(&req.launch.mounts, &[])?;
    let mut out = launch(ctx, request(&req.launch, &req.name, disks)?)?;
    match super::mounts::after_start(ctx, &req.name, &req.launch.mounts, None) {
        Ok(m) => out.mounts = m,
        Err(e) => out.warnings.push(format!("mounts: {e}")),
    }
    if let Some(wait) = req.wait_cloud_init {
        let (waited, saw) = agent_then_cloud_init(ctx, &req.name, wait)?;
        report_cloud_init(&mut out.warnings, &mut out.cloud_init, waited, &saw);
    }
    Ok(out)
}
