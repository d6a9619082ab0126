#!/usr/bin/env python3
"""Builds mcqemu's desktop test image: Debian 12 with a real X server (Xorg, the modesetting
driver on QEMU's std VGA through bochs-drm, libinput for the PS/2 keyboard and the virtio
tablet), the openbox window manager and desktop_app.py, a full-screen Tk program that logs
every input event it receives to /run/desktop/events.jsonl. X starts at boot from a systemd
unit (root, vt7, no display manager); the screen mode is 1280x800 unless the kernel command
line says `mcqemu.mode=WxH`, and `desktop-mode WxH` (run through the guest agent) switches it
with xrandr and restarts the program. qemu-guest-agent answers early, as in build_cloud.py.

Made like build_cloud.py (whose helpers it imports): mmdebstrap (root mode) from Debian's
packages, an ext4 file system written with `mke2fs -d` (no loop devices, no mounts), qcow2,
and the kernel and initramfs copied out for direct kernel boot with APPEND.

Usage: build_desktop.py OUTDIR -> prints {"disk", "kernel", "initrd", "append", "manifest",
"events"} as JSON. Cached in OUTDIR/<key>/, keyed by this script, build_cloud.py,
desktop_app.py and the candidate versions of the packages.

Needs root, mmdebstrap, mke2fs, qemu-img and access to deb.debian.org (`.ci/setup-host`).
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

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import build_cloud  # noqa: E402
from build_cloud import (  # noqa: E402
    candidates, mounts_under, prune_old_images, remove_tree, run)

APP = os.path.join(HERE, "desktop_app.py")
# Without recommends. x11-xserver-utils: xrandr and xsetroot; xinit starts X and the session.
PACKAGES = [
    "systemd", "systemd-sysv", "udev", "dbus", "qemu-guest-agent", "linux-image-amd64",
    "initramfs-tools", "zstd", "kmod", "procps", "xserver-xorg-core",
    "xserver-xorg-input-libinput", "xinit", "x11-xserver-utils", "openbox", "python3-tk",
    "fonts-dejavu-core",
]
APPEND = "root=/dev/vda rw console=ttyS0 quiet"
EVENTS = "/run/desktop/events.jsonl"
MMDEBSTRAP_TIMEOUT = 12 * 60
DISK_SIZE = "2G"
# build_cloud's excludes (docs, and drivers for hardware QEMU does not emulate here), but
# the tiny DRM drivers (bochs) stay.
PATH_EXCLUDES = build_cloud.PATH_EXCLUDES + [
    "/lib/modules/*/kernel/drivers/net/ethernet/*",
    "/lib/modules/*/kernel/drivers/scsi/*",
    "/lib/modules/*/kernel/fs/btrfs/*", "/lib/modules/*/kernel/fs/xfs/*",
    "/lib/modules/*/kernel/fs/ocfs2/*", "/lib/modules/*/kernel/fs/nfs*",
    "/usr/share/icons/*",
]
PATH_INCLUDES = build_cloud.PATH_INCLUDES
EARLY_FILES = dict(build_cloud.EARLY_FILES)

SESSION = """#!/bin/sh
# The X session: the screen mode, a plain background, openbox, and the test program, restarted
# whenever it exits (desktop-mode restarts it after a mode change).
mode=$(sed -n 's/.*mcqemu\\.mode=\\([0-9]*x[0-9]*\\).*/\\1/p' /proc/cmdline)
/usr/local/bin/desktop-mode --no-restart "${mode:-1280x800}"
xsetroot -solid '#204060'
openbox &
mkdir -p /run/desktop
while :; do
  python3 /opt/mcqemu-desktop/desktop_app.py %s
  sleep 0.5
