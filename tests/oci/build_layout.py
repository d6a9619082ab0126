#!/usr/bin/env python3
"""Writes an OCI image layout for the container-image tests, with nothing but the standard
library: every layer is built here with tarfile, so each case is exactly what the test says.

  build_layout.py DEST TAG [--hostile] [--bootable] [--arch arm64] [--payload N:MB] [--zeros MB]
  build_layout.py DEST TAG --debian | --no-shell

The normal image has two layers:
  1 (gzip): folders; etc/a ("one"); etc/gone; opt/keep/old; usr/bin/ping, setuid root with a
    security.capability xattr (cap_net_raw); usr/bin/ping2, a hard link to it; home/user/own,
    owned 1000:1000, mode 0600; lnk -> etc/a; dev/null, a character device (never made).
  2 (plain tar): etc/a ("two"); a whiteout of etc/gone; opt/keep made opaque, with opt/keep/new.
Its config has Env, WorkingDir, User, Entrypoint, Cmd and ExposedPorts.
--hostile adds a layer whose entry climbs out with '..'.
--bootable adds a layer with Debian's static busybox (apt-get download busybox-static) as
/bin/busybox with links for a shell and a few tools, a copy of it as /usr/local/bin/nc with
the file capability cap_net_bind_service, and /etc/passwd and /etc/group naming the image's
user (1000, "app"): a root a VM can run programs in; its Entrypoint is then
busybox httpd on the exposed port 8080, serving /home/user.
--arch arm64 makes an arm64 image (its busybox from Debian's arm64 packages, read through the
apt lists build_guest.py keeps for the aarch64 test guest in target/test-guest/apt-arm64).
--debian makes a different image instead: one layer, a Debian bookworm root from mmdebstrap (with git)
(variant essential: glibc, bash, coreutils, dpkg; needs root), no User, no Entrypoint.
--curl makes the same Debian root with curl and ca-certificates (and the system bundle) in
place of git and kmod: the secrets test's HTTPS client.
--no-shell makes one whose only file is a static busybox without its links (no /bin/sh).
--payload N:MB adds N gzip layers of MB MiB of random bytes each (the bench's image);
--zeros MB adds one gzip layer holding a single file of MB MiB of zeros (small to download,
large to unpack: the bench's memory row).
Prints the manifest's digest.
"""
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

CAP_NET_RAW = bytes([1, 0, 0, 2, 0, 32, 0, 0]) + bytes(12)
# vfs_cap_data revision 2, effective, permitted: cap_net_bind_service (bit 10).
CAP_NET_BIND_SERVICE = bytes([1, 0, 0, 2, 0, 4, 0, 0]) + bytes(12)


def blob(dest, data, media_type):
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(dest, "blobs", "sha256", digest), "wb") as f:
        f.write(data)
    return {"mediaType": media_type, "digest": "sha256:" + digest, "size": len(data)}


def layer(entries):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
        for e in entries:
            info = tarfile.TarInfo(e["name"])
            info.type = e.get("type", tarfile.REGTYPE)
            info.mode = e.get("mode", 0o644)
            info.uid, info.gid = e.get("owner", (0, 0))
            info.mtime = 1700000000
            info.linkname = e.get("link", "")
            if "devmajor" in e:
                info.devmajor, info.devminor = e["devmajor"], e["devminor"]
            if "xattrs" in e:
                info.pax_headers = {"SCHILY.xattr." + k: v.decode("latin-1") for k, v in e["xattrs"].items()}
            data = e.get("data", b"")
            info.size = len(data) if info.type == tarfile.REGTYPE else 0
            t.addfile(info, io.BytesIO(data) if info.type == tarfile.REGTYPE else None)
    return out.getvalue()


def d(name, mode=0o755):
    return {"name": name, "type": tarfile.DIRTYPE, "mode": mode}


