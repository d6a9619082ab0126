//! The QEMU command line: one escaper for every interpolated value, and the argv `launch_vm`
//! runs. What `extra_args` may add is judged in [`super::extra_args`]; port forwards are
//! parsed in [`super::forwards`].

use std::path::PathBuf;

use crate::state::config::{Disk, MemoryFile, SeedBus, Uefi, VmConfig};

/// Escapes a value for QEMU's option syntax (`key=value,key=value`): commas are doubled, so a
/// file named `data,readonly=on.qcow2` stays one value.
pub fn qopt(value: &str) -> String {
    value.replace(',', ",,")
}

/// Splits a QEMU option string the way QEMU does: `,` separates, `,,` is a literal comma.
/// The reference the fuzzers check [`qopt`] against.
pub fn split_opts(s: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ',' {
            if chars.peek() == Some(&',') {
                chars.next();
                if let Some(last) = out.last_mut() {
                    last.push(',');
                }
            } else {
                out.push(String::new());
            }
        } else if let Some(last) = out.last_mut() {
            last.push(c);
        }
    }
    out
}

/// The name the guest sees the data channel's port by (`/sys/class/virtio-ports/*/name`).
pub const DATA_PORT: &str = "org.mcqemu.data.0";

/// The names the guest sees mount ports by: the prefix and the mount's number.
pub const MOUNT_PORT_PREFIX: &str = "org.mcqemu.fs.";
/// The mount whose port a VM with `mount_spare` has from the start.
pub const SPARE_MOUNT: u32 = 0;

/// The socket of mount `id`'s port, beside the agent's socket `qga_socket`.
pub fn mount_socket(qga_socket: &std::path::Path, id: u32) -> std::path::PathBuf {
    qga_socket.with_file_name(format!("fs{id}.sock"))
}

/// The data channel's socket: beside the agent's, so every way a VM gets its runtime folder
/// (a launch, a fork's copy, a resume, a clone) moves it along.
pub fn data_socket(qga_socket: &std::path::Path) -> PathBuf {
    qga_socket.with_file_name("data.sock")
}

fn p(path: &std::path::Path) -> String {
    qopt(&path.to_string_lossy())
}

/// True for the PC architectures: their machines have a BIOS, VGA, a PS/2 keyboard and the
/// ACPI vmgenid device; the others are virt boards.
pub fn x86(arch: &str) -> bool {
    arch == "x86_64" || arch == "i386"
}

/// QEMU's own seccomp sandbox, as libvirt sets it by default: a QEMU that a guest exploit takes
/// over cannot start programs, raise privileges, or change its resource limits.
pub const SECCOMP_POLICY: &str =
    "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";

/// The memory backend's id for templates and their clones.
pub const MEMORY_ID: &str = "mcq-ram";

/// Builds QEMU's argv (without the binary) for a spec.
pub fn build_argv(s: &VmConfig) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    machine_args(s, &mut a);
    channel_args(s, &mut a);
    display_args(s, &mut a);
    disk_args(s, &mut a);
    cdrom_args(s, &mut a);
    net_args(s, &mut a);
    boot_args(s, &mut a);
    a.extend(s.extra_args.iter().cloned());
    a
}

/// The VM's name, sandbox, machine (with its memory file), accelerator, CPU, memory and CPUs.
fn machine_args(s: &VmConfig, a: &mut Vec<String>) {
    let mut push = |parts: &[&str]| a.extend(parts.iter().map(|x| x.to_string()));
    push(&[
        "-name",
        &format!("guest={},process=mcqemu-{}", qopt(&s.name), qopt(&s.name)),
    ]);
    push(&["-sandbox", SECCOMP_POLICY]);
    let id = qopt(s.compute.memory_id.as_deref().unwrap_or(MEMORY_ID));
    match &s.compute.memory_file {
        Some(MemoryFile { path: file, shared }) => {
            push(&[
                "-object",
                &format!(
                    "memory-backend-file,id={id},size={}M,mem-path={},share={}",
                    s.compute.memory_mb,
                    p(file),
                    match (*shared, s.compute.memory_prealloc) {
                        (true, true) => "on,prealloc=on",
                        (true, false) => "on",
                        (false, _) => "off",
                    }
                ),
            ]);
            push(&[
                "-machine",
                &format!("{},memory-backend={id}", qopt(&s.machine.kind)),
            ]);
        }
        None => push(&["-machine", &qopt(&s.machine.kind)]),
    }
    push(&["-accel", s.machine.accel.name()]);
    if let Some(cpu) = &s.machine.cpu {
        push(&["-cpu", &qopt(cpu)]);
    }
    push(&[
        "-m",
        &s.compute.memory_mb.to_string(),
        "-smp",
        &s.compute.cpus.to_string(),
    ]);
}

