//! The `instructions` of `initialize` and `server/discover`: all that a host like Claude Code
//! shows the model about this server before it searches the tools, so they say in one screen
//! what mcqemu is, its three journeys and the tool that starts each, templates, the roots rule,
//! progress, and the resources. `tests/it/mcp_protocol.rs` pins their length and that every tool
//! they name exists.

/// The longest the instructions may grow: one screen.
pub const MAX_LEN: usize = 1500;

/// The instructions, one line per topic.
pub const INSTRUCTIONS: &str = concat!(
    "mcqemu runs QEMU virtual machines on this host; they outlive it (list_vms).\n",
    "Three journeys, each started by one tool:\n",
    "1. Sandbox a distribution from the catalog (image_catalog): image_pull, image_prepare (adds \
     the guest agent), sandbox_vm; then guest_exec, guest_file_read, guest_file_write; \
     sandbox_destroy ends it.\n",
    "2. Drive a desktop or an installer: launch_vm with iso (a disk from image_create); look with \
     vm_screenshot, act with vm_click, vm_drag, vm_scroll, vm_type_text, vm_send_keys; after \
     each action vm_screen_wait returns the screen once it has settled.\n",
    "3. Boot a kernel and read its serial console: launch_vm with kernel, initrd and append \
     (console=ttyS0); then vm_serial_wait for a string, vm_serial_read for the tail.\n",
    "Many fast sandboxes of one kind: template_create once (a base image plus setup commands), \
     then sandbox_vm {\"template\": NAME} starts a clone in under a second. \
     sandbox_fork copies one; sandbox_suspend/sandbox_resume park one on disk. Idle ones \
     suspend, resumed on use; old ones stop (vm_lifetime)\n",
    "Roots: host paths must lie in the roots (the client's or --root folders); a refusal \
     names them.\n",
    "Long calls report progress (progressToken) and stop when cancelled; guest_exec \
     live=true streams output.\n",
    "Resources: mcqemu://vm/{name}/serial, mcqemu://vm/{name}/screen, .../metrics.\n",
    "A person may watch and take over (vm_view): ask them for passwords or CAPTCHAs.\n",
    "Failed calls are isError results saying what to do next; \
     _meta[\"mcqemu/error\"].kind names the kind (busy: retry).",
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_one_screen() {
        assert!(
            INSTRUCTIONS.len() <= MAX_LEN,
            "{} characters",
            INSTRUCTIONS.len()
        );
        assert!(!INSTRUCTIONS.contains("  "), "{INSTRUCTIONS}");
        assert_eq!(INSTRUCTIONS.lines().count(), 11);
    }
}
