#!/usr/bin/env python3
"""Builds mcqemu's test cloud image: a small Debian 12 (bookworm) system from the
distribution's packages (systemd, cloud-init limited to NoCloud, qemu-guest-agent, the Debian
kernel), made with mmdebstrap (root mode) and written into an ext4 file system with
`mke2fs -d` (no loop devices, no mounts), then converted to qcow2. The kernel and
initramfs are copied out next to it for direct kernel boot with APPEND.

Usage: build_cloud.py OUTDIR   -> prints {"disk", "kernel", "initrd", "append", "manifest"}
as JSON. The output is cached in OUTDIR/<key>/, keyed by this script and by the candidate
versions the host's apt has for the packages (like tests/guest/build_guest.py); a build goes
into a private folder first and is renamed into place in one step.

Needs root (mmdebstrap's root mode: the tree's files must be owned by the right users for
mke2fs to copy them), mmdebstrap, mke2fs (e2fsprogs >= 1.43 for -d), qemu-img and access to
deb.debian.org. `.ci/setup-host` installs the tools. Takes about 1-2 minutes (mmdebstrap
downloads and installs ~200 packages).
"""
import datetime
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SUITE = "bookworm"
MIRRORS = [
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
]
# Installed on top of mmdebstrap's "apt" variant (Essential:yes + apt), without recommends.
# cloud-init brings its python dependencies and isc-dhcp-client through Depends. dbus (only a
# Recommends of systemd) is what systemd-logind needs: without it the ACPI power button
# (QMP system_powerdown) does nothing, and neither does qemu-ga's guest-shutdown
# (`shutdown -P +0` schedules through logind). systemd-resolved: cloud-init's networkd renderer
# restarts it with systemd-networkd when it brings interfaces up itself (a seed found only in
# the network stage, or none), and fails with a warning when it is missing; it also takes the
# DNS servers from DHCP.
PACKAGES = [
    "systemd", "systemd-sysv", "udev", "dbus", "systemd-resolved", "cloud-init",
    "qemu-guest-agent", "linux-image-amd64", "initramfs-tools", "zstd", "sudo", "e2fsprogs",
    "iproute2", "kmod",
]
APPEND = "root=/dev/vda rw console=ttyS0"
# About 1-2 minutes here; tests/common/cloud.rs waits 15 minutes for the whole build.
MMDEBSTRAP_TIMEOUT = 12 * 60
DISK_SIZE = "2G"
# Passed to mmdebstrap as --dpkgopt: files the packages ship that a test image never needs
# (documentation, translations, kernel modules for hardware QEMU does not emulate here).
# Copyright files stay.
PATH_EXCLUDES = [
    "/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*",
    "/usr/share/lintian/*",
    "/lib/modules/*/kernel/sound/*",
    "/lib/modules/*/kernel/drivers/media/*",
    "/lib/modules/*/kernel/drivers/net/wireless/*",
    "/lib/modules/*/kernel/drivers/infiniband/*",
    "/lib/modules/*/kernel/drivers/staging/*",
    "/lib/modules/*/kernel/drivers/iio/*",
    "/lib/modules/*/kernel/drivers/isdn/*",
    "/lib/modules/*/kernel/drivers/bluetooth/*",
    "/lib/modules/*/kernel/net/bluetooth/*",
    "/lib/modules/*/kernel/net/wireless/*",
    "/lib/modules/*/kernel/net/mac80211/*",
    "/lib/modules/*/kernel/drivers/gpu/drm/amd/*",
    "/lib/modules/*/kernel/drivers/gpu/drm/nouveau/*",
    "/lib/modules/*/kernel/drivers/gpu/drm/i915/*",
    "/lib/modules/*/kernel/drivers/gpu/drm/radeon/*",
]
PATH_INCLUDES = ["/usr/share/doc/*/copyright"]

