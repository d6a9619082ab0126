//! What every tool call does besides its own work, through [`crate::mcp::call::Hooks`]: a call
//! that names a VM and acts on it is that VM's activity (its idle clock starts again), and
//! brings it back first when it was suspended for idleness; a call that ends a VM says so
//! before it does (its end is recorded as asked, by that tool).

use crate::mcp::call::Hooks;
use crate::mcp::tool::{Args, ToolCtx, ToolError};
use crate::ops::vm::{ends, lifetime};

/// The hooks the front ends install.
pub const HOOKS: Hooks = Hooks { before, after };

/// Tools that end the VM they name.
const ENDING: [&str; 3] = ["stop_vm", "sandbox_suspend", "sandbox_destroy"];

/// True for tools whose call is activity on the VM they name: everything that works on a
/// running VM (its screen, input, serial console, guest, forwards, mounts, snapshots, forks),
/// but not looking at it (vm_info, list_vms), changing its lifetime, or ending it.
pub fn is_activity(tool: &str) -> bool {
    let reads_only = matches!(tool, "vm_info" | "vm_lifetime" | "vm_snapshot_list");
    (tool.starts_with("vm_") || tool.starts_with("guest_") || tool == "sandbox_fork") && !reads_only
        || matches!(tool, "pause_vm" | "resume_vm")
}

fn named(args: &Args) -> Option<&str> {
    args.get("name")?.as_str()
}

fn before(tool: &str, args: &Args, ctx: &ToolCtx) -> Result<(), ToolError> {
    let Some(name) = named(args) else {
        return Ok(());
    };
    if is_activity(tool) {
        crate::ops::sandbox::suspend::wake_if_idle(ctx, name)?;
        lifetime::touch(name);
    } else if ENDING.contains(&tool) {
        ends::intend(name, ends::end(ends::ASKED, Some(tool), ""));
    }
    Ok(())
}

fn after(tool: &str, args: &Args, ok: bool) {
    let Some(name) = named(args) else { return };
    if is_activity(tool) {
        // A long call (a wait, a copy) is activity until its end.
        lifetime::touch(name);
    } else if ENDING.contains(&tool) && !ok {
        ends::withdraw(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activity_is_working_on_a_vm_not_looking_at_it() {
        for t in [
            "guest_exec",
            "vm_screenshot",
            "vm_view_frame",
            "sandbox_fork",
            "pause_vm",
        ] {
            assert!(is_activity(t), "{t}");
        }
        for t in [
            "vm_info",
            "list_vms",
            "vm_lifetime",
            "stop_vm",
            "sandbox_destroy",
            "launch_vm",
        ] {
            assert!(!is_activity(t), "{t}");
        }
        // Every tool named here exists.
        let names: Vec<&str> = crate::tools::ALL.iter().map(|t| t.name).collect();
        for t in ENDING {
            assert!(names.contains(&t), "{t}");
        }
    }
}
