//! Schemas several tools share (no tool is defined here): launch_vm's parameters and result,
//! which sandbox_vm, template_create and image_prepare take too, and the image tools' shapes.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::mcp::tool::{Args, ToolError};
use crate::ops::sandbox::request::SandboxRequest;
use crate::ops::vm::checks::checked_path;
use crate::ops::vm::checks::Access;
use crate::ops::vm::egress::{Rule, MAX_RULES};
use crate::ops::vm::launch::{ARCHES, DEFAULT_CPUS, DEFAULT_FIRMWARE, DEFAULT_MEMORY_MB};
use crate::ops::vm::launch_args::{egress_rules, LaunchArgs};
use crate::ops::vm::mounts::{MountSpec, MAX_MOUNTS};

/// A path parameter, checked against the roots for `access` and resolved (every symlink and
/// `..`): the tool must use the returned path from then on, never the text it was given.
pub fn path_arg(args: &Args, name: &str, access: Access) -> Result<PathBuf, ToolError> {
    Ok(checked_path(args.str(name)?, name, access)?)
}

/// sandbox_vm's parameters, typed.
pub fn sandbox_request(args: &Args) -> Result<SandboxRequest, ToolError> {
    let text = |k: &str| args.opt_str(k).map(|v| v.map(str::to_string));
    Ok(SandboxRequest {
        name: text("name")?,
        template: text("template")?,
        base_image: text("base_image")?,
        oci: text("oci")?,
        oci_digest: None,
        run: args.bool_or("run", false)?,
        expose: args.bool_or("expose", false)?,
        oci_command: Vec::new(),
        disk_size: text("disk_size")?,
        launch: launch_args(args)?,
        allow_network: allow_network_arg(args)?.0.unwrap_or(false),
        wait_agent_s: args.opt_f64("wait_agent_s")?,
        wait_cloud_init: args.bool_or("wait_cloud_init", false)?,
        wait_cloud_init_s: args.opt_f64("wait_cloud_init_s")?,
    })
}

/// launch_vm's parameters (which sandbox_vm, template_create and image_prepare share), typed.
pub fn launch_args(args: &Args) -> Result<LaunchArgs, ToolError> {
    let text = |k: &str| args.opt_str(k).map(|v| v.map(str::to_string));
    let (allow, egress) = allow_network_arg(args)?;
    Ok(LaunchArgs {
        arch: text("arch")?,
        machine: text("machine")?,
        accel: text("accel")?,
        memory_mb: args.opt_i64("memory_mb")?,
        cpus: args.opt_i64("cpus")?,
        firmware: text("firmware")?,
        iso: text("iso")?,
        kernel: text("kernel")?,
        initrd: text("initrd")?,
        append: text("append")?,
        extra_args: args.str_list("extra_args")?,
        no_net: args.bool_or("no_net", false)?,
        restrict_net: args.bool_or("restrict_net", false)? || allow == Some(false),
        port_forwards: args.opt_str_list("port_forwards")?,
        cloud_init: args.get("cloud_init").cloned(),
        egress,
        seed_files: Vec::new(),
        mounts: mounts_arg(args, "mounts")?,
        lifetime: lifetime_arg(args)?,
    })
}

/// Parameter `key`: host folders for the guest, as [`mounts_schema`] describes them.
pub fn mounts_arg(args: &Args, key: &str) -> Result<Vec<MountSpec>, ToolError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| {
            ToolError::new(format!(
                "{key}: {e}; give a list of {{\"host\": FOLDER, \"guest\": PATH, \"writable\": false}}"
            ))
        }),
    }
}