# The initramfs holds only what it takes to mount the root file system (virtio-blk, ext4) and
# to see a NoCloud seed before the real root starts (the CD-ROM on q35's AHCI or i440fx's
# IDE, ISO 9660 and FAT seeds): cloud-init-local does not wait for udev, so a seed whose
# driver udev loads later could be missed. MODULES=most would make it ~36 MB instead of ~7.
INITRAMFS_MODULES = [
    "virtio_pci", "virtio_blk", "virtio_scsi", "virtio_net", "virtio_console", "ext4",
    "ahci", "ata_piix", "sr_mod", "sd_mod", "cdrom", "isofs", "vfat", "nls_cp437",
    "nls_iso8859_1", "nls_utf8",
]
FSTAB = "/dev/vda / ext4 defaults 0 1\n"
# Copied into the tree before the kernel is installed (the essential hook runs between the
# Essential:yes packages and the rest), so that its initramfs is built with them. FSTYPE: the
# fsck hook would otherwise probe the root device, which does not exist in the chroot, and
# leave e2fsck out ("fsck not present, so skipping root file system" at boot).
EARLY_FILES = {
    "etc/initramfs-tools/conf.d/mcqemu": "MODULES=list\nCOMPRESS=zstd\nFSTYPE=ext4\n",
    "usr/share/initramfs-tools/modules.d/mcqemu": "\n".join(INITRAMFS_MODULES) + "\n",
    "etc/fstab": FSTAB,
}

FILES = {
    # cloud-init looks for a NoCloud seed (a file system labelled cidata, or the kernel
    # command line / SMBIOS serial ds=nocloud;...) and nothing else.
    "etc/cloud/cloud.cfg.d/90-datasource.cfg": "datasource_list: [ NoCloud, None ]\n",
    "etc/fstab": FSTAB,
    # Debian's default locale (en_US.UTF-8) is not generated in this image, and cc_locale's
    # update-locale then fails ("invalid locale settings"), which fails cloud-config.service
    # and makes `cloud-init status` say error. C.UTF-8 is built into glibc.
    "etc/default/locale": "LANG=C.UTF-8\n",
    "etc/cloud/cloud.cfg.d/91-mcqemu.cfg": "locale: C.UTF-8\n",
    # The agent answers as soon as the local file systems are up instead of after
    # sysinit.target, which waits for cloud-init's network stage (~35 s later under TCG): an
    # answering agent does not mean that cloud-init has finished
    # (/var/lib/cloud/instance/boot-finished says that).
    "etc/systemd/system/qemu-guest-agent.service.d/mcqemu.conf":
        "[Unit]\nDefaultDependencies=no\nAfter=local-fs.target systemd-tmpfiles-setup.service\n"
        "Conflicts=shutdown.target\nBefore=shutdown.target\n",
    "etc/hostname": "mcqemu-cloud\n",
    "etc/hosts": "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n",
    # cloud-init renders its network configuration (DHCP on the first NIC unless the seed
    # says otherwise) for systemd-networkd, the only renderer this image has. This file
    # catches the NICs cloud-init's files do not match.
    "etc/systemd/network/99-mcqemu-dhcp.network":
        "[Match]\nName=en* eth*\n\n[Network]\nDHCP=yes\n",
    # The default waits 2 minutes for every link, which holds up cloud-init's network stage
    # when a VM has no NIC; its failure ("-") would leave the system "degraded".
    "etc/systemd/system/systemd-networkd-wait-online.service.d/mcqemu.conf":
        "[Service]\nExecStart=\nExecStart=-/lib/systemd/systemd-networkd-wait-online --any"
        " --timeout=20\n",
}
# Symlinks as `systemctl enable` makes them. qemu-guest-agent.service has no [Install]
# section: it starts from its udev rule when the org.qemu.guest_agent.0 port appears, and is
# wanted by multi-user.target here too so that it is part of the boot transaction either way.
ENABLE = {
    "multi-user.target.wants": ["qemu-guest-agent.service", "systemd-networkd.service"],
    "sockets.target.wants": ["systemd-networkd.socket"],
    "network-online.target.wants": ["systemd-networkd-wait-online.service"],
    "sysinit.target.wants": ["systemd-resolved.service"],
}
# systemd-firstboot would prompt on the console for a locale, a time zone and a root password
# on the first boot (the machine-id is empty); the apt timers would download package lists
# in the middle of a test.
MASK = ["systemd-firstboot.service", "apt-daily.timer", "apt-daily-upgrade.timer",
        "e2scrub_all.timer", "fstrim.timer", "dpkg-db-backup.timer"]