def busybox_entries(deb_arch):
    """Debian's static busybox with links, and the image's users."""
    work = tempfile.mkdtemp(prefix="oci-busybox-")
    opts, pkg = [], "busybox-static"
    if deb_arch != "amd64":
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, os.path.join(here, "..", "guest"))
        import build_guest
        opts = build_guest.refresh_lists(os.path.join(here, "..", "..", "target", "test-guest"),
                                         deb_arch)
        pkg = "busybox-static:" + deb_arch
    try:
        subprocess.run(["apt-get"] + opts + ["download", "-o", "APT::Sandbox::User=root", pkg],
                       cwd=work, check=True, stdout=subprocess.DEVNULL)
        deb = [f for f in os.listdir(work) if f.endswith(".deb")][0]
        fs = subprocess.run(["dpkg-deb", "--fsys-tarfile", os.path.join(work, deb)], check=True,
                            stdout=subprocess.PIPE).stdout
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(fs)) as t:
        m = [x for x in t.getmembers() if x.name.lstrip("./") in ("bin/busybox", "usr/bin/busybox")][0]
        data = t.extractfile(m).read()
    entries = [d("bin"), {"name": "bin/busybox", "data": data, "mode": 0o755}]
    for tool in ["sh", "id", "pwd", "env", "cat", "ls", "echo", "stat", "sleep", "mount", "df", "httpd", "pidof"]:
        entries.append({"name": "bin/" + tool, "type": tarfile.SYMTYPE, "link": "busybox"})
    entries.append({"name": "etc/passwd", "data": b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/user:/bin/sh\n"})
    entries.append({"name": "etc/group", "data": b"root:x:0:\napp:x:1000:\n"})
    return entries


def start(dest):
    """An empty OCI layout at `dest`."""
    os.makedirs(os.path.join(dest, "blobs", "sha256"), exist_ok=True)
    with open(os.path.join(dest, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)


def finish(dest, tag, config, layers):
    """The image's config, its manifest and the index naming it `tag`; prints its digest."""
    cfg = blob(dest, json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json")
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": cfg, "layers": layers}
    m = blob(dest, json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
    m["annotations"] = {"org.opencontainers.image.ref.name": tag}
    with open(os.path.join(dest, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                   "manifests": [m]}, f)
    print(m["digest"])


def single(dest, tag, tar, env, arch="amd64"):
    """A layout of one image: one gzip layer `tar`, a config with `env` and nothing else."""
    start(dest)
    layers = [blob(dest, gzip.compress(tar, compresslevel=1, mtime=0),
                   "application/vnd.oci.image.layer.v1.tar+gzip")]
    config = {"architecture": arch, "os": "linux", "config": {"Env": env},
              "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(tar).hexdigest()]}}
    finish(dest, tag, config, layers)


def main():
    dest, tag = sys.argv[1], sys.argv[2]
    if "--debian" in sys.argv[3:] or "--curl" in sys.argv[3:]:
        include = "curl,ca-certificates" if "--curl" in sys.argv[3:] else "git,kmod"
        tar = subprocess.run(["mmdebstrap", "--quiet", "--variant=essential", "--include=" + include,
                              "bookworm", "-"],
                             check=True, stdout=subprocess.PIPE).stdout
        return single(dest, tag, tar, ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                       "LANG=C.UTF-8"])
    deb_arch = sys.argv[sys.argv.index("--arch") + 1] if "--arch" in sys.argv else "amd64"
    if "--kernel-tools" in sys.argv[3:] or "--no-modprobe" in sys.argv[3:]:
        # Busybox as root with the tools a kernel test needs; --no-modprobe leaves out every
        # module loader, so only the kernel's autoloader can load one.
        tools = ["mkdir", "ip", "grep", "cut", "tr", "umount", "uname", "head", "wc", "sort"]
        if "--kernel-tools" in sys.argv[3:]:
            tools += ["modprobe", "insmod", "lsmod"]
        entries = busybox_entries(deb_arch) + [d("sbin")] + [
            {"name": "bin/" + t, "type": tarfile.SYMTYPE, "link": "busybox"} for t in tools]
        return single(dest, tag, layer(entries), ["PATH=/usr/local/bin:/usr/bin:/bin:/sbin"],
                      deb_arch)
    if "--no-shell" in sys.argv[3:]:
        entries = [e for e in busybox_entries("amd64") if e.get("type") != tarfile.SYMTYPE]
        return single(dest, tag, layer(entries), [])
    hostile = "--hostile" in sys.argv[3:]
    bootable = "--bootable" in sys.argv[3:]
    deb_arch = sys.argv[sys.argv.index("--arch") + 1] if "--arch" in sys.argv else "amd64"
    start(dest)
    one = layer([
        d("etc"), d("opt"), d("opt/keep"), d("usr"), d("usr/bin"), d("home"), d("home/user"), d("dev"),
        {"name": "etc/a", "data": b"one"},
        {"name": "etc/gone", "data": b"x"},
        {"name": "opt/keep/old", "data": b"old"},
        {"name": "usr/bin/ping", "data": b"#!ping", "mode": 0o4755, "xattrs": {"security.capability": CAP_NET_RAW}},
        {"name": "usr/bin/ping2", "type": tarfile.LNKTYPE, "link": "usr/bin/ping"},
        {"name": "home/user/own", "data": b"mine", "mode": 0o600, "owner": (1000, 1000)},
        {"name": "lnk", "type": tarfile.SYMTYPE, "link": "etc/a"},
        {"name": "dev/null", "type": tarfile.CHRTYPE, "mode": 0o666, "devmajor": 1, "devminor": 3},
    ])
    two = layer([
        {"name": "etc/a", "data": b"two"},
        {"name": "etc/.wh.gone"},
        {"name": "opt/keep/.wh..wh..opq"},
        {"name": "opt/keep/new", "data": b"new"},
    ])
    layers = [
        blob(dest, gzip.compress(one, mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip"),
        blob(dest, two, "application/vnd.oci.image.layer.v1.tar"),
    ]
    diff_ids = ["sha256:" + hashlib.sha256(t).hexdigest() for t in (one, two)]
    if bootable:
        entries = busybox_entries(deb_arch)
        # A copy of busybox named nc (busybox runs the applet its name says) that the image
        # lets bind ports below 1024, as a file capability: the image's user can serve port 80
        # with it and with no other program.
        box = [e for e in entries if e["name"] == "bin/busybox"][0]["data"]
        entries += [d("usr"), d("usr/local"), d("usr/local/bin"),
                    {"name": "usr/local/bin/nc", "data": box, "mode": 0o755,
                     "xattrs": {"security.capability": CAP_NET_BIND_SERVICE}}]
        tools = layer(entries)
        layers.append(blob(dest, gzip.compress(tools, mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip"))
        diff_ids.append("sha256:" + hashlib.sha256(tools).hexdigest())
    extra = []
    args = sys.argv[3:]
    for i, a in enumerate(args):
        if a == "--payload":
            count, mb = (int(x) for x in args[i + 1].split(":"))
            for k in range(count):
                extra.append(layer([d("data"), {"name": "data/p%d" % k, "data": os.urandom(mb << 20)}]))
        if a == "--zeros":
            extra.append(layer([d("data"), {"name": "data/zeros", "data": bytes(int(args[i + 1]) << 20)}]))
    for t in extra:
        layers.append(blob(dest, gzip.compress(t, compresslevel=1, mtime=0),
                           "application/vnd.oci.image.layer.v1.tar+gzip"))
        diff_ids.append("sha256:" + hashlib.sha256(t).hexdigest())
    if hostile:
        evil = layer([{"name": "../evil", "data": b"out"}])
        layers.append(blob(dest, evil, "application/vnd.oci.image.layer.v1.tar"))
        diff_ids.append("sha256:" + hashlib.sha256(evil).hexdigest())
    config = {
        "architecture": deb_arch, "os": "linux",
        "config": {
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=hello from the image"],
            "WorkingDir": "/home/user", "User": "1000:1000",
            "Entrypoint": ["/usr/bin/ping"], "Cmd": ["-c", "1", "10.0.2.2"],
            "ExposedPorts": {"8080/tcp": {}},
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    if bootable:
        # A program to run: busybox's web server on the exposed port, serving the user's home.
        config["config"]["Entrypoint"] = ["/bin/httpd", "-f", "-p", "8080", "-h", "/home/user"]
        config["config"]["Cmd"] = []
    finish(dest, tag, config, layers)


if __name__ == "__main__":
    main()
