//! Other kinds of container roots booted as sandboxes: a glibc root (Debian bookworm from
//! mmdebstrap, which needs root, so this suite is not among the ordinary user's in CI), with
//! git working in a mounted host folder and kmod's modprobe loading modules from the modules
//! disk's binary indexes, and a root with no shell at all (a static busybox without its links).

use std::path::Path;
use std::time::Duration;

use crate::common::*;
use crate::oci::layout;
use serde_json::json;

const STEP: Duration = Duration::from_secs(300);

/// A sandbox of the layout at `dir`, ready, with `mounts`.
fn boot(lab: &mut Lab, dir: &std::path::Path, name: &str, mounts: serde_json::Value) {
    let sb = lab.srv().call_ok_within(
        "sandbox_vm",
        json!({"oci": format!("oci:{}:v1", dir.display()), "name": name, "cpus": 1,
               "memory_mb": 512, "wait_agent_s": 150, "mounts": mounts}),
        STEP,
    );
    lab.track(&sb);
    assert_eq!(sb["agent_ready"], json!(true), "{sb}");
}

/// A glibc root (Debian bookworm from mmdebstrap: bash, coreutils, dpkg) and a root with no
/// shell at all (a static busybox without its links) boot the same way.
#[test]
fn a_glibc_root_and_a_root_without_a_shell_boot_too() {
    if let Err(e) = static_agent("x86_64-unknown-linux-musl") {
        let built = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target/x86_64-unknown-linux-musl/release/mcqemu-agent");
        assert!(built.is_file(), "{e}");
    }
    let mut lab = Lab::new("ocig");
    let debian = lab.dir.join("debian");
    layout(&debian, "v1", &["--debian"]);
    // A host folder mounted writable, where git works (Debian's cloud kernel: fuse.ko).
    let repo = lab.dir.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    boot(
        &mut lab,
        &debian,
        "deb",
        json!([{"host": repo, "guest": "/work", "writable": true}]),
    );
    let r = lab.srv().call_ok_within(
        "guest_exec",
        json!({"name": "deb", "command": "bash", "args": ["-c",
               "id -u; ldd --version | head -1; dpkg-query -W -f '${Status}\\n' dpkg; pwd"]}),
        STEP,
    );
    let out = r["stdout"].as_str().unwrap_or("");
    assert!(
        out.starts_with("0\nldd (Debian GLIBC") && out.ends_with("install ok installed\n/\n"),
        "a glibc root: {r}"
    );
    let r = lab.srv().call_ok_within(
        "guest_exec",
        json!({"name": "deb", "command": "bash", "args": ["-c",
               "set -e; cd /work; git init -q; echo hi > x; ln -s x link; git add x link; \
                git -c user.email=t@t -c user.name=t commit -qm one; git status --short; \
                git log --format=%s"]}),
        STEP,
    );
    assert_eq!(r["exitcode"], json!(0), "git in a mount: {r}");
    assert_eq!(r["stdout"], json!("one\n"), "{r}");
    let head = std::fs::read_to_string(repo.join(".git/HEAD")).unwrap();
    assert!(head.starts_with("ref: refs/heads/"), "{head}");
    assert_eq!(
        std::fs::read_link(repo.join("link")).unwrap(),
        Path::new("x")
    );
    // Debian's own kmod modprobe reads the modules disk's binary indexes: by name with the
    // dependencies, and by the alias the kernel asks for.
    let r = lab.srv().call_ok_within(
        "guest_exec",
        json!({"name": "deb", "command": "bash", "args": ["-c",
               "set -e; modprobe br_netfilter; modprobe fs-overlay; modprobe -n ext4; \
                cut -d' ' -f1 /proc/modules | sort | tr '\\n' ' '"]}),
        STEP,
    );
    assert_eq!(r["exitcode"], json!(0), "kmod's modprobe: {r}");
    let loaded = r["stdout"].as_str().unwrap_or("");
    for m in ["br_netfilter", "bridge", "stp", "llc", "overlay"] {
        assert!(
            loaded.split(' ').any(|l| l == m),
            "{m} not loaded by kmod: {r}"
        );
    }
    lab.srv()
        .call_ok_within("sandbox_destroy", json!({"name": "deb"}), STEP);

    let bare = lab.dir.join("no-shell");
    layout(&bare, "v1", &["--no-shell"]);
    boot(&mut lab, &bare, "bare", json!([]));
    let r = lab.srv().call_ok_within(
        "guest_exec",
        json!({"name": "bare", "command": "/bin/busybox", "args": ["echo", "no shell here"]}),
        STEP,
    );
    assert_eq!(r["stdout"], json!("no shell here\n"), "{r}");
    let r = lab.srv().call_tool_within(
        "guest_exec",
        json!({"name": "bare", "command": "sh", "args": ["-c", "true"]}),
        STEP,
    );
    let e = tool_err(&r, "sh in a root without one");
    assert!(e.contains("No such file"), "{e}");
    lab.srv()
        .call_ok_within("sandbox_destroy", json!({"name": "bare"}), STEP);
}