/// The `mounts` parameter of launch_vm, sandbox_vm, template_create and vm_mount's `add`.
pub fn mounts_schema() -> Value {
    json!({
        "type": "array",
        "maxItems": MAX_MOUNTS,
        "items": {
            "type": "object",
            "properties": {
                "host": {"type": "string", "minLength": 1,
                         "description": "A host folder inside the roots (~ allowed)."},
                "guest": {"type": "string", "minLength": 2,
                          "description": "Where the guest sees it, e.g. /src."},
                "writable": {"type": "boolean", "default": false,
                             "description": "Let the guest change it (read-only unless true)."}
            },
            "required": ["host", "guest"],
            "additionalProperties": false
        },
        "description": "Host folders mounted live into the guest (a FUSE file server on the \
            host, over a virtio port: the guest needs fuse.ko only). Read-only unless \
            writable; the guest never reaches outside the folder; files it creates are the \
            host user's, never setuid or devices. A host change shows in the guest within a \
            second; a guest write is on the host when the call that made it returns. A guest \
            running mcqemu-agent mounts them as it boots; with qemu-ga, sandbox_vm mounts them \
            once the agent answers (launch_vm: in the background, or call vm_mount {name}). \
            Forks, suspends and templates refuse a VM with mounts (vm_mount remove first)."
    })
}

/// `allow_network`: true, false, or a list of egress rules, parsed here so that a malformed
/// rule is refused before anything starts. A list (even empty) keeps the network restricted;
/// a non-empty one adds the VM's egress proxy.
pub fn allow_network_arg(args: &Args) -> Result<(Option<bool>, Vec<Rule>), ToolError> {
    match args.get("allow_network") {
        None => Ok((None, Vec::new())),
        Some(Value::Bool(b)) => Ok((Some(*b), Vec::new())),
        Some(Value::Array(items)) => {
            let list = items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| ToolError::new("allow_network rules must be strings"))?;
            Ok((Some(false), egress_rules(&list)?))
        }
        Some(_) => Err(ToolError::new(
            "allow_network must be true, false, or a list of rules (\"host\", \"host:port\", \
             \"*.domain\")",
        )),
    }
}

/// The `allow_network` parameter of sandbox_vm and launch_vm.
pub fn allow_network_schema(default: bool) -> Value {
    json!({
        "anyOf": [
            {"type": "boolean"},
            {"type": "array", "items": {"type": "string"},
             "maxItems": MAX_RULES}
        ],
        "default": default,
        "description": "Guest-initiated network: true (all), false (none; port forwards still \
            work), or a list of rules: \"host\", \"host:port\", \"*.domain\" (ports 80 and \
            443 unless given). With rules the guest reaches only an HTTP proxy (vm_info's \
            egress_proxy, http://10.0.2.2:3128; plain HTTP by absolute URL, HTTPS by CONNECT) \
            that lets through the names the rules allow and answers 403 to the rest; an IP \
            address passes only a rule that is that address. guest_exec and cloud_init seeds \
            get http_proxy/https_proxy set."
    })
}

/// The `memory_mb` parameter of launch_vm and sandbox_vm.
pub fn memory_schema() -> Value {
    json!({"type": "integer", "minimum": 16, "maximum": 1048576, "default": DEFAULT_MEMORY_MB})
}

/// The `cpus` parameter of launch_vm and sandbox_vm.
pub fn cpus_schema() -> Value {
    json!({"type": "integer", "minimum": 1, "maximum": 256,
           "description": format!("vCPUs; default {DEFAULT_CPUS}, or 1 on a one-CPU host.")})
}

/// The guest architecture (default: the host's, when QEMU emulates it; else x86_64).
pub fn arch_schema() -> Value {
    json!({
        "type": "string", "enum": ARCHES.iter().map(|a| a.0).collect::<Vec<_>>(),
        "description": format!(
            "Guest architecture; default the host's ({}).",
            crate::ops::vm::launch::default_arch()
        )
    })
}

/// How the guest boots.
pub fn firmware_schema() -> Value {
    json!({
        "type": "string", "enum": ["bios", "uefi"],
        "description": format!(
            "How the guest boots: bios (x86 SeaBIOS; on aarch64/riscv64 only with kernel) or \
             uefi. Default {DEFAULT_FIRMWARE} on x86, uefi on aarch64 and riscv64 (their virt \
             board has no BIOS) unless kernel is given."
        )
    })
}

