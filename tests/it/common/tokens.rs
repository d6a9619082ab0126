//! Token counts of the tool list, with a real tokenizer: npm's `gpt-tokenizer` (cl100k_base,
//! bundled in the package), installed once into `target/sdk-clients/tokenizer` under the
//! client installers' lock, run by `tests/clients/count_tokens.mjs`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

use super::cli::try_run_command;

/// The pinned tokenizer.
const TOKENIZER: &str = "gpt-tokenizer@4.0.0";

/// Bound on the install and on one count.
const STEP: Duration = Duration::from_secs(300);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/sdk-clients")
}

/// The folder whose node_modules holds the tokenizer, installed once per process.
fn tokenizer() -> Result<PathBuf, String> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = root();
        std::fs::create_dir_all(&root).map_err(|e| format!("cannot create {root:?}: {e}"))?;
        let _lock = super::dirlock::DirLock::acquire(root.join(".install.lock"))?;
        let dir = root.join("tokenizer");
        let stamp = dir.join(".installed");
        if std::fs::read_to_string(&stamp).ok().as_deref() == Some(TOKENIZER) {
            return Ok(dir);
        }
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {dir:?}: {e}"))?;
        std::fs::write(dir.join("package.json"), "{\"private\": true}\n")
            .map_err(|e| format!("cannot write {dir:?}/package.json: {e}"))?;
        let done = try_run_command(
            Command::new("npm")
                .args([
                    "install",
                    "--no-audit",
                    "--no-fund",
                    "--ignore-scripts",
                    TOKENIZER,
                ])
                .current_dir(&dir),
            None,
            STEP,
        )?;
        if !done.status.success() {
            return Err(format!(
                "npm install {TOKENIZER} failed ({}): {} (needs npm and the npm registry)",
                done.status,
                String::from_utf8_lossy(&done.stderr).trim()
            ));
        }
        std::fs::write(&stamp, TOKENIZER).map_err(|e| format!("cannot write {stamp:?}: {e}"))?;
        Ok(dir)
    })
    .clone()
}

/// Tokens of what a host shows the model of `tools` (a tools/list `tools` array): each tool's
/// name, description and inputSchema. Returns the total and the count per tool.
pub fn tool_tokens(tools: &Value) -> Result<(u64, Vec<(String, u64)>), String> {
    let dir = tokenizer()?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/count_tokens.mjs");
    let input = serde_json::to_vec(tools).map_err(|e| e.to_string())?;
    let done = try_run_command(
        Command::new("node").arg(script).arg(&dir),
        Some(&input),
        STEP,
    )?;
    if !done.status.success() {
        return Err(format!(
            "count_tokens.mjs failed ({}): {}",
            done.status,
            String::from_utf8_lossy(&done.stderr).trim()
        ));
    }
    let v: Value = serde_json::from_slice(&done.stdout)
        .map_err(|e| format!("count_tokens.mjs printed no JSON ({e})"))?;
    let mut per: Vec<(String, u64)> = v["tools"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, n)| (k.clone(), n.as_u64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default();
    per.sort_by_key(|p| std::cmp::Reverse(p.1));
    Ok((v["total"].as_u64().unwrap_or(0), per))
}
