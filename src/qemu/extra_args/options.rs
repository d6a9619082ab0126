//! The QEMU options and option keys the `extra_args` policy knows, by what their values are:
//! refused outright, drives, taking no value, host files read or written, free text, host
//! programs, character devices.

/// Options that are refused outright in `extra_args`, with the reason.
pub(super) const DENIED: &[(&str, &str)] = &[
    ("virtfs", "host filesystem passthrough"),
    ("fsdev", "host filesystem passthrough"),
    ("runas", "changes the user QEMU runs as"),
    ("run-with", "changes QEMU's user or root"),
    ("chroot", "changes QEMU's root"),
    ("monitor", "mcqemu owns the monitor"),
    ("qmp", "mcqemu owns the QMP channel"),
    ("qmp-pretty", "mcqemu owns the QMP channel"),
    ("mon", "mcqemu owns the monitor"),
    ("pidfile", "mcqemu owns the pidfile"),
    ("daemonize", "mcqemu daemonizes QEMU itself"),
    ("serial", "mcqemu owns the serial console"),
    (
        "readconfig",
        "a config file can carry any option past this policy",
    ),
    (
        "set",
        "rewrites options after this policy checked them, mcqemu's own channels included",
    ),
    ("plugin", "loads host code into QEMU"),
    (
        "sandbox",
        "mcqemu runs every QEMU in its seccomp sandbox, which extra_args cannot change",
    ),
    ("hda", "host block devices"),
    ("hdb", "host block devices"),
    ("hdc", "host block devices"),
    ("hdd", "host block devices"),
    ("cdrom", "host block devices"),
    ("fda", "host block devices"),
    ("fdb", "host block devices"),
    ("pflash", "host block devices"),
    ("mtdblock", "host block devices"),
    ("sd", "host block devices"),
];

/// Options whose value names a drive; refused when it reaches a host device.
pub(super) const DRIVE_OPTS: &[&str] = &["drive", "blockdev"];

/// Options taking no value (the rest take one): every such option of QEMU 7.2's system
/// emulators (`qemu-system-* -help`), so that what follows one is read as QEMU reads it.
pub(super) const FLAG_OPTS: &[&str] = &[
    "daemonize",
    "S",
    "snapshot",
    "no-reboot",
    "no-shutdown",
    "nographic",
    "enable-kvm",
    "no-user-config",
    "nodefaults",
    "full-screen",
    "no-hpet",
    "no-acpi",
    "s",
    "h",
    "help",
    "version",
    "audio-help",
    "mem-prealloc",
    "usb",
    "portrait",
    "win2k-hack",
    "no-fd-bootchk",
    "singlestep",
    "xen-attach",
    "xen-domid-restrict",
    "only-migratable",
    "enable-sync-profile",
    "async-teardown",
    "preconfig",
    "semihosting",
    "old-param",
];

/// Options whose whole value is a host file or folder QEMU reads.
pub(super) const READ_FILE_OPTS: &[&str] = &["kernel", "initrd", "dtb", "bios", "option-rom", "L"];

/// Options whose whole value is a host file QEMU writes (or maps for writing).
pub(super) const WRITE_FILE_OPTS: &[&str] = &["D", "mem-path"];

/// Options whose value is free text for the guest, where a `/` names no host file.
pub(super) const TEXT_OPTS: &[&str] = &["append", "name", "k", "boot", "uuid"];

/// Keys whose value is a host path (`file=`, `path=`, ...): written unless [`reads_only`].
pub(super) const FILE_KEYS: &[&str] = &[
    "file",
    "filename",
    "path",
    "mem-path",
    "logfile",
    "romfile",
    "dtb",
    "data",
    "dir",
    "sock",
    "addr.path",
    "x509-dir",
    "tftp",
];

/// Keys whose value makes QEMU start a host program.
pub(super) const HOST_PROGRAM_KEYS: &[&str] = &["smb"];

/// Keys that name guest-side or textual things even when they contain a `/`.
pub(super) const TEXT_KEYS: &[&str] = &[
    "name",
    "id",
    "serial",
    "mount_tag",
    "vendor",
    "product",
    "version",
];

/// Options whose value is a character-device spec, where `pipe:` talks to host FIFOs.
pub(super) const CHARDEV_SPEC_OPTS: &[&str] = &["parallel", "debugcon", "gdb"];
