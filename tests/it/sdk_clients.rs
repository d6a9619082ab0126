//! Real MCP clients against the mcqemu binary: the official Python SDK (in
//! `auto` mode, which must negotiate 2026-07-28, and in `legacy` mode, which
//! must negotiate 2025-11-25) and the official TypeScript SDK (2025-11-25).
//! The client scripts live in tests/clients/; they record the wire traffic and
//! validate it against the era's schema models. Each runs two journeys: tools
//! (no VM), and resources (a running test guest's serial log and screen, the
//! list following the VM as it comes and goes, and a VM that is gone).
//!
//! The SDKs are installed once, pinned, under target/sdk-clients/ (a Python
//! venv and a node_modules tree); that needs python3 (with venv), node and npm
//! on PATH and access to the PyPI and npm registries.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

/// The pinned SDK versions.
const PYTHON_MCP_VERSION: &str = "2.3.0";
const TS_SDK_VERSION: &str = "1.32.2";

/// Bound on one installation step (venv creation, pip install, npm install).
const INSTALL_TIMEOUT: Duration = Duration::from_secs(300);
/// Bound on one client script run (the scripts bound themselves at 100 s).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);
/// How long output pipes may stay open after the process exited.
const PIPE_GRACE: Duration = Duration::from_secs(10);

const SETUP_HINT: &str =
    "These tests need python3 (with the venv module), node (>= 18) and npm on PATH, \
     and access to pypi.org and registry.npmjs.org to install the pinned SDKs under \
     target/sdk-clients/ (e.g. `apt-get install python3-venv nodejs npm`, then re-run \
     `cargo test --test it -- sdk_clients::`).";

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn clients_dir() -> PathBuf {
    manifest_dir().join("tests/clients")
}

fn sdk_root() -> PathBuf {
    manifest_dir().join("target/sdk-clients")
}

/// What a bounded command run produced.
struct Outcome {
    success: bool,
    timed_out: bool,
    status: String,
    stdout: String,
    stderr: String,
}

impl Outcome {
    fn describe(&self) -> String {
        format!(
            "{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            if self.timed_out {
                "TIMED OUT (killed)".to_string()
            } else {
                self.status.clone()
            },
            self.stdout,
            self.stderr
        )
    }
}

/// Read a pipe to its end on a thread; the receiver gets the text at EOF.
fn drain(mut pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
    });
    rx
}

/// The drained text, waiting a little for EOF: a leftover grandchild (say a
/// server that outlived its client) can hold the pipe open.
fn collect(rx: &mpsc::Receiver<String>) -> String {
    rx.recv_timeout(PIPE_GRACE).unwrap_or_else(|_| {
        format!("(output incomplete: the pipe was still open {PIPE_GRACE:?} after the exit)")
    })
}

/// Run `cmd` to completion or until `timeout`, capturing its output. Err only
/// when it cannot be started at all.
fn run_bounded(cmd: &mut Command, timeout: Duration) -> Result<Outcome, String> {
    let mut child: Child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let out = drain(child.stdout.take().expect("piped stdout"));
    let err = drain(child.stderr.take().expect("piped stderr"));
    let deadline = Instant::now() + timeout;
    let (status, timed_out) = loop {
        match child.try_wait() {
            Ok(Some(status)) => break (Some(status), false),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                break (child.wait().ok(), true);
            }
            Ok(None) => thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(format!("waiting for {cmd:?}: {e}")),
        }
    };
    Ok(Outcome {
        success: !timed_out && status.is_some_and(|s| s.success()),
        timed_out,
        status: status.map_or_else(|| "no exit status".into(), |s| s.to_string()),
        stdout: collect(&out),
        stderr: collect(&err),
    })
}

/// Run an installation step; Err carries the full output.
fn install_step(what: &str, cmd: &mut Command) -> Result<(), String> {
    let o = run_bounded(cmd, INSTALL_TIMEOUT)?;
    if o.success {
        Ok(())
    } else {
        Err(format!("{what} failed: {}\n{SETUP_HINT}", o.describe()))
    }
}

fn require_tool(name: &str) -> Result<(), String> {
    match run_bounded(Command::new(name).arg("--version"), Duration::from_secs(30)) {
        Ok(o) if o.success => Ok(()),
        Ok(o) => Err(format!(
            "`{name} --version` failed: {}\n{SETUP_HINT}",
            o.describe()
        )),
        Err(e) => Err(format!("{name} is not usable: {e}\n{SETUP_HINT}")),
    }
}

