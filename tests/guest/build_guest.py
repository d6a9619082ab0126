#!/usr/bin/env python3
"""Builds mcqemu's test guest from Debian packages only: a Debian kernel, busybox-static and
qemu-guest-agent with the shared libraries it loads, packed into an uncompressed initramfs (cpio
newc, written here, so no root, no loop mounts and no cpio binary are needed).

Two architectures:
- x86_64 (the default): Debian's amd64 packages from the host's own apt lists; the kernel is
  booted as an uncompressed vmlinux through PVH.
- aarch64: Debian's arm64 packages, from apt lists of their own (arm64 added to apt's
  architectures for a private list folder, OUTDIR/apt-arm64, refreshed once a day); the kernel
  is the raw arm64 Image (it carries the EFI stub, so QEMU's -kernel on the virt board and
  UEFI firmware both boot it), the serial console ttyAMA0.

With --agent PATH (a static mcqemu-agent), the guest carries mcqemu's own agent instead of
qemu-ga: `--agent-mode service` starts it from the busybox init script as qemu-ga was started;
`--agent-mode init` makes it the guest's PID 1 (/init), with the modules it loads listed in
/etc/mcqemu-agent/modules and the rest of the set-up (busybox's links, the serial shell) in
/etc/mcqemu-agent/start; `--agent-mode bare` is a root with no shell at all: the agent as
/init, its module list, and one static program (/bin/busybox, without its links).

Usage: build_guest.py [--arch x86_64|aarch64] [--agent PATH [--agent-mode service|init|bare]] OUTDIR
  -> prints {"kernel": ..., "initrd": ..., "append": ..., "packages": [...]} as JSON.
The output is cached in OUTDIR/<key>/, keyed by the exact package versions (and the init
script and command line), so each architecture has keys of its own.
"""
import gzip
import hashlib
import io
import json
import lzma
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time

LIB_PACKAGES = [
    "busybox-static", "qemu-guest-agent", "libc6", "libglib2.0-0", "libnuma1", "libudev1",
    "liburing2", "libpcre2-8-0", "libffi8", "libmount1", "libselinux1", "libblkid1", "zlib1g",
]
# Loaded in dependency order: the package ships no modules.dep.
MODULES = [
    "virtio_ring", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio", "virtio_pci",
    "virtio_mmio", "virtio_console", "failover", "net_failover", "virtio_net", "virtio_blk",
    "virtio_input", "evdev", "button", "psmouse", "fuse",
]
APPEND = "console=tty0 console=ttyS0 cryptomgr.notests rodata=off panic=-1 loglevel=4"

# Debian's arm64 kernel on QEMU's virt board. Built in (=y) there, so not listed: the virtio
# core, the PL011 serial port (ttyAMA0), the PL031 RTC, the PL061 GPIO, PCI's generic host, the
# ACPI power button, fbcon. Modules (=m), in dependency order (each module's own `depends=`
# is checked against this order when the guest is built): virtio over PCI and MMIO, the agent's
# virtio-serial channel, the network and disks, virtio input (the tablet) and evdev, gpio_keys
# (the power button when booted with a device tree rather than ACPI), the screen (virtio-gpu on
# DRM, the virt board has no VGA), and a USB keyboard or tablet on xHCI.
MODULES_ARM64 = [
    "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci", "virtio_mmio",
    "virtio_console", "failover", "net_failover", "virtio_net", "virtio_blk", "virtio_input",
    "evdev", "gpio_keys", "drm", "drm_kms_helper", "drm_shmem_helper", "virtio_dma_buf",
    "virtio_gpu", "usb_common", "usbcore", "xhci_hcd", "xhci_pci", "hid", "usbhid",
    "hid_generic", "fuse",
]
APPEND_ARM64 = "console=tty0 console=ttyAMA0 cryptomgr.notests rodata=off panic=-1 loglevel=4"

