//! The journey users come for, on a test image built the way a publisher builds Debian's
//! genericcloud image (tests/cloud/build_stock.py: GPT, an EFI system partition with GRUB,
//! the *cloud* kernel flavour without AHCI, cloud-init, and no qemu-guest-agent), over MCP
//! against the built binary and real QEMU under TCG with UEFI firmware:
//!
//! - image_pull from a local HTTP server with a SHA512SUMS file in Debian's format;
//! - image_prepare installing qemu-guest-agent over the guest's network from a package
//!   repository the test serves on 127.0.0.1 (10.0.2.2 to the guest), as from a mirror;
//! - sandbox_vm from the prepared image with cloud_init and a bigger disk_size: the cloud
//!   kernel sees its seed (the virtio-scsi CD-ROM), host name, user and key, runcmd and
//!   write_files are applied, the root file system grew;
//! - a seed the guest never saw is a clear error;
//! - template_create from the prepared image under UEFI (its variable store kept) and a clone;
//! - the stock image itself, without an agent: the wait ends once cloud-init has finished,
//!   with the reason; disk_size refusals that create nothing.
//!
//! Each test holds one guest slot and boots its guests one after the other.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::cloud_guest::{self as cg, *};
use crate::common::stock::{test_stock_image, StockImage};
use crate::common::*;
use serde_json::{json, Value};

const GIB: u64 = 1 << 30;

