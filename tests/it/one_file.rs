//! One file on any Linux host: the static binary copied alone into an empty folder and run with
//! `env -i` and a PATH holding only QEMU and e2fsprogs (no apt, no dpkg, no ar, no xz) boots
//! container images. Its agents come from inside it; the image kernel is Debian's package,
//! served here on 127.0.0.1 and named in MCQEMU_IMAGE_KERNEL_DEB, fetched once and unpacked
//! in-process; every module of that kernel is usable in the guest (busybox's modprobe, and
//! the kernel's own autoloader in an image with no modprobe at all); a package that is not
//! the one named is refused and nothing of it is kept.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::kernel::kernel_deb;
use crate::common::*;
use crate::oci::layout;
use serde_json::{json, Value};

const STEP: Duration = Duration::from_secs(300);

/// The static musl build of mcqemu (with the agents inside it that .ci/build-agents left for
/// src/build.rs), built or found up to date by cargo.
fn static_server() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = "x86_64-unknown-linux-musl";
    static_agent(target).unwrap_or_else(|e| panic!("{e}"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root).args([
        "build",
        "--release",
        "--quiet",
        "--bin",
        "mcqemu",
        "--target",
        target,
    ]);
    let done = try_run_command(&mut cmd, None, Duration::from_secs(1800))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        done.status.success(),
        "building the static mcqemu failed: {}",
        String::from_utf8_lossy(&done.stderr)
    );
    let target_dir = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"));
    target_dir.join(target).join("release").join("mcqemu")
}

/// A folder of links to the only programs the host lends the server: QEMU and e2fsprogs.
fn bare_path(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for prog in ["qemu-system-x86_64", "qemu-img", "mke2fs", "debugfs"] {
        let found = ["/usr/bin", "/usr/sbin", "/bin", "/sbin"]
            .iter()
            .map(|d| Path::new(d).join(prog))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("{prog} is not installed"));
        std::os::unix::fs::symlink(found, bin.join(prog)).unwrap();
    }
    bin
}

/// The copied binary as a server with nothing but `env` in its environment.
fn alone(lab: &Lab, exe: &Path, home: &Path, env: &[(&str, String)]) -> Server {
    let mut cmd = Command::new(exe);
    cmd.env_clear()
        .env("HOME", home)
        .env("MCQEMU_STATE_DIR", lab.state())
        .env("MCQEMU_RUNTIME_DIR", lab.runtime())
        .env("MCQEMU_ROOTS", lab.dir.path());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut s = Server::try_spawn(TempDir::new("srv"), cmd).unwrap_or_else(|e| panic!("{e}"));
    s.initialize(NEWEST);
    s
}

fn sh(s: &mut Server, name: &str, script: &str) -> Value {
    let r = s.call_ok_within(
        "guest_exec",
        json!({"name": name, "command": "sh", "args": ["-c", script], "timeout": 60}),
        STEP,
    );
    assert_eq!(r["exitcode"], 0, "{script}: {r}");
    r
}