/// The stamp a finished installation leaves, so an interrupted one is redone.
const STAMP: &str = ".mcqemu-installed";

fn stamped(dir: &Path, version: &str) -> bool {
    std::fs::read_to_string(dir.join(STAMP)).is_ok_and(|s| s.trim() == version)
}

fn stamp(dir: &Path, version: &str) -> Result<(), String> {
    std::fs::write(dir.join(STAMP), format!("{version}\n"))
        .map_err(|e| format!("cannot write {:?}: {e}", dir.join(STAMP)))
}

/// The version of `mcp` the venv's python imports, if any.
fn venv_mcp_version(python: &Path) -> Option<String> {
    let o = run_bounded(
        Command::new(python).args([
            "-c",
            "import importlib.metadata as m, mcp, mcp_types; print(m.version('mcp'))",
        ]),
        Duration::from_secs(60),
    )
    .ok()?;
    o.success.then(|| o.stdout.trim().to_string())
}

fn installed_ts_sdk_version(node_dir: &Path) -> Option<String> {
    let manifest = node_dir.join("node_modules/@modelcontextprotocol/sdk/package.json");
    let text = std::fs::read_to_string(manifest).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json["version"].as_str().map(str::to_string)
}

fn ensure_venv(root: &Path) -> Result<PathBuf, String> {
    let venv = root.join("venv");
    let python = venv.join("bin/python");
    if stamped(&venv, PYTHON_MCP_VERSION)
        && venv_mcp_version(&python).as_deref() == Some(PYTHON_MCP_VERSION)
    {
        return Ok(python);
    }
    require_tool("python3")?;
    // Missing, interrupted, broken or another version: start from a clean venv.
    if venv.exists() {
        std::fs::remove_dir_all(&venv).map_err(|e| format!("cannot remove {venv:?}: {e}"))?;
    }
    install_step(
        "python3 -m venv",
        Command::new("python3").arg("-m").arg("venv").arg(&venv),
    )?;
    install_step(
        &format!("pip install mcp=={PYTHON_MCP_VERSION}"),
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .arg(format!("mcp=={PYTHON_MCP_VERSION}")),
    )?;
    match venv_mcp_version(&python) {
        Some(v) if v == PYTHON_MCP_VERSION => stamp(&venv, PYTHON_MCP_VERSION).map(|()| python),
        other => Err(format!(
            "after installing, the venv at {venv:?} imports mcp {other:?}, not {PYTHON_MCP_VERSION}"
        )),
    }
}

fn ensure_node_modules(root: &Path) -> Result<PathBuf, String> {
    let node_dir = root.join("node");
    require_tool("node")?;
    if stamped(&node_dir, TS_SDK_VERSION)
        && installed_ts_sdk_version(&node_dir).as_deref() == Some(TS_SDK_VERSION)
    {
        return Ok(node_dir);
    }
    require_tool("npm")?;
    if node_dir.exists() {
        std::fs::remove_dir_all(&node_dir)
            .map_err(|e| format!("cannot remove {node_dir:?}: {e}"))?;
    }
    std::fs::create_dir_all(&node_dir).map_err(|e| format!("cannot create {node_dir:?}: {e}"))?;
    let manifest = serde_json::json!({
        "name": "mcqemu-sdk-clients",
        "private": true,
        "dependencies": { "@modelcontextprotocol/sdk": TS_SDK_VERSION }
    });
    std::fs::write(node_dir.join("package.json"), format!("{manifest:#}\n"))
        .map_err(|e| format!("cannot write {node_dir:?}/package.json: {e}"))?;
    install_step(
        &format!("npm install @modelcontextprotocol/sdk@{TS_SDK_VERSION}"),
        Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--ignore-scripts"])
            .current_dir(&node_dir),
    )?;
    match installed_ts_sdk_version(&node_dir) {
        Some(v) if v == TS_SDK_VERSION => stamp(&node_dir, TS_SDK_VERSION).map(|()| node_dir),
        other => Err(format!(
            "after npm install, {node_dir:?} holds @modelcontextprotocol/sdk {other:?}, not {TS_SDK_VERSION}"
        )),
    }
}

