#!/usr/bin/env python3
"""Builds mcqemu's stock-shaped test cloud image: Debian 12 (bookworm) laid out the way Debian
publishes its genericcloud image, so that tests run the whole journey on a real-shaped image
(firmware, boot loader, partition table, initramfs, first-boot growth) instead of on
build_cloud.py's direct-kernel one.

- The root is made with mmdebstrap (root mode) from the distribution's packages: systemd,
  cloud-init (limited to NoCloud), cloud-guest-utils (growpart), and the *cloud* kernel
  flavour, linux-image-cloud-amd64, with initramfs-tools' default MODULES=most. That kernel
  has no AHCI driver (CONFIG_SATA_AHCI is not set; ata_piix is there): a seed CD-ROM on q35's
  AHCI is invisible to it and cloud-init falls back to DataSourceNone, one on virtio-scsi
  (virtio_scsi, sr_mod, cdrom and isofs are modules, all in the initramfs) is found. No
  qemu-guest-agent.
- The disk is GPT, as Debian's: partition 14 BIOS boot (3 MiB at 1 MiB), 15 EFI system
  (124 MiB FAT at 4 MiB, mounted on /boot/efi), 1 root (ext4 from 128 MiB to the end, so that
  cloud-init's growpart and resize2fs can grow it into a bigger overlay). UEFI boots
  /EFI/BOOT/BOOTX64.EFI, a GRUB made with grub-mkstandalone; BIOS boots GRUB's boot.img in the
  MBR and a core.img in the BIOS boot partition. Both embed the same grub.cfg, which finds
  the root file system by its UUID and boots /vmlinuz with Debian's kernel command line
  (console=tty0 console=ttyS0,115200); there is no menu and no /boot/grub on the root.
  Everything is written into one file, without loop devices or mounts: sfdisk,
  `mke2fs -d -E offset=`, `mkfs.vfat --offset` and mtools, then converted to qcow2 (2 GiB
  virtual).
- Next to it, `repo/`: a flat apt repository of qemu-guest-agent and every package it depends
  on that the image lacks, as the image's own apt resolves them (same mirrors and suites), so
  that a guest whose only source is `deb [trusted=yes] http://10.0.2.2:PORT/ ./` can
  `apt-get install qemu-guest-agent` with no other network.

Usage: build_stock.py OUTDIR   -> prints {"disk", "repo", "manifest", "firmware": "uefi",
"bios": true, "root_uuid", "append"} as JSON ("firmware" is the one to boot it with; "bios"
says SeaBIOS boots it too). Cached in OUTDIR/<key>/ like build_cloud.py (whose helpers
it imports): keyed by both scripts, the candidate versions of the packages and the host's GRUB
packages, built in a private folder and renamed into place in one step.

Needs root, mmdebstrap, mke2fs, sfdisk, mkfs.vfat, mtools, grub-mkstandalone and grub-mkimage
with the x86_64-efi and i386-pc modules (grub-efi-amd64-bin, grub-pc-bin), dpkg-scanpackages,
qemu-img and access to deb.debian.org; `.ci/setup-host` installs them. Takes about 1-2
minutes (mmdebstrap downloads and installs ~200 packages; the disk takes ~2 s).
"""
import datetime
import gzip
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import uuid

sys.dont_write_bytecode = True  # no __pycache__ in tests/cloud
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_cloud  # noqa: E402  (the suite, the mirrors, the cloud-init fixes, the helpers)
from build_cloud import (  # noqa: E402
    candidates, mounts_under, prune_old_images, remove_stale_builds, remove_tree, run)

SUITE = build_cloud.SUITE
MIRRORS = build_cloud.MIRRORS
# On top of mmdebstrap's "apt" variant, without recommends; see build_cloud.PACKAGES for why
# dbus and systemd-resolved. cloud-guest-utils brings growpart (and fdisk's sfdisk, which
# growpart uses on GPT). git: the mounts journey commits in a mounted host folder.
PACKAGES = [
    "systemd", "systemd-sysv", "udev", "dbus", "systemd-resolved", "cloud-init",
    "cloud-guest-utils", "e2fsprogs", "linux-image-cloud-amd64", "initramfs-tools", "zstd",
    "sudo", "iproute2", "kmod", "git",
]
# What repo/ serves: these and their Depends (and Pre-Depends) that the image lacks. Not their
# Recommends: the guest's apt skips a recommended package that no source has.
REPO_PACKAGES = ["qemu-guest-agent"]
# Host packages whose files are written onto the disk (the boot loaders).
HOST_PACKAGES = ["grub-efi-amd64-bin", "grub-pc-bin"]
MMDEBSTRAP_TIMEOUT = 12 * 60
PATH_EXCLUDES = ["/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*",
                 "/usr/share/locale/*", "/usr/share/lintian/*"]