INIT_TEMPLATE = r"""#!/bin/busybox sh
/bin/busybox mkdir -p /bin /sbin /usr/bin /usr/sbin
/bin/busybox --install -s /bin
# qemu-ga's guest-set-time runs /sbin/hwclock, which --install -s put in /bin.
/bin/busybox ln -sf /bin/busybox /sbin/hwclock
export PATH=/sbin:/usr/sbin:/bin:/usr/bin
mkdir -p /proc /sys /dev /tmp /run /var
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
ln -sf /run /var/run
for m in %(modules)s; do
  [ -e /lib/modules/$m.ko ] && insmod /lib/modules/$m.ko 2>/dev/null
done
hostname mcqemu-guest
ip link set lo up
if [ -e /sys/class/net/eth0 ]; then
  ip link set eth0 up
  ip addr add 10.0.2.15/24 dev eth0
  ip route add default via 10.0.2.2
fi
mkdir -p /var/log
acpid -c /etc/acpi -l /run/acpid.log
agent=""
i=0
while [ -z "$agent" ] && [ $i -lt 50 ]; do
  for p in /sys/class/virtio-ports/*; do
    [ -e "$p/name" ] || continue
    if [ "$(cat $p/name)" = "org.qemu.guest_agent.0" ]; then agent=/dev/${p##*/}; fi
  done
  [ -z "$agent" ] && sleep 0.1
  i=$((i+1))
done
if [ -n "$agent" ]; then
  (while :; do qemu-ga -m virtio-serial -p "$agent" -t /run; sleep 0.2; done) &
fi
echo "mcqemu-test-guest: ready (agent on ${agent:-none})" > /dev/%(serial)s
# With mcqemu.serial_shell=1 on the kernel command line, offer a shell on the serial port
# the way busybox init's askfirst does: it starts once Enter is pressed.
case " $(cat /proc/cmdline) " in
  *" mcqemu.serial_shell=1 "*)
    (while :; do
      setsid sh -c 'exec </dev/%(serial)s >/dev/%(serial)s 2>&1; echo; echo "Please press Enter to activate this console."; read x; exec sh -i'
      sleep 0.2
    done) &
    ;;
esac
while :; do sleep 3600; done
"""
INIT = INIT_TEMPLATE % {"modules": " ".join(MODULES), "serial": "ttyS0"}
INIT_ARM64 = INIT_TEMPLATE % {"modules": " ".join(MODULES_ARM64), "serial": "ttyAMA0"}

# mcqemu-agent in qemu-ga's place, started the same way.
QEMU_GA_LOOP = '(while :; do qemu-ga -m virtio-serial -p "$agent" -t /run; sleep 0.2; done) &'
AGENT_LOOP = '(while :; do /usr/sbin/mcqemu-agent --port "$agent"; sleep 0.2; done) &'

# With mcqemu-agent as PID 1: what the init script did besides mounting, loading modules,
# naming the host, the network and the power button (the agent's own), run by the agent.
START_TEMPLATE = r"""#!/bin/busybox sh
/bin/busybox mkdir -p /bin /sbin /usr/bin /usr/sbin
/bin/busybox --install -s /bin
/bin/busybox ln -sf /bin/busybox /sbin/hwclock
export PATH=/sbin:/usr/sbin:/bin:/usr/bin
ln -sf /run /var/run
echo "mcqemu-test-guest: ready (agent: mcqemu-agent as PID 1)" > /dev/%(serial)s
case " $(cat /proc/cmdline) " in
  *" mcqemu.serial_shell=1 "*)
    (while :; do
      setsid sh -c 'exec </dev/%(serial)s >/dev/%(serial)s 2>&1; echo; echo "Please press Enter to activate this console."; read x; exec sh -i'
      sleep 0.2
    done) &
    ;;
esac
"""

SHUTDOWN = """#!/bin/sh
# busybox has no shutdown(8); qemu-ga runs /sbin/shutdown for guest-shutdown.
for a in "$@"; do
  case "$a" in
    -r) exec reboot -f ;;
    -H) exec halt -f ;;
  esac
done
exec poweroff -f
"""