/// Run one installation once per test process, serialised across processes by
/// a lock under target/sdk-clients; every caller gets its result.
fn installed(
    cell: &'static OnceLock<Result<PathBuf, String>>,
    install: fn(&Path) -> Result<PathBuf, String>,
) -> &'static Path {
    let setup = cell.get_or_init(|| {
        let root = sdk_root();
        std::fs::create_dir_all(&root).map_err(|e| format!("cannot create {root:?}: {e}"))?;
        let _lock = crate::common::dirlock::DirLock::acquire(root.join(".install.lock"))?;
        install(&root)
    });
    match setup {
        Ok(path) => path,
        Err(e) => panic!("SDK client setup failed: {e}"),
    }
}

/// The venv's python, with the pinned Python SDK.
fn python() -> &'static Path {
    static VENV: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    installed(&VENV, ensure_venv)
}

/// The directory whose node_modules holds the pinned TypeScript SDK.
fn node_dir() -> &'static Path {
    static NODE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    installed(&NODE, ensure_node_modules)
}

fn run_client(what: &str, cmd: &mut Command) {
    let outcome = run_bounded(cmd, CLIENT_TIMEOUT).unwrap_or_else(|e| panic!("{what}: {e}"));
    if !outcome.success {
        panic!("{what} failed: {}", outcome.describe());
    }
    print!("{}", outcome.stdout);
}

fn python_client(mode: &str) {
    run_client(
        &format!("python_client.py {mode}"),
        Command::new(python())
            .arg(clients_dir().join("python_client.py"))
            .arg(env!("CARGO_BIN_EXE_mcqemu"))
            .arg(mode),
    );
}

/// The environment of a resources journey: the test guest, and the folders and roots of
/// `lab` (whose killer ends whatever QEMU the journey leaves).
fn resources_env(
    lab: &crate::common::Lab,
    guest: &crate::common::Guest,
) -> Vec<(&'static str, String)> {
    vec![
        ("MCQEMU_TEST_KERNEL", guest.kernel.clone()),
        ("MCQEMU_TEST_INITRD", guest.initrd.clone()),
        ("MCQEMU_TEST_APPEND", guest.append.clone()),
        ("MCQEMU_STATE_DIR", lab.state().display().to_string()),
        ("MCQEMU_RUNTIME_DIR", lab.runtime().display().to_string()),
        ("MCQEMU_ROOTS", crate::common::test_roots()),
    ]
}

fn python_resources(mode: &str) {
    let python = python();
    let guest = crate::common::test_guest();
    let lab = crate::common::Lab::without_server(&format!("sdk-{mode}"), 1);
    run_client(
        &format!("python_client.py {mode} resources"),
        Command::new(python)
            .arg(clients_dir().join("python_client.py"))
            .arg(env!("CARGO_BIN_EXE_mcqemu"))
            .arg(mode)
            .arg("resources")
            .envs(resources_env(&lab, &guest)),
    );
}

#[test]
fn python_sdk_auto_mode_reads_vm_resources_and_listens_for_changes() {
    python_resources("auto");
}

#[test]
fn python_sdk_legacy_mode_reads_vm_resources_and_hears_list_changed() {
    python_resources("legacy");
}

#[test]
fn typescript_sdk_reads_vm_resources_and_hears_list_changed() {
    let (python, node_dir) = (python(), node_dir());
    let guest = crate::common::test_guest();
    let lab = crate::common::Lab::without_server("sdk-ts", 1);
    run_client(
        "ts_client.mjs resources",
        Command::new("node")
            .arg(clients_dir().join("ts_client.mjs"))
            .arg(env!("CARGO_BIN_EXE_mcqemu"))
            .arg("resources")
            .env("MCQEMU_SDK_NODE_DIR", node_dir)
            .env("MCQEMU_SDK_PYTHON", python)
            .envs(resources_env(&lab, &guest)),
    );
}

#[test]
fn python_sdk_auto_mode_speaks_2026_07_28() {
    python_client("auto");
}

#[test]
fn python_sdk_legacy_mode_speaks_2025_11_25() {
    python_client("legacy");
}

#[test]
fn typescript_sdk_speaks_2025_11_25() {
    // ts_client.mjs runs record.py and validate_transcript.py with the venv's python.
    let (python, node_dir) = (python(), node_dir());
    run_client(
        "ts_client.mjs",
        Command::new("node")
            .arg(clients_dir().join("ts_client.mjs"))
            .arg(env!("CARGO_BIN_EXE_mcqemu"))
            .env("MCQEMU_SDK_NODE_DIR", node_dir)
            .env("MCQEMU_SDK_PYTHON", python),
    );
}