/// No display; the pidfile, the silent audio backend and the host channels: QMP, the guest
/// agent's virtio-serial port, the serial console (logged), the tablet.
fn channel_args(s: &VmConfig, a: &mut Vec<String>) {
    let mut push = |parts: &[&str]| a.extend(parts.iter().map(|x| x.to_string()));
    push(&[
        "-display",
        "none",
        "-pidfile",
        &s.channels.pidfile.to_string_lossy(),
    ]);
    // A silent audio backend of our own: without one, QEMU probes the audio drivers at start
    // (10.0 loads its PulseAudio, ALSA, JACK, OSS, SDL and Spice modules, 67 more libraries):
    // 14 ms of a QEMU 10 start (45.6 -> 31.9 ms), 5 ms of 7.2's. No guest device changes, so
    // templates saved without it still load.
    push(&["-audiodev", "none,id=mcq-audio"]);
    push(&[
        "-qmp",
        &format!("unix:{},server=on,wait=off", p(&s.channels.qmp_socket)),
    ]);
    push(&[
        "-chardev",
        &format!(
            "socket,id=mcq-qga,path={},server=on,wait=off",
            p(&s.channels.qga_socket)
        ),
    ]);
    push(&["-device", "virtio-serial-pci,id=mcq-vser"]);
    push(&[
        "-device",
        "virtserialport,bus=mcq-vser.0,chardev=mcq-qga,name=org.qemu.guest_agent.0",
    ]);
    if s.channels.data_channel {
        let socket = data_socket(&s.channels.qga_socket);
        push(
            &port_args("mcq-data", &socket, DATA_PORT)
                .each_ref()
                .map(String::as_str),
        );
    }
    if s.channels.mount_spare {
        let socket = mount_socket(&s.channels.qga_socket, SPARE_MOUNT);
        let name = format!("{MOUNT_PORT_PREFIX}{SPARE_MOUNT}");
        let id = format!("mcq-fs{SPARE_MOUNT}");
        push(
            &port_args(&id, &socket, &name)
                .each_ref()
                .map(String::as_str),
        );
    }
    push(&[
        "-chardev",
        &format!(
            "socket,id=mcq-serial,path={},server=on,wait=off,logfile={},logappend=on",
            p(&s.channels.serial_socket),
            p(&s.channels.serial_log)
        ),
    ]);
    push(&["-serial", "chardev:mcq-serial"]);
    push(&["-device", "virtio-tablet-pci,id=mcq-tablet"]);
}

/// A virtio-serial port `name` on the bus, behind a listening socket at `socket`; `id` names
/// both the chardev and the port.
fn port_args(id: &str, socket: &std::path::Path, name: &str) -> [String; 4] {
    [
        "-chardev".to_string(),
        format!("socket,id={id},path={},server=on,wait=off", p(socket)),
        "-device".to_string(),
        format!("virtserialport,bus=mcq-vser.0,chardev={id},name={name},id={id}"),
    ]
}

/// The virt boards' GPU and keyboard (the PC machines have VGA and PS/2 of their own).
fn display_args(s: &VmConfig, a: &mut Vec<String>) {
    let mut push = |parts: &[&str]| a.extend(parts.iter().map(|x| x.to_string()));
    let pc = x86(&s.machine.arch);
    if !pc {
        // The virt boards have no VGA and no PS/2: a GPU that edk2 and Linux both draw on (so
        // vm_screenshot works), and a virtio keyboard. (QEMU's USB keyboard was measured to
        // drop most events at the pace vm_type_text sends them, which PS/2 and virtio keep.)
        push(&["-device", "virtio-gpu-pci,id=mcq-gpu"]);
        push(&["-device", "virtio-keyboard-pci,id=mcq-kbd"]);
    }
}

