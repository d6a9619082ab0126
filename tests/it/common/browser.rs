//! The real browser of the live-view tests and benches: Debian's Chromium, driven headless by
//! playwright-core, and the official MCP Apps host bridge, from npm packages pinned here and
//! installed once under target/browser-tests/node beside the scripts of `tests/browser/`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

/// The pinned npm packages: playwright-core drives Chromium; the official MCP Apps host
/// bridge (ext-apps, with the v2 SDK packages and zod it needs, bundled by esbuild) hosts the
/// view; the TypeScript SDK's client talks to mcqemu.
const PACKAGES: &[(&str, &str)] = &[
    ("playwright-core", "1.65.1"),
    ("@modelcontextprotocol/ext-apps", "2.0.4"),
    ("@modelcontextprotocol/client", "2.4.0"),
    ("@modelcontextprotocol/core", "2.4.0"),
    ("@modelcontextprotocol/sdk", "1.32.2"),
    ("zod", "4.6.7"),
    ("esbuild", "0.25.12"),
];
fn installed(dir: &Path, package: &str) -> Option<String> {
    let manifest = dir.join("node_modules").join(package).join("package.json");
    let v: Value = serde_json::from_slice(&std::fs::read(manifest).ok()?).ok()?;
    v["version"].as_str().map(String::from)
}

/// target/browser-tests/node with [`PACKAGES`] installed (once, under a lock) and the test
/// scripts copied beside them (an ES module finds its imports beside itself).
pub fn node_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/browser-tests");
    let dir = root.join("node");
    std::fs::create_dir_all(&dir).expect("create target/browser-tests/node");
    let _lock = super::dirlock::DirLock::acquire(root.join(".install.lock")).expect("lock");
    if PACKAGES
        .iter()
        .any(|(p, v)| installed(&dir, p).as_deref() != Some(*v))
    {
        let deps: serde_json::Map<String, Value> = PACKAGES
            .iter()
            .map(|(p, v)| (p.to_string(), json!(v)))
            .collect();
        let pkg = json!({"name": "mcqemu-browser-tests", "private": true,
                         "type": "module", "dependencies": deps});
        std::fs::write(dir.join("package.json"), format!("{pkg:#}\n")).expect("package.json");
        // ext-apps names React and the v2 server as peers; the test needs neither.
        let st = Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--legacy-peer-deps"])
            .current_dir(&dir)
            .status()
            .expect("run npm (apt-get install npm)");
        assert!(
            st.success(),
            "npm install of the browser-test packages failed"
        );
    }
    for f in [
        "view_http.mjs",
        "view_apps.mjs",
        "apps_host.js",
        "view_bench.mjs",
        "view_desktop.mjs",
        "view_page.mjs",
    ] {
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/browser")
                .join(f),
            dir.join(f),
        )
        .expect("copy a browser script");
    }
    dir
}

/// A base64 PNG as (width, height, RGBA pixels).
pub fn decode(b64: &str) -> (u32, u32, Vec<[u8; 4]>) {
    let bytes = super::b64::b64_decode(b64);
    let mut r = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .expect("a PNG");
    let mut buf = vec![0; r.output_buffer_size().expect("size")];
    let info = r.next_frame(&mut buf).expect("PNG data");
    let bpp = info.line_size / info.width as usize;
    let px = buf[..info.buffer_size()]
        .chunks(bpp)
        .map(|c| {
            [
                c[0],
                c[1 % bpp],
                c[2 % bpp],
                if bpp == 4 { c[3] } else { 255 },
            ]
        })
        .collect();
    (info.width, info.height, px)
}

/// Longest run of one browser script (each of its steps has a bound of its own).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(300);

/// Runs one of the browser scripts in the node folder; the JSON line it printed last.
pub fn run_node(node: &Path, script: &str, args: &[&str], env: &[(&str, &str)]) -> Value {
    try_run_node(node, script, args, env).unwrap_or_else(|e| panic!("{e}"))
}

/// [`run_node`], an `Err` saying what went wrong.
pub fn try_run_node(
    node: &Path,
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<Value, String> {
    let mut cmd = Command::new("node");
    cmd.arg(node.join(script))
        .args(args)
        .envs(env.iter().copied())
        .current_dir(node);
    let out = super::cli::try_run_command(&mut cmd, None, SCRIPT_TIMEOUT)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "{script} failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_str(stdout.trim().lines().last().unwrap_or("{}"))
        .map_err(|e| format!("{script} printed no JSON ({e}): {stdout}"))
}

/// The Chromium to drive: `$CHROMIUM`, else Debian's.
pub fn chromium() -> String {
    let c = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&c).exists(),
        "no Chromium at {c}: apt-get install chromium (.ci/setup-host does), or set CHROMIUM"
    );
    c
}
