//! Named groups of tools, so that a client pays for the tool definitions it needs (every
//! session of every agent reads the whole tool list before its first call): `mcqemu --tools
//! sandbox,guest` (or `MCQEMU_TOOLS`) serves those groups only; the default is every tool
//! under the seed's names. The instructions keep only the lines whose tools are served.

use crate::kind::Failed;
use crate::mcp::tool::ToolDef;

/// A group: its name, what it is for, and its tools.
pub struct Group {
    /// The name `--tools` takes.
    pub name: &'static str,
    /// What it is for, for `mcqemu tools --groups`.
    pub about: &'static str,
    /// Its tools' names.
    pub tools: &'static [&'static str],
}

/// The groups; a tool may be in several.
pub const GROUPS: &[Group] = &[
    Group {
        name: "sandbox",
        about: "disposable VMs from images, container images and templates; forks, sleep and \
            travel between hosts",
        tools: &[
            "sandbox_vm",
            "sandbox_destroy",
            "sandbox_fork",
            "sandbox_suspend",
            "sandbox_resume",
            "template_create",
            "template_list",
            "template_pool",
            "template_delete",
            "template_push",
            "template_pull",
            "sandbox_push",
            "list_vms",
            "vm_info",
            "vm_lifetime",
            "vm_mount",
            "vm_port_forward",
        ],
    },
    Group {
        name: "guest",
        about: "programs and files inside a guest, through its agent",
        tools: &[
            "guest_ping",
            "guest_info",
            "guest_exec",
            "guest_exec_status",
            "guest_exec_kill",
            "guest_file_read",
            "guest_file_write",
            "guest_copy_in",
            "guest_copy_out",
            "guest_list_dir",
        ],
    },
    Group {
        name: "screen",
        about: "look at a VM's screen and drive its keyboard and pointer; a person's live view",
        tools: &[
            "vm_screenshot",
            "vm_screen_wait",
            "vm_view",
            "vm_takeover",
            "vm_view_frame",
            "vm_view_input",
            "vm_send_keys",
            "vm_type_text",
            "vm_click",
            "vm_mouse_move",
            "vm_drag",
            "vm_scroll",
        ],
    },
    Group {
        name: "images",
        about: "disk images: create, inspect, convert, snapshot, download, pull, prepare",
        tools: &[
            "image_create",
            "image_info",
            "image_convert",
            "image_resize",
            "image_snapshot_list",
            "image_snapshot_create",
            "image_snapshot_apply",
            "image_snapshot_delete",
            "image_download",
            "image_pull",
            "image_catalog",
            "image_prepare",
        ],
    },
    Group {
        name: "vm",
        about: "VMs launched by hand: launch, stop, pause, attach, snapshots, the serial console",
        tools: &[
            "launch_vm",
            "stop_vm",
            "pause_vm",
            "resume_vm",
            "attach_vm",
            "forget_vm",
            "list_vms",
            "vm_info",
            "vm_lifetime",
            "vm_port_forward",
            "vm_mount",
            "vm_snapshot_create",
            "vm_snapshot_restore",
            "vm_snapshot_delete",
            "vm_snapshot_list",
            "vm_serial_read",
            "vm_serial_write",
            "vm_serial_wait",
        ],
    },
];

/// The tools `spec` names (`all`, or group names separated by commas), in `all`'s order, with
/// the instructions that fit them; an unknown group is an error naming the known ones.
pub fn select(
    all: &'static [ToolDef],
    instructions: &'static str,
    spec: &str,
) -> Result<(&'static [ToolDef], &'static str), Failed> {
    let names: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if names.is_empty() || names.contains(&"all") {
        return Ok((all, instructions));
    }
    let mut wanted: Vec<&str> = Vec::new();
    for n in &names {
        let g = GROUPS.iter().find(|g| g.name == *n).ok_or_else(|| {
            Failed::invalid(format!(
                "no tool group {n:?}; the groups are {} and all",
                GROUPS.iter().map(|g| g.name).collect::<Vec<_>>().join(", ")
            ))
        })?;
        wanted.extend(g.tools);
    }
    let tools: Vec<ToolDef> = all
        .iter()
        .filter(|t| wanted.contains(&t.name))
        .cloned()
        .collect();
    let served: Vec<&str> = tools.iter().map(|t| t.name).collect();
    let text = fitting(instructions, all, &served, &names);
    Ok((
        Box::leak(tools.into_boxed_slice()),
        Box::leak(text.into_boxed_str()),
    ))
}

/// `instructions` without the lines that name a tool of `all` that is not `served`, and a
/// last line saying which groups are served.
fn fitting(instructions: &str, all: &[ToolDef], served: &[&str], groups: &[&str]) -> String {
    let absent: Vec<&str> = all
        .iter()
        .map(|t| t.name)
        .filter(|n| !served.contains(n))
        .collect();
    let names_absent = |line: &str| {
        line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .any(|w| absent.contains(&w))
    };
    let mut out: Vec<&str> = instructions.lines().filter(|l| !names_absent(l)).collect();
    let last = format!(
        "This server serves the tool groups {} only (mcqemu --tools all serves every tool).",
        groups.join(", ")
    );
    out.push(&last);
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_name_only_real_tools_and_cover_them_all() {
        let all = crate::tools::ALL;
        for g in GROUPS {
            for t in g.tools {
                assert!(all.iter().any(|d| d.name == *t), "{}: no tool {t}", g.name);
            }
        }
        for d in all {
            assert!(
                GROUPS.iter().any(|g| g.tools.contains(&d.name)),
                "{} is in no group",
                d.name
            );
        }
        let text = crate::mcp::protocol::INSTRUCTIONS;
        let (tools, said) = select(all, text, "sandbox, guest").unwrap();
        assert!(tools.iter().any(|t| t.name == "sandbox_vm"));
        assert!(!tools
            .iter()
            .any(|t| t.name == "launch_vm" || t.name == "vm_click"));
        assert!(said.contains("sandbox_vm {"), "{said}");
        assert!(!said.contains("launch_vm"), "{said}");
        assert!(said.ends_with("sandbox, guest only (mcqemu --tools all serves every tool)."));
        let (every, same) = select(all, text, "all").unwrap();
        assert_eq!((every.len(), same), (all.len(), text));
        let Err(e) = select(all, text, "sandbox,nope") else {
            panic!("an unknown group was taken");
        };
        assert!(
            e.msg.contains("\"nope\"") && e.msg.contains("images"),
            "{e}"
        );
    }
}