/// The UEFI flash pair and the virtio disks.
fn disk_args(s: &VmConfig, a: &mut Vec<String>) {
    let mut push = |parts: &[&str]| a.extend(parts.iter().map(|x| x.to_string()));
    if let Some(Uefi { code, vars, format }) = &s.boot.uefi {
        let format = qopt(format);
        push(&[
            "-drive",
            &format!(
                "if=pflash,format={format},unit=0,readonly=on,file={}",
                p(code)
            ),
        ]);
        push(&[
            "-drive",
            &format!("if=pflash,format={format},unit=1,file={}", p(vars)),
        ]);
    }
    for (
        i,
        Disk {
            path: disk,
            format: fmt,
        },
    ) in s.disks.iter().enumerate()
    {
        push(&[
            "-drive",
            &format!(
                "file={},format={},if=virtio,id=mcq-disk{i}",
                p(disk),
                qopt(fmt)
            ),
        ]);
    }
    // After the disks, so the root stays /dev/vda.
    if let Some(m) = &s.devices.modules {
        push(&[
            "-drive",
            &format!(
                "file={},format=raw,if=virtio,readonly=on,id=mcq-modules",
                p(m)
            ),
        ]);
    }
}

/// The install ISO and the cloud-init seed, with the virtio-scsi controller either needs.
fn cdrom_args(s: &VmConfig, a: &mut Vec<String>) {
    let mut push = |parts: &[&str]| a.extend(parts.iter().map(|x| x.to_string()));
    let pc = x86(&s.machine.arch);
    // Installers on a PC expect the machine's own CD-ROM; the virt boards have none, so theirs
    // goes on virtio-scsi like the seed, first in the firmware's boot order.
    let scsi_iso = s.boot.iso.is_some() && !pc;
    let scsi_seed = s.devices.seed.is_some() && s.devices.seed_bus == SeedBus::VirtioScsi;
    if scsi_iso || scsi_seed {
        push(&["-device", "virtio-scsi-pci,id=mcq-scsi"]);
    }
    if let Some(iso) = &s.boot.iso {
        if pc {
            push(&[
                "-drive",
                &format!(
                    "file={},format=raw,media=cdrom,readonly=on,id=mcq-cdrom",
                    p(iso)
                ),
            ]);
            push(&["-boot", "order=dc"]);
        } else {
            push(&[
                "-drive",
                &format!(
                    "file={},format=raw,if=none,media=cdrom,readonly=on,id=mcq-cdrom",
                    p(iso)
                ),
                "-device",
                "scsi-cd,bus=mcq-scsi.0,drive=mcq-cdrom,id=mcq-cdrom-cd,bootindex=0",
            ]);
        }
    }
    if let Some(seed) = &s.devices.seed {
        match s.devices.seed_bus {
            SeedBus::VirtioScsi => push(&[
                "-drive",
                &format!(
                    "file={},format=raw,if=none,media=cdrom,readonly=on,id=mcq-seed",
                    p(seed)
                ),
                "-device",
                "scsi-cd,bus=mcq-scsi.0,drive=mcq-seed,id=mcq-seed-cd",
            ]),
            SeedBus::Cdrom => push(&[
                "-drive",
                &format!(
                    "file={},format=raw,media=cdrom,readonly=on,id=mcq-seed",
                    p(seed)
                ),
            ]),
        }
    }
}

/// User-mode networking with its port forwards, or no network card at all.
fn net_args(s: &VmConfig, a: &mut Vec<String>) {
    let mut push = |parts: &[&str]| a.extend(parts.iter().map(|x| x.to_string()));
    if !s.network.no_net {
        let mut netdev = String::from("user,id=mcq-net0");
        if s.network.restrict_net && !s.network.jailed_net {
            netdev.push_str(",restrict=on");
        }
        for f in &s.network.forwards {
            let addr = if s.network.jailed_net {
                std::net::Ipv4Addr::LOCALHOST
            } else {
                f.addr
            };
            netdev.push_str(&format!(",hostfwd=tcp:{addr}:{}-:{}", f.host, f.guest));
        }
        push(&[
            "-netdev",
            &netdev,
            "-device",
            "virtio-net-pci,netdev=mcq-net0",
        ]);
    } else {
        push(&["-nic", "none"]);
    }
}

