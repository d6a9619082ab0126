//! cloud-init and image_prepare on the test cloud image (tests/cloud/build_cloud.py: Debian 12
//! with cloud-init and qemu-guest-agent), over MCP against the built binary and real QEMU:
//!
//! - sandbox_vm with `cloud_init` and `wait_cloud_init`: users, sudo, keys, host name, runcmd
//!   (shell strings and argv lists), write_files, cloud-init's own schema check, and a second
//!   sandbox from the same base being a new instance;
//! - image_prepare: the source untouched, a flat qcow2 that boots as a sandbox with a new
//!   machine-id and instance-id, and the caller's cloud_init baked in.
//!
//! Cloud-image boots are slow under TCG (the agent answers after ~20-35 s, cloud-init finishes
//! after ~45-90 s on 2 idle cores), so each test holds one guest slot and boots its guests one
//! after the other (the tests run side by side: at most two guests at once). Every QEMU is
//! SIGKILLed on the way out, pass or fail ([`Lab`]). Guests keep the sandbox default restricted
//! network: nothing leaves this machine.

use std::time::Instant;

use crate::common::cloud_guest::{self as cg, *};
use crate::common::*;
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// 2. cloud-init end to end in sandboxes of the cloud image

#[test]
fn cloud_init_sandbox_end_to_end() {
    let image = test_cloud_image();
    let (lab, mut s) = cloud_lab("e2e");
    let t0 = Instant::now();

    // write_files content that breaks naive YAML, checked byte for byte in the guest.
    let content =
        "a: b # not a comment\n'single' \"double\" both ' \"\n*star &anchor !tag - dash\n\
                   yes\noff\n\ttab\\backslash é 😀\n---\n#cloud-config\nno newline at the end";
    let argv_file = "/var/tmp/mcq argv: yes #1 &*!";
    let cloud_init = json!({
        "hostname": "mcq-ci-one",
        "users": [{"name": "dev", "ssh_authorized_keys": [TEST_KEY], "sudo": true,
                   "shell": "/bin/bash", "groups": ["adm"]}],
        "runcmd": [
            "echo mcq-marker-one > /var/tmp/mcq-marker-1",
            "printf '%s\\n' 'a: b # c' \"it's\" > /var/tmp/mcq-runcmd-string",
            ["touch", argv_file],
            ["sh", "-c", "printf '%s|' \"$@\" > /var/tmp/mcq-runcmd-argv", "sh",
             "one two", "it's", "a: b", "#c", "yes", "*x"]
        ],
        "write_files": [{"path": "/etc/mcq-tricky.txt", "content": content,
                         "permissions": "0640"}],
        "packages": ["hello"]
    });
    let one = "ci-one";
    let sb = cloud_sandbox(
        &lab,
        &mut s,
        cloud_sandbox_args(&image, one, &image.disk, cloud_init.clone()),
    );
    // packages cannot install without a network: "error" (or "degraded" in newer cloud-init)
    // is expected then; everything else must still have run.
    let status = sb["cloud_init"]["status"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        ["done", "error", "degraded"]
            .iter()
            .any(|s| status.starts_with(s)),
        "cloud-init status: {}",
        sb["cloud_init"]
    );
    eprintln!(
        "first sandbox cloud-init report: {}",
        sb["cloud_init"]["report"]
    );
    let iid_one = recorded_instance_id(&mut s, one);

    // The host name, the user, its groups, shell, sudo rule and key.
    assert_eq!(sh(&mut s, one, "hostname").trim(), "mcq-ci-one");
    let id = sh(&mut s, one, "id dev");
    assert!(id.contains("(adm)"), "id dev: {id}");
    let passwd = sh(&mut s, one, "getent passwd dev");
    assert!(
        passwd.trim_end().ends_with(":/home/dev:/bin/bash"),
        "{passwd}"
    );
    let sudo = sh(&mut s, one, "sudo -l -U dev");
    assert!(sudo.contains("NOPASSWD: ALL"), "sudo -l -U dev: {sudo}");
    let keys =
        String::from_utf8(guest_bytes(&mut s, one, "/home/dev/.ssh/authorized_keys")).unwrap();
    assert!(
        keys.lines().any(|l| l == TEST_KEY),
        "authorized_keys: {keys}"
    );
    assert_eq!(
        sh(&mut s, one, "stat -c %U /home/dev/.ssh/authorized_keys").trim(),
        "dev"
    );

    // runcmd: a shell string, and argv lists with every element kept whole.
    assert_eq!(
        guest_bytes(&mut s, one, "/var/tmp/mcq-marker-1"),
        b"mcq-marker-one\n"
    );
    assert_eq!(
        guest_bytes(&mut s, one, "/var/tmp/mcq-runcmd-string"),
        b"a: b # c\nit's\n"
    );
    let r = exec(&mut s, one, "test", &["-f", argv_file]);
    assert_eq!(
        r["exitcode"],
        json!(0),
        "runcmd's argv list did not touch {argv_file:?}"
    );
    assert_eq!(
        String::from_utf8(guest_bytes(&mut s, one, "/var/tmp/mcq-runcmd-argv")).unwrap(),
        "one two|it's|a: b|#c|yes|*x|"
    );

    // write_files: byte for byte, mode 0640.
    assert_eq!(
        String::from_utf8(guest_bytes(&mut s, one, "/etc/mcq-tricky.txt")).unwrap(),
        content
    );
    assert_eq!(
        sh(&mut s, one, "stat -c %a /etc/mcq-tricky.txt").trim(),
        "640"
    );

    // cloud-init's own schema check of the user-data it was given.
    let schema = exec(&mut s, one, "cloud-init", &["schema", "--system"]);
    assert_eq!(
        schema["exitcode"],
        json!(0),
        "cloud-init schema --system refused the user-data: {schema}"
    );

    // The YAML through the guest's PyYAML (cloud-init's own parser), whatever the host has.
    let parsed: Value = serde_json::from_str(&sh(
        &mut s,
        one,
        "python3 -c 'import yaml, json; \
         print(json.dumps(yaml.safe_load(open(\"/var/lib/cloud/instance/user-data.txt\"))))'",
    ))
    .expect("json from the guest");
    assert_eq!(parsed["runcmd"], cloud_init["runcmd"], "{parsed}");
    assert_eq!(
        parsed["write_files"][0]["content"],
        json!(content),
        "{parsed}"
    );
    assert_eq!(parsed["packages"], json!(["hello"]), "{parsed}");
    assert_eq!(
        parsed["users"][1]["sudo"],
        json!("ALL=(ALL) NOPASSWD:ALL"),
        "{parsed}"
    );

    // The instance is the one this launch announced.
    let guest_iid = sh(&mut s, one, "cat /var/lib/cloud/data/instance-id");
    assert_eq!(guest_iid.trim(), iid_one);
    let queried = exec(&mut s, one, "cloud-init", &["query", "instance_id"]);
    assert_eq!(queried["exitcode"], json!(0), "{queried}");
    assert_eq!(queried["stdout"].as_str().unwrap().trim(), iid_one);
    eprintln!("first sandbox checked after {:?}", t0.elapsed());
    let sb_iid_one = sb["cloud_init"]["instance_id"].clone();
    destroy(&mut s, one);

    // -- A second sandbox from the same base: a new instance with its own name and data.
    let two = "ci-two";
    let sb2 = cloud_sandbox(
        &lab,
        &mut s,
        cloud_sandbox_args(
            &image,
            two,
            &image.disk,
            json!({"hostname": "mcq-ci-two",
                   "runcmd": ["echo mcq-marker-two > /var/tmp/mcq-marker-2"]}),
        ),
    );
    assert_eq!(
        sb2["cloud_init"]["status"],
        json!("done"),
        "a seed without packages should leave cloud-init done: {}",
        sb2["cloud_init"]
    );
    let iid_two = recorded_instance_id(&mut s, two);
    assert_ne!(iid_one, iid_two);
    assert_eq!(
        sh(&mut s, two, "cat /var/lib/cloud/data/instance-id").trim(),
        iid_two
    );
    assert_eq!(sh(&mut s, two, "hostname").trim(), "mcq-ci-two");
    assert_eq!(
        guest_bytes(&mut s, two, "/var/tmp/mcq-marker-2"),
        b"mcq-marker-two\n"
    );
    let r = exec(
        &mut s,
        two,
        "sh",
        &["-c", "ls /var/tmp/mcq-marker-1 /etc/mcq-tricky.txt; id dev"],
    );
    assert_ne!(
        r["exitcode"],
        json!(0),
        "the first sandbox's data is in the second: {r}"
    );
    assert!(
        !r["stdout"].as_str().unwrap().contains("mcq-marker-1"),
        "the first sandbox's marker is in the second: {r}"
    );
    copies_with_coreutils(&lab, &mut s, two);
    let sb_iid_two = sb2["cloud_init"]["instance_id"].clone();
    destroy(&mut s, two);
    eprintln!("cloud_init_sandbox_end_to_end took {:?}", t0.elapsed());

    // Last, so that everything above is checked either way: sandbox_vm's result carries the
    // instance-id of the launch, beside the cloud-init report.
    assert_eq!(
        (sb_iid_one, sb_iid_two),
        (json!(iid_one), json!(iid_two)),
        "sandbox_vm with wait_cloud_init dropped the launch's cloud_init.instance_id: {}",
        sb["cloud_init"]
    );
}