/// launch_vm's parameters.
pub fn launch_props() -> Value {
    json!({
        "name": {
            "type": "string", "minLength": 1, "maxLength": 48,
            "description": "VM name: ^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$."
        },
        "arch": arch_schema(),
        "disks": {
            "type": "array",
            "items": {"type": "string"},
            "default": [],
            "description": "Disk image paths; formats are probed."
        },
        "iso": {
            "type": "string",
            "description": "Installer ISO attached as a CD-ROM (boots first)."
        },
        "memory_mb": memory_schema(),
        "cpus": cpus_schema(),
        "machine": {
            "type": "string",
            "description": "Machine type; default q35 on x86, virt on aarch64/riscv64."
        },
        "firmware": firmware_schema(),
        "port_forwards": {
            "type": "array",
            "items": {"type": "string"},
            "default": [],
            "description": "TCP forwards: \"HOST:GUEST\", \"auto:GUEST\", \"GUEST\", or \
                            \"ADDR:HOST:GUEST\". Host ports listen on 127.0.0.1 unless ADDR says \
                            otherwise."
        },
        "no_net": {"type": "boolean", "default": false, "description": "No network card at all."},
        "allow_network": allow_network_schema(true),
        "restrict_net": {
            "type": "boolean", "default": false,
            "description": "Block guest-initiated traffic (port forwards still work)."
        },
        "extra_args": {
            "type": "array",
            "items": {"type": "string"},
            "default": [],
            "description": "OPERATOR-ONLY: extra QEMU arguments. Options reaching host files, \
                            devices or processes, or mcqemu's own control channels, are refused."
        },
        "accel": {
            "type": "string", "enum": ["auto", "kvm", "tcg"], "default": "auto",
            "description": "auto picks KVM only where it can really run guests; default from \
                            MCQEMU_ACCEL."
        },
        "kernel": {
            "type": "string",
            "description": "Direct kernel boot: kernel image."
        },
        "initrd": {
            "type": "string",
            "description": "Direct kernel boot: initial ramdisk."
        },
        "append": {
            "type": "string",
            "description": "Direct kernel boot: kernel command line."
        },
        "cloud_init": cloud_init_schema(),
        "mounts": mounts_schema()
    })
}

/// What counts as a VM's activity, for the lifetime parameters' descriptions.
pub const ACTIVITY: &str = "Activity: a tool call that names the VM and works on it (guest_*, \
    vm_* but vm_info, pause/resume, sandbox_fork), an open live view or a person's hold, data \
    through its port forwards or egress proxy, a background process from guest_exec still \
    running. Enforced by mcqemu's watcher process, with or without a server running.";

/// The lifetime parameters: `ttl_s`, `idle_s`, `on_idle`, `on_ttl`, with `defaults` (the
/// kind's) in their descriptions.
pub fn lifetime_props(props: &mut Value, defaults: &str, actions: &[&str]) {
    props["ttl_s"] = json!({
        "type": "integer", "minimum": 0, "maximum": crate::ops::vm::lifetime::MAX_S,
        "description": format!("Seconds until the VM ends (then on_ttl); 0: no deadline. {defaults}")
    });
    props["idle_s"] = json!({
        "type": "integer", "minimum": 0, "maximum": crate::ops::vm::lifetime::MAX_S,
        "description": format!("Seconds without activity before the VM ends (then on_idle); \
            0: never. {ACTIVITY}")
    });
    props["on_idle"] = json!({
        "type": "string", "enum": actions,
        "description": "What idleness does: stop (QEMU ends, record and disk stay), suspend \
            (saved to disk; the next tool naming it resumes it, in about a clone's ready \
            time), destroy (gone)."
    });
    props["on_ttl"] = json!({
        "type": "string", "enum": actions,
        "description": "What the deadline does (same actions as on_idle)."
    });
}