/// SHA-512 of a file, as hex.
fn sha512_file(path: &Path) -> String {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    ring::digest::digest(&ring::digest::SHA512, &data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// An HTTP server with the stock image under /images (with a Debian-style SHA512SUMS beside
/// it) and the package repository under /repo.
fn publisher(image: &StockImage) -> HttpServer {
    let disk = std::fs::read(&image.disk).expect("read the stock disk");
    let name = "debian-12-genericcloud-amd64-test.qcow2";
    let sums = format!(
        "{}  debian-12-genericcloud-amd64-other.raw\n{}  {name}\n",
        "0".repeat(128),
        sha512_file(&image.disk)
    );
    let mut routes: Vec<(String, Route)> = vec![
        (format!("/images/{name}"), Route::body(disk)),
        ("/images/SHA512SUMS".into(), Route::body(sums.into_bytes())),
    ];
    for entry in std::fs::read_dir(&image.repo).expect("list the repo") {
        let p = entry.unwrap().path();
        let file = p.file_name().unwrap().to_string_lossy().into_owned();
        let body = Route::body(std::fs::read(&p).unwrap());
        // apt asks a flat repository `URI ./` for `URI/./NAME`, with `+` sent as `%2b`.
        let quoted = file.replace('+', "%2b");
        for path in [format!("/repo/./{quoted}"), format!("/repo/{quoted}")] {
            routes.push((path, body.clone()));
        }
    }
    let borrowed: Vec<(&str, Route)> = routes
        .iter()
        .map(|(p, r)| (p.as_str(), r.clone()))
        .collect();
    HttpServer::start(borrowed)
}

/// The cloud_init that points the guest's apt at the test's repository only.
fn local_mirror(http: &HttpServer) -> Value {
    let port = http
        .url("/")
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_string();
    json!({
        "write_files": [{
            "path": "/etc/apt/sources.list",
            "content": format!("deb [trusted=yes] http://10.0.2.2:{port}/repo/ ./\n")
        }],
        "runcmd": ["rm -f /etc/apt/sources.list.d/debian.sources"]
    })
}

/// Bytes of the root file system as the guest's df sees them.
fn root_bytes(s: &mut Server, vm: &str) -> u64 {
    sh(s, vm, "df -B1 --output=size / | tail -1")
        .trim()
        .parse()
        .unwrap()
}

fn virtual_size(s: &mut Server, path: &Path) -> u64 {
    let info = s.call_ok("image_info", json!({"path": path}));
    info["virtual_size"]
        .as_u64()
        .unwrap_or_else(|| panic!("{info}"))
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Host folders mounted into the stock image's guest (the cloud kernel's fuse.ko, qemu-ga as
/// its agent, so mcqemu's relay goes into /run): read, the read-only refusal, writes, changes
/// seen both ways, and git init and commit in the writable one.
fn mounts_on_the_cloud_kernel(s: &mut Server, vm: &str, dir: &Path) {
    let (ro, rw) = (dir.join("m-ro"), dir.join("m-rw"));
    std::fs::create_dir_all(&ro).unwrap();
    std::fs::create_dir_all(&rw).unwrap();
    std::fs::write(ro.join("hello.txt"), "from the host\n").unwrap();
    let out = s.call_ok_within(
        "vm_mount",
        json!({"name": vm, "add": [{"host": ro, "guest": "/mnt/ro"},
                                   {"host": rw, "guest": "/mnt/rw", "writable": true}]}),
        Duration::from_secs(120),
    );
    assert!(
        out["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["state"] == "mounted"),
        "{out}"
    );
    assert_eq!(sh(s, vm, "cat /mnt/ro/hello.txt"), "from the host\n");
    let r = s.call_ok(
        "guest_exec",
        json!({"name": vm, "command": "sh", "args": ["-c", "echo x > /mnt/ro/no"]}),
    );
    assert_ne!(
        r["exitcode"],
        json!(0),
        "a read-only mount took a write: {r}"
    );
    assert!(!ro.join("no").exists());
    std::fs::write(ro.join("hello.txt"), "changed\n").unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(sh(s, vm, "cat /mnt/ro/hello.txt"), "changed\n");
    sh(
        s,
        vm,
        "set -e; cd /mnt/rw; git init -q; echo hi > x; git add x; \
         git -c user.email=t@t -c user.name=t commit -qm one; test -z \"$(git status --short)\"",
    );
    assert!(rw.join(".git/HEAD").is_file());
    assert_eq!(std::fs::read_to_string(rw.join("x")).unwrap(), "hi\n");
    assert!(sh(s, vm, "findmnt -n -o FSTYPE /mnt/rw").contains("fuse"));
    s.call_ok_within(
        "vm_mount",
        json!({"name": vm, "remove": ["/mnt/ro", "/mnt/rw"]}),
        Duration::from_secs(60),
    );
}

#[test]
fn stock_image_pull_prepare_sandbox_template_clone() {
    let image = test_stock_image();
    let http = publisher(&image);
    let (lab, mut s) = cloud_lab("stock");
    let t0 = Instant::now();
    let dir = s.tmp.subdir("images");

    // 1. image_pull, verified against the publisher-style checksum file.
    let pulled = s.call_ok_within(
        "image_pull",
        json!({
            "url": http.url("/images/debian-12-genericcloud-amd64-test.qcow2"),
            "checksums_url": http.url("/images/SHA512SUMS"),
            "path": dir.join("stock.qcow2"),
        }),
        Duration::from_secs(300),
    );
    assert_eq!(pulled["verified"], json!(true), "{pulled}");
    assert_eq!(pulled["algorithm"], json!("sha512"), "{pulled}");
    let source = PathBuf::from(pulled["path"].as_str().unwrap());
    let source_hash = sha512_file(&source);
    let base_size = virtual_size(&mut s, &source);
    eprintln!("image_pull: {pulled}");

    // 2. image_prepare under UEFI: the agent comes from the test's repository.
    let prepared = dir.join("prepared.qcow2");
    let t = Instant::now();
    let prep = s.call_ok_within(
        "image_prepare",
        json!({
            "source": source, "dest": prepared, "firmware": "uefi",
            "memory_mb": 1024, "cpus": 1, "timeout_s": 1200, "agent": "qemu-ga",
            "cloud_init": local_mirror(&http),
        }),
        CLOUD_CALL,
    );
    let prepare_ms = t.elapsed().as_millis();
    eprintln!("image_prepare in {prepare_ms} ms: {prep}");
    assert!(
        prep["agent_version"]
            .as_str()
            .is_some_and(|v| v.starts_with("7.2")),
        "{prep}"
    );
    assert_eq!(prep["os"]["id"], json!("debian"), "{prep}");
    assert_eq!(
        sha512_file(&source),
        source_hash,
        "image_prepare wrote its source"
    );
    let served: Vec<String> = http.hits();
    assert!(
        served.iter().any(|h| h.contains("qemu-guest-agent")),
        "the guest never fetched qemu-guest-agent from the test repository: {served:?}"
    );
    let prepared_hash = sha512_file(&prepared);
    // Debian's images ship /etc/machine-id empty; a missing one makes every boot a systemd
    // first boot (systemd-firstboot prompts, the boot falls into emergency mode).
    assert_eq!(
        machine_id_size(&image, &prepared, &dir),
        Some(0),
        "the prepared image's /etc/machine-id is missing or not empty"
    );

    // 3. A sandbox from the prepared image with cloud_init and a bigger disk.
    let one = "stock-one";
    let t = Instant::now();
    let sb = cg::cloud_sandbox(
        &lab,
        &mut s,
        json!({
            "name": one, "base_image": prepared, "firmware": "uefi",
            "memory_mb": 1024, "cpus": 1, "disk_size": "4G",
            "wait_agent_s": 600, "wait_cloud_init": true, "wait_cloud_init_s": 600,
            "cloud_init": {
                "hostname": "mcq-stock",
                "users": [{"name": "dev", "ssh_authorized_keys": [TEST_KEY], "sudo": true}],
                "runcmd": ["echo mcq-stock-marker > /var/tmp/mcq-marker"],
                "write_files": [{"path": "/etc/mcq-stock.txt", "content": "a: b # c\n"}]
            }
        }),
    );
    let cold_ms = t.elapsed().as_millis();
    eprintln!("cold sandbox from the prepared image to cloud-init done: {cold_ms} ms");
    assert_eq!(sb["cloud_init"]["status"], json!("done"), "{sb}");
    // The cloud kernel saw its seed: NoCloud on the virtio-scsi CD-ROM.
    let kernel = sh(&mut s, one, "uname -r");
    assert!(
        kernel.trim().ends_with("-cloud-amd64"),
        "not the cloud kernel: {kernel}"
    );
    let ds = sh(&mut s, one, "cloud-init status --long");
    assert!(
        ds.contains("DataSourceNoCloud") || ds.contains("nocloud"),
        "{ds}"
    );
    let cd = sh(
        &mut s,
        one,
        "lsblk -ndo NAME,LABEL,TRAN /dev/sr0 2>&1; readlink -f /sys/block/sr0/device",
    );
    assert!(cd.contains("cidata"), "the seed CD-ROM: {cd}");
    assert!(cd.contains("virtio"), "the seed is not on virtio: {cd}");
    assert_eq!(sh(&mut s, one, "hostname").trim(), "mcq-stock");
    // Not a first boot, and the ESP mounted by its UUID as the fstab says.
    assert_eq!(
        sh(
            &mut s,
            one,
            "systemctl show -p ConditionResult --value systemd-firstboot.service"
        )
        .trim(),
        "no",
        "the sandbox booted as a systemd first boot"
    );
    let efi = sh(&mut s, one, "findmnt -n -o FSTYPE /boot/efi");
    assert_eq!(efi.trim(), "vfat", "/boot/efi is not mounted: {efi}");
    let keys =
        String::from_utf8(guest_bytes(&mut s, one, "/home/dev/.ssh/authorized_keys")).unwrap();
    assert!(keys.lines().any(|l| l == TEST_KEY), "{keys}");
    assert!(sh(&mut s, one, "sudo -l -U dev").contains("NOPASSWD: ALL"));
    assert_eq!(
        guest_bytes(&mut s, one, "/var/tmp/mcq-marker"),
        b"mcq-stock-marker\n"
    );
    assert_eq!(
        guest_bytes(&mut s, one, "/etc/mcq-stock.txt"),
        b"a: b # c\n"
    );
    // disk_size: the overlay is 4 GiB and cloud-init grew the root file system into it.
    let root = root_bytes(&mut s, one);
    assert!(
        root > base_size + GIB,
        "root fs {root} bytes on a 4G disk, base {base_size}"
    );
    // A file round trip through the agent.
    let w = s.call_ok(
        "guest_file_write",
        json!({"name": one, "path": "/var/tmp/rt.bin", "content": "cm91bmQgdHJpcA==",
               "encoding": "base64"}),
    );
    assert_eq!(w["bytes_written"], json!(10), "{w}");
    assert_eq!(guest_bytes(&mut s, one, "/var/tmp/rt.bin"), b"round trip");
    mounts_on_the_cloud_kernel(&mut s, one, &dir);

    // 4. A base whose cloud-init looks for no seed: the sandbox says so and is removed.
    sh(
        &mut s,
        one,
        "printf 'datasource_list: [ None ]\\n' > /etc/cloud/cloud.cfg.d/99-mcq-none.cfg && \
         cloud-init clean --logs && : > /etc/machine-id && sync",
    );
    let stopped = s.call_ok_within(
        "stop_vm",
        json!({"name": one, "timeout": 180}),
        cg::STEP * 2,
    );
    assert_eq!(stopped["status"], json!("stopped"), "{stopped}");
    let overlay = PathBuf::from(sb["overlay"].as_str().unwrap());
    let blind = dir.join("blind.qcow2");
    s.call_ok_within(
        "image_convert",
        json!({"source": overlay, "dest": blind, "format": "qcow2"}),
        Duration::from_secs(300),
    );
    destroy(&mut s, one);
    let err = s.call_err_within(
        "sandbox_vm",
        json!({
            "name": "stock-blind", "base_image": blind, "firmware": "uefi",
            "memory_mb": 1024, "cpus": 1, "wait_agent_s": 600,
            "wait_cloud_init": true, "wait_cloud_init_s": 600,
            "cloud_init": {"hostname": "never-applied"}
        }),
        CLOUD_CALL,
    );
    assert!(err.contains("never saw its cloud-init seed"), "{err}");
    assert!(
        err.contains("datasource_list") && err.contains("removed"),
        "{err}"
    );
    assert!(!cg::vm_names(&mut s).contains(&"stock-blind".to_string()));

    // 5. A UEFI template from the prepared image, and a clone of it.
    let t = Instant::now();
    let tpl = s.call_ok_within(
        "template_create",
        json!({"name": "stock-tpl", "base_image": prepared, "firmware": "uefi",
               "memory_mb": 1024, "cpus": 1, "wait_agent_s": 600,
               "setup": [{"command": "sh", "args": ["-c", "echo from-template > /var/tmp/tpl"]}]}),
        CLOUD_CALL,
    );
    let template_ms = t.elapsed().as_millis();
    let tdir = PathBuf::from(tpl["path"].as_str().unwrap());
    let vars = tdir.join("uefi-vars.fd");
    assert!(
        vars.is_file(),
        "the template kept no UEFI variable store: {tpl}"
    );
    assert_eq!(mode(&vars), 0o600);
    let t = Instant::now();
    let clone = s.call_tool_within(
        "sandbox_vm",
        json!({"name": "stock-clone", "template": "stock-tpl"}),
        Duration::from_secs(300),
    );
    lab.track(&clone);
    let clone = tool_ok(&clone, "clone of stock-tpl");
    let clone_ms = t.elapsed().as_millis();
    assert_eq!(clone["agent_ready"], json!(true), "{clone}");
    assert_eq!(
        guest_bytes(&mut s, "stock-clone", "/var/tmp/tpl"),
        b"from-template\n"
    );
    let clone_vars = lab.vm_dir("stock-clone").join("uefi-vars.fd");
    assert!(
        clone_vars.is_file() && mode(&clone_vars) == 0o600,
        "{}",
        clone_vars.display()
    );
    destroy(&mut s, "stock-clone");
    s.call_ok("template_delete", json!({"name": "stock-tpl"}));

    // 6. Nothing wrote the images the journey started from.
    assert_eq!(
        sha512_file(&source),
        source_hash,
        "the pulled image changed"
    );
    assert_eq!(
        sha512_file(&prepared),
        prepared_hash,
        "the prepared image changed"
    );
    eprintln!(
        "stock journey: image_prepare {prepare_ms} ms, cold sandbox {cold_ms} ms, \
         template_create {template_ms} ms, clone {clone_ms} ms, {:?} in all",
        t0.elapsed()
    );
}

#[test]
fn a_stock_image_without_an_agent_ends_the_wait_when_cloud_init_is_done() {
    let image = test_stock_image();
    let (lab, mut s) = cloud_lab("noagent");
    let dir = s.tmp.subdir("images");
    let base = dir.join("stock.qcow2");
    std::fs::copy(&image.disk, &base).unwrap();

    // disk_size refusals: nothing is created.
    for (size, why) in [
        ("1G", "smaller"),
        ("lots", "invalid size"),
        ("9000G", "MCQEMU_MAX_DISK_GB"),
    ] {
        let err = s.call_err(
            "sandbox_vm",
            json!({"name": "refused", "base_image": base, "disk_size": size, "firmware": "uefi"}),
        );
        assert!(
            err.contains("disk_size") && err.contains(why),
            "{size}: {err}"
        );
        assert!(
            !lab.vm_dir("refused").exists(),
            "a refused sandbox left {}",
            lab.vm_dir("refused").display()
        );
    }

    // The stock image: cloud-init applies the seed (the cloud kernel sees it), then no agent.
    let t = Instant::now();
    let r = s.call_tool_within(
        "sandbox_vm",
        json!({
            "name": "bare", "base_image": base, "firmware": "uefi", "memory_mb": 1024,
            "cpus": 1, "disk_size": "4G", "wait_agent_s": 1500,
            "cloud_init": {"hostname": "mcq-bare"}
        }),
        CLOUD_CALL,
    );
    lab.track(&r);
    let waited = t.elapsed();
    // A sandbox whose agent never answers is an error, and is removed.
    assert_eq!(r["isError"], json!(true), "{r}");
    let err = r["content"][0]["text"].as_str().unwrap_or_default();
    eprintln!("stock image without an agent: sandbox_vm failed after {waited:?}: {err}");
    assert!(
        waited < Duration::from_secs(1200),
        "the wait did not end with cloud-init"
    );
    assert!(
        err.contains("no running qemu-guest-agent") && err.contains("image_prepare"),
        "{err}"
    );
    // cloud-init saw the seed (the cloud kernel has the drivers for it on virtio-scsi).
    assert!(err.contains("DataSourceNoCloud"), "{err}");
    assert!(
        err.contains("removed") && err.contains("Last serial output"),
        "{err}"
    );
    assert!(!cg::vm_names(&mut s).contains(&"bare".to_string()));
    assert!(!lab.vm_dir("bare").exists());
}

/// image_prepare with mcqemu-agent: the agent rides on the seed, so the guest needs no network
/// and no package manager; the prepared image's sandboxes answer through mcqemu-agent (as a
/// systemd service of the image), env and cwd included, and stop gracefully.
#[test]
fn image_prepare_with_mcqemu_agent_needs_no_network() {
    static_agent("x86_64-unknown-linux-musl").unwrap_or_else(|e| panic!("{e}"));
    let image = test_stock_image();
    let (lab, mut s) = cloud_lab("prepours");
    let dir = s.tmp.subdir("images");
    let source = dir.join("stock.qcow2");
    std::fs::copy(&image.disk, &source).unwrap();
    let prepared = dir.join("prepared-ours.qcow2");
    let t = Instant::now();
    let prep = s.call_ok_within(
        "image_prepare",
        json!({
            "source": source, "dest": prepared, "firmware": "uefi", "memory_mb": 1024,
            "cpus": 1, "timeout_s": 1200, "agent": "mcqemu", "allow_network": false,
        }),
        CLOUD_CALL,
    );
    let prepare_ms = t.elapsed().as_millis();
    eprintln!("image_prepare with mcqemu-agent, no network: {prepare_ms} ms: {prep}");
    assert!(
        prep["agent_version"]
            .as_str()
            .is_some_and(|v| v.starts_with("mcqemu-agent")),
        "{prep}"
    );
    assert_eq!(prep["os"]["id"], json!("debian"), "{prep}");
    assert_eq!(
        machine_id_size(&image, &prepared, &dir),
        Some(0),
        "the prepared image's /etc/machine-id is missing or not empty"
    );
    let t = Instant::now();
    let r = s.call_tool_within(
        "sandbox_vm",
        json!({"name": "ours", "base_image": prepared, "firmware": "uefi", "memory_mb": 1024,
               "cpus": 1, "wait_agent_s": 1200}),
        CLOUD_CALL,
    );
    lab.track(&r);
    let sb = tool_ok(&r, "sandbox_vm from the prepared image");
    eprintln!("a cold sandbox of it: {:?}", t.elapsed());
    assert_eq!(sb["agent_ready"], json!(true), "{sb}");
    let r = s.call_ok_within(
        "guest_exec",
        json!({"name": "ours", "command": "sh", "args": ["-c", "echo $GREETING in $PWD"],
               "env": {"GREETING": "hello"}, "cwd": "/etc"}),
        Duration::from_secs(60),
    );
    assert_eq!(r["stdout"], json!("hello in /etc\n"), "{r}");
    assert!(our_agent_answers(&mut s, "ours"), "qemu-ga answered");
    let d = s.call_ok_within(
        "sandbox_destroy",
        json!({"name": "ours"}),
        Duration::from_secs(120),
    );
    eprintln!("destroyed: {d}");
}

/// The size of `/etc/machine-id` in the root file system of qcow2 `disk` (partition 1 of the
/// stock image's layout), read on the host with debugfs; None when the file is missing.
fn machine_id_size(image: &StockImage, disk: &Path, scratch: &Path) -> Option<u64> {
    let manifest: Value = serde_json::from_slice(&std::fs::read(&image.manifest).unwrap()).unwrap();
    let offset = manifest["partitions"]["1"]["start"].as_u64().unwrap();
    let raw = scratch.join("machine-id-check.raw");
    let conv = std::process::Command::new("qemu-img")
        .args(["convert", "-O", "raw"])
        .arg(disk)
        .arg(&raw)
        .output()
        .unwrap();
    assert!(conv.status.success(), "{conv:?}");
    let out = std::process::Command::new("debugfs")
        .args(["-R", "stat /etc/machine-id"])
        .arg(format!("{}?offset={offset}", raw.display()))
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&raw);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if text.contains("File not found") {
        return None;
    }
    let size = text
        .split("Size: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok());
    assert!(size.is_some(), "debugfs said: {text}");
    size
}