/// guest_copy_in and guest_copy_out over the data channel in a Debian guest (coreutils' dd
/// and head, GNU tar, udev): exact bytes (sha256sum in the guest), modes and a link kept.
fn copies_with_coreutils(lab: &Lab, s: &mut Server, vm: &str) {
    let src = lab.dir.subdir("copy-src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    let big = pseudo_random(5 << 20, 21);
    std::fs::write(src.join("sub/big.bin"), &big).unwrap();
    std::fs::write(src.join("run.sh"), "#!/bin/sh\necho ran\n").unwrap();
    std::fs::set_permissions(
        src.join("run.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o750),
    )
    .unwrap();
    std::os::unix::fs::symlink("sub/big.bin", src.join("link")).unwrap();
    let r = s.call_ok_within(
        "guest_copy_in",
        json!({"name": vm, "host_path": src, "guest_path": "/var/tmp/copied"}),
        STEP,
    );
    assert_eq!(r["via"], json!("channel"), "{r}");
    let listing = sh(
        s,
        vm,
        "cd /var/tmp/copied && sha256sum sub/big.bin | cut -d' ' -f1 && stat -c %a run.sh \
         && readlink link",
    );
    assert_eq!(
        listing,
        format!("{}\n750\nsub/big.bin\n", sha256_hex(&big)),
        "the copy in the guest"
    );
    let back = lab.dir.join("copy-back");
    let r = s.call_ok_within(
        "guest_copy_out",
        json!({"name": vm, "guest_path": "/var/tmp/copied", "host_path": back}),
        STEP,
    );
    assert_eq!(r["via"], json!("channel"), "{r}");
    assert_eq!(std::fs::read(back.join("sub/big.bin")).unwrap(), big);
    assert_eq!(
        std::fs::read_link(back.join("link")).unwrap(),
        std::path::Path::new("sub/big.bin")
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(back.join("run.sh"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o750);
}

// ---------------------------------------------------------------------------------------------
// 3. image_prepare on the cloud image

#[test]
fn image_prepare_cloud_image() {
    let image = test_cloud_image();
    let t_hash = Instant::now();
    let source_hash = sha256_hex(&std::fs::read(&image.disk).unwrap());
    eprintln!("hashing the source took {:?}", t_hash.elapsed());
    let (lab, mut s) = cloud_lab("prep");
    let out = TempDir::new("prepared");
    let dest = out.join("prepared.qcow2");

    // The caller's cloud_init is applied too: it records the machine-id and instance-id of the
    // preparing boot in the image, for the sandbox below to compare with.
    let t = Instant::now();
    let r = s.call_tool_within(
        "image_prepare",
        json!({
            "source": image.disk, "dest": dest,
            "kernel": image.kernel, "initrd": image.initrd, "append": image.append,
            "memory_mb": 1024, "cpus": 2, "allow_network": false, "timeout_s": 600,
            "cloud_init": {
                "hostname": "mcq-prepared",
                "write_files": [{"path": "/etc/mcq-prepared.txt", "content": "baked: in\n"}],
                "runcmd": [["sh", "-c",
                    "cat /etc/machine-id > /var/tmp/mcq-prepare-machine-id; \
                     cat /var/lib/cloud/data/instance-id > /var/tmp/mcq-prepare-instance-id"]]
            }
        }),
        CLOUD_CALL,
    );
    let took = t.elapsed();
    if r["isError"] != json!(false) {
        let log = s.stderr_text();
        panic!(
            "image_prepare failed after {took:?}: {}\nthe server's stderr ends with:\n{}",
            r["content"],
            tail(&log, 8000)
        );
    }
    let prepared = tool_ok(&r, "image_prepare");
    eprintln!(
        "image_prepare took {took:?} (duration_ms {}): dest {} bytes, agent {}, os {}, cloud-init {}",
        prepared["duration_ms"],
        prepared["bytes"],
        prepared["agent_version"],
        prepared["os"],
        prepared["cloud_init"]
    );
    assert_eq!(prepared["dest"], json!(dest), "{prepared}");
    assert_eq!(prepared["source"], json!(image.disk), "{prepared}");
    assert_eq!(prepared["format"], json!("qcow2"), "{prepared}");
    let bytes = std::fs::metadata(&dest).unwrap().len();
    assert_eq!(prepared["bytes"], json!(bytes), "{prepared}");
    assert!(
        !prepared["agent_version"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "{prepared}"
    );
    assert_eq!(prepared["os"]["id"], json!("debian"), "{prepared}");
    assert_eq!(
        prepared["cloud_init"]["finished"],
        json!(true),
        "{prepared}"
    );
    assert!(prepared["duration_ms"].as_u64().unwrap() > 0);

    // A flat qcow2 (no backing file), not bigger than it must be, and the source untouched.
    let info = qemu_img_info(&dest);
    assert_eq!(info["format"], json!("qcow2"), "{info}");
    assert!(
        info.get("backing-filename").is_none(),
        "dest has a backing file: {info}"
    );
    let (ok, check_out, check_err) = run_tool("qemu-img", &["check", dest.to_str().unwrap()]);
    assert!(
        ok,
        "qemu-img check {}: {check_out}{check_err}",
        dest.display()
    );
    let source_bytes = std::fs::metadata(&image.disk).unwrap().len();
    assert!(
        bytes < info["virtual-size"].as_u64().unwrap() && bytes < source_bytes * 2,
        "dest is {bytes} bytes, the source {source_bytes}: {info}"
    );
    assert_eq!(
        sha256_hex(&std::fs::read(&image.disk).unwrap()),
        source_hash,
        "image_prepare changed its source"
    );
    // The preparing VM is gone: no record, no QEMU.
    assert!(
        cg::vm_names(&mut s).is_empty(),
        "{:?}",
        cg::vm_names(&mut s)
    );
    assert!(qemu_pids_mentioning(&lab.runtime()).is_empty());

    // -- A sandbox of the result: its agent answers, cloud-init runs again as a new instance
    // with a new machine-id, and what the caller's cloud_init baked in is there.
    let vm = "from-prepared";
    let sb = cloud_sandbox(
        &lab,
        &mut s,
        cloud_sandbox_args(
            &image,
            vm,
            &dest,
            json!({"hostname": "mcq-from-prepared",
                   "runcmd": ["echo again > /var/tmp/mcq-again"]}),
        ),
    );
    let iid = recorded_instance_id(&mut s, vm);
    let prep_iid = sh(&mut s, vm, "cat /var/tmp/mcq-prepare-instance-id")
        .trim()
        .to_string();
    let prep_mid = sh(&mut s, vm, "cat /var/tmp/mcq-prepare-machine-id")
        .trim()
        .to_string();
    assert!(prep_iid.starts_with("iid-"), "{prep_iid:?}");
    assert_eq!(prep_mid.len(), 32, "{prep_mid:?}");
    let mid = sh(&mut s, vm, "cat /etc/machine-id").trim().to_string();
    eprintln!("machine-id while preparing {prep_mid}, in the sandbox {mid}; instance-id while preparing {prep_iid}, in the sandbox {iid}");
    assert_eq!(mid.len(), 32, "no machine-id in the sandbox: {mid:?}");
    assert_ne!(
        mid, prep_mid,
        "the prepared image kept the preparing boot's machine-id"
    );
    assert_ne!(iid, prep_iid);
    assert_eq!(
        sh(&mut s, vm, "cat /var/lib/cloud/data/instance-id").trim(),
        iid
    );
    // Only this boot's instance, and only this boot's logs: prepare cleaned the rest.
    assert_eq!(sh(&mut s, vm, "ls /var/lib/cloud/instances").trim(), iid);
    let log_boots = sh(
        &mut s,
        vm,
        "grep -c \"running 'init-local'\" /var/log/cloud-init.log",
    );
    assert_eq!(
        log_boots.trim(),
        "1",
        "cloud-init.log holds more than this boot"
    );
    assert_eq!(sh(&mut s, vm, "hostname").trim(), "mcq-from-prepared");
    assert_eq!(guest_bytes(&mut s, vm, "/var/tmp/mcq-again"), b"again\n");
    assert_eq!(
        guest_bytes(&mut s, vm, "/etc/mcq-prepared.txt"),
        b"baked: in\n"
    );
    assert_eq!(
        sb["cloud_init"]["status"],
        json!("done"),
        "{}",
        sb["cloud_init"]
    );
    destroy(&mut s, vm);
    assert_eq!(
        sha256_hex(&std::fs::read(&image.disk).unwrap()),
        source_hash,
        "the source changed"
    );

    // Last: image_prepare reports the instance-id its boot had (as launch_vm does).
    assert_eq!(
        prepared["cloud_init"]["instance_id"],
        json!(prep_iid),
        "image_prepare's cloud_init lacks the preparing boot's instance_id: {}",
        prepared["cloud_init"]
    );
}

// ---------------------------------------------------------------------------------------------
// 4. A guest that drops to systemd's emergency mode

#[test]
fn a_sandbox_in_emergency_mode_fails_at_once_naming_it() {
    let image = test_cloud_image();
    let (_lab, mut s) = cloud_lab("emerg");
    // The cloud image booted into emergency.target: systemd's sulogin shell says "You are in
    // emergency mode" on the console, and no agent starts.
    let mut args = cloud_sandbox_args(&image, "emerg", &image.disk, json!({"hostname": "e"}));
    args["append"] = json!(format!("{} systemd.unit=emergency.target", image.append));
    args["wait_agent_s"] = json!(900);
    args["cpus"] = json!(1);
    let t = Instant::now();
    let err = s.call_err_within("sandbox_vm", args, CLOUD_CALL);
    let took = t.elapsed();
    eprintln!("sandbox in emergency mode: error after {took:?}: {err}");
    assert!(err.contains("emergency mode"), "{err}");
    assert!(err.contains("removed"), "{err}");
    assert!(
        err.contains("Last serial output"),
        "no console lines: {err}"
    );
    // The cloud image reaches emergency.target in well under a minute under TCG; the agent
    // wait was 900 s.
    assert!(took < std::time::Duration::from_secs(240), "{took:?}");
    assert!(!cg::vm_names(&mut s).contains(&"emerg".to_string()));
}

// A cloud-init module that fails leaves a usable guest: the sandbox stays, with a warning
// naming the module. write_files runs early in boot (cloud-init's init stage), runcmd late.
#[test]
fn a_sandbox_whose_cloud_init_module_fails_comes_up_with_a_warning() {
    let image = test_cloud_image();
    let (lab, mut s) = cloud_lab("modfail");
    let cloud_init = json!({
        "hostname": "mcq-modfail",
        "write_files": [{"path": "/proc/mcq-cannot/be-written", "content": "x"}],
        "runcmd": ["false"],
    });
    let mut args = cloud_sandbox_args(&image, "modfail", &image.disk, cloud_init);
    args["cpus"] = json!(1);
    let sb = cloud_sandbox(&lab, &mut s, args);
    let failed: Vec<&str> = sb["cloud_init"]["failed_modules"]
        .as_array()
        .unwrap_or_else(|| panic!("no failed_modules: {sb}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    // cloud-init names the module write-files (cc_write_files).
    assert!(failed.contains(&"write-files"), "{sb}");
    assert!(failed.iter().any(|m| m.starts_with("scripts")), "{sb}");
    assert!(
        sb["cloud_init"]["status"]
            .as_str()
            .is_some_and(|st| st.starts_with("error")),
        "{sb}"
    );
    let warnings = sb["warnings"].to_string();
    assert!(warnings.contains("write-files"), "{warnings}");
    // The guest is the caller's to look into: its agent answers and the rest was applied.
    assert_eq!(sh(&mut s, "modfail", "hostname").trim(), "mcq-modfail");
    cg::destroy(&mut s, "modfail");
}

#[test]
fn launch_vm_waits_for_cloud_init_and_names_a_failed_module() {
    let image = test_cloud_image();
    let (lab, mut s) = cloud_lab("lwait");
    // launch_vm writes its disks: an overlay of its own over the cached image.
    let dir = TempDir::new("lwait-disk");
    let disk = dir.join("disk.qcow2");
    let (ok, _, err) = run_tool(
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-F",
            "qcow2",
            "-b",
            image.disk.to_str().unwrap(),
            disk.to_str().unwrap(),
        ],
    );
    assert!(ok, "qemu-img create: {err}");
    // runcmd's `false` fails cloud-init's scripts_user module: status "error".
    let args = json!({
        "name": "lwait", "disks": [disk], "kernel": image.kernel, "initrd": image.initrd,
        "append": image.append, "memory_mb": 1024, "cpus": 1, "restrict_net": true,
        "cloud_init": {"hostname": "mcq-lwait", "runcmd": ["false"]},
        "wait_cloud_init": true, "wait_cloud_init_s": 600,
    });
    let t = Instant::now();
    let r = s.call_tool_within("launch_vm", args, CLOUD_CALL);
    lab.track(&r);
    let out = tool_ok(&r, "launch_vm with wait_cloud_init");
    eprintln!(
        "launch_vm + cloud-init: {:?}: {}",
        t.elapsed(),
        out["cloud_init"]
    );
    assert_eq!(out["cloud_init"]["finished"], json!(true), "{out}");
    assert!(
        out["cloud_init"]["status"]
            .as_str()
            .is_some_and(|st| st.starts_with("error") || st.starts_with("degraded")),
        "{out}"
    );
    let warned = out["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .find(|w| w.contains("cloud-init finished with status"))
        .unwrap_or_else(|| panic!("no warning names the failed module: {out}"));
    assert!(warned.contains("scripts"), "{warned}");
    // Everything else cloud-init was asked for ran, and the VM is the caller's: still running.
    assert_eq!(sh(&mut s, "lwait", "hostname").trim(), "mcq-lwait");
    stop(&mut s, "lwait");
}
