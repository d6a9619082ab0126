//! Host folders mounted into real guests over MCP: the test guest (qemu-ga by default, so the
//! server puts mcqemu-agent's relay into the guest; mcqemu-agent as its service or PID 1 under
//! `MCQEMU_TEST_AGENT`), read-only and writable mounts, host and guest changes seen, the
//! escapes a hostile guest (and a careless host) would try, vm_mount on a running VM, and the
//! refusals of forks, suspends and paths outside the roots.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::*;

/// sandbox_vm of the test guest with `mounts`; returns its result.
fn sandbox_with(lab: &mut Lab, name: &str, mounts: Value) -> Value {
    let guest = test_guest();
    let base = lab.dir.path().join(format!("{name}-base.img"));
    std::fs::File::create(&base)
        .and_then(|f| f.set_len(1 << 20))
        .unwrap();
    let r = lab.srv().call_tool_within(
        "sandbox_vm",
        json!({
            "base_image": base, "name": name, "memory_mb": 128, "cpus": 1,
            "port_forwards": [], "wait_agent_s": 90, "kernel": guest.kernel,
            "initrd": guest.initrd, "append": guest.append, "mounts": mounts,
        }),
        Duration::from_secs(200),
    );
    lab.track(&r);
    r
}

/// `sh -c script` in the guest; (exit code, stdout + stderr).
fn try_sh(lab: &mut Lab, name: &str, script: &str) -> (i64, String) {
    let r = lab.srv().call_ok_within(
        "guest_exec",
        json!({"name": name, "command": "sh", "args": ["-c", script], "timeout": 60}),
        Duration::from_secs(120),
    );
    let out = format!(
        "{}{}",
        r["stdout"].as_str().unwrap_or_default(),
        r["stderr"].as_str().unwrap_or_default()
    );
    (r["exitcode"].as_i64().unwrap_or(-1), out)
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn mounts_in_the_test_guest_read_write_escape_and_refuse() {
    // As an ordinary user in CI, the agent built earlier (as root) is used as it is.
    if let Err(e) = static_agent("x86_64-unknown-linux-musl") {
        let built = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target/x86_64-unknown-linux-musl/release/mcqemu-agent");
        assert!(built.is_file(), "{e}");
    }
    test_guest();
    let mut lab = Lab::new("mounts");
    let top = lab.dir.path().to_path_buf();
    let (ro, rw, outside) = (top.join("ro"), top.join("rw"), top.join("outside"));
    for d in [&ro, &rw, &outside] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(ro.join("hello.txt"), "hello from the host\n").unwrap();
    std::fs::create_dir_all(ro.join("sub")).unwrap();
    std::fs::write(ro.join("sub/deep.txt"), "deep\n").unwrap();
    std::fs::write(outside.join("marker"), "HOST-SECRET\n").unwrap();
    std::fs::write(top.join("outside.txt"), "untouched\n").unwrap();

    let started = Instant::now();
    let r = sandbox_with(
        &mut lab,
        "mnt",
        json!([{"host": ro, "guest": "/ro"}, {"host": rw, "guest": "/rw", "writable": true}]),
    );
    let sc = tool_ok(&r, "sandbox_vm with mounts");
    eprintln!("sandbox with two mounts ready in {:?}", started.elapsed());
    let mounts = sc["mounts"].as_array().expect("mounts in the result");
    assert_eq!(mounts.len(), 2, "{sc}");
    for m in mounts {
        assert_eq!(m["state"], "mounted", "{sc}");
    }

    // Reads, and a read-only mount refuses every change (the host folder unchanged).
    let out = lab.guest_sh("mnt", "cat /ro/hello.txt /ro/sub/deep.txt; ls /ro");
    assert!(
        out.contains("hello from the host") && out.contains("deep"),
        "{out}"
    );
    for script in [
        "echo x > /ro/new.txt",
        "echo x >> /ro/hello.txt",
        "mkdir /ro/d",
        "rm /ro/hello.txt",
        "mv /ro/hello.txt /ro/h2",
        "chmod 777 /ro/hello.txt",
        "touch /ro/hello.txt",
    ] {
        let (code, out) = try_sh(&mut lab, "mnt", script);
        assert_ne!(code, 0, "{script} worked on a read-only mount: {out}");
    }
    assert_eq!(files_in(&ro), ["hello.txt", "sub"]);

    // A guest write is on the host when guest_exec returns; a host change shows within 1 s.
    lab.guest_sh(
        "mnt",
        "echo from-guest > /rw/g.txt; mkdir -p /rw/a/b; mv /rw/g.txt /rw/a/b/",
    );
    assert_eq!(
        std::fs::read_to_string(rw.join("a/b/g.txt")).unwrap(),
        "from-guest\n"
    );
    std::fs::write(ro.join("hello.txt"), "changed on the host\n").unwrap();
    std::fs::write(ro.join("later.txt"), "new\n").unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let out = lab.guest_sh("mnt", "cat /ro/hello.txt /ro/later.txt");
    assert!(
        out.contains("changed on the host") && out.contains("new"),
        "{out}"
    );

    // Escapes. A symlink made in the guest is stored as a link and followed only by the
    // guest's kernel, in the guest; the host file it names is untouched.
    let (_, out) = try_sh(
        &mut lab,
        "mnt",
        "ln -s ../outside.txt /rw/esc; echo pwned > /rw/esc; ln -s /etc /rw/etc-link; \
         cat /rw/../outside.txt 2>&1; true",
    );
    assert_eq!(
        std::fs::read_to_string(top.join("outside.txt")).unwrap(),
        "untouched\n",
        "{out}"
    );
    // A symlink made on the host to a folder outside: the guest never reads the host's.
    std::os::unix::fs::symlink(&outside, rw.join("host-link")).unwrap();
    let (_, out) = try_sh(&mut lab, "mnt", "cat /rw/host-link/marker 2>&1; true");
    assert!(
        !out.contains("HOST-SECRET"),
        "the guest read outside: {out}"
    );
    // A folder the guest is inside, swapped on the host for a link to outside.
    std::fs::create_dir_all(rw.join("d")).unwrap();
    std::fs::write(rw.join("d/marker"), "inside\n").unwrap();
    lab.guest_sh("mnt", "cat /rw/d/marker");
    std::fs::rename(rw.join("d"), rw.join("d.old")).unwrap();
    std::os::unix::fs::symlink(&outside, rw.join("d")).unwrap();
    for _ in 0..3 {
        let (_, out) = try_sh(&mut lab, "mnt", "cat /rw/d/marker 2>&1; true");
        assert!(!out.contains("HOST-SECRET"), "the swap led outside: {out}");
        std::thread::sleep(Duration::from_millis(400));
    }
    // No device files, no setuid bits, no hard link to a file outside the mount.
    let (code, out) = try_sh(&mut lab, "mnt", "mknod /rw/null c 1 3");
    assert_ne!(code, 0, "{out}");
    assert!(!rw.join("null").exists());
    lab.guest_sh("mnt", "echo x > /rw/s; chmod 4755 /rw/s; ln /rw/s /rw/s2");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::metadata(rw.join("s")).unwrap();
    assert_eq!(
        meta.permissions().mode() & 0o7000,
        0,
        "a setuid bit reached the host"
    );
    assert_eq!(meta.nlink(), 2, "the hard link inside the mount works");
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() };
    assert_eq!(meta.uid(), me, "files are the host user's");
    let (code, _) = try_sh(&mut lab, "mnt", "ln /etc/passwd /rw/pw");
    assert_ne!(code, 0);
    assert!(!rw.join("pw").exists());
    // The lab folder beside the mounts holds only what the test made.
    assert_eq!(
        files_in(&outside),
        ["marker"],
        "something was written outside"
    );

    // vm_info shows the mounts; fork and suspend refuse, naming them.
    let info = lab.srv().call_ok("vm_info", json!({"name": "mnt"}));
    assert_eq!(info["mounts"].as_array().map(Vec::len), Some(2), "{info}");
    for (tool, args) in [
        (
            "sandbox_fork",
            json!({"name": "mnt", "names": ["mnt-copy"]}),
        ),
        ("sandbox_suspend", json!({"name": "mnt"})),
    ] {
        let r = lab
            .srv()
            .call_tool_within(tool, args, Duration::from_secs(60));
        let e = tool_err(&r, tool);
        assert!(e.contains("/rw") && e.contains("vm_mount"), "{tool}: {e}");
    }

    // vm_mount: remove one (unmounted in the guest), add it again elsewhere.
    let out = lab.srv().call_ok_within(
        "vm_mount",
        json!({"name": "mnt", "remove": ["/ro"]}),
        Duration::from_secs(60),
    );
    assert_eq!(out["mounts"].as_array().map(Vec::len), Some(1), "{out}");
    let (_, left) = try_sh(&mut lab, "mnt", "cat /ro/hello.txt 2>&1; true");
    assert!(
        !left.contains("changed on the host"),
        "still mounted: {left}"
    );
    let out = lab.srv().call_ok_within(
        "vm_mount",
        json!({"name": "mnt", "add": [{"host": ro, "guest": "/again"}]}),
        Duration::from_secs(60),
    );
    assert_eq!(out["added"][0]["state"], "mounted", "{out}");
    let again = lab.guest_sh("mnt", "cat /again/later.txt");
    assert_eq!(again.trim(), "new");

    // Bad mounts are refused before anything changes.
    for (mounts, why) in [
        (
            json!([{"host": "/etc", "guest": "/e"}]),
            "outside the folders",
        ),
        (json!([{"host": ro, "guest": "/again"}]), "already mounted"),
        (json!([{"host": ro, "guest": "relative"}]), "not absolute"),
        (json!([{"host": ro, "guest": "/proc/x"}]), "kernel"),
    ] {
        let r = lab
            .srv()
            .call_tool("vm_mount", json!({"name": "mnt", "add": mounts}));
        let e = tool_err(&r, "a bad mount");
        assert!(e.contains(why), "{why}: {e}");
    }
    let r = lab.srv().call_tool(
        "launch_vm",
        json!({"name": "p9", "extra_args": ["-virtfs", "local,path=/,mount_tag=h,security_model=none"]}),
    );
    tool_err(&r, "extra_args passthrough");
}

