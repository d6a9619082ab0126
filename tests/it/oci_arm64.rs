//! A container image booted as an aarch64 sandbox under TCG: an arm64 layout from
//! `tests/oci/build_layout.py --bootable --arch arm64` booted by `sandbox_vm {"oci", "arch":
//! "aarch64"}` on QEMU's virt board with Debian's arm64 cloud kernel (the server reads Debian's
//! arm64 package lists into a folder of its own) and the aarch64 mcqemu-agent as PID 1 of its
//! initrd; guest_exec runs as the image's user in its folder.

use std::path::Path;

use crate::common::arm64::{arm_lab, SLOW};
use crate::common::*;
use crate::oci::layout;
use serde_json::json;

#[test]
fn an_arm64_image_root_boots_on_the_virt_board() {
    if let Err(e) = static_agent("aarch64-unknown-linux-musl") {
        let built = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target/aarch64-unknown-linux-musl/release/mcqemu-agent");
        assert!(built.is_file(), "{e}");
    }
    let (lab, mut s) = arm_lab("ocia");
    let dir = lab.dir.join("layout");
    layout(&dir, "v1", &["--bootable", "--arch", "arm64"]);
    let reference = format!("oci:{}:v1", dir.display());
    let t = std::time::Instant::now();
    let sb = s.call_ok_within(
        "sandbox_vm",
        json!({"oci": reference, "arch": "aarch64", "name": "arm", "cpus": 1,
               "memory_mb": 512, "wait_agent_s": 200,
               "mounts": [{"host": dir, "guest": "/host"}]}),
        SLOW,
    );
    lab.killer.track(&sb);
    eprintln!(
        "aarch64 sandbox_vm oci (kernel fetch, boot): {} ms, agent after {} ms",
        t.elapsed().as_millis(),
        sb["agent_wait_ms"]
    );
    assert_eq!(sb["agent_ready"], json!(true), "{sb}");
    assert_eq!(
        sh(&mut s, "arm", "uname -m; id -u; pwd; echo \"$GREETING\""),
        "aarch64\n1000\n/home/user\nhello from the image\n"
    );
    // A host folder mounted on aarch64 (the arm64 cloud kernel's fuse.ko, the aarch64 relay).
    assert_eq!(sb["mounts"][0]["state"], json!("mounted"), "{sb}");
    let layout_marker = std::fs::read_to_string(dir.join("oci-layout")).unwrap();
    assert_eq!(sh(&mut s, "arm", "cat /host/oci-layout"), layout_marker);
    // The arm64 package's modules, on their disk, with the autoloader pointed at the agent
    // (loading one needs root; the image's user is 1000, and one_file loads them on x86_64).
    assert_eq!(
        sh(
            &mut s,
            "arm",
            "cat /proc/sys/kernel/modprobe; grep -c '^kernel/fs/overlayfs/overlay.ko:' \
             /lib/modules/$(uname -r)/modules.dep"
        ),
        "/run/mcqemu/modprobe\n1\n"
    );
    s.call_ok_within("sandbox_destroy", json!({"name": "arm"}), SLOW);
}
