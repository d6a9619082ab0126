//! What every tool call does besides its own work, through [`crate::mcp::call::Hooks`]: a call
//! that names a VM and acts on it is that VM's activity from its start to its end (its
//! activity file is touched every second meanwhile: a 20-minute guest_exec keeps a VM with a
//! 15-minute idle limit), and brings it back first when it was suspended for idleness; a call
//! that ends a VM says so before it does (its end is recorded as asked, by that tool).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

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

/// The VMs with calls in progress, and how many each.
fn in_call() -> &'static Mutex<HashMap<String, usize>> {
    static IN: OnceLock<Mutex<HashMap<String, usize>>> = OnceLock::new();
    IN.get_or_init(|| {
        // One thread touches the VMs with calls in progress every second, for this process's
        // life (a process that dies stops touching: its VMs' idle clocks run again).
        let _ = std::thread::Builder::new()
            .name("activity".into())
            .spawn(|| loop {
                std::thread::sleep(Duration::from_secs(1));
                let names: Vec<String> = in_call()
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .keys()
                    .cloned()
                    .collect();
                for n in names {
                    lifetime::touch(&n);
                }
            });
        Mutex::new(HashMap::new())
    })
}

fn before(tool: &str, args: &Args, ctx: &ToolCtx) -> Result<(), ToolError> {
    let Some(name) = named(args) else {
        return Ok(());
    };
    if is_activity(tool) {
        crate::ops::sandbox::suspend::wake_if_idle(ctx, name)?;
        lifetime::touch(name);
        *in_call()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name.to_string())
            .or_insert(0) += 1;
    } else if ENDING.contains(&tool) {
        ends::intend(name, ends::end(ends::ASKED, Some(tool), ""));
    }
    Ok(())
}

fn after(tool: &str, args: &Args, ok: bool) {
    let Some(name) = named(args) else { return };
    if is_activity(tool) {
        let mut calls = in_call().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = calls.get_mut(name) {
            *n -= 1;
            if *n == 0 {
                calls.remove(name);
            }
        }
        drop(calls);
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