PATH_INCLUDES = ["/usr/share/doc/*/copyright"]

# The disk (offsets and sizes in bytes) as Debian's genericcloud images lay it out: the root
# is partition 1 but comes last, so that growpart can grow it.
SECTOR = 512
MIB = 1 << 20
DISK_BYTES = 2048 * MIB
BIOS_START, BIOS_SIZE = 1 * MIB, 3 * MIB           # partition 14
ESP_START, ESP_SIZE = 4 * MIB, 124 * MIB           # partition 15
ROOT_START = 128 * MIB                             # partition 1, to 1 MiB before the end
ROOT_SIZE = DISK_BYTES - MIB - ROOT_START
GPT_TYPES = {
    "root": "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709",  # Linux root (x86-64)
    "bios": "21686148-6449-6E6F-744E-656564454649",  # BIOS boot
    "esp": "C12A7328-F81F-11D2-BA4B-00A0C93EC93B",   # EFI system
}
# Debian's GRUB_CMDLINE_LINUX for its cloud images, after the root.
KERNEL_ARGS = "ro console=tty0 console=ttyS0,115200 earlyprintk=ttyS0,115200 consoleblank=0"
# The embedded grub.cfg: plain commands only, since the BIOS core.img runs it with GRUB's
# rescue parser (no normal.mod there). Debian's symlinks /vmlinuz and /initrd.img follow a
# kernel upgrade made in the guest. `boot` is explicit: there is no menu to wait on.
GRUB_CFG = """\
serial --unit=0 --speed=115200
terminal_input console serial
terminal_output console serial
search --no-floppy --fs-uuid --set=root {uuid}
linux /vmlinuz {append}
initrd /initrd.img
boot
"""
# What the EFI image's memdisk holds (every module would make it 10 MB instead of 0.8) and
# what core.img embeds (it must stay well under GRUB's ~450 KiB limit for i386-pc).
GRUB_EFI_MODULES = ["part_gpt", "part_msdos", "ext2", "fat", "search", "search_fs_uuid",
                    "search_label", "linux", "normal", "boot", "serial", "terminal", "echo",
                    "test", "ls", "cat", "configfile", "gzio", "all_video"]
GRUB_PC_MODULES = ["biosdisk", "part_gpt", "ext2", "search", "search_fs_uuid", "linux",
                   "boot", "serial", "terminal", "echo", "ls"]
# boot.img: where it reads the LBA of core.img's first sector, and the 2-byte jump over its
# "was the BIOS's drive a hard disk" check, which grub-setup replaces with NOPs for hard disks
# (GRUB_BOOT_MACHINE_KERNEL_SECTOR, GRUB_BOOT_MACHINE_DRIVE_CHECK). core.img's first sector
# (diskboot.img) ends with a 12-byte block list: the LBA of the rest of core.img (8 bytes),
# its length in sectors (grub-mkimage fills it in) and a segment.
BOOT_IMG_KERNEL_SECTOR = 0x5c
BOOT_IMG_DRIVE_CHECK = 0x66
BOOT_IMG_CODE_END = 0x1b8  # the disk signature and the partition table follow: kept
DISKBOOT_BLOCKLIST = SECTOR - 12

# Copied in, with /etc/fstab, before the kernel is installed (see build_cloud.EARLY_FILES), so
# that its initramfs is built with them. MODULES stays Debian's default (most). FSTYPE: the
# fsck hook cannot probe the root device (UUID=...) from a chroot and would leave e2fsck out
# ("fsck not present, so skipping root file system" at boot).
EARLY_FILES = {"etc/initramfs-tools/conf.d/mcqemu": "FSTYPE=ext4\n"}

