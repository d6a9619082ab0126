//! One state folder, two QEMUs: the system's 7.2 and 10.0 unpacked beside it
//! ([`crate::common::qemu10`]). A template pins the concrete machine type, accelerator, CPU model and
//! QEMU version it was saved with, so a template saved under 7.2 starts clones under 10.0, and
//! one saved under 10.0 is refused under 7.2 with the reason, before anything starts.

use std::time::Duration;

use crate::common::qemu10::qemu10;
use crate::common::*;
use serde_json::{json, Value};

const CREATE: Duration = Duration::from_secs(300);
const CLONE: Duration = Duration::from_secs(120);

fn template_args(name: &str) -> Value {
    let g = test_guest();
    json!({
        "name": name, "kernel": g.kernel, "initrd": g.initrd, "append": g.append,
        "memory_mb": 256, "cpus": 1, "wait_agent_s": 180,
        "setup": [{"command": "/bin/sh", "args": ["-c", format!("echo {name} > /root/marker")]}]
    })
}

fn template_record(lab: &Lab, name: &str) -> Value {
    let path = lab
        .state()
        .join("templates")
        .join(name)
        .join("template.json");
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

#[test]
fn a_template_saved_under_7_2_clones_under_10_0_and_the_reverse_is_refused() {
    test_guest();
    let q10 = qemu10();
    let env10 = q10.env();
    let env10: Vec<(&str, &str)> = env10.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let lab = Lab::without_server("qver", 1);
    let mut old = lab.spawn_server();
    let mut new = lab.spawn_server_with(&env10);

    // Saved by 7.2: the concrete machine type and the version are recorded.
    let r = old.call_tool_within("template_create", template_args("t72"), CREATE);
    lab.track(&r);
    tool_ok(&r, "template_create under 7.2");
    let t72 = template_record(&lab, "t72");
    assert_eq!(t72["machine"], json!("pc-q35-7.2"), "{t72}");
    assert!(
        t72["qemu_version"].as_str().unwrap().starts_with("7.2."),
        "{t72}"
    );
    assert_eq!(t72["accel"], json!("tcg"), "{t72}");
    assert_eq!(t72["cpu"], json!("max"), "{t72}");

    // ...cloned under 10.0, with the template's state inside.
    let c = new.call_tool_within(
        "sandbox_vm",
        json!({"name": "c10", "template": "t72"}),
        CLONE,
    );
    lab.track(&c);
    let c = tool_ok(&c, "clone of a 7.2 template under 10.0");
    assert_eq!(c["agent_ready"], json!(true), "{c}");
    let info = new.call_ok("vm_info", json!({"name": "c10"}));
    assert!(
        info["qemu_version"].as_str().unwrap().starts_with("10."),
        "{info}"
    );
    let cat = new.call_ok_within(
        "guest_exec",
        json!({"name": "c10", "command": "/bin/cat", "args": ["/root/marker"]}),
        CLONE,
    );
    assert_eq!(cat["stdout"], json!("t72\n"), "{cat}");
    let d = new.call_ok_within("sandbox_destroy", json!({"name": "c10"}), CLONE);
    assert_eq!(d["destroyed"], json!(true), "{d}");

    // Saved by 10.0: refused under 7.2, naming both versions, and nothing starts.
    let r = new.call_tool_within("template_create", template_args("t10"), CREATE);
    lab.track(&r);
    tool_ok(&r, "template_create under 10.0");
    let t10 = template_record(&lab, "t10");
    assert!(
        t10["machine"].as_str().unwrap().starts_with("pc-q35-10."),
        "{t10}"
    );
    let err = old.call_err_within(
        "sandbox_vm",
        json!({"name": "c72", "template": "t10"}),
        CLONE,
    );
    assert!(
        err.contains("saved by QEMU 10.") && err.contains("older QEMU 7.2"),
        "{err}"
    );
    let vms = old.call_ok("list_vms", json!({}));
    assert!(
        !vms.to_string().contains("c72"),
        "a refused clone was recorded: {vms}"
    );
    assert!(!lab.vm_dir("c72").join("uefi-vars.fd").exists());

    // Pushed from the QEMU 10 host and pulled where QEMU 7.2 runs: refused before anything is
    // written, naming both versions.
    let layout = format!("oci:{}:t10", lab.dir.join("travel").display());
    new.call_ok_within(
        "template_push",
        json!({"name": "t10", "reference": layout}),
        CREATE,
    );
    let err = old.call_err_within(
        "template_pull",
        json!({"reference": layout, "name": "t10-here"}),
        CREATE,
    );
    assert!(
        err.contains("saved by QEMU 10.") && err.contains("older QEMU 7.2"),
        "{err}"
    );
    assert!(!lab.state().join("templates/t10-here").exists());
}