#[test]
fn the_static_binary_alone_boots_images_with_the_kernel_and_its_modules() {
    let exe = static_server();
    let deb = kernel_deb("amd64").unwrap_or_else(|e| panic!("{e}"));
    let lab = Lab::without_server("one", 1);
    let folder = lab.dir.join("alone");
    std::fs::create_dir_all(&folder).unwrap();
    let copied = folder.join("mcqemu");
    std::fs::copy(&exe, &copied).unwrap();
    let path = bare_path(&lab.dir.join("host")).display().to_string();
    let home = lab.dir.join("home");

    // doctor: the agents are the binary's own.
    let out = Command::new(&copied)
        .arg("doctor")
        .env_clear()
        .env("HOME", &home)
        .env("PATH", &path)
        .env("MCQEMU_STATE_DIR", lab.state())
        .output()
        .unwrap();
    let doctor =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    for arch in ["x86_64", "aarch64"] {
        let row = doctor
            .lines()
            .find(|l| l.starts_with(&format!("agent {arch}")))
            .unwrap_or_else(|| panic!("no agent row for {arch}: {doctor}"));
        assert!(
            row.contains(" ok ") && row.contains("inside this binary"),
            "{row}\n{doctor}"
        );
    }

    let data = Arc::new(std::fs::read(&deb.path).unwrap());
    let http = HttpServer::start(vec![("/k.deb", Route::ranged(data, "\"k1\""))]);
    let env = [
        ("PATH", path.clone()),
        (
            "MCQEMU_IMAGE_KERNEL_DEB",
            deb.env_value(&http.url("/k.deb")),
        ),
    ];
    let mut s = alone(&lab, &copied, &home, &env);

    // An image with busybox's modprobe: the package fetched once, every module there.
    let tools = lab.dir.join("tools");
    layout(&tools, "v1", &["--kernel-tools"]);
    let t = Instant::now();
    let sb = s.call_ok_within(
        "sandbox_vm",
        json!({"oci": format!("oci:{}:v1", tools.display()), "name": "kt", "cpus": 1,
               "memory_mb": 512, "wait_agent_s": 150}),
        STEP,
    );
    lab.track(&sb);
    eprintln!(
        "first sandbox (fetch, unpack, modules disk, boot) {} ms",
        t.elapsed().as_millis()
    );
    assert_eq!(sb["agent_ready"], true, "{sb}");
    let r = sh(
        &mut s,
        "kt",
        "for m in overlay tun veth bridge br_netfilter nf_tables; do modprobe $m || exit 1; done; \
         mkdir -p /tmp/o/l /tmp/o/u /tmp/o/w /tmp/o/m && \
         mount -t overlay overlay -o lowerdir=/tmp/o/l,upperdir=/tmp/o/u,workdir=/tmp/o/w /tmp/o/m && \
         ip link add va type veth peer name vb && ip link show va >/dev/null && \
         ls /lib/modules/$(uname -r)/modules.dep && cut -d' ' -f1 /proc/modules",
    );
    let loaded = r["stdout"].as_str().unwrap_or("");
    for m in [
        "overlay",
        "tun",
        "veth",
        "bridge",
        "br_netfilter",
        "nf_tables",
    ] {
        assert!(
            loaded.lines().any(|l| l == m),
            "{m} is not loaded: {loaded}"
        );
    }
    let fetched = |h: &HttpServer| h.hits().iter().filter(|p| *p == "/k.deb").count();
    assert_eq!(fetched(&http), 1, "the package is fetched once");
    s.call_ok_within("sandbox_destroy", json!({"name": "kt"}), STEP);

    // An image with no modprobe anywhere: the kernel's autoloader loads what a mount and a
    // veth pair need, through mcqemu-agent; nothing is fetched again.
    let bare = lab.dir.join("bare");
    layout(&bare, "v1", &["--no-modprobe"]);
    let t = Instant::now();
    let sb = s.call_ok_within(
        "sandbox_vm",
        json!({"oci": format!("oci:{}:v1", bare.display()), "name": "nm", "cpus": 1,
               "memory_mb": 512, "wait_agent_s": 150}),
        STEP,
    );
    lab.track(&sb);
    eprintln!(
        "second sandbox (cached kernel) {} ms",
        t.elapsed().as_millis()
    );
    let r = sh(
        &mut s,
        "nm",
        "! ls /sbin/modprobe /bin/modprobe /usr/sbin/modprobe /usr/bin/modprobe 2>/dev/null && \
         test \"$(cat /proc/sys/kernel/modprobe)\" = /run/mcqemu/modprobe && \
         mkdir -p /tmp/o/l /tmp/o/u /tmp/o/w /tmp/o/m && \
         mount -t overlay overlay -o lowerdir=/tmp/o/l,upperdir=/tmp/o/u,workdir=/tmp/o/w /tmp/o/m && \
         ip link add va type veth peer name vb && cut -d' ' -f1 /proc/modules",
    );
    let loaded = r["stdout"].as_str().unwrap_or("");
    for m in ["overlay", "veth"] {
        assert!(
            loaded.lines().any(|l| l == m),
            "the autoloader did not load {m}: {loaded}"
        );
    }
    assert_eq!(fetched(&http), 1, "a cached kernel is never fetched again");
    s.call_ok_within("sandbox_destroy", json!({"name": "nm"}), STEP);
    drop(s);

    // A package that is not the one named: refused by digest, nothing kept.
    let mut wrong = std::fs::read(&deb.path).unwrap();
    let mid = wrong.len() / 2;
    wrong[mid] ^= 0xff;
    http.set_route("/bad.deb", Route::ranged(Arc::new(wrong), "\"bad\""));
    let fresh = lab.dir.join("fresh-state");
    std::fs::create_dir_all(&fresh).unwrap();
    let env = [
        ("PATH", path),
        (
            "MCQEMU_IMAGE_KERNEL_DEB",
            deb.env_value(&http.url("/bad.deb")),
        ),
        ("MCQEMU_STATE_DIR", fresh.display().to_string()),
    ];
    let mut s = alone(&lab, &copied, &home, &env);
    let e = s.call_err_within(
        "sandbox_vm",
        json!({"oci": format!("oci:{}:v1", bare.display()), "name": "bad", "cpus": 1,
               "memory_mb": 256}),
        STEP,
    );
    assert!(
        e.contains(&deb.sha256) && e.contains("nothing was kept"),
        "a corrupted package: {e}"
    );
    let boot = fresh.join("oci").join("boot");
    let left: Vec<String> = std::fs::read_dir(&boot)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.ends_with(".lock"))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "kept of a corrupted package: {left:?}");
}