# The cloud-init fixes build_cloud.py found (a NoCloud-only datasource list, the C.UTF-8
# locale, the networkd DHCP catch-all, a bounded wait-online): its text and its reasons.
FILES = {rel: build_cloud.FILES[rel] for rel in (
    "etc/cloud/cloud.cfg.d/90-datasource.cfg",
    "etc/default/locale",
    "etc/cloud/cloud.cfg.d/91-mcqemu.cfg",
    "etc/hosts",
    "etc/systemd/network/99-mcqemu-dhcp.network",
    "etc/systemd/system/systemd-networkd-wait-online.service.d/mcqemu.conf",
)}
FILES.update({
    "etc/hostname": "mcqemu-stock\n",
    # As Debian's images: deb822 sources on deb.debian.org (the tests replace them through
    # cloud-init with the local repository).
    "etc/apt/sources.list.d/debian.sources":
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n"
        "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
})
ENABLE = {wants: [u for u in units if u != "qemu-guest-agent.service"]
          for wants, units in build_cloud.ENABLE.items()}
# Debian's images keep systemd-firstboot (they ship /etc/machine-id empty, which is not a
# first boot): so does this one, so that a prepared image that loses its machine-id is caught.
MASK = [u for u in build_cloud.MASK if u != "systemd-firstboot.service"]


def die(msg):
    sys.exit("build_stock: " + msg)


def kernel_package():
    """linux-image-cloud-amd64's dependency (linux-image-6.1.0-NN-cloud-amd64): a new kernel
    ABI changes the key."""
    try:
        out = run(["apt-cache", "depends", "linux-image-cloud-amd64"],
                  stderr=subprocess.DEVNULL)
    except (OSError, subprocess.CalledProcessError):
        return None
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Depends: linux-image-"):
            return line.split(":", 1)[1].strip()
    return None


def host_versions(pkgs):
    """The installed versions of the host's packages (the boot loaders come from them)."""
    try:
        out = run(["dpkg-query", "-W", "-f", "${Package}=${Version}\n"] + pkgs,
                  stderr=subprocess.DEVNULL)
    except (OSError, subprocess.CalledProcessError):
        return ["%s=?" % p for p in pkgs]
    return sorted(out.split())


def cache_key():
    pkgs = PACKAGES + REPO_PACKAGES
    kpkg = kernel_package()
    if kpkg:
        pkgs.append(kpkg)
    versions = candidates(pkgs)
    lines = ["%s=%s" % (p, versions[p] or "?") for p in pkgs]
    lines += ["host:" + v for v in host_versions(HOST_PACKAGES)]
    h = hashlib.sha256()
    for script in (__file__, build_cloud.__file__):
        with open(os.path.abspath(script), "rb") as f:
            h.update(f.read() + b"\0")
    h.update("\n".join(lines).encode())
    return h.hexdigest()[:16], lines


def derived_uuid(key, what):
    """A UUID fixed by the key: the same build gives the same disk, file systems and grub.cfg."""
    return str(uuid.UUID(bytes=hashlib.sha256((key + what).encode()).digest()[:16], version=4))


def tool(*names):
    """The first of `names` on PATH (Fedora calls GRUB's tools grub2-*)."""
    return next((shutil.which(n) for n in names if shutil.which(n)), None)


def check_tools():
    need = {"mmdebstrap": ["mmdebstrap"], "mke2fs": ["mke2fs"], "qemu-img": ["qemu-img"],
            "sfdisk": ["sfdisk"], "mkfs.vfat": ["mkfs.vfat"], "mcopy": ["mcopy"],
            "grub-mkstandalone": ["grub-mkstandalone", "grub2-mkstandalone"],
            "grub-mkimage": ["grub-mkimage", "grub2-mkimage"],
            "dpkg-scanpackages": ["dpkg-scanpackages"]}
    missing = [t for t, names in need.items() if not tool(*names)]
    if missing:
        die("%s not found; run .ci/setup-host" % ", ".join(missing))
    if grub_lib("x86_64-efi") is None or grub_lib("i386-pc") is None:
        die("GRUB's x86_64-efi or i386-pc modules not found (grub-efi-amd64-bin, "
            "grub-pc-bin); run .ci/setup-host")
    if os.geteuid() != 0:
        die("building the stock test image needs root (mmdebstrap's root mode); build it "
            "with: sudo python3 tests/cloud/build_stock.py target/test-stock")


