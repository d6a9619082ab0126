//! The `instructions` of `initialize` and `server/discover`: all that a host like Claude Code
//! shows the model about this server before it searches the tools, so they say in one screen
//! what mcqemu is, its journeys and the tool that starts each (the fast one first: a container
//! image with the user's folder mounted), templates, the roots rule, progress, and the
//! resources. `tests/it/mcp_protocol.rs` pins their length and that every tool
//! they name exists.

/// The longest the instructions may grow: one screen.
pub const MAX_LEN: usize = 1500;

/// The instructions, one line per topic.
pub const INSTRUCTIONS: &str = concat!(
    "mcqemu runs QEMU virtual machines on this host; they outlive it (list_vms).\n",
    "Four journeys, each started by one tool:\n",
    "1. Run code in a sandbox (seconds): sandbox_vm {\"oci\": \"python:3.12-slim\", \"mounts\": \
     [{\"host\": \"~/proj\", \"guest\": \"/src\", \"writable\": true}]} boots a container \
     image with the user's folder inside; then guest_exec, guest_file_read, \
     guest_file_write; sandbox_destroy ends it. Many of one kind: template_create once, then \
     sandbox_vm {\"template\": NAME} clones in under a second; sandbox_fork copies one.\n",
    "2. A full distribution (minutes): image_catalog, image_pull, image_prepare (adds \
     the guest agent), then sandbox_vm on the prepared image.\n",
    "3. Drive a desktop or an installer: launch_vm with iso; look with vm_screenshot, act with \
     vm_click, vm_type_text, vm_send_keys; vm_screen_wait returns the settled screen.\n",
    "4. Boot a kernel and read its serial console: launch_vm with kernel, initrd and append \
     (console=ttyS0); then vm_serial_wait, vm_serial_read.\n",
    "Sandboxes end by themselves: idle ones suspend, resumed on use; old ones stop \
     (vm_lifetime).\n",
    "Host paths must lie in the roots (the client's or --root folders).\n",
    "Long calls report progress and stop when cancelled; guest_exec live=true streams output.\n",
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
        assert_eq!(INSTRUCTIONS.lines().count(), 12);
        // Agents take the first path they are shown: the seconds-fast one leads.
        let oci = INSTRUCTIONS.find("\"oci\"").unwrap();
        assert!(oci < INSTRUCTIONS.find("image_prepare").unwrap());
        assert!(INSTRUCTIONS.contains("\"mounts\""));
    }
}
