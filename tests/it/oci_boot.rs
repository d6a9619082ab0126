//! Container images booted as sandboxes, over MCP against the built binary and real QEMU: an OCI
//! layout from `tests/oci/build_layout.py --bootable` (the owners, whiteouts and setuid file of
//! the oci suite, plus Debian's static busybox and a passwd naming the image's user 1000) is
//! booted by `sandbox_vm {"oci"}` with Debian's cloud kernel (fetched by the server with apt)
//! and mcqemu-agent as PID 1 of its initrd. guest_exec runs with the image's Env, WorkingDir
//! and User; the owners and modes inside the guest are the image's; disk_size grows the root;
//! files go both ways; a
//! template made with `template_create {"oci"}` clones into a sandbox that keeps the image's
//! user, takes a copy over the data channel and forks; `run` and `expose` start the image's Entrypoint (a web server) and forward its port.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::oci::layout;
use serde_json::{json, Value};

const STEP: Duration = Duration::from_secs(300);

fn exec(lab: &mut Lab, name: &str, script: &str) -> Value {
    let r = lab.srv().call_keeping(
        "guest_exec",
        json!({"name": name, "command": "sh", "args": ["-c", script], "timeout": 60}),
        STEP,
    );
    let sc = tool_ok(&r, script);
    assert_eq!(sc["exitcode"], 0, "{script}: {sc}");
    sc
}

#[test]
fn an_image_root_boots_and_runs_programs_as_the_image_says() {
    // The agent the server puts into the initrd, from cargo's target folder: built here, or
    // (as an ordinary user without cargo, .ci/unprivileged) as root built it before.
    if let Err(e) = static_agent("x86_64-unknown-linux-musl") {
        let built = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target/x86_64-unknown-linux-musl/release/mcqemu-agent");
        assert!(built.is_file(), "{e}");
    }
    let mut lab = Lab::new("ocib");
    let dir = lab.dir.join("layout");
    let digest = layout(&dir, "v1", &["--bootable"]);
    let reference = format!("oci:{}:v1", dir.display());

    inside_the_image(&mut lab, &reference, &digest);
    run_and_expose(&mut lab, &reference);
    template_clone_copy_fork(&mut lab, &reference);
}

/// A sandbox of the image: its user, folder, Env, owners and layers, disk_size, files both
/// ways, the record's image and digest, and oci beside base_image refused.
fn inside_the_image(lab: &mut Lab, reference: &str, digest: &str) {
    let t = Instant::now();
    let work = lab.dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let sb = lab.srv().call_ok_within(
        "sandbox_vm",
        json!({"oci": reference, "name": "img", "cpus": 1, "memory_mb": 512,
               "wait_agent_s": 150, "disk_size": "2G",
               "mounts": [{"host": work, "guest": "/work", "writable": true}]}),
        STEP,
    );
    lab.track(&sb);
    eprintln!(
        "sandbox_vm oci (pull, build, kernel fetch, boot): {} ms, agent after {} ms",
        t.elapsed().as_millis(),
        sb["agent_wait_ms"]
    );
    assert_eq!(sb["agent_ready"], json!(true), "{sb}");
    assert_eq!(sb["sandbox"]["image"], json!(reference), "{sb}");
    assert_eq!(sb["sandbox"]["image_digest"], json!(digest), "{sb}");

    let out = exec(
        lab,
        "img",
        "id -u; id -g; pwd; echo \"$GREETING\"; echo \"$HOME\"; \
         stat -c '%u:%g %a' /home/user/own /usr/bin/ping; cat /etc/a; echo; ls /opt/keep; \
         [ -e /etc/gone ] || echo gone",
    );
    assert_eq!(
        out["stdout"].as_str().unwrap(),
        "1000\n1000\n/home/user\nhello from the image\n/home/user\n1000:1000 600\n0:0 4755\n\
         two\nnew\ngone\n",
        "the image's user, folder, environment, owners and layers: {out}"
    );

    // The image's file capability holds in the guest: its user binds port 80 with the program
    // the image gives cap_net_bind_service, and not with the same program without it.
    let out = exec(
        lab,
        "img",
        "bind() { \"$@\" </dev/null >/dev/null 2>/tmp/nc.err & p=$!; sleep 1; \
           if kill -0 $p 2>/dev/null; then echo bound; kill $p; else echo refused; fi; }; \
         bind /usr/local/bin/nc -l -p 80; bind /bin/busybox nc -l -p 81",
    );
    assert_eq!(
        out["stdout"],
        json!("bound\nrefused\n"),
        "port 80 with the capability, 81 without: {out}"
    );

    // A writable mount shows as the image's user's, who writes into it; on the host the file
    // is the host user's.
    let out = exec(
        lab,
        "img",
        "stat -c '%u:%g' /work; echo mine > /work/by-user && cat /work/by-user",
    );
    assert_eq!(out["stdout"], json!("1000:1000\nmine\n"), "{out}");
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(work.join("by-user")).unwrap();
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() };
    assert_eq!(meta.uid(), me);

    // disk_size is room in the root: the agent grew the file system at boot.
    let df = exec(lab, "img", "df -k / | tail -1");
    let total_kb: u64 = df["stdout"]
        .as_str()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("df: {df}"));
    assert!(
        total_kb > 1800 * 1024,
        "the root was not grown to disk_size 2G: {df}"
    );

    // Files both ways (the agent itself writes them, as root).
    let w = lab.srv().call_ok_within(
        "guest_file_write",
        json!({"name": "img", "path": "/tmp/in.txt", "content": "into the image\n"}),
        STEP,
    );
    assert_eq!(w["bytes_written"], json!(15), "{w}");
    let r = lab.srv().call_ok_within(
        "guest_file_read",
        json!({"name": "img", "path": "/tmp/in.txt"}),
        STEP,
    );
    assert_eq!(r["content"], json!("into the image\n"), "{r}");

    let info = lab
        .srv()
        .call_ok_within("vm_info", json!({"name": "img"}), STEP);
    assert_eq!(
        info["record"]["sandbox"]["image_digest"],
        json!(digest),
        "{info}"
    );
    let both = lab.srv().call_tool_within(
        "sandbox_vm",
        json!({"oci": reference, "base_image": "/nonexistent"}),
        STEP,
    );
    let err = tool_err(&both, "oci with base_image");
    assert!(err.contains("not both"), "{err}");
    lab.srv()
        .call_ok_within("sandbox_destroy", json!({"name": "img"}), STEP);
}