/// Direct kernel boot, the VM generation ID (PC machines only, ACPI) and a deferred incoming
/// migration.
fn boot_args(s: &VmConfig, a: &mut Vec<String>) {
    let mut push = |parts: &[&str]| a.extend(parts.iter().map(|x| x.to_string()));
    let pc = x86(&s.machine.arch);
    if let Some(k) = &s.boot.kernel {
        push(&["-kernel", &k.to_string_lossy()]);
    }
    if let Some(i) = &s.boot.initrd {
        push(&["-initrd", &i.to_string_lossy()]);
    }
    if let Some(ap) = &s.boot.append {
        push(&["-append", ap]);
    }
    // A VM generation ID device exists on the PC machines only (ACPI).
    if let Some(guid) = s.devices.vmgenid.as_ref().filter(|_| pc) {
        push(&[
            "-device",
            &format!("vmgenid,id=mcq-vmgenid,guid={}", qopt(guid)),
        ]);
    }
    if s.start.start_paused {
        push(&["-S"]);
    }
    if s.start.incoming {
        push(&["-incoming", "defer"]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::config::Accel;

    /// A TCG guest of `arch` on `machine`, 128 MiB, one vCPU.
    fn config(name: &str, machine: &str, arch: &str) -> VmConfig {
        let mut c = VmConfig {
            name: name.into(),
            ..Default::default()
        };
        c.machine.kind = machine.into();
        c.machine.arch = arch.into();
        c.machine.accel = Accel::Tcg;
        c.compute.memory_mb = 128;
        c.compute.cpus = 1;
        c
    }

    #[test]
    fn escaped_value_splits_back_to_itself() {
        for s in ["data,readonly=on.qcow2", ",,", "a,", ",a", "plain", ""] {
            let opt = format!("file={}", qopt(s));
            assert_eq!(split_opts(&opt), vec![format!("file={s}")]);
        }
    }

    #[test]
    fn argv_keeps_commas_inside_one_value() {
        let mut spec = config("vm", "q35", "x86_64");
        spec.disks = vec![Disk::new("/d/data,readonly=on.qcow2", "qcow2")];
        let argv = build_argv(&spec);
        let drive = argv.iter().find(|a| a.starts_with("file=/d/")).unwrap();
        let parts = split_opts(drive);
        assert_eq!(parts[0], "file=/d/data,readonly=on.qcow2");
        assert!(!parts.iter().any(|p| p == "readonly=on"));
    }

    #[test]
    fn a_spare_mount_port_is_mount_0_beside_the_agents_only_when_the_spec_has_it() {
        let mut spec = config("vm", "q35", "x86_64");
        spec.channels.qga_socket = PathBuf::from("/run/mcq/vm/qga.sock");
        assert!(!build_argv(&spec)
            .iter()
            .any(|a| a.contains("org.mcqemu.fs.")));
        spec.channels.mount_spare = true;
        let argv = build_argv(&spec);
        assert!(argv
            .iter()
            .any(|a| a == "socket,id=mcq-fs0,path=/run/mcq/vm/fs0.sock,server=on,wait=off"));
        assert!(argv.iter().any(|a| {
            a == "virtserialport,bus=mcq-vser.0,chardev=mcq-fs0,name=org.mcqemu.fs.0,id=mcq-fs0"
        }));
    }

    #[test]
    fn the_data_channel_is_a_port_beside_the_agents_only_when_the_spec_has_it() {
        let mut spec = config("vm", "q35", "x86_64");
        spec.channels.qga_socket = PathBuf::from("/run/mcq/vm/qga.sock");
        assert!(!build_argv(&spec).iter().any(|a| a.contains("mcq-data")));
        spec.channels.data_channel = true;
        let argv = build_argv(&spec);
        assert!(argv
            .iter()
            .any(|a| a == "socket,id=mcq-data,path=/run/mcq/vm/data.sock,server=on,wait=off"));
        assert!(argv.iter().any(|a| {
            a == "virtserialport,bus=mcq-vser.0,chardev=mcq-data,name=org.mcqemu.data.0,id=mcq-data"
        }));
    }

    #[test]
    fn virt_boards_get_a_gpu_a_virtio_keyboard_and_their_cdroms_on_virtio_scsi() {
        let mut spec = config("arm", "virt", "aarch64");
        spec.boot.iso = Some(PathBuf::from("/i/installer.iso"));
        spec.devices.seed = Some(PathBuf::from("/s/seed.iso"));
        let argv = build_argv(&spec).join(" ");
        assert!(
            argv.contains("virtio-gpu-pci") && argv.contains("virtio-keyboard-pci"),
            "{argv}"
        );
        assert_eq!(argv.matches("virtio-scsi-pci").count(), 1, "{argv}");
        assert!(argv.contains("scsi-cd,bus=mcq-scsi.0,drive=mcq-cdrom,id=mcq-cdrom-cd,bootindex=0"));
        assert!(!argv.contains("-boot order"), "{argv}");
        let mut pc = spec;
        pc.machine.arch = "x86_64".into();
        pc.machine.kind = "q35".into();
        let argv = build_argv(&pc).join(" ");
        assert!(
            !argv.contains("virtio-gpu-pci") && !argv.contains("virtio-keyboard"),
            "{argv}"
        );
        assert!(
            argv.contains("media=cdrom,readonly=on,id=mcq-cdrom -boot order=dc"),
            "{argv}"
        );
    }

    #[test]
    fn seed_goes_on_virtio_scsi_unless_a_template_kept_the_cdrom() {
        let mut spec = config("vm", "q35", "x86_64");
        spec.devices.seed = Some(PathBuf::from("/s/seed.iso"));
        let argv = build_argv(&spec).join(" ");
        assert!(
            argv.contains("-device virtio-scsi-pci,id=mcq-scsi"),
            "{argv}"
        );
        assert!(argv.contains("file=/s/seed.iso,format=raw,if=none,media=cdrom,readonly=on"));
        assert!(
            argv.contains("scsi-cd,bus=mcq-scsi.0,drive=mcq-seed"),
            "{argv}"
        );
        spec.devices.seed_bus = SeedBus::Cdrom;
        let argv = build_argv(&spec).join(" ");
        assert!(!argv.contains("virtio-scsi"), "{argv}");
        assert!(argv.contains("file=/s/seed.iso,format=raw,media=cdrom,readonly=on,id=mcq-seed"));
    }

    /// What a fork's receiver and copies need: their memory backend under the parent's RAM
    /// id, `-S`, and a config that survives the record as JSON.
    #[test]
    fn a_copy_maps_its_memory_under_the_parents_ram_id_and_the_spec_round_trips() {
        let mut spec = config("copy", "pc-q35-7.2", "x86_64");
        spec.compute.memory_mb = 256;
        spec.compute.memory_file = Some(MemoryFile {
            path: "/f/ram".into(),
            shared: false,
        });
        spec.compute.memory_id = Some("pc.ram".into());
        spec.start.incoming = true;
        spec.start.start_paused = true;
        let argv = build_argv(&spec).join(" ");
        assert!(
            argv.contains("memory-backend-file,id=pc.ram,size=256M,mem-path=/f/ram,share=off"),
            "{argv}"
        );
        assert!(argv.contains("pc-q35-7.2,memory-backend=pc.ram"), "{argv}");
        assert!(argv.contains(" -S -incoming defer"), "{argv}");
        let back: VmConfig = serde_json::from_value(serde_json::to_value(&spec).unwrap()).unwrap();
        assert_eq!(build_argv(&back), build_argv(&spec));
        let mut template = spec;
        template.compute.memory_id = None;
        template.start.start_paused = false;
        let argv = build_argv(&template).join(" ");
        assert!(
            argv.contains("id=mcq-ram,") && !argv.contains(" -S "),
            "{argv}"
        );
    }

    /// Only a shared memory file is allocated up front (a receiver's in /dev/shm); a private
    /// mapping of a frozen state never is.
    #[test]
    fn only_a_shared_memory_file_is_preallocated() {
        let mut receiver = config("r", "pc", "x86_64");
        receiver.compute.memory_mb = 256;
        receiver.compute.memory_file = Some(MemoryFile {
            path: "/dev/shm/r.ram".into(),
            shared: true,
        });
        receiver.compute.memory_prealloc = true;
        let argv = build_argv(&receiver).join(" ");
        assert!(
            argv.contains("mem-path=/dev/shm/r.ram,share=on,prealloc=on"),
            "{argv}"
        );
        let mut copy = receiver.clone();
        copy.compute.memory_file = Some(MemoryFile {
            path: "/f/ram".into(),
            shared: false,
        });
        let argv = build_argv(&copy).join(" ");
        assert!(!argv.contains("prealloc"), "{argv}");
        let mut on_disk = receiver;
        on_disk.compute.memory_prealloc = false;
        let argv = build_argv(&on_disk).join(" ");
        assert!(
            argv.contains("share=on ") || argv.ends_with("share=on"),
            "{argv}"
        );
        assert!(!argv.contains("prealloc"), "{argv}");
    }
}