def grub_lib(platform):
    for d in ("/usr/lib/grub", "/usr/lib/grub2"):
        if os.path.isfile(os.path.join(d, platform, "linux.mod")):
            return os.path.join(d, platform)
    return None


def write_file(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.lexists(path):
        os.unlink(path)
    with open(path, "w") as f:
        f.write(text)


def symlink(target, link):
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(target, link)


def customize(root, fstab):
    """Configures the installed tree from outside, as build_cloud.customize does."""
    for rel, text in FILES.items():
        write_file(root, rel, text)
    write_file(root, "etc/fstab", fstab)
    os.makedirs(os.path.join(root, "boot/efi"), exist_ok=True)
    # mmdebstrap's one-line sources.list; debian.sources replaces it.
    if os.path.lexists(os.path.join(root, "etc/apt/sources.list")):
        os.unlink(os.path.join(root, "etc/apt/sources.list"))
    for wants, units in ENABLE.items():
        d = os.path.join(root, "etc/systemd/system", wants)
        os.makedirs(d, exist_ok=True)
        for unit in units:
            src = next((p for p in ("/lib/systemd/system/" + unit,
                                    "/usr/lib/systemd/system/" + unit)
                        if os.path.exists(root + p)), None)
            if src is None:
                die("unit %s not found in the tree" % unit)
            symlink(src, os.path.join(d, unit))
    for alias, unit in (("dbus-org.freedesktop.network1.service", "systemd-networkd.service"),
                        ("dbus-org.freedesktop.resolve1.service", "systemd-resolved.service")):
        symlink("/lib/systemd/system/" + unit, os.path.join(root, "etc/systemd/system", alias))
    symlink("../run/systemd/resolve/stub-resolv.conf", os.path.join(root, "etc/resolv.conf"))
    for unit in MASK:
        symlink("/dev/null", os.path.join(root, "etc/systemd/system", unit))
    # No SSH server: drop cc_ssh (see build_cloud.customize).
    cfg = os.path.join(root, "etc/cloud/cloud.cfg")
    with open(cfg) as f:
        text = f.read()
    with open(cfg, "w") as f:
        f.write("".join(ln for ln in text.splitlines(True) if ln.rstrip() != " - ssh"))
    # A test image: root logs in on the serial console without a password (Debian's locks it).
    shadow = os.path.join(root, "etc/shadow")
    with open(shadow) as f:
        lines = f.read().splitlines()
    lines = [("root::" + ln.split(":", 2)[2]) if ln.startswith("root:") else ln for ln in lines]
    with open(shadow, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(root, "etc/machine-id"), "w"):
        pass
    dbus_id = os.path.join(root, "var/lib/dbus/machine-id")
    if os.path.lexists(dbus_id) and not os.path.islink(dbus_id):
        os.unlink(dbus_id)
    for link in ("vmlinuz", "initrd.img"):
        if not os.path.exists(os.path.join(root, link)):
            die("the tree has no /%s (the kernel's symlink, which grub.cfg boots)" % link)


def installed_versions(root):
    out = run(["dpkg-query", "--admindir", os.path.join(root, "var/lib/dpkg"), "-W",
               "-f", "${Package}=${Version}\n"])
    return sorted(line for line in out.splitlines() if line)


def make_repo(debs, repo, status, work):
    """Indexes the downloaded packages as a flat repository (Packages, Packages.gz and an
    unsigned Release, which `[trusted=yes]` accepts), then checks that apt, with this
    repository as its only source and the image's dpkg status, can install every one of
    REPO_PACKAGES with recommends on, as the guest's apt would. Returns the package list."""
    os.makedirs(repo)
    for f in sorted(os.listdir(debs)):
        if f.endswith(".deb"):
            # apt's cache names keep the epoch as "1%3a"; a pool's names drop it (and a "%"
            # in a URL path would have to be quoted).
            name, version, arch = f.split("_")
            version = version.split("%3a", 1)[-1]
            shutil.move(os.path.join(debs, f), os.path.join(repo, "_".join((name, version, arch))))
    packages = run(["dpkg-scanpackages", "--multiversion", "."], cwd=repo,
                   stderr=subprocess.DEVNULL)
    with open(os.path.join(repo, "Packages"), "w") as f:
        f.write(packages)
    with gzip.GzipFile(os.path.join(repo, "Packages.gz"), "wb", mtime=0) as f:
        f.write(packages.encode())
    release = ["Date: " + datetime.datetime.now(datetime.timezone.utc)
               .strftime("%a, %d %b %Y %H:%M:%S UTC"), "SHA256:"]
    for name in ("Packages", "Packages.gz"):
        with open(os.path.join(repo, name), "rb") as f:
            data = f.read()
        release.append(" %s %d %s" % (hashlib.sha256(data).hexdigest(), len(data), name))
    with open(os.path.join(repo, "Release"), "w") as f:
        f.write("\n".join(release) + "\n")

    check = os.path.join(work, "apt-check")
    for d in ("lists/partial", "cache/archives/partial", "etc/apt.conf.d",
              "etc/preferences.d", "etc/sources.list.d"):
        os.makedirs(os.path.join(check, d))
    with open(os.path.join(check, "etc/sources.list"), "w") as f:
        f.write("deb [trusted=yes] file:%s ./\n" % repo)
    conf = os.path.join(check, "apt.conf")
    with open(conf, "w") as f:
        f.write('Dir::Etc "%s/etc";\nDir::State "%s";\nDir::State::Lists "%s/lists";\n'
                'Dir::State::status "%s";\nDir::Cache "%s/cache";\nDebug::NoLocking "1";\n'
                'APT::Architecture "amd64";\nAPT::Install-Recommends "1";\n'
                % (check, check, check, status, check))
    env = dict(os.environ, APT_CONFIG=conf)
    run(["apt-get", "-q", "update"], env=env, stderr=subprocess.STDOUT)
    sim = subprocess.run(["apt-get", "-q", "install", "--simulate"] + REPO_PACKAGES, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if sim.returncode != 0:
        die("the local repository cannot install %s into the image:\n%s"
            % (" ".join(REPO_PACKAGES), sim.stdout[-4000:]))
    return sorted(line.split()[1] for line in sim.stdout.splitlines()
                  if line.startswith("Inst "))


def write_at(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def make_disk(raw, rootfs, root_uuid, append, esp_volid, key, work):
    """Writes the partition table, both file systems and both boot loaders into `raw`."""
    with open(raw, "wb") as f:
        f.truncate(DISK_BYTES)
    parts = [(1, ROOT_START, ROOT_SIZE, "root"), (14, BIOS_START, BIOS_SIZE, "bios"),
             (15, ESP_START, ESP_SIZE, "esp")]
    table = ["label: gpt", "label-id: " + derived_uuid(key, "disk"), "unit: sectors",
             "first-lba: 2048", ""]
    for n, start, size, kind in parts:
        table.append("%s%d : start=%d, size=%d, type=%s, uuid=%s" % (
            raw, n, start // SECTOR, size // SECTOR, GPT_TYPES[kind],
            derived_uuid(key, "part-" + kind)))
    run(["sfdisk", "-q", "--no-reread", "--no-tell-kernel", raw],
        input="\n".join(table) + "\n", stderr=subprocess.STDOUT)
    # -d copies the tree (owners, modes, device nodes, hard links) into the new file system,
    # at the partition's offset in the same file; the size is in KiB.
    run(["mke2fs", "-q", "-F", "-t", "ext4", "-d", rootfs, "-L", "root", "-U", root_uuid,
         "-E", "offset=%d" % ROOT_START, raw, "%dk" % (ROOT_SIZE // 1024)],
        stderr=subprocess.STDOUT)

    cfg = os.path.join(work, "grub.cfg")
    with open(cfg, "w") as f:
        f.write(GRUB_CFG.format(uuid=root_uuid, append=append))
    # On UEFI the kernel's console=tty0 needs the GOP frame buffer that GRUB hands over
    # ("no suitable video mode found ... Booting in blind mode" otherwise).
    efi_cfg = os.path.join(work, "grub-efi.cfg")
    with open(efi_cfg, "w") as f:
        f.write("insmod all_video\n" + GRUB_CFG.format(uuid=root_uuid, append=append))
    efi = os.path.join(work, "BOOTX64.EFI")
    run([tool("grub-mkstandalone", "grub2-mkstandalone"), "-O", "x86_64-efi",
         "-d", grub_lib("x86_64-efi"), "--install-modules=" + " ".join(GRUB_EFI_MODULES),
         "--modules=part_gpt ext2", "--locales=", "--fonts=", "--themes=", "-o", efi,
         "boot/grub/grub.cfg=" + efi_cfg], stderr=subprocess.STDOUT)
    run(["mkfs.vfat", "-F", "16", "-n", "EFI", "-i", esp_volid.replace("-", ""),
         "--offset=%d" % (ESP_START // SECTOR), raw, str(ESP_SIZE // 1024)],
        stderr=subprocess.STDOUT)
    esp = "%s@@%d" % (raw, ESP_START)
    run(["mmd", "-i", esp, "::/EFI", "::/EFI/BOOT"], stderr=subprocess.STDOUT)
    run(["mcopy", "-i", esp, efi, "::/EFI/BOOT/BOOTX64.EFI"], stderr=subprocess.STDOUT)

    # BIOS, as grub-install would on this disk: core.img into the BIOS boot partition, and
    # boot.img's code into the MBR pointing at it.
    core = os.path.join(work, "core.img")
    pc = grub_lib("i386-pc")
    run([tool("grub-mkimage", "grub2-mkimage"), "-O", "i386-pc", "-d", pc, "-o", core,
         "-p", "/boot/grub", "-c", cfg] + GRUB_PC_MODULES, stderr=subprocess.STDOUT)
    with open(core, "rb") as f:
        core_img = bytearray(f.read())
    if len(core_img) > BIOS_SIZE:
        die("core.img (%d bytes) does not fit the BIOS boot partition" % len(core_img))
    struct.pack_into("<Q", core_img, DISKBOOT_BLOCKLIST, BIOS_START // SECTOR + 1)
    write_at(raw, BIOS_START, core_img)
    with open(os.path.join(pc, "boot.img"), "rb") as f:
        boot_img = bytearray(f.read())
    struct.pack_into("<Q", boot_img, BOOT_IMG_KERNEL_SECTOR, BIOS_START // SECTOR)
    boot_img[BOOT_IMG_DRIVE_CHECK:BOOT_IMG_DRIVE_CHECK + 2] = b"\x90\x90"
    write_at(raw, 0, bytes(boot_img[:BOOT_IMG_CODE_END]))
    return os.path.getsize(efi), len(core_img)


def build(out_dir):
    key, keyed = cache_key()
    dest = os.path.join(out_dir, key)
    root_uuid = derived_uuid(key, "rootfs")
    append = "root=UUID=%s %s" % (root_uuid, KERNEL_ARGS)
    result = {"disk": os.path.join(dest, "disk.qcow2"),
              "repo": os.path.join(dest, "repo"),
              "manifest": os.path.join(dest, "manifest.json"),
              "firmware": "uefi",
              "bios": True,
              "root_uuid": root_uuid,
              "append": append}
    if os.path.exists(os.path.join(dest, "done")):
        return result
    check_tools()
    os.makedirs(out_dir, exist_ok=True)
    # build_cloud's stale-build sweep looks for this prefix.
    remove_stale_builds(out_dir)
    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="cloud-build-", dir=out_dir)
    try:
        with open(os.path.join(work, "pid"), "w") as f:
            f.write(str(os.getpid()))
        rootfs = os.path.join(work, "rootfs")
        tmp = os.path.join(work, "tmp")
        debs = os.path.join(work, "debs")
        os.makedirs(tmp)
        os.makedirs(os.path.join(debs, "partial"))
        early = os.path.join(work, "early")
        for rel, text in EARLY_FILES.items():
            write_file(early, rel, text)
        volid = hashlib.sha256((key + "esp").encode()).hexdigest()[:8].upper()
        esp_volid = volid[:4] + "-" + volid[4:]
        fstab = ("UUID=%s / ext4 rw,discard,errors=remount-ro 0 1\n"
                 "UUID=%s /boot/efi vfat defaults 0 0\n" % (root_uuid, esp_volid))
        write_file(early, "etc/fstab", fstab)
        # The repository's packages, downloaded by the image's own apt (its dpkg status, the
        # same mirrors and package lists) before mmdebstrap's cleanup drops the lists: exactly
        # what the guest's apt would fetch.
        download_hook = (
            'APT_CONFIG="$MMDEBSTRAP_APT_CONFIG" apt-get --yes --quiet --download-only '
            '--no-install-recommends -o Dir::Cache::Archives="%s/" install %s'
            % (debs, " ".join(REPO_PACKAGES)))
        cmd = ["mmdebstrap", "--mode=root", "--variant=apt", "--format=directory",
               "--include=" + ",".join(PACKAGES),
               "--essential-hook=" + 'cp -r "%s/." "$1/"' % early,
               "--customize-hook=" + download_hook]
        for p in PATH_EXCLUDES:
            cmd.append("--dpkgopt=path-exclude=" + p)
        for p in PATH_INCLUDES:
            cmd.append("--dpkgopt=path-include=" + p)
        cmd += [SUITE, rootfs] + MIRRORS
        env = dict(os.environ, TMPDIR=tmp, DEBIAN_FRONTEND="noninteractive")
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
        with open(os.path.join(work, "pid"), "a") as f:
            f.write(" %d" % proc.pid)
        try:
            log, _ = proc.communicate(timeout=MMDEBSTRAP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            log, _ = proc.communicate()
            die("mmdebstrap did not finish within %d s:\n%s"
                % (MMDEBSTRAP_TIMEOUT, log[-6000:]))
        if proc.returncode != 0:
            die("mmdebstrap failed (exit %d):\n%s" % (proc.returncode, log[-6000:]))
        t_mmdebstrap = time.monotonic() - t0
        if mounts_under(rootfs):
            die("mmdebstrap left mounts in %s: %s" % (rootfs, mounts_under(rootfs)))

        customize(rootfs, fstab)
        packages = installed_versions(rootfs)
        kernel_release = os.readlink(os.path.join(rootfs, "vmlinuz")).split("vmlinuz-", 1)[-1]
        staged = os.path.join(work, "out")
        os.makedirs(staged)
        t0 = time.monotonic()
        repo_installs = make_repo(debs, os.path.join(staged, "repo"),
                                  os.path.join(rootfs, "var/lib/dpkg/status"), work)
        t_repo = time.monotonic() - t0

        t0 = time.monotonic()
        raw = os.path.join(work, "disk.raw")
        efi_bytes, core_bytes = make_disk(raw, rootfs, root_uuid, append, esp_volid, key, work)
        # Not compressed, as build_cloud.py (faster boots under TCG).
        run(["qemu-img", "convert", "-O", "qcow2", raw, os.path.join(staged, "disk.qcow2")])
        os.unlink(raw)
        t_image = time.monotonic() - t0
        manifest = {
            "key": key,
            "suite": SUITE,
            "mirrors": MIRRORS,
            "keyed_on": keyed,
            "kernel_release": kernel_release,
            "append": append,
            "root_uuid": root_uuid,
            "esp_volume_id": esp_volid,
            "firmware": ["uefi", "bios"],
            "disk_virtual_size": DISK_BYTES,
            "partitions": {"1": {"start": ROOT_START, "size": ROOT_SIZE, "fs": "ext4",
                                 "label": "root"},
                           "14": {"start": BIOS_START, "size": BIOS_SIZE, "bios_boot": True},
                           "15": {"start": ESP_START, "size": ESP_SIZE, "fs": "vfat",
                                  "label": "EFI"}},
            "packages": packages,
            "repo_packages": sorted(f for f in os.listdir(os.path.join(staged, "repo"))
                                    if f.endswith(".deb")),
            "repo_installs": repo_installs,
            "built_at": datetime.datetime.now(datetime.timezone.utc)
            .strftime("%Y-%m-%dT%H:%M:%SZ"),
            "build_seconds": {"mmdebstrap": round(t_mmdebstrap, 1),
                              "repo": round(t_repo, 1),
                              "image": round(t_image, 1),
                              "total": round(time.monotonic() - started, 1)},
            "sizes": {"disk.qcow2": os.path.getsize(os.path.join(staged, "disk.qcow2")),
                      "BOOTX64.EFI": efi_bytes, "core.img": core_bytes},
        }
        build_cloud.place(staged, dest, work, manifest)
    except subprocess.CalledProcessError as e:
        die("%s failed (exit %d): %s" % (e.cmd[0], e.returncode, (e.stdout or "").strip()))
    finally:
        remove_tree(work)
    prune_old_images(out_dir, key)
    return result


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(json.dumps(build(os.path.abspath(sys.argv[1]))))
