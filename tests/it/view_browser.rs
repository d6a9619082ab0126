//! The live view in a real browser: Debian's Chromium, headless, driven by playwright-core
//! (installed on first use under target/browser-tests/), on the page `mcqemu view` serves for a
//! real VM (the test guest). The page draws the VM's screen, a person takes over, types a line
//! that reaches the guest's console exactly, clicks, and hands back; the page logs no console
//! error and asks nothing of any other origin, and the hold is gone afterwards.

use std::path::PathBuf;
use std::time::Duration;

use crate::common::browser::{chromium, decode, node_dir, run_node};
use crate::common::view::{boot_test_sandbox, finish_tty_reader, spawn_view, start_tty_reader};
use crate::common::*;
use serde_json::{json, Value};

const STEP: Duration = Duration::from_secs(60);

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

    // x and y of the batch "xéy" arrived (é has no US key); the page said what it left out.
    assert_eq!(finish_tty_reader(lab.srv(), &reader), format!("{typed}xy"));
    let status = seen["steps"]["status_after_typing"]
        .as_str()
        .unwrap_or_default();
    assert!(
        status.contains("not typed") && status.contains('é'),
        "{seen}"
    );
    // Chords went out as pressed, and the server took them.
    let inputs = seen["inputs"].as_array().expect("the input batches");
    let chords: Vec<&Value> = inputs
        .iter()
        .flat_map(|i| i["events"].as_array().into_iter().flatten())
        .filter(|e| e["type"] == "keys")
        .flat_map(|e| e["keys"].as_array().into_iter().flatten())
        .collect();
    assert!(
        chords.contains(&&json!("ctrl-shift-a")) && chords.contains(&&json!("ctrl-shift-1")),
        "{chords:?}"
    );
    let refused: Vec<&Value> = inputs.iter().filter(|i| i["error"] == true).collect();
    assert!(refused.is_empty(), "the server refused input: {refused:?}");
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
    assert_eq!(
        seen["steps"]["calls_after_teardown"],
        json!([]),
        "the view went on calling after its teardown: {seen}"
    );
    assert_eq!(finish_tty_reader(lab.srv(), &reader), typed);
}