/// The lifetime parameters as given (each None: the kind's default).
pub fn lifetime_arg(args: &Args) -> Result<crate::ops::vm::lifetime::Asked, ToolError> {
    let u = |k: &str| -> Result<Option<u64>, ToolError> {
        Ok(args.opt_i64(k)?.map(|v| v.max(0) as u64))
    };
    Ok(crate::ops::vm::lifetime::Asked {
        ttl_s: u("ttl_s")?,
        idle_s: u("idle_s")?,
        on_idle: args.opt_str("on_idle")?.map(str::to_string),
        on_ttl: args.opt_str("on_ttl")?.map(str::to_string),
    })
}

/// A lifetime's shape in results.
pub fn lifetime_out() -> Value {
    json!({"type": ["object", "null"], "description": "When it ends by itself: ttl_s, deadline, \
        expires_in_s, on_ttl, idle_s, on_idle, idle_for_s, idle_left_s, last_activity(_by), \
        busy (what keeps it from idling)."})
}

/// The `cloud_init` parameter of launch_vm and sandbox_vm.
pub fn cloud_init_schema() -> Value {
    json!({
        "type": "object",
        "description": "cloud-init configuration, written as a NoCloud seed (a CD-ROM labelled \
            cidata, with a fresh instance-id at every launch). Fields: hostname, users \
            [{name, ssh_authorized_keys, sudo, shell, groups, lock_passwd}], \
            ssh_authorized_keys (for the image's default user), packages, runcmd (strings or \
            argv lists), write_files [{path, content, encoding, permissions, owner}], \
            network_config; or user_data, a raw string passed verbatim instead of all but \
            network_config."
    })
}

/// launch_vm's result.
pub fn launch_out() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "status": {"type": "string"},
            "pid": {"type": ["integer", "null"]},
            "accel": {"type": "string"},
            "arch": {"type": "string"},
            "machine": {"type": "string"},
            "qemu_version": {"type": "string"},
            "port_forwards": {"type": "array", "items": {"type": "object"}},
            "qmp_socket": {"type": "string"},
            "qga_socket": {"type": "string"},
            "serial_log": {"type": "string"},
            "warnings": {"type": "array", "items": {"type": "string"}},
            "sandbox": {"type": "object"},
            "cloud_init": {"type": "object"}
        },
        "required": ["name", "status", "accel", "qmp_socket"]
    })
}

/// sandbox_vm's parameters (template_create takes them too).
pub fn sandbox_props() -> Value {
    let mut props = json!({
        "base_image": {
            "type": "string", "minLength": 1,
            "description": "Base disk image; left untouched. Give this, oci or template."
        },
        "oci": {
            "type": "string", "minLength": 1,
            "description": "A container image as the sandbox's root instead of base_image: \
                python:3.12-slim, ghcr.io/org/img:tag, REG/NAME@sha256:..., \
                oci:DIR[:tag] (an OCI layout), docker-archive:FILE (docker save). Pulled and \
                built once (image_pull), booted with \
                mcqemu's kernel (or kernel) and mcqemu-agent as PID 1; guest_exec runs with \
                the image's Env, WorkingDir and User."
        },
        "run": {
            "type": "boolean", "default": false,
            "description": "With oci: start the image's Entrypoint and Cmd in the background \
                once the agent answers; image_process.handle is for guest_exec_status and \
                guest_exec_kill."
        },
        "expose": {
            "type": "boolean", "default": false,
            "description": "With oci: forward an automatic host port to each TCP port the \
                image's ExposedPorts names (besides port_forwards, or auto:22)."
        },
        "template": {
            "type": "string",
            "description": "Start a clone of this template (template_create) instead of \
                booting: ready in about 0.1 s, or at once from its warm pool \
                (template_pool). Its clock is set just after; the next guest call waits \
                for that. The template fixes memory, cpus, kernel and disks."
        },
        "name": {
            "type": "string",
            "description": "VM name; default the first free of sandbox, sandbox-2, ..."
        },
        "arch": arch_schema(),
        "memory_mb": memory_schema(),
        "cpus": cpus_schema(),
        "port_forwards": {
            "type": "array",
            "items": {"type": "string"},
            "description": "null means [\"auto:22\"]; [] means none."
        },
        "allow_network": allow_network_schema(false),
        "wait_agent_s": {"type": "number", "minimum": 0, "maximum": 3600, "default": 90},
        "kernel": {"type": "string"},
        "initrd": {"type": "string"},
        "append": {"type": "string"},
        "firmware": firmware_schema(),
        "disk_size": disk_size_schema(),
        "cloud_init": cloud_init_schema(),
        "mounts": mounts_schema(),
        "wait_cloud_init": {
            "type": "boolean", "default": false,
            "description": "Also wait, through the agent, until cloud-init has finished \
                (/var/lib/cloud/instance/boot-finished), and report its status."
        },
        "wait_cloud_init_s": {
            "type": "number", "minimum": 0, "maximum": 3600, "default": 600,
            "description": "How long to wait for cloud-init after the agent answers."
        }
    });
    lifetime_props(
        &mut props,
        "Default for a sandbox: 86400 (a day), then stop; idle_s 900, then suspend.",
        &["stop", "suspend", "destroy"],
    );
    props
}

