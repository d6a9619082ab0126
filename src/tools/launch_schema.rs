//! The parameters and result of launch_vm, and the parameters sandbox_vm shares with it.

use serde_json::{json, Value};

use super::launch::{ARCHES, DEFAULT_ARCH, DEFAULT_CPUS, DEFAULT_FIRMWARE, DEFAULT_MEMORY_MB};

/// The `memory_mb` parameter of launch_vm and sandbox_vm.
pub fn memory_schema() -> Value {
    json!({"type": "integer", "minimum": 16, "maximum": 1048576, "default": DEFAULT_MEMORY_MB})
}

/// The `cpus` parameter of launch_vm and sandbox_vm.
pub fn cpus_schema() -> Value {
    json!({"type": "integer", "minimum": 1, "maximum": 256,
           "description": format!("vCPUs; default {DEFAULT_CPUS}, or 1 on a one-CPU host.")})
}

/// launch_vm's parameters.
pub fn launch_props() -> Value {
    json!({
        "name": {
            "type": "string", "minLength": 1, "maxLength": 48,
            "description": "VM name: ^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$."
        },
        "arch": {
            "type": "string", "enum": ARCHES.iter().map(|a| a.0).collect::<Vec<_>>(),
            "default": DEFAULT_ARCH
        },
        "disks": {
            "type": "array",
            "items": {"type": "string"},
            "default": [],
            "description": "Disk image paths; formats are probed."
        },
        "iso": {
            "type": ["string", "null"], "default": null,
            "description": "Installer ISO attached as a CD-ROM (boots first)."
        },
        "memory_mb": memory_schema(),
        "cpus": cpus_schema(),
        "machine": {
            "type": ["string", "null"], "default": null,
            "description": "Machine type; default q35 on x86, virt on aarch64/riscv64."
        },
        "firmware": {"type": "string", "enum": ["bios", "uefi"], "default": DEFAULT_FIRMWARE},
        "port_forwards": {
            "type": "array",
            "items": {"type": "string"},
            "default": [],
            "description": "TCP forwards: \"HOST:GUEST\", \"auto:GUEST\", \"GUEST\", or \
                            \"ADDR:HOST:GUEST\". Host ports listen on 127.0.0.1 unless ADDR says \
                            otherwise."
        },
        "no_net": {"type": "boolean", "default": false, "description": "No network card at all."},
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
            "type": ["string", "null"], "default": null,
            "description": "Direct kernel boot: kernel image."
        },
        "initrd": {
            "type": ["string", "null"], "default": null,
            "description": "Direct kernel boot: initial ramdisk."
        },
        "append": {
            "type": ["string", "null"], "default": null,
            "description": "Direct kernel boot: kernel command line."
        },
        "cloud_init": cloud_init_schema()
    })
}

/// The `cloud_init` parameter of launch_vm and sandbox_vm.
pub fn cloud_init_schema() -> Value {
    json!({
        "type": ["object", "null"], "default": null,
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
