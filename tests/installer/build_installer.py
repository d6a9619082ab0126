#!/usr/bin/env python3
"""Builds the Debian 12 installer ISO the install-journey test boots, the way Debian's mini.iso
is made: the kernel and initrd of Debian's package debian-installer-12-netboot-amd64 (the text
installer: /usr/lib/debian-installer/images/12/amd64/text/debian-installer/amd64/) on an ISO
made by grub-mkrescue (GRUB for BIOS, and UEFI where its modules are installed), booting at
once with the mirror on the kernel command line.

Usage: build_installer.py OUTDIR
  -> prints {"iso": ..., "version": ..., "append": ...} as JSON.

The package is fetched with `apt-get download` from this host's apt lists and unpacked with
dpkg-deb (nothing is installed). The ISO is cached in OUTDIR/<key>/, keyed by the package's
version and the boot line; a build happens in a temporary folder renamed into place, so an
interrupted build leaves nothing that looks finished. Needs apt-get, dpkg-deb, grub-mkrescue
(grub-pc-bin), xorriso and mtools (.ci/setup-host installs them).
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

PACKAGE = "debian-installer-12-netboot-amd64"
IMAGES = "usr/lib/debian-installer/images/12/amd64/text/debian-installer/amd64"
# Picked from the installer's list, the mirror directory "/debian/" becomes "debian//dists",
# which some routes to Debian's mirror answer with 400: the mirror is given on the boot line.
APPEND = ("mirror/country=manual mirror/http/hostname=deb.debian.org "
          "mirror/http/directory=/debian mirror/http/proxy= --- quiet")
GRUB_CFG = """set timeout=0
set default=0
menuentry "Debian installer" {
  linux /linux %s
  initrd /initrd.gz
}
""" % APPEND


def run(cmd, **kw):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
    if proc.returncode != 0:
        sys.exit("build_installer: %s failed (%d): %s"
                 % (" ".join(cmd), proc.returncode, proc.stderr.decode(errors="replace").strip()))
    return proc.stdout.decode(errors="replace")


def candidate():
    out = run(["apt-cache", "policy", PACKAGE])
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Candidate:"):
            version = line.split(":", 1)[1].strip()
            if version and version != "(none)":
                return version
    sys.exit("build_installer: no candidate for %s; run 'apt-get update' (Debian 12 lists)"
             % PACKAGE)


def build(dest, version):
    parent = os.path.dirname(dest)
    work = tempfile.mkdtemp(prefix=".build-", dir=parent)
    try:
        run(["apt-get", "-q", "download", "-o", "APT::Sandbox::User=root",
             "%s=%s" % (PACKAGE, version)], cwd=work)
        debs = [f for f in os.listdir(work) if f.endswith(".deb")]
        if len(debs) != 1:
            sys.exit("build_installer: apt-get download gave %r" % debs)
        iso_root = os.path.join(work, "iso")
        os.makedirs(os.path.join(iso_root, "boot", "grub"))
        tar = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", os.path.join(work, debs[0])],
                               stdout=subprocess.PIPE)
        members = ["./%s/linux" % IMAGES, "./%s/initrd.gz" % IMAGES]
        run(["tar", "-x", "-C", work] + members, stdin=tar.stdout)
        if tar.wait() != 0:
            sys.exit("build_installer: dpkg-deb --fsys-tarfile failed")
        for f in ("linux", "initrd.gz"):
            os.rename(os.path.join(work, IMAGES, f), os.path.join(iso_root, f))
        with open(os.path.join(iso_root, "boot", "grub", "grub.cfg"), "w") as f:
            f.write(GRUB_CFG)
        staged = os.path.join(work, "out")
        os.mkdir(staged)
        run(["grub-mkrescue", "-o", os.path.join(staged, "installer.iso"), iso_root])
        with open(os.path.join(staged, "manifest.json"), "w") as f:
            json.dump({"package": PACKAGE, "version": version, "append": APPEND}, f)
        os.rename(staged, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: build_installer.py OUTDIR")
    out = os.path.abspath(sys.argv[1])
    os.makedirs(out, exist_ok=True)
    version = candidate()
    key = hashlib.sha256((PACKAGE + version + GRUB_CFG).encode()).hexdigest()[:16]
    dest = os.path.join(out, key)
    if not os.path.exists(os.path.join(dest, "installer.iso")):
        build(dest, version)
    print(json.dumps({"iso": os.path.join(dest, "installer.iso"), "version": version,
                      "append": APPEND}))


if __name__ == "__main__":
    main()