/// `disk_size` of sandbox_vm, template_create and image_prepare.
pub fn disk_size_schema() -> Value {
    json!({
        "type": "string", "minLength": 1,
        "description": "The guest's disk size, e.g. \"20G\" (binary units): the overlay is made \
            this large and cloud-init grows the root file system to fill it. At least the base \
            image's size; absent: the base's size."
    })
}

// ---- the image tools' shared shapes

/// An image path parameter.
pub fn path_schema(desc: &str) -> Value {
    json!({"type": "string", "minLength": 1, "description": desc})
}

/// An image snapshot tag.
pub fn tag_schema() -> Value {
    json!({
        "type": "string", "minLength": 1, "maxLength": 64,
        "description": "Snapshot tag: 1-64 of A-Z a-z 0-9 _ . -, starting with a letter or digit."
    })
}

/// A result object with these properties, these required.
pub fn out_object(props: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": props, "required": required})
}

/// One internal snapshot of an image, as the image tools list it.
pub fn snapshot_item_schema() -> Value {
    out_object(
        json!({
            "id": {"type": "string"},
            "tag": {"type": "string"},
            "vm_state_size": {"type": "integer"},
            "date": {"type": "string"},
            "vm_clock": {"type": "string"}
        }),
        &["tag"],
    )
}

/// The `hold` parameter, shared with vm_click.
pub fn hold_param() -> Value {
    json!({
        "type": "array", "items": {"type": "string"}, "maxItems": crate::ops::screen::pointer::MAX_HOLD,
        "description": "Modifier keys held down from before the first button change to after \
            the last (shift-click, ctrl-drag): shift, ctrl, alt, altgr, win, or their _r keys."
    })
}

/// The `hold` argument, checked: modifiers only.
pub fn hold_arg(args: &Args) -> Result<Vec<&'static str>, ToolError> {
    let names = args.opt_str_list("hold")?.unwrap_or_default();
    Ok(crate::ops::screen::pointer::modifiers(&names)?)
}

/// The `scale` parameter of the pointer tools.
pub fn scale_param() -> Value {
    json!({
        "type": "number", "minimum": MIN_SCALE, "maximum": 1,
        "description": "The scale of the vm_screenshot the coordinates were read from (as it \
            returned it): they are then pixels of that image, mapped to the screen. Default 1: \
            screen pixels."
    })
}

/// Smallest `scale` accepted (below any vm_screenshot gives: a 32 px image of a 16384 px screen
/// is 0.0019).
const MIN_SCALE: f64 = 0.0001;

/// The `scale` argument: 1 when absent.
pub fn scale_arg(args: &Args) -> Result<f64, ToolError> {
    match args.opt_f64("scale")? {
        None => Ok(1.0),
        Some(s) if (MIN_SCALE..=1.0).contains(&s) => Ok(s),
        Some(s) => Err(ToolError::new(format!(
            "scale must be between {MIN_SCALE} and 1 (a screenshot's size divided by the \
             screen's, as vm_screenshot returns it), not {s}; nothing was sent"
        ))),
    }
}