def place(staged, dest, work, manifest):
    """Writes the manifest and the `done` mark into a finished build and renames it into
    place in one step, so a concurrent build (another test binary or a run by hand) never sees
    a half-written image: whoever renames first wins, and the other uses the winner's files.
    An unfinished folder already at `dest` is moved into `work` (removed with it)."""
    with open(os.path.join(staged, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    open(os.path.join(staged, "done"), "w").close()
    if os.path.isdir(dest) and not os.path.exists(os.path.join(dest, "done")):
        try:
            os.rename(dest, os.path.join(work, "stale"))
        except OSError:
            pass
    try:
        os.rename(staged, dest)
    except OSError:
        if not os.path.exists(os.path.join(dest, "done")):
            raise


def die(msg):
    sys.exit("build_cloud: " + msg)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, **kw).stdout


def candidates(pkgs):
    """The candidate version of every package from the host's apt (one apt-cache call, ~0.6 s:
    this runs at the start of every test binary). None when the host has no apt or the
    package is unknown to it: the key then rests on the script alone."""
    if not shutil.which("apt-cache"):
        return {p: None for p in pkgs}
    try:
        out = run(["apt-cache", "policy"] + pkgs, stderr=subprocess.DEVNULL)
    except subprocess.CalledProcessError:
        return {p: None for p in pkgs}
    found = {}
    current = None
    for raw in out.splitlines():
        if raw and not raw[0].isspace() and raw.rstrip().endswith(":"):
            current = raw.rstrip()[:-1]
            continue
        line = raw.strip()
        if current and line.startswith("Candidate:"):
            v = line.split(":", 1)[1].strip()
            found[current] = v if v and v != "(none)" else None
    return {p: found.get(p) for p in pkgs}


def kernel_package():
    """linux-image-amd64's dependency (linux-image-6.1.0-NN-amd64): a new kernel ABI changes
    the key even when the metapackage's version string would not say much."""
    if not shutil.which("apt-cache"):
        return None
    try:
        out = run(["apt-cache", "depends", "linux-image-amd64"], stderr=subprocess.DEVNULL)
    except subprocess.CalledProcessError:
        return None
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Depends: linux-image-"):
            return line.split(":", 1)[1].strip()
    return None


def cache_key():
    pkgs = list(PACKAGES)
    kpkg = kernel_package()
    if kpkg:
        pkgs.append(kpkg)
    versions = candidates(pkgs)
    lines = ["%s=%s" % (p, versions[p] or "?") for p in pkgs]
    with open(os.path.abspath(__file__), "rb") as f:
        script = f.read()
    key = hashlib.sha256(script + b"\0" + "\n".join(lines).encode()).hexdigest()[:16]
    return key, lines


def check_tools():
    missing = [t for t in ("mmdebstrap", "mke2fs", "qemu-img") if not shutil.which(t)]
    if missing:
        die("%s not found; run .ci/setup-host (it installs mmdebstrap, e2fsprogs and "
            "qemu-utils)" % ", ".join(missing))
    if os.geteuid() != 0:
        die("building the test cloud image needs root (mmdebstrap's root mode, so that "
            "mke2fs -d copies files owned by root); run the tests as root once, or build it "
            "with: sudo python3 tests/cloud/build_cloud.py target/test-cloud")


def mounts_under(path):
    """Mount points at or below `path` (deepest first), from /proc/self/mountinfo."""
    path = os.path.realpath(path)
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                mp = line.split()[4].replace("\\040", " ")
                if mp == path or mp.startswith(path + "/"):
                    found.append(mp)
    except OSError:
        pass
    return sorted(found, key=len, reverse=True)


def remove_tree(path):
    """Removes a build folder that may still hold mmdebstrap's mounts (/proc, /sys, /dev/pts
    inside the chroot) when a build was killed: unmounts them first, and never crosses into
    another file system, so it cannot delete anything of the host's."""
    for mp in mounts_under(path):
        subprocess.run(["umount", "-l", mp], stderr=subprocess.DEVNULL)
    if os.path.lexists(path):
        subprocess.run(["rm", "-rf", "--one-file-system", path], stderr=subprocess.DEVNULL)


def remove_stale_builds(out_dir):
    """Removes the folders of builds whose processes (this script, mmdebstrap) are gone: the
    script was killed by the harness's timeout."""
    for name in os.listdir(out_dir):
        if not name.startswith("cloud-build-"):
            continue
        work = os.path.join(out_dir, name)
        try:
            with open(os.path.join(work, "pid")) as f:
                pids = [int(p) for p in f.read().split()]
        except (OSError, ValueError):
            pids = []
        try:
            young = time.time() - os.path.getmtime(work) < 60
        except OSError:
            continue
        if any(alive(p) for p in pids) or (not pids and young):
            continue
        remove_tree(work)


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except PermissionError:
        return True
    except OSError:
        return False


def prune_old_images(out_dir, key):
    """Removes the images of other keys (older package versions, an older script: ~550 MB
    each) finished over a day ago; a younger one may still be in use by a test process that
    started before the key changed."""
    for name in os.listdir(out_dir):
        path = os.path.join(out_dir, name)
        if name == key or len(name) != 16 or not os.path.isdir(path):
            continue
        try:
            age = time.time() - os.path.getmtime(os.path.join(path, "done"))
        except OSError:
            continue
        if age > 86400:
            remove_tree(path)


def customize(root):
    """Configures the installed tree (as root, from outside: no chroot needed)."""
    for rel, text in FILES.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.islink(path) or os.path.exists(path):
            os.unlink(path)
        with open(path, "w") as f:
            f.write(text)
    unit_dirs = [os.path.join(root, d) for d in ("lib/systemd/system", "usr/lib/systemd/system")]
    for wants, units in ENABLE.items():
        d = os.path.join(root, "etc/systemd/system", wants)
        os.makedirs(d, exist_ok=True)
        for unit in units:
            src = next((os.path.join(u, unit) for u in unit_dirs
                        if os.path.exists(os.path.join(u, unit))), None)
            if src is None:
                die("unit %s not found in the tree" % unit)
            link = os.path.join(d, unit)
            if not os.path.lexists(link):
                os.symlink("/" + os.path.relpath(src, root), link)
    for alias, unit in (("dbus-org.freedesktop.network1.service", "systemd-networkd.service"),
                        ("dbus-org.freedesktop.resolve1.service", "systemd-resolved.service")):
        link = os.path.join(root, "etc/systemd/system", alias)
        if not os.path.lexists(link):
            os.symlink("/lib/systemd/system/" + unit, link)
    # mmdebstrap leaves the host's resolv.conf in the tree; the guest's comes from resolved.
    resolv = os.path.join(root, "etc/resolv.conf")
    if os.path.lexists(resolv):
        os.unlink(resolv)
    os.symlink("../run/systemd/resolve/stub-resolv.conf", resolv)
    for unit in MASK:
        link = os.path.join(root, "etc/systemd/system", unit)
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink("/dev/null", link)
    # There is no SSH server (nor ssh-keygen): cc_ssh would log a warning and a traceback for
    # each host key type it fails to make (and `ssh_genkeytypes: []` fails the schema check).
    cfg = os.path.join(root, "etc/cloud/cloud.cfg")
    with open(cfg) as f:
        text = f.read()
    with open(cfg, "w") as f:
        f.write("".join(ln for ln in text.splitlines(True) if ln.rstrip() != " - ssh"))
    # No root password: root logs in on the serial console without one (a test image).
    shadow = os.path.join(root, "etc/shadow")
    with open(shadow) as f:
        lines = f.read().splitlines()
    lines = [("root::" + ln.split(":", 2)[2]) if ln.startswith("root:") else ln for ln in lines]
    with open(shadow, "w") as f:
        f.write("\n".join(lines) + "\n")
    # Every boot of a copy gets its own machine-id (systemd generates one when it is empty).
    with open(os.path.join(root, "etc/machine-id"), "w"):
        pass
    dbus_id = os.path.join(root, "var/lib/dbus/machine-id")
    if os.path.lexists(dbus_id) and not os.path.islink(dbus_id):
        os.unlink(dbus_id)


def installed_versions(root):
    out = run(["dpkg-query", "--admindir", os.path.join(root, "var/lib/dpkg"), "-W",
               "-f", "${Package}=${Version}\n"])
    return sorted(line for line in out.splitlines() if line)


def build(out_dir):
    key, keyed = cache_key()
    dest = os.path.join(out_dir, key)
    result = {"disk": os.path.join(dest, "disk.qcow2"),
              "kernel": os.path.join(dest, "vmlinuz"),
              "initrd": os.path.join(dest, "initrd.img"),
              "append": APPEND,
              "manifest": os.path.join(dest, "manifest.json")}
    if os.path.exists(os.path.join(dest, "done")):
        return result
    check_tools()
    os.makedirs(out_dir, exist_ok=True)
    remove_stale_builds(out_dir)
    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="cloud-build-", dir=out_dir)
    try:
        with open(os.path.join(work, "pid"), "w") as f:
            f.write(str(os.getpid()))
        rootfs = os.path.join(work, "rootfs")
        tmp = os.path.join(work, "tmp")
        os.makedirs(tmp)
        early = os.path.join(work, "early")
        for rel, text in EARLY_FILES.items():
            path = os.path.join(early, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        essential_hook = 'cp -r "%s/." "$1/"' % early
        cmd = ["mmdebstrap", "--mode=root", "--variant=apt", "--format=directory",
               "--include=" + ",".join(PACKAGES),
               "--essential-hook=" + essential_hook]
        for p in PATH_EXCLUDES:
            cmd.append("--dpkgopt=path-exclude=" + p)
        for p in PATH_INCLUDES:
            cmd.append("--dpkgopt=path-include=" + p)
        cmd += [SUITE, rootfs] + MIRRORS
        env = dict(os.environ, TMPDIR=tmp, DEBIAN_FRONTEND="noninteractive")
        t0 = time.monotonic()
        # In its own process group, so that a timeout ends apt and dpkg too.
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
        t_debootstrap = time.monotonic() - t0
        if mounts_under(rootfs):
            die("mmdebstrap left mounts in %s: %s" % (rootfs, mounts_under(rootfs)))

        customize(rootfs)
        boot = os.path.join(rootfs, "boot")
        vmlinuz = sorted(f for f in os.listdir(boot) if f.startswith("vmlinuz-"))
        initrd = sorted(f for f in os.listdir(boot) if f.startswith("initrd.img-"))
        if not vmlinuz or not initrd:
            die("no kernel or initramfs in the tree's /boot: %s" % os.listdir(boot))
        kernel_release = vmlinuz[-1][len("vmlinuz-"):]
        packages = installed_versions(rootfs)

        staged = os.path.join(work, "out")
        os.makedirs(staged)
        shutil.copyfile(os.path.join(boot, vmlinuz[-1]), os.path.join(staged, "vmlinuz"))
        shutil.copyfile(os.path.join(boot, initrd[-1]), os.path.join(staged, "initrd.img"))
        raw = os.path.join(work, "disk.raw")
        t0 = time.monotonic()
        # -d copies the tree (owners, modes, device nodes, hard links) into the new file
        # system; the file is created sparse.
        run(["mke2fs", "-q", "-F", "-t", "ext4", "-d", rootfs, "-L", "root", "-m", "1",
             raw, DISK_SIZE], stderr=subprocess.STDOUT)
        # Not compressed (-c): that would make it ~170 MB instead of ~530 MB, but takes ~15 s
        # more here and slowed boots under TCG on 2 cores by a few seconds (the host
        # decompresses every cluster the guest reads).
        run(["qemu-img", "convert", "-O", "qcow2", raw, os.path.join(staged, "disk.qcow2")])
        t_image = time.monotonic() - t0
        os.unlink(raw)
        manifest = {
            "key": key,
            "suite": SUITE,
            "mirrors": MIRRORS,
            "keyed_on": keyed,
            "kernel_release": kernel_release,
            "append": APPEND,
            "disk_virtual_size": DISK_SIZE,
            "packages": packages,
            "built_at": datetime.datetime.now(datetime.timezone.utc)
            .strftime("%Y-%m-%dT%H:%M:%SZ"),
            "build_seconds": {"mmdebstrap": round(t_debootstrap, 1),
                              "image": round(t_image, 1),
                              "total": round(time.monotonic() - started, 1)},
            "sizes": {f: os.path.getsize(os.path.join(staged, f))
                      for f in ("disk.qcow2", "vmlinuz", "initrd.img")},
        }
        place(staged, dest, work, manifest)
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