POWER_BUTTON = "#!/bin/sh\nexec poweroff -f\n"


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, **kw).stdout


def candidates(pkgs, apt_opts=()):
    """The candidate version of every package, from one apt-cache call (each call costs ~0.6 s,
    and the cache check runs at the start of every test binary)."""
    out = run(["apt-cache"] + list(apt_opts) + ["policy"] + pkgs)
    found = {}
    current = None
    for raw in out.splitlines():
        if raw and not raw[0].isspace() and raw.rstrip().endswith(":"):
            current = raw.rstrip()[:-1]
            continue
        line = raw.strip()
        if current and line.startswith("Candidate:"):
            v = line.split(":", 1)[1].strip()
            if v and v != "(none)":
                found[current] = v
    for pkg in pkgs:
        if pkg not in found:
            sys.exit("build_guest: no candidate for %s; run 'apt-get update' first" % pkg)
    return [found[p] for p in pkgs]


def kernel_package(meta="linux-image-amd64", apt_opts=()):
    out = run(["apt-cache"] + list(apt_opts) + ["depends", meta])
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Depends: linux-image-"):
            return line.split(":", 1)[1].strip()
    sys.exit("build_guest: cannot resolve %s; run 'apt-get update' first" % meta)


# How long the private arm64 lists are used before they are refreshed: Debian's archive keeps
# only the newest version of a package, so a list much older than the archive names .debs that
# are gone (a failed download refreshes them too).
LISTS_MAX_AGE_S = 24 * 3600


def private_apt(out_dir, deb_arch):
    """apt options for lists of their own with `deb_arch` added to apt's architectures (the
    host's sources, its own lists and its package cache are left alone)."""
    base = os.path.join(out_dir, "apt-" + deb_arch)
    return base, [
        "-o", "APT::Architectures::=" + deb_arch,
        "-o", "Dir::State::Lists=" + os.path.join(base, "lists"),
        "-o", "Dir::Cache=" + os.path.join(base, "cache"),
        "-o", "APT::Sandbox::User=root",
    ]


