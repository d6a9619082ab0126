#!/usr/bin/env python3
"""Today's Debian cloud kernel package for the tests, fetched with apt into OUT/kernel-debs
(kept across runs, checked against apt's SHA256): mcqemu itself never runs apt, and the test
servers get the package through MCQEMU_IMAGE_KERNEL_DEB, so a Debian kernel update that moves
the pinned package out of the pool never breaks the tests.

usage: kernel_deb.py --arch amd64|arm64 OUT   (prints {"path", "sha256", "package"} as JSON)
"""
import hashlib
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_guest  # noqa: E402


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def apt_field(text, name):
    for line in text.splitlines():
        if line.startswith(name + ": "):
            return line.split(": ", 1)[1].strip()
    return None


def main():
    deb_arch = sys.argv[sys.argv.index("--arch") + 1]
    out = os.path.abspath(sys.argv[-1])
    opts, qual = [], ""
    if deb_arch != "amd64":
        opts = build_guest.refresh_lists(out, deb_arch)
        qual = ":" + deb_arch
    run = lambda argv, **kw: subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True, **kw).stdout
    depends = run(["apt-cache"] + opts + ["depends", "linux-image-cloud-%s%s" % (deb_arch, qual)])
    pkg = next(l.split(":", 1)[1].strip() for l in depends.splitlines()
               if l.strip().startswith("Depends: linux-image-")).split(":")[0]
    show = run(["apt-cache"] + opts + ["show", pkg + qual])
    want, filename = apt_field(show, "SHA256"), apt_field(show, "Filename")
    folder = os.path.join(out, "kernel-debs")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, os.path.basename(filename))
    if not (os.path.isfile(path) and sha256(path) == want):
        run(["apt-get"] + opts + ["download", "-o", "APT::Sandbox::User=root", pkg + qual], cwd=folder)
    got = sha256(path)
    if got != want:
        sys.exit("kernel_deb: %s has SHA256 %s, apt says %s" % (path, got, want))
    print(json.dumps({"path": os.path.abspath(path), "sha256": got, "package": pkg}))


if __name__ == "__main__":
    main()