/// A template's mounts are its clones' (plugged in once each clone runs); launch_vm's mounts of
/// a guest with qemu-ga are made in the background once its agent answers.
#[test]
fn a_template_s_mounts_are_its_clones_and_launch_vm_mounts_when_the_agent_answers() {
    if let Err(e) = static_agent("x86_64-unknown-linux-musl") {
        let built = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target/x86_64-unknown-linux-musl/release/mcqemu-agent");
        assert!(built.is_file(), "{e}");
    }
    let g = test_guest();
    let mut lab = Lab::new("mountt");
    let share = lab.dir.path().join("share");
    std::fs::create_dir_all(&share).unwrap();
    std::fs::write(share.join("f"), "shared\n").unwrap();
    let boot = json!({"kernel": g.kernel, "initrd": g.initrd, "append": g.append,
                      "memory_mb": 128, "cpus": 1});
    let mut t = boot.clone();
    t["name"] = json!("mt");
    t["wait_agent_s"] = json!(120);
    t["mounts"] = json!([{"host": share, "guest": "/share"}]);
    lab.srv()
        .call_ok_within("template_create", t, Duration::from_secs(300));
    let r = lab.srv().call_tool_within(
        "sandbox_vm",
        json!({"template": "mt", "name": "clone"}),
        Duration::from_secs(120),
    );
    lab.track(&r);
    let sc = tool_ok(&r, "a clone of a template with mounts");
    assert_eq!(sc["mounts"][0]["state"], "mounted", "{sc}");
    assert_eq!(lab.guest_sh("clone", "cat /share/f"), "shared\n");
    lab.srv().call_ok_within(
        "sandbox_destroy",
        json!({"name": "clone"}),
        Duration::from_secs(60),
    );
    // Its runtime folder went with it, the note that its agent answered included.
    assert!(
        !lab.runtime().join("clone").exists(),
        "{:?}",
        list_dir(&lab.runtime().join("clone"))
    );

    let mut l = boot.clone();
    l["name"] = json!("launched");
    l["mounts"] = json!([{"host": share, "guest": "/share"}]);
    let out = lab.launch(l, Duration::from_secs(60));
    assert_eq!(out["mounts"][0]["state"], "waiting", "{out}");
    let deadline = Instant::now() + Duration::from_secs(150);
    loop {
        let info = lab.srv().call_ok("vm_info", json!({"name": "launched"}));
        if info["mounts"][0]["state"] == "mounted" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never mounted: {}",
            info["mounts"]
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(lab.guest_sh("launched", "cat /share/f"), "shared\n");
}