/// run and expose.
fn run_and_expose(lab: &mut Lab, reference: &str) {
    // run and expose: the image's Entrypoint (busybox httpd on its exposed 8080, as the
    // image's user) in the background, reached through the forward expose added.
    let web = lab.srv().call_ok_within(
        "sandbox_vm",
        json!({"oci": reference, "name": "web", "cpus": 1, "memory_mb": 512,
               "wait_agent_s": 150, "run": true, "expose": true}),
        STEP,
    );
    lab.track(&web);
    let handle = web["image_process"]["handle"].clone();
    assert!(handle.is_string(), "{web}");
    let forwards = web["port_forwards"].as_array().unwrap();
    let host = forwards
        .iter()
        .find(|f| f["guest"] == 8080)
        .and_then(|f| f["host"].as_u64())
        .unwrap_or_else(|| panic!("no forward to the exposed 8080: {web}"));
    assert!(
        forwards.iter().any(|f| f["guest"] == 22),
        "auto:22 stays: {web}"
    );
    assert_eq!(http_get(host, "/own"), "mine", "the image's server answers");
    let st = lab.srv().call_ok_within(
        "guest_exec_status",
        json!({"name": "web", "handle": handle}),
        STEP,
    );
    assert_eq!(st["running"], json!(true), "httpd still runs: {st}");
    let who = exec(lab, "web", "stat -c %u /proc/$(pidof httpd || echo 1)");
    assert_eq!(
        who["stdout"],
        json!("1000\n"),
        "httpd runs as the image's user: {who}"
    );
    let plain = lab.srv().call_tool_within(
        "sandbox_vm",
        json!({"base_image": "/nonexistent", "run": true}),
        STEP,
    );
    assert!(tool_err(&plain, "run without oci").contains("need oci"));
    lab.srv()
        .call_ok_within("sandbox_destroy", json!({"name": "web"}), STEP);
}

/// A template of the image, a clone, a copy over the data channel and a fork.
fn template_clone_copy_fork(lab: &mut Lab, reference: &str) {
    // A template of the image; its clone keeps the image's user and folder.
    let t = Instant::now();
    let made = lab.srv().call_ok_within(
        "template_create",
        json!({"name": "imgt", "oci": reference, "cpus": 1, "memory_mb": 512,
               "wait_agent_s": 150}),
        STEP,
    );
    eprintln!("template_create oci: {} ms", t.elapsed().as_millis());
    assert_eq!(made["name"], json!("imgt"), "{made}");
    let t = Instant::now();
    let c = lab.srv().call_ok_within(
        "sandbox_vm",
        json!({"template": "imgt", "name": "imgc"}),
        STEP,
    );
    lab.track(&c);
    eprintln!("clone of the oci template: {} ms", t.elapsed().as_millis());
    let out = exec(lab, "imgc", "id -u; pwd");
    assert_eq!(out["stdout"], json!("1000\n/home/user\n"), "{out}");

    // A copy over the data channel (the agent unpacks it, as root like `docker cp`: into a
    // folder the image's user may not write), then a fork that keeps it.
    let tree = lab.dir.join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::write(tree.join("sub/f.txt"), "copied in\n").unwrap();
    let c_in = lab.srv().call_ok_within(
        "guest_copy_in",
        json!({"name": "imgc", "host_path": tree.to_str().unwrap(), "guest_path": "/opt/tree"}),
        STEP,
    );
    assert_eq!(
        c_in["via"],
        json!("channel"),
        "the data channel, its helper as root: {c_in}"
    );
    let f = lab
        .srv()
        .call_ok_within("sandbox_fork", json!({"name": "imgc", "count": 1}), STEP);
    let fork = f["copies"][0].clone();
    lab.track(&fork);
    let fork = fork["name"].as_str().unwrap().to_string();
    let out = exec(
        lab,
        &fork,
        "cat /opt/tree/sub/f.txt; stat -c %u /opt/tree/sub/f.txt; id -u",
    );
    assert_eq!(
        out["stdout"],
        json!("copied in\n0\n1000\n"),
        "the fork: the copy (root's), guest_exec as the image's user: {out}"
    );
    lab.srv()
        .call_ok_within("sandbox_destroy", json!({"name": fork}), STEP);
    lab.srv()
        .call_ok_within("sandbox_destroy", json!({"name": "imgc"}), STEP);
    lab.srv()
        .call_ok_within("template_delete", json!({"name": "imgt"}), STEP);
}
