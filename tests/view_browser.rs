//! The live view in a real browser: Debian's Chromium, headless, driven by playwright-core
//! (installed on first use under target/browser-tests/), on the page `mcqemu view` serves for a
//! real VM (the test guest). The page draws the VM's screen, a person takes over, types a line
//! that reaches the guest's console exactly, clicks, and hands back; the page logs no console
//! error and asks nothing of any other origin, and the hold is gone afterwards.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::view::{boot_test_sandbox, finish_tty_reader, spawn_view, start_tty_reader};
use common::*;
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
const STEP: Duration = Duration::from_secs(60);

fn installed(dir: &Path, package: &str) -> Option<String> {
    let manifest = dir.join("node_modules").join(package).join("package.json");
    let v: Value = serde_json::from_slice(&std::fs::read(manifest).ok()?).ok()?;
    v["version"].as_str().map(String::from)
}

/// target/browser-tests/node with [`PACKAGES`] installed (once, under a lock) and the test
/// scripts copied beside them (an ES module finds its imports beside itself).
fn node_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/browser-tests");
    let dir = root.join("node");
    std::fs::create_dir_all(&dir).expect("create target/browser-tests/node");
    let _lock = common::dirlock::DirLock::acquire(root.join(".install.lock")).expect("lock");
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
fn decode(b64: &str) -> (u32, u32, Vec<[u8; 4]>) {
    let bytes = common::b64::b64_decode(b64);
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

/// Runs one of the browser scripts in the node folder; the JSON line it printed last.
fn run_node(node: &Path, script: &str, args: &[&str], env: &[(&str, &str)]) -> Value {
    let out = Command::new("node")
        .arg(node.join(script))
        .args(args)
        .envs(env.iter().copied())
        .current_dir(node)
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim().lines().last().unwrap_or("{}"))
        .unwrap_or_else(|e| panic!("{script} printed no JSON ({e}): {stdout}"))
}

fn chromium() -> String {
    let c = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&c).exists(),
        "no Chromium at {c}: apt-get install chromium (.ci/setup-host does), or set CHROMIUM"
    );
    c
}

#[test]
fn the_view_in_chromium_shows_the_screen_and_a_person_types_into_the_guest() {
    let chromium = chromium();
    let node = node_dir();
    let mut lab = Lab::new("vbrowser");
    let name = "vb";
    boot_test_sandbox(&mut lab, name);

    // A guest program waiting for a line on the console the keyboard types into.
    let reader = start_tty_reader(lab.srv(), name, "vb");

    let (mut view, url) = spawn_view(&lab, name);
    let shot = std::env::var("MCQEMU_VIEW_SHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| lab.dir.join("view.png"));
    let typed = "Typed in Chromium: a-Z 0-9 ~!@#";
    let seen = run_node(
        &node,
        "view_http.mjs",
        &[url.as_str(), typed, shot.to_str().unwrap()],
        &[("CHROMIUM", chromium.as_str())],
    );
    let _ = view.kill();
    let _ = view.wait();
    let first = seen["first_frame"].as_str().unwrap_or_default().to_string();
    let mut seen = seen;
    seen["first_frame"] = json!(format!("({} bytes)", first.len()));
    eprintln!("the view in Chromium: {seen}");
    // The page drew the screen vm_screenshot shows (the cursor may have blinked between).
    let drawn = decode(
        first
            .strip_prefix("data:image/png;base64,")
            .expect("a PNG data URL"),
    );
    // (call_keeping: the tty reader's answer may come meanwhile and must be kept.)
    let screenshot = lab
        .srv()
        .call_keeping("vm_screenshot", json!({"name": name}), STEP);
    let img = screenshot["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "image")
        .expect("vm_screenshot's image");
    let taken = decode(img["data"].as_str().unwrap());
    assert_eq!((drawn.0, drawn.1), (taken.0, taken.1), "sizes differ");
    let differ = drawn.2.iter().zip(&taken.2).filter(|(a, b)| a != b).count();
    assert!(
        differ * 100 <= drawn.2.len(),
        "{differ} of {} pixels differ from vm_screenshot's",
        drawn.2.len()
    );
    assert_eq!(seen["console_errors"], json!([]), "{seen}");
    assert_eq!(seen["elsewhere"], json!([]), "{seen}");
    assert!(seen["frames"].as_u64().unwrap_or(0) >= 1, "{seen}");
    assert_eq!(seen["steps"]["held"], json!(true), "{seen}");
    let png = std::fs::read(&shot).expect("the page's screenshot");
    assert!(png.len() > 1000);

    assert_eq!(finish_tty_reader(lab.srv(), &reader), typed);
    let info = lab.srv().call_ok("vm_info", json!({"name": name}));
    assert!(
        info["held"].is_null(),
        "the hold outlived the hand-back: {info}"
    );
}

#[test]
fn the_view_as_an_mcp_app_under_the_official_host_bridge() {
    let chromium = chromium();
    let node = node_dir();
    let mut lab = Lab::new("vapps");
    let name = "va";
    boot_test_sandbox(&mut lab, name);
    let reader = start_tty_reader(lab.srv(), name, "va");
    let typed = "Typed through the host bridge 42";
    let (state, runtime) = (lab.state(), lab.runtime());
    let roots = test_roots();
    let seen = run_node(
        &node,
        "view_apps.mjs",
        &[BIN, name, typed],
        &[
            ("MCQEMU_STATE_DIR", state.to_str().unwrap()),
            ("MCQEMU_RUNTIME_DIR", runtime.to_str().unwrap()),
            ("MCQEMU_ROOTS", roots.as_str()),
            ("CHROMIUM", chromium.as_str()),
        ],
    );
    eprintln!("the view under AppBridge: {seen}");
    assert_eq!(seen["console_errors"], json!([]), "{seen}");
    assert_eq!(seen["elsewhere"], json!([]), "{seen}");
    assert_eq!(seen["steps"]["mime"], json!("text/html;profile=mcp-app"));
    assert!(
        seen["calls"]["vm_view_frame"].as_u64().unwrap_or(0) >= 1,
        "{seen}"
    );
    assert!(
        seen["calls"]["vm_view_input"].as_u64().unwrap_or(0) >= 1,
        "{seen}"
    );
    let told = seen["steps"]["context"].to_string();
    assert!(
        told.contains("handed back") && told.contains(name),
        "{told}"
    );
    assert_eq!(seen["steps"]["held_before_teardown"], json!(true), "{seen}");
    assert_eq!(seen["steps"]["held_after_teardown"], json!(false), "{seen}");
    assert_eq!(finish_tty_reader(lab.srv(), &reader), typed);
}
