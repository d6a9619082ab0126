//! Fixtures of the security tests (`tests/security_*.rs`): a root beside the outside world
//! ([`Fence`]), servers rooted there, qemu-img images and overlays, symlinks, the refusal check
//! ([`assert_refused`]), a [`Tripwire`] that must never be contacted, and launch_vm arguments
//! for a small VM.

use std::io::ErrorKind;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use super::cli::run_tool;
use super::files::TempDir;
use super::lab::Lab;
use super::server::{Server, NEWEST};

/// Bound for a launch_vm call (QEMU start-up plus the first QMP session) on a loaded machine.
pub const LAUNCH: Duration = Duration::from_secs(120);

/// A root (`root/`) and the outside world (`out/`) side by side in one folder, canonical.
pub struct Fence {
    pub root: PathBuf,
    pub out: PathBuf,
}

impl Fence {
    pub fn in_folder(base: &Path) -> Fence {
        let base = std::fs::canonicalize(base).expect("canonical test folder");
        let root = base.join("root");
        let out = base.join("out");
        for d in [&root, &out] {
            std::fs::create_dir_all(d).expect("create fence folder");
        }
        Fence { root, out }
    }

    pub fn r(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    pub fn o(&self, rel: &str) -> PathBuf {
        self.out.join(rel)
    }
}

/// A server (own temp folder) whose only operator root is `root`.
pub fn server_rooted_at(root: &Path) -> Server {
    let mut s = Server::start_with_env(&[("MCQEMU_ROOTS", st(root))]);
    s.initialize(NEWEST);
    s
}

/// A server on the lab's state and runtime folders with `env` (e.g. its roots or quotas).
pub fn lab_server(lab: &Lab, env: &[(&str, &str)]) -> Server {
    let mut s = Server::try_start_with(TempDir::new("srv"), &lab.state(), &lab.runtime(), env)
        .unwrap_or_else(|e| panic!("{e}"));
    s.initialize(NEWEST);
    s
}

pub fn st(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Runs qemu-img and fails the test when it fails.
pub fn qemu_img(args: &[&str]) {
    let (ok, out, err) = run_tool("qemu-img", args);
    assert!(ok, "qemu-img {args:?} failed: {out}{err}");
}

pub fn qcow2(path: &Path, size: &str) {
    qemu_img(&["create", "-q", "-f", "qcow2", st(path), size]);
}

/// A qcow2 overlay on `backing` (written into the image as given), not opening it.
pub fn overlay(path: &Path, backing: &str, backing_format: &str) {
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-u",
        "-b",
        backing,
        "-F",
        backing_format,
        st(path),
        "1M",
    ]);
}

pub fn symlink(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link).expect("symlink");
}

/// Checks a refusal names `target` (the path as resolved), lists `root` among the roots and
/// says how an operator widens them.
pub fn assert_refused(err: &str, target: &Path, root: &Path) {
    let t = st(target);
    assert!(err.contains(t), "the refusal does not name {t}: {err}");
    let listed = format!("{} (", root.display());
    assert!(
        err.contains(&listed),
        "the refusal does not list the root {}: {err}",
        root.display()
    );
    assert!(
        err.contains("--root"),
        "the refusal does not mention --root: {err}"
    );
}

/// A TCP listener standing in for an NBD or HTTP server that must never be contacted.
pub struct Tripwire(TcpListener);

impl Tripwire {
    pub fn new() -> Tripwire {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind tripwire");
        l.set_nonblocking(true).expect("nonblocking");
        Tripwire(l)
    }

    pub fn port(&self) -> u16 {
        self.0.local_addr().unwrap().port()
    }

    /// Fails the test when anything connected.
    pub fn assert_untouched(&self, what: &str) {
        match self.0.accept() {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Ok((_, peer)) => panic!("{what}: something connected to the tripwire from {peer}"),
            Err(e) => panic!("{what}: tripwire accept failed: {e}"),
        }
    }
}

/// The list_vms names of a server.
pub fn vm_names(s: &mut Server) -> Vec<String> {
    let l = s.call_ok("list_vms", json!({}));
    l["vms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect()
}

/// launch_vm arguments for a small diskless BIOS VM under TCG, plus `extra` fields.
pub fn vm_args(name: &str, extra: Value) -> Value {
    let mut a = json!({"name": name, "memory_mb": 64, "cpus": 1, "accel": "tcg", "no_net": true});
    if let Value::Object(m) = extra {
        for (k, v) in m {
            a[k] = v;
        }
    }
    a
}