done
""" % EVENTS

# Sets the screen mode (adding it with cvt when the monitor's list lacks it) and restarts the
# program, which logs "ready" with its new layout.
DESKTOP_MODE = """#!/bin/sh
restart=true
[ "$1" = "--no-restart" ] && { restart=false; shift; }
mode="$1"
export DISPLAY=:0
out=$(xrandr | awk '/ connected/ {print $1; exit}')
[ -n "$out" ] || { echo "desktop-mode: no connected output" >&2; exit 1; }
if ! xrandr | grep -q "^ *$mode "; then
  set -- $(cvt ${mode%%x*} ${mode##*x} | sed -n 's/^Modeline //p' | tr -d '"')
  xrandr --newmode "$mode" $(echo "$@" | cut -d' ' -f2-)
  xrandr --addmode "$out" "$mode"
fi
xrandr --output "$out" --mode "$mode" || exit 1
if $restart; then
  pkill -f /opt/mcqemu-desktop/desktop_app.py
fi
echo "$mode"
"""

UNIT = """[Unit]
Description=mcqemu test desktop (Xorg on vt7, openbox, desktop_app.py)
After=systemd-udevd.service systemd-user-sessions.service

[Service]
Environment=HOME=/root
ExecStartPre=-/sbin/modprobe bochs
ExecStartPre=/bin/sh -c 'for i in $(seq 100); do [ -e /dev/dri/card0 ] && exit 0; sleep 0.1; done; exit 1'
ExecStart=/usr/bin/xinit /opt/mcqemu-desktop/session -- /usr/lib/xorg/Xorg :0 vt7 -nolisten tcp -s 0 -dpms -novtswitch
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
"""

FILES = {
    "etc/fstab": build_cloud.FSTAB,
    "etc/hostname": "mcqemu-desktop\n",
    "etc/hosts": build_cloud.FILES["etc/hosts"],
    "etc/default/locale": "LANG=C.UTF-8\n",
    "etc/systemd/system/qemu-guest-agent.service.d/mcqemu.conf":
        build_cloud.FILES["etc/systemd/system/qemu-guest-agent.service.d/mcqemu.conf"],
    "etc/systemd/system/mcqemu-desktop.service": UNIT,
    # No screen blanking, and X's keyboard layout stays us.
    "etc/X11/xorg.conf.d/10-mcqemu.conf":
        'Section "ServerFlags"\n  Option "BlankTime" "0"\n  Option "StandbyTime" "0"\n'
        '  Option "SuspendTime" "0"\n  Option "OffTime" "0"\nEndSection\n',
    "opt/mcqemu-desktop/session": SESSION,
    "usr/local/bin/desktop-mode": DESKTOP_MODE,
}
EXECUTABLE = ["opt/mcqemu-desktop/session", "usr/local/bin/desktop-mode"]
ENABLE = {"multi-user.target.wants": ["qemu-guest-agent.service", "mcqemu-desktop.service"]}
MASK = ["systemd-firstboot.service", "apt-daily.timer", "apt-daily-upgrade.timer",
        "e2scrub_all.timer", "fstrim.timer", "dpkg-db-backup.timer", "getty@tty1.service"]


def die(msg):
    sys.exit("build_desktop: " + msg)


def cache_key():
    pkgs = list(PACKAGES)
    kpkg = build_cloud.kernel_package()
    if kpkg:
        pkgs.append(kpkg)
    versions = candidates(pkgs)
    lines = ["%s=%s" % (p, versions[p] or "?") for p in pkgs]
    h = hashlib.sha256()
    for f in (__file__, build_cloud.__file__, APP):
        with open(os.path.abspath(f), "rb") as fh:
            h.update(fh.read() + b"\0")
    h.update("\n".join(lines).encode())
    return h.hexdigest()[:16], lines


def customize(root):
    files = dict(FILES)
    with open(APP) as f:
        files["opt/mcqemu-desktop/desktop_app.py"] = f.read()
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.lexists(path):
            os.unlink(path)
        with open(path, "w") as f:
            f.write(text)
    for rel in EXECUTABLE:
        os.chmod(os.path.join(root, rel), 0o755)
    for wants, units in ENABLE.items():
        d = os.path.join(root, "etc/systemd/system", wants)
        os.makedirs(d, exist_ok=True)
        for unit in units:
            src = next((p for p in ("/etc/systemd/system/" + unit, "/lib/systemd/system/" + unit,
                                    "/usr/lib/systemd/system/" + unit)
                        if os.path.exists(root + p)), None)
            if src is None:
                die("unit %s not found in the tree" % unit)
            link = os.path.join(d, unit)
            if not os.path.lexists(link):
                os.symlink(src, link)
    for unit in MASK:
        link = os.path.join(root, "etc/systemd/system", unit)
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink("/dev/null", link)
    shadow = os.path.join(root, "etc/shadow")
    with open(shadow) as f:
        lines = f.read().splitlines()
    lines = [("root::" + ln.split(":", 2)[2]) if ln.startswith("root:") else ln for ln in lines]
    with open(shadow, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(root, "etc/machine-id"), "w"):
        pass


def mmdebstrap(work, rootfs):
    tmp = os.path.join(work, "tmp")
    os.makedirs(tmp)
    early = os.path.join(work, "early")
    for rel, text in EARLY_FILES.items():
        path = os.path.join(early, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    cmd = ["mmdebstrap", "--mode=root", "--variant=apt", "--format=directory",
           "--include=" + ",".join(PACKAGES), "--essential-hook=" + 'cp -r "%s/." "$1/"' % early]
    cmd += ["--dpkgopt=path-exclude=" + p for p in PATH_EXCLUDES]
    cmd += ["--dpkgopt=path-include=" + p for p in PATH_INCLUDES]
    cmd += [build_cloud.SUITE, rootfs] + build_cloud.MIRRORS
    env = dict(os.environ, TMPDIR=tmp, DEBIAN_FRONTEND="noninteractive")
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
        die("mmdebstrap did not finish within %d s:\n%s" % (MMDEBSTRAP_TIMEOUT, log[-6000:]))
    if proc.returncode != 0:
        die("mmdebstrap failed (exit %d):\n%s" % (proc.returncode, log[-6000:]))
    if mounts_under(rootfs):
        die("mmdebstrap left mounts in %s: %s" % (rootfs, mounts_under(rootfs)))


def build(out_dir):
    key, keyed = cache_key()
    dest = os.path.join(out_dir, key)
    result = {"disk": os.path.join(dest, "disk.qcow2"), "kernel": os.path.join(dest, "vmlinuz"),
              "initrd": os.path.join(dest, "initrd.img"), "append": APPEND,
              "manifest": os.path.join(dest, "manifest.json"), "events": EVENTS}
    if os.path.exists(os.path.join(dest, "done")):
        return result
    build_cloud.check_tools()
    os.makedirs(out_dir, exist_ok=True)
    build_cloud.remove_stale_builds(out_dir)
    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="cloud-build-", dir=out_dir)
    try:
        with open(os.path.join(work, "pid"), "w") as f:
            f.write(str(os.getpid()))
        rootfs = os.path.join(work, "rootfs")
        t0 = time.monotonic()
        mmdebstrap(work, rootfs)
        t_mmdebstrap = time.monotonic() - t0
        customize(rootfs)
        boot = os.path.join(rootfs, "boot")
        vmlinuz = sorted(f for f in os.listdir(boot) if f.startswith("vmlinuz-"))
        initrd = sorted(f for f in os.listdir(boot) if f.startswith("initrd.img-"))
        if not vmlinuz or not initrd:
            die("no kernel or initramfs in the tree's /boot: %s" % os.listdir(boot))
        packages = build_cloud.installed_versions(rootfs)
        staged = os.path.join(work, "out")
        os.makedirs(staged)
        shutil.copyfile(os.path.join(boot, vmlinuz[-1]), os.path.join(staged, "vmlinuz"))
        shutil.copyfile(os.path.join(boot, initrd[-1]), os.path.join(staged, "initrd.img"))
        raw = os.path.join(work, "disk.raw")
        t0 = time.monotonic()
        run(["mke2fs", "-q", "-F", "-t", "ext4", "-d", rootfs, "-L", "root", "-m", "1",
             raw, DISK_SIZE], stderr=subprocess.STDOUT)
        run(["qemu-img", "convert", "-O", "qcow2", raw, os.path.join(staged, "disk.qcow2")])
        os.unlink(raw)
        t_image = time.monotonic() - t0
        manifest = {
            "key": key, "suite": build_cloud.SUITE, "keyed_on": keyed,
            "kernel_release": vmlinuz[-1][len("vmlinuz-"):], "append": APPEND,
            "events": EVENTS, "packages": packages,
            "built_at": datetime.datetime.now(datetime.timezone.utc)
            .strftime("%Y-%m-%dT%H:%M:%SZ"),
            "build_seconds": {"mmdebstrap": round(t_mmdebstrap, 1),
                              "image": round(t_image, 1),
                              "total": round(time.monotonic() - started, 1)},
            "sizes": {f: os.path.getsize(os.path.join(staged, f))
                      for f in ("disk.qcow2", "vmlinuz", "initrd.img")},
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