def refresh_lists(out_dir, deb_arch, force=False):
    """Runs apt-get update on the private lists when they are missing, older than
    LISTS_MAX_AGE_S, or `force`d; returns the apt options that read them."""
    base, opts = private_apt(out_dir, deb_arch)
    stamp = os.path.join(base, "updated")
    try:
        fresh = time.time() - os.path.getmtime(stamp) < LISTS_MAX_AGE_S
    except OSError:
        fresh = False
    if force or not fresh:
        os.makedirs(os.path.join(base, "lists", "partial"), exist_ok=True)
        os.makedirs(os.path.join(base, "cache", "archives", "partial"), exist_ok=True)
        proc = subprocess.run(["apt-get", "-q"] + opts + ["update"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            lists = os.path.join(base, "lists")
            if not force and any("binary-%s_Packages" % deb_arch in f for f in os.listdir(lists)):
                # Lists from an earlier update still name what the archive had then.
                sys.stderr.write("build_guest: apt-get update of the %s lists failed; using the "
                                 "older lists in %s:\n%s\n" % (deb_arch, lists, proc.stdout[-2000:]))
                return opts
            sys.exit("build_guest: apt-get update of the %s lists in %s failed:\n%s"
                     % (deb_arch, base, proc.stdout[-4000:]))
        with open(stamp, "w") as f:
            f.write(time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))
    return opts


def extract_vmlinux(bzimage):
    data = open(bzimage, "rb").read()
    pos = data.find(b"\xfd7zXZ\x00")
    while pos >= 0:
        try:
            out = lzma.LZMADecompressor().decompress(data[pos:])
            if out[:4] == b"\x7fELF":
                return out
        except lzma.LZMAError:
            pass
        pos = data.find(b"\xfd7zXZ\x00", pos + 1)
    sys.exit("build_guest: no xz-compressed ELF payload in %s" % bzimage)


def extract_arm64_image(vmlinuz):
    """The raw arm64 Image that QEMU's -kernel takes on the virt board: Debian's vmlinuz is that
    Image already (an EFI-stub PE with the arm64 header); a gzip'd one is unpacked."""
    data = open(vmlinuz, "rb").read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    if data[0x38:0x3C] != b"ARM\x64":
        sys.exit("build_guest: %s is not an arm64 Image (no ARM\\x64 magic at 0x38)" % vmlinuz)
    return data


class Cpio:
    """A cpio 'newc' archive writer."""

    def __init__(self):
        self.buf = io.BytesIO()
        self.ino = 1
        self.names = set()

    def _entry(self, name, mode, data=b"", rdev=(0, 0)):
        name = name.lstrip("/")
        if name in self.names:
            return
        self.names.add(name)
        namez = name.encode() + b"\0"
        fields = [self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(namez), 0]
        self.ino += 1
        self.buf.write(b"070701" + b"".join(b"%08X" % f for f in fields))
        self.buf.write(namez)
        self.buf.write(b"\0" * ((4 - (110 + len(namez)) % 4) % 4))
        self.buf.write(data)
        self.buf.write(b"\0" * ((4 - len(data) % 4) % 4))

    def dir(self, name):
        parts = name.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            self._entry("/".join(parts[:i]), stat.S_IFDIR | 0o755)

    def file(self, name, data, mode=0o755):
        self.dir(os.path.dirname(name.strip("/")) or ".")
        self._entry(name, stat.S_IFREG | mode, data)

    def symlink(self, name, target):
        self.dir(os.path.dirname(name.strip("/")) or ".")
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

    def chardev(self, name, major, minor):
        self._entry(name, stat.S_IFCHR | 0o600, rdev=(major, minor))

    def finish(self):
        self.names.discard("TRAILER!!!")
        self._entry("TRAILER!!!", 0)
        return self.buf.getvalue()


def add_tree_libs(cpio, root, libdirs=("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64")):
    """Copies every shared library (and its symlinks) the packages ship."""
    for libdir in libdirs:
        base = os.path.join(root, libdir)
        if not os.path.isdir(base):
            continue
        for name in sorted(os.listdir(base)):
            path = os.path.join(base, name)
            if ".so" not in name:
                continue
            if os.path.islink(path):
                cpio.symlink(libdir + "/" + name, os.readlink(path))
            elif os.path.isfile(path):
                cpio.file(libdir + "/" + name, open(path, "rb").read())


class Arch:
    """What differs between the architectures' guests."""

    def __init__(self, deb_arch, kernel_meta, kernel_file, extract, modules, init, append,
                 libdirs, private_lists):
        self.deb_arch = deb_arch
        self.kernel_meta = kernel_meta
        self.kernel_file = kernel_file
        self.extract = extract
        self.modules = modules
        self.init = init
        self.append = append
        self.libdirs = libdirs
        # True: Debian's packages of this architecture come from lists of their own (the
        # host's apt knows only its own architecture), and are named pkg:ARCH.
        self.private_lists = private_lists


ARCHES = {
    "x86_64": Arch("amd64", "linux-image-amd64", "vmlinux", extract_vmlinux, MODULES, INIT,
                   APPEND, ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64"), False),
    "aarch64": Arch("arm64", "linux-image-arm64:arm64", "Image", extract_arm64_image,
                    MODULES_ARM64, INIT_ARM64, APPEND_ARM64,
                    ("lib/aarch64-linux-gnu", "usr/lib/aarch64-linux-gnu", "lib"), True),
}


class DownloadFailed(Exception):
    pass


def module_depends(path):
    """The modules a .ko says it needs (its .modinfo `depends=`), names with '_'."""
    data = open(path, "rb").read()
    for field in data.split(b"\0"):
        if field.startswith(b"depends="):
            return [d.replace("-", "_") for d in field[8:].decode().split(",") if d]
    return []


def build(out_dir, arch="x86_64", force_update=False, agent=None, agent_mode="service"):
    a = ARCHES[arch]
    serial = "ttyAMA0" if arch == "aarch64" else "ttyS0"
    init = a.init
    start = None
    agent_bytes = b""
    if agent:
        agent_bytes = open(agent, "rb").read()
        if agent_mode == "service":
            init = init.replace(QEMU_GA_LOOP, AGENT_LOOP)
        elif agent_mode == "init":
            start = START_TEMPLATE % {"serial": serial}
    bare = bool(agent) and agent_mode == "bare"
    apt_opts = refresh_lists(out_dir, a.deb_arch, force_update) if a.private_lists else []
    kpkg = kernel_package(a.kernel_meta, apt_opts)
    lib_packages = LIB_PACKAGES
    if a.private_lists:
        lib_packages = ["%s:%s" % (p, a.deb_arch) for p in LIB_PACKAGES]
    pkgs = [kpkg] + lib_packages
    versions = ["%s=%s" % (p, v) for p, v in zip(pkgs, candidates(pkgs, apt_opts))]
    keyed = ("\n".join(versions) + init + SHUTDOWN + a.append).encode()
    if agent:
        keyed += hashlib.sha256(agent_bytes).hexdigest().encode() + agent_mode.encode()
    key = hashlib.sha256(keyed).hexdigest()[:16]
    dest = os.path.join(out_dir, key)
    result = {"kernel": os.path.join(dest, a.kernel_file), "initrd": os.path.join(dest, "initrd.cpio"),
              "append": a.append, "packages": versions}
    if os.path.exists(os.path.join(dest, "done")):
        return result
    os.makedirs(out_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="guest-build-", dir=out_dir)
    try:
        debs = os.path.join(work, "debs")
        os.makedirs(debs)
        download = ["apt-get"] + apt_opts + ["download", "-o", "APT::Sandbox::User=root"] + versions
        try:
            run(download, cwd=debs)
        except subprocess.CalledProcessError:
            if a.private_lists and not force_update:
                raise DownloadFailed()
            raise
        root = os.path.join(work, "root")
        kroot = os.path.join(work, "kernel")
        for deb in sorted(os.listdir(debs)):
            target = kroot if deb.startswith("linux-image-") else root
            run(["dpkg-deb", "-x", os.path.join(debs, deb), target])
        boot = os.path.join(kroot, "boot")
        vmlinuz = [f for f in os.listdir(boot) if f.startswith("vmlinuz-")][0]
        vmlinux = a.extract(os.path.join(boot, vmlinuz))

        cpio = Cpio()
        for d in ["bin", "sbin", "usr/bin", "usr/sbin", "dev", "proc", "sys", "tmp", "run", "etc/acpi/PWRF",
                  "lib/modules", "root", "var"]:
            cpio.dir(d)
        cpio.chardev("dev/console", 5, 1)
        cpio.chardev("dev/null", 1, 3)
        modules_list = "".join("/lib/modules/%s.ko\n" % m for m in a.modules).encode()
        if bare:
            # No shell, no libraries, nothing else: the agent as /init and one static program
            # (busybox, without its links: there is no /bin/sh).
            cpio.file("init", agent_bytes)
            cpio.dir("etc/mcqemu-agent")
            cpio.file("etc/mcqemu-agent/modules", modules_list, 0o644)
            cpio.file("etc/hostname", b"mcqemu-bare\n", 0o644)
            cpio.file("bin/busybox", open(os.path.join(root, "bin/busybox"), "rb").read())
        elif start is None:
            cpio.file("init", init.encode())
        else:
            cpio.file("init", agent_bytes)
            cpio.dir("etc/mcqemu-agent")
            cpio.file("etc/mcqemu-agent/start", start.encode())
            cpio.file("etc/hostname", b"mcqemu-guest\n", 0o644)
            cpio.file("etc/mcqemu-agent/modules", modules_list, 0o644)
        if not bare:
            cpio.file("bin/busybox", open(os.path.join(root, "bin/busybox"), "rb").read())
            cpio.file("sbin/shutdown", SHUTDOWN.encode())
            cpio.file("etc/acpi/PWRF/00000080", POWER_BUTTON.encode())
            cpio.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n", 0o644)
            cpio.file("etc/group", b"root:x:0:\n", 0o644)
            if agent:
                cpio.file("usr/sbin/mcqemu-agent", agent_bytes)
            else:
                ga = os.path.join(root, "usr/sbin/qemu-ga")
                if not os.path.exists(ga):
                    ga = os.path.join(root, "usr/bin/qemu-ga")
                cpio.file("usr/sbin/qemu-ga", open(ga, "rb").read())
            add_tree_libs(cpio, root, a.libdirs)
        moddir = [d for d in os.listdir(os.path.join(kroot, "lib/modules"))][0]
        mroot = os.path.join(kroot, "lib/modules", moddir, "kernel")
        found = {}
        for dirpath, _, files in os.walk(mroot):
            for f in files:
                if f.endswith(".ko"):
                    found[f[:-3]] = os.path.join(dirpath, f)
        # Module names use '_' where some file names have '-' (virtio-gpu.ko, xhci-pci.ko).
        for name in list(found):
            found.setdefault(name.replace("-", "_"), found[name])
        for i, m in enumerate(a.modules):
            if m not in found:
                sys.exit("build_guest: kernel module %s not found" % m)
            missing = [d for d in module_depends(found[m]) if d not in a.modules[:i]]
            if missing:
                sys.exit("build_guest: kernel module %s needs %s loaded before it; add it to the "
                         "%s module list" % (m, ", ".join(missing), arch))
            cpio.file("lib/modules/%s.ko" % m, open(found[m], "rb").read(), 0o644)

        # Everything is written into a private folder first and renamed into place in one
        # step, so a concurrent build (another test binary) never sees or clobbers a half-written
        # guest: whoever renames first wins, and the loser uses the winner's files.
        staged = os.path.join(work, "out")
        os.makedirs(staged)
        with open(os.path.join(staged, a.kernel_file), "wb") as f:
            f.write(vmlinux)
        with open(os.path.join(staged, "initrd.cpio"), "wb") as f:
            f.write(cpio.finish())
        with open(os.path.join(staged, "packages.txt"), "w") as f:
            f.write("\n".join(versions) + "\n")
        open(os.path.join(staged, "done"), "w").close()
        if os.path.isdir(dest) and not os.path.exists(os.path.join(dest, "done")):
            # A leftover of an interrupted non-atomic build: move it aside, then drop it.
            try:
                os.rename(dest, os.path.join(work, "stale"))
            except OSError:
                pass
        try:
            os.rename(staged, dest)
        except OSError:
            if not os.path.exists(os.path.join(dest, "done")):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


def main(argv):
    opts = {"--arch": "x86_64", "--agent": None, "--agent-mode": "service"}
    args = argv[1:]
    while len(args) >= 2 and args[0] in opts:
        opts[args[0]] = args[1]
        args = args[2:]
    arch, agent, mode = opts["--arch"], opts["--agent"], opts["--agent-mode"]
    if len(args) != 1 or arch not in ARCHES or mode not in ("service", "init", "bare"):
        sys.exit(__doc__)
    out_dir = os.path.abspath(args[0])
    agent = os.path.abspath(agent) if agent else None
    try:
        result = build(out_dir, arch, agent=agent, agent_mode=mode)
    except DownloadFailed:
        # The private lists name versions the archive no longer has: refresh them once.
        result = build(out_dir, arch, force_update=True, agent=agent, agent_mode=mode)
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv)
