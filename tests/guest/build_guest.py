#!/usr/bin/env python3
"""Builds mcqemu's test guest from Debian packages only: a Debian kernel (booted as an
uncompressed vmlinux through PVH), busybox-static and qemu-guest-agent with the shared
libraries it loads, packed into an uncompressed initramfs (cpio newc, written here, so no
root, no loop mounts and no cpio binary are needed).

Usage: build_guest.py OUTDIR   -> prints {"kernel": ..., "initrd": ..., "append": ...} as JSON.
The output is cached in OUTDIR/<key>/, keyed by the exact package versions.
"""
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

LIB_PACKAGES = [
    "busybox-static", "qemu-guest-agent", "libc6", "libglib2.0-0", "libnuma1", "libudev1",
    "liburing2", "libpcre2-8-0", "libffi8", "libmount1", "libselinux1", "libblkid1", "zlib1g",
]
# Loaded in dependency order: the package ships no modules.dep.
MODULES = [
    "virtio_ring", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio", "virtio_pci",
    "virtio_mmio", "virtio_console", "failover", "net_failover", "virtio_net", "virtio_blk",
    "virtio_input", "evdev", "button", "psmouse",
]
APPEND = "console=tty0 console=ttyS0 cryptomgr.notests rodata=off panic=-1 loglevel=4"

INIT = r"""#!/bin/busybox sh
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
echo "mcqemu-test-guest: ready (agent on ${agent:-none})" > /dev/ttyS0
# With mcqemu.serial_shell=1 on the kernel command line, offer a shell on the serial port
# the way busybox init's askfirst does: it starts once Enter is pressed.
case " $(cat /proc/cmdline) " in
  *" mcqemu.serial_shell=1 "*)
    (while :; do
      setsid sh -c 'exec </dev/ttyS0 >/dev/ttyS0 2>&1; echo; echo "Please press Enter to activate this console."; read x; exec sh -i'
      sleep 0.2
    done) &
    ;;
esac
while :; do sleep 3600; done
""" % {"modules": " ".join(MODULES)}

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


def candidates(pkgs):
    """The candidate version of every package, from one apt-cache call (each call costs ~0.6 s,
    and the cache check runs at the start of every test binary)."""
    out = run(["apt-cache", "policy"] + pkgs)
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


def kernel_package():
    out = run(["apt-cache", "depends", "linux-image-amd64"])
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Depends: linux-image-"):
            return line.split(":", 1)[1].strip()
    sys.exit("build_guest: cannot resolve linux-image-amd64; run 'apt-get update' first")


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


def add_tree_libs(cpio, root):
    """Copies every shared library (and its symlinks) the packages ship."""
    for libdir in ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64"]:
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


def build(out_dir):
    kpkg = kernel_package()
    pkgs = [kpkg] + LIB_PACKAGES
    versions = ["%s=%s" % (p, v) for p, v in zip(pkgs, candidates(pkgs))]
    key = hashlib.sha256(("\n".join(versions) + INIT + SHUTDOWN + APPEND).encode()).hexdigest()[:16]
    dest = os.path.join(out_dir, key)
    result = {"kernel": os.path.join(dest, "vmlinux"), "initrd": os.path.join(dest, "initrd.cpio"),
              "append": APPEND, "packages": versions}
    if os.path.exists(os.path.join(dest, "done")):
        return result
    os.makedirs(out_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="guest-build-", dir=out_dir)
    try:
        debs = os.path.join(work, "debs")
        os.makedirs(debs)
        run(["apt-get", "download", "-o", "APT::Sandbox::User=root"] + versions, cwd=debs)
        root = os.path.join(work, "root")
        kroot = os.path.join(work, "kernel")
        for deb in sorted(os.listdir(debs)):
            target = kroot if deb.startswith("linux-image-") else root
            run(["dpkg-deb", "-x", os.path.join(debs, deb), target])
        boot = os.path.join(kroot, "boot")
        vmlinuz = [f for f in os.listdir(boot) if f.startswith("vmlinuz-")][0]
        vmlinux = extract_vmlinux(os.path.join(boot, vmlinuz))

        cpio = Cpio()
        for d in ["bin", "sbin", "usr/bin", "usr/sbin", "dev", "proc", "sys", "tmp", "run", "etc/acpi/PWRF",
                  "lib/modules", "root", "var"]:
            cpio.dir(d)
        cpio.chardev("dev/console", 5, 1)
        cpio.chardev("dev/null", 1, 3)
        cpio.file("init", INIT.encode())
        cpio.file("bin/busybox", open(os.path.join(root, "bin/busybox"), "rb").read())
        cpio.file("sbin/shutdown", SHUTDOWN.encode())
        cpio.file("etc/acpi/PWRF/00000080", POWER_BUTTON.encode())
        cpio.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n", 0o644)
        cpio.file("etc/group", b"root:x:0:\n", 0o644)
        ga = os.path.join(root, "usr/sbin/qemu-ga")
        if not os.path.exists(ga):
            ga = os.path.join(root, "usr/bin/qemu-ga")
        cpio.file("usr/sbin/qemu-ga", open(ga, "rb").read())
        add_tree_libs(cpio, root)
        moddir = [d for d in os.listdir(os.path.join(kroot, "lib/modules"))][0]
        mroot = os.path.join(kroot, "lib/modules", moddir, "kernel")
        found = {}
        for dirpath, _, files in os.walk(mroot):
            for f in files:
                if f.endswith(".ko"):
                    found[f[:-3]] = os.path.join(dirpath, f)
        for m in MODULES:
            if m not in found:
                sys.exit("build_guest: kernel module %s not found" % m)
            cpio.file("lib/modules/%s.ko" % m, open(found[m], "rb").read(), 0o644)

        # Everything is written into a private folder first and renamed into place in one
        # step, so a concurrent build (another test binary) never sees or clobbers a half-written
        # guest: whoever renames first wins, and the loser uses the winner's files.
        staged = os.path.join(work, "out")
        os.makedirs(staged)
        with open(os.path.join(staged, "vmlinux"), "wb") as f:
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


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(json.dumps(build(os.path.abspath(sys.argv[1]))))
