//! cloud-init over MCP, against the built binary, the real QEMU (TCG here) and the test cloud
//! image (tests/cloud/build_cloud.py: Debian 12 with cloud-init and qemu-guest-agent):
//!
//! - the NoCloud seed launch_vm writes, read back by independent readers (isoinfo through Rock
//!   Ridge and Joliet, bsdtar) and its YAML by a real YAML parser (PyYAML), with the quoting
//!   cases that break hand-written YAML; refusals of bad `cloud_init` fields that start nothing;
//!   a fresh instance-id at every launch;
//! - sandbox_vm with `cloud_init` and `wait_cloud_init` on the cloud image: users, sudo, keys,
//!   host name, runcmd (shell strings and argv lists), write_files, cloud-init's own schema
//!   check, and a second sandbox from the same base being a new instance;
//! - image_prepare on the cloud image: the source untouched, a flat qcow2 that boots as a
//!   sandbox with a new machine-id and instance-id, and the caller's cloud_init baked in.
//!
//! Cloud-image boots are slow under TCG (the agent answers after ~20-35 s, cloud-init finishes
//! after ~45-90 s on 2 idle cores), so each test holds one guest slot and boots its guests one
//! after the other (the tests themselves run side by side, so at most two guests run at once),
//! and there are four full boots in all. Every QEMU is SIGKILLed on the way out, pass or fail
//! ([`Lab`]). Guests keep the sandbox default restricted network: nothing leaves this machine.

mod common;

use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use mcqemu::b64;
use serde_json::{json, Value};

/// Bound for a tool call that boots the cloud image and waits for cloud-init (or prepares it).
const CLOUD_CALL: Duration = Duration::from_secs(15 * 60);
/// Bound for guest_exec round trips, stop_vm and sandbox_destroy.
const STEP: Duration = Duration::from_secs(120);
/// A public key for the test user (never used to log in: the guests run no SSH server).
const TEST_KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMcqemuTestKeyNotARealKey0123456789abcdefABCD mcqemu-test@host: #1";

// ---------------------------------------------------------------------------------------------
// Helpers

/// A lab with one guest slot and a server whose roots also hold the cloud image cache. Build
/// the cloud image (if needed) before calling this, never while holding the slot.
fn cloud_lab(label: &str) -> (Lab, Server) {
    let lab = Lab::without_server(label, 1);
    let tmp = TempDir::new("srv");
    let roots = cloud_roots();
    let mut s = Server::try_start_with(
        tmp,
        &lab.state(),
        &lab.runtime(),
        &[("MCQEMU_ROOTS", roots.as_str())],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    s.initialize(NEWEST);
    (lab, s)
}

/// guest_exec that must succeed as a tool call.
fn exec(s: &mut Server, vm: &str, command: &str, args: &[&str]) -> Value {
    s.call_ok_within(
        "guest_exec",
        json!({"name": vm, "command": command, "args": args, "timeout": 90}),
        STEP,
    )
}

/// `sh -c SCRIPT` in the guest; must exit 0; returns stdout.
fn sh(s: &mut Server, vm: &str, script: &str) -> String {
    let r = exec(s, vm, "sh", &["-c", script]);
    assert_eq!(
        r["exitcode"],
        json!(0),
        "sh -c {script:?} in {vm} failed: {r}"
    );
    r["stdout"].as_str().unwrap_or_default().to_string()
}

/// A guest file's bytes, exactly (base64 through the agent).
fn guest_bytes(s: &mut Server, vm: &str, path: &str) -> Vec<u8> {
    let r = s.call_ok_within(
        "guest_file_read",
        json!({"name": vm, "path": path, "encoding": "base64"}),
        STEP,
    );
    assert_eq!(r["truncated"], json!(false), "{r}");
    b64::decode(r["content"].as_str().unwrap()).unwrap()
}

/// The instance-id the server recorded for `vm`'s current launch (vm_info's record).
fn recorded_instance_id(s: &mut Server, vm: &str) -> String {
    let info = s.call_ok("vm_info", json!({"name": vm}));
    info["record"]["cloud_init"]["instance_id"]
        .as_str()
        .unwrap_or_else(|| panic!("vm_info of {vm} has no cloud_init.instance_id: {info}"))
        .to_string()
}

/// The last `n` bytes of `text` or a little fewer (whole characters).
fn tail(text: &str, n: usize) -> &str {
    let mut start = text.len().saturating_sub(n);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// The names list_vms shows.
fn vm_names(s: &mut Server) -> Vec<String> {
    let l = s.call_ok("list_vms", json!({}));
    l["vms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect()
}

fn stop(s: &mut Server, vm: &str) {
    let r = s.call_ok_within("stop_vm", json!({"name": vm, "force": true}), STEP);
    assert_eq!(r["status"], json!("stopped"), "{r}");
}

fn destroy(s: &mut Server, vm: &str) {
    let r = s.call_ok_within("sandbox_destroy", json!({"name": vm}), STEP);
    assert_eq!(r["destroyed"], json!(true), "{r}");
}

/// A host program's stdout, bytes exactly; it must exit 0.
fn host(program: &str, args: &[&str]) -> Vec<u8> {
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    try_run(program, &args, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"))
}

fn host_text(program: &str, args: &[&str]) -> String {
    String::from_utf8(host(program, args)).expect("utf-8 output")
}

fn have(program: &str) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok()
}

/// True when the host's python3 can import PyYAML.
fn host_has_pyyaml() -> bool {
    std::process::Command::new("python3")
        .args(["-c", "import yaml"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Parses YAML with PyYAML's safe loader on the host and returns it as JSON.
fn host_yaml(text: &[u8]) -> Value {
    let done = try_run_command(
        std::process::Command::new("python3").args([
            "-c",
            "import sys, yaml, json; print(json.dumps(yaml.safe_load(sys.stdin)))",
        ]),
        Some(text),
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        done.status.success(),
        "PyYAML refused the document: {}\n{}",
        String::from_utf8_lossy(&done.stderr),
        String::from_utf8_lossy(text)
    );
    serde_json::from_slice(&done.stdout).expect("json.dumps output")
}

/// The sandbox_vm arguments for the cloud image (`base` defaults to the image's own disk).
fn cloud_sandbox_args(image: &CloudImage, name: &str, base: &Path, cloud_init: Value) -> Value {
    json!({
        "name": name,
        "base_image": base,
        "kernel": image.kernel,
        "initrd": image.initrd,
        "append": image.append,
        "memory_mb": 1024,
        "cpus": 2,
        "wait_agent_s": 300,
        "wait_cloud_init": true,
        "wait_cloud_init_s": 600,
        "cloud_init": cloud_init,
    })
}

/// Boots a cloud-image sandbox and waits for cloud-init; returns its result (its QEMU is
/// tracked for killing before anything is checked).
fn cloud_sandbox(lab: &Lab, s: &mut Server, args: Value) -> Value {
    let t = Instant::now();
    let r = s.call_tool_within("sandbox_vm", args.clone(), CLOUD_CALL);
    lab.track(&r);
    let sb = tool_ok(&r, &format!("sandbox_vm {args}"));
    eprintln!(
        "sandbox_vm {}: agent after {} ms, cloud-init finished {} ms later (status {}), {:?} in all",
        sb["name"],
        sb["agent_wait_ms"],
        sb["cloud_init"]["wait_ms"],
        sb["cloud_init"]["status"],
        t.elapsed()
    );
    assert_eq!(sb["agent_ready"], json!(true), "agent not ready: {sb}");
    assert_eq!(sb["cloud_init"]["finished"], json!(true), "{sb}");
    sb
}

/// Strings that hand-written YAML gets wrong: indicators, comments, both quote kinds, line
/// breaks, YAML 1.1 booleans, numbers and null, document markers, control and non-BMP
/// characters.
const TRICKY: &[&str] = &[
    "a: b",
    "key: value # not a comment",
    "# leading hash",
    "trailing #",
    "it's",
    "say \"hi\"",
    "both ' and \"",
    "line1\nline2\n",
    "\n",
    "*star",
    "&anchor",
    "!tag",
    "!!str x",
    "- dash",
    "-",
    "? question",
    "yes",
    "off",
    "on",
    "no",
    "y",
    "N",
    "True",
    "null",
    "~",
    "",
    " leading space",
    "trailing space ",
    "0640",
    "010",
    "0x1f",
    "1e3",
    "12:30:45",
    ".inf",
    ".NaN",
    "1_000",
    "---",
    "...",
    "%TAG !",
    "@at",
    "`tick",
    "{flow: map}",
    "[flow, seq]",
    "| block",
    "> folded",
    "tab\there",
    "back\\slash\\n",
    "cr\r\nlf",
    "é ü ñ 日本",
    "emoji 😀",
    "nel\u{85}",
    "ls\u{2028}ps\u{2029}",
    "bom\u{feff}",
    "ctrl\u{1}\u{7f}",
    "=",
    "<<",
    "#cloud-config",
];

// ---------------------------------------------------------------------------------------------
// 1. The seed, read back without booting

#[test]
fn cloud_init_seed_iso_read_back_and_refusals() {
    let (lab, mut s) = cloud_lab("seed");
    let tricky: Vec<Value> = TRICKY.iter().map(|t| json!(t)).collect();
    let sudo_rule = "ALL=(ALL) NOPASSWD: /usr/bin/true # not a comment";
    let network = json!({
        "version": 2,
        "ethernets": {"id0": {"match": {"name": "en*"}, "dhcp4": true, "dhcp6": false,
                              "mtu": 1500, "nameservers": {"addresses": ["10.0.2.3"]}}},
        "yes": "off", "<<": "*alias", "nothing": null, "list": ["- a", "b: c", 3, true]
    });
    let mut runcmd = tricky.clone();
    let mut argv = vec![json!("printf"), json!("%s\\n")];
    argv.extend(tricky.iter().cloned());
    runcmd.push(Value::Array(argv));
    let cloud_init = json!({
        "hostname": "mcq-seed",
        "users": [
            {"name": "dev", "ssh_authorized_keys": [TEST_KEY], "sudo": true,
             "shell": "/bin/bash", "groups": ["adm", "yes"], "lock_passwd": false},
            {"name": "ops", "sudo": sudo_rule, "groups": "adm, off", "lock_passwd": true}
        ],
        "ssh_authorized_keys": [TEST_KEY, "ssh-rsa AAAAB3Nza: #2 'q' \"dq\""],
        "packages": tricky,
        "runcmd": runcmd,
        "write_files": [
            {"path": "/etc/mcq/tricky: #1 'x'.txt", "content": TRICKY.join("\n"),
             "permissions": "0640", "owner": "root:adm"},
            {"path": "/etc/mcq/b64", "content": "aGVsbG8K", "encoding": "b64"},
            {"path": "/etc/mcq/empty"}
        ],
        "network_config": network
    });
    // What user-data must parse to: sudo true is the NOPASSWD rule, "default" keeps the
    // image's own user, the host name is also the fqdn, a file without content is empty.
    let want_user_data = json!({
        "hostname": "mcq-seed",
        "fqdn": "mcq-seed",
        "users": [
            "default",
            {"name": "dev", "ssh_authorized_keys": [TEST_KEY], "sudo": "ALL=(ALL) NOPASSWD:ALL",
             "shell": "/bin/bash", "groups": ["adm", "yes"], "lock_passwd": false},
            {"name": "ops", "sudo": sudo_rule, "groups": "adm, off", "lock_passwd": true}
        ],
        "ssh_authorized_keys": cloud_init["ssh_authorized_keys"],
        "packages": cloud_init["packages"],
        "runcmd": cloud_init["runcmd"],
        "write_files": [
            {"path": "/etc/mcq/tricky: #1 'x'.txt", "content": TRICKY.join("\n"),
             "permissions": "0640", "owner": "root:adm"},
            {"path": "/etc/mcq/b64", "content": "aGVsbG8K", "encoding": "b64"},
            {"path": "/etc/mcq/empty", "content": ""}
        ]
    });
    let launch_args = |name: &str, ci: &Value| {
        json!({"name": name, "memory_mb": 64, "cpus": 1, "accel": "tcg", "no_net": true,
               "cloud_init": ci})
    };

    // -- The first launch: the result, the record, the CD-ROM QEMU really has.
    let vm = "ci-seed";
    let first = lab.launch_on(&mut s, launch_args(vm, &cloud_init), STEP);
    let seed = lab.vm_dir(vm).join("seed.iso");
    let iid1 = first["cloud_init"]["instance_id"]
        .as_str()
        .unwrap_or_else(|| panic!("launch_vm gave no cloud_init.instance_id: {first}"))
        .to_string();
    assert!(iid1.starts_with("iid-"), "{first}");
    assert_eq!(first["cloud_init"]["seed"], json!(seed), "{first}");
    assert_eq!(recorded_instance_id(&mut s, vm), iid1);
    let info = s.call_ok("vm_info", json!({"name": vm}));
    let cd = info["block_devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["file"] == json!(seed))
        .unwrap_or_else(|| panic!("QEMU has no drive on {}: {info}", seed.display()))
        .clone();
    assert_eq!(cd["read_only"], json!(true), "{cd}");
    assert_eq!(cd["format"], json!("raw"), "{cd}");
    let pid = first["pid"].as_i64().unwrap() as i32;
    let argv = cmdline(pid).unwrap_or_default().join(" ");
    assert!(
        argv.contains(&format!(
            "file={},format=raw,media=cdrom,readonly=on",
            seed.display()
        )),
        "the seed is not a read-only CD-ROM: {argv}"
    );
    stop(&mut s, vm);
    assert!(seed.is_file(), "seed.iso is gone after stop_vm");
    let seed_s = seed.to_str().unwrap();

    // -- isoinfo: the volume, both name extensions, the listing.
    let d = host_text("isoinfo", &["-d", "-i", seed_s]);
    assert!(
        d.lines().any(|l| l.trim() == "Volume id: cidata"),
        "isoinfo -d: {d}"
    );
    assert!(d.contains("Joliet"), "no Joliet tree: {d}");
    assert!(d.contains("Rock Ridge"), "no Rock Ridge entries: {d}");
    let mut want_names = vec!["/meta-data", "/network-config", "/user-data"];
    for ext in ["-R", "-J"] {
        let mut names: Vec<String> = host_text("isoinfo", &[ext, "-f", "-i", seed_s])
            .lines()
            .map(str::to_string)
            .collect();
        names.sort();
        assert_eq!(names, want_names, "isoinfo {ext} -f");
        let long = host_text("isoinfo", &[ext, "-l", "-i", seed_s]);
        for n in &want_names {
            assert!(long.contains(&n[1..]), "isoinfo {ext} -l lacks {n}: {long}");
        }
    }
    // -- bsdtar, a second reader (libarchive).
    let bsdtar = have("bsdtar");
    if bsdtar {
        let mut names: Vec<String> = host_text("bsdtar", &["-tf", seed_s])
            .lines()
            .map(|l| format!("/{}", l.trim_start_matches("./")))
            .filter(|l| l != "/" && l != "/.")
            .collect();
        names.sort();
        assert_eq!(names, want_names, "bsdtar -tf");
    } else {
        eprintln!("bsdtar is missing (libarchive-tools): the seed was read with isoinfo only");
    }
    // Every file, the same bytes through every reader.
    let extract = |file: &str| -> Vec<u8> {
        let path = format!("/{file}");
        let rr = host("isoinfo", &["-R", "-x", &path, "-i", seed_s]);
        let joliet = host("isoinfo", &["-J", "-x", &path, "-i", seed_s]);
        assert_eq!(rr, joliet, "{file}: Rock Ridge and Joliet disagree");
        if bsdtar {
            let bt = host("bsdtar", &["-xOf", seed_s, file]);
            assert_eq!(rr, bt, "{file}: isoinfo and bsdtar disagree");
        }
        rr
    };
    let user_data = extract("user-data");
    let meta_data = extract("meta-data");
    let network_config = extract("network-config");
    assert!(
        user_data.starts_with(b"#cloud-config\n"),
        "{}",
        String::from_utf8_lossy(&user_data)
    );

    // -- The YAML, through PyYAML (the parser cloud-init itself uses).
    if host_has_pyyaml() {
        let parsed = host_yaml(&user_data);
        if parsed != want_user_data {
            for (k, v) in want_user_data.as_object().unwrap() {
                assert_eq!(&parsed[k], v, "user-data field {k} does not round trip");
            }
        }
        assert_eq!(parsed, want_user_data);
        assert_eq!(
            host_yaml(&meta_data),
            json!({"instance-id": iid1, "local-hostname": "mcq-seed"})
        );
        assert_eq!(host_yaml(&network_config), network);
    } else {
        eprintln!(
            "PyYAML is not importable on the host: the YAML round trip is checked in the guest \
             by cloud_init_sandbox_end_to_end only"
        );
    }

    // -- A second launch of the same VM: a new instance-id, the same user-data.
    let second = lab.launch_on(&mut s, launch_args(vm, &cloud_init), STEP);
    let iid2 = second["cloud_init"]["instance_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(iid1, iid2, "two launches got the same instance-id");
    assert_eq!(recorded_instance_id(&mut s, vm), iid2);
    stop(&mut s, vm);
    assert_eq!(extract("user-data"), user_data);
    let meta2 = String::from_utf8(extract("meta-data")).unwrap();
    assert!(
        meta2.contains(&iid2) && !meta2.contains(&iid1),
        "meta-data: {meta2}"
    );

    // -- Raw user_data: verbatim, byte for byte, over many sectors; the host name falls back to
    // the VM name; no network-config unless given.
    let mut raw = String::from("#cloud-config\n# verbatim: \"quotes\" 'both' *star &amp !bang\n");
    let mut i = 0;
    while raw.len() < 100_000 {
        raw.push_str(&format!(
            "# line {i}: é 😀 {}\n",
            TRICKY[i % TRICKY.len()].replace('\n', " ")
        ));
        i += 1;
    }
    let raw_vm = "ci-raw";
    let r = lab.launch_on(
        &mut s,
        launch_args(raw_vm, &json!({"user_data": raw})),
        STEP,
    );
    let raw_iid = r["cloud_init"]["instance_id"].as_str().unwrap().to_string();
    assert!(raw_iid != iid1 && raw_iid != iid2, "{r}");
    stop(&mut s, raw_vm);
    let raw_seed = lab.vm_dir(raw_vm).join("seed.iso");
    let raw_s = raw_seed.to_str().unwrap();
    let rr = host("isoinfo", &["-R", "-x", "/user-data", "-i", raw_s]);
    assert!(
        rr == raw.as_bytes(),
        "raw user_data changed on the way ({} bytes read, {} given)",
        rr.len(),
        raw.len()
    );
    assert_eq!(
        host("isoinfo", &["-J", "-x", "/user-data", "-i", raw_s]),
        rr
    );
    if bsdtar {
        assert_eq!(host("bsdtar", &["-xOf", raw_s, "user-data"]), rr);
    }
    let listed = host_text("isoinfo", &["-R", "-f", "-i", raw_s]);
    want_names.retain(|n| *n != "/network-config");
    for n in &want_names {
        assert!(listed.lines().any(|l| l == *n), "{n} missing: {listed}");
    }
    if host_has_pyyaml() {
        let meta = host("isoinfo", &["-R", "-x", "/meta-data", "-i", raw_s]);
        assert_eq!(
            host_yaml(&meta),
            json!({"instance-id": raw_iid, "local-hostname": raw_vm})
        );
    }

    // -- Refusals: each names the field, and starts nothing.
    let bad: Vec<(Value, &str)> = vec![
        (json!({"hostnme": "x"}), "hostnme"),
        (json!({"users": [{"name": "a", "shel": "/bin/sh"}]}), "shel"),
        (json!({"users": [{"shell": "/bin/sh"}]}), "users[0].name"),
        (
            json!({"users": [{"name": "a", "sudo": 1}]}),
            "users[0].sudo",
        ),
        (
            json!({"users": [{"name": "a", "lock_passwd": "no"}]}),
            "users[0].lock_passwd",
        ),
        (json!({"users": {"name": "a"}}), "users"),
        (json!({"packages": "vim"}), "packages"),
        (json!({"packages": ["vim", 3]}), "packages[1]"),
        (json!({"runcmd": [1]}), "runcmd[0]"),
        (json!({"runcmd": [["ls", 2]]}), "runcmd[0][1]"),
        (
            json!({"write_files": [{"path": "/a", "mode": "0644"}]}),
            "mode",
        ),
        (
            json!({"write_files": [{"path": "rel"}]}),
            "write_files[0].path",
        ),
        (
            json!({"write_files": [{"path": "/a", "permissions": "rw"}]}),
            "write_files[0].permissions",
        ),
        (
            json!({"write_files": [{"path": "/a", "encoding": "rot13"}]}),
            "write_files[0].encoding",
        ),
        (
            json!({"ssh_authorized_keys": "ssh-ed25519 AAA"}),
            "ssh_authorized_keys",
        ),
        (json!({"network_config": "dhcp"}), "network_config"),
        (json!({"user_data": 5}), "user_data"),
        (
            json!({"user_data": "#cloud-config\n", "hostname": "x"}),
            "user_data",
        ),
        (json!({"hostname": "not a host"}), "hostname"),
        (json!("hostname: x"), "cloud_init"),
    ];
    let qemus_before = qemu_pids_mentioning(&lab.runtime()).len();
    // A small base for sandbox_vm, so that only cloud_init is wrong.
    let base = lab.dir.join("base.qcow2");
    let (ok, out, err) = run_tool(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", base.to_str().unwrap(), "16M"],
    );
    assert!(ok, "qemu-img create: {out}{err}");
    let dest = lab.dir.join("never-written.qcow2");
    let mut leftovers = Vec::new();
    for (i, (ci, field)) in bad.iter().enumerate() {
        let name = format!("ci-bad-{i}");
        let launch = s.call_err("launch_vm", launch_args(&name, ci));
        let sandbox_name = format!("ci-bad-sb-{i}");
        let sandbox = s.call_err(
            "sandbox_vm",
            json!({"name": sandbox_name, "base_image": base, "memory_mb": 64, "cpus": 1,
                   "wait_agent_s": 0, "cloud_init": ci}),
        );
        let prepare = s.call_err(
            "image_prepare",
            json!({"source": base, "dest": dest, "cloud_init": ci, "timeout_s": 30}),
        );
        for (tool, msg) in [
            ("launch_vm", &launch),
            ("sandbox_vm", &sandbox),
            ("image_prepare", &prepare),
        ] {
            assert!(
                msg.contains(field) && msg.contains("cloud_init"),
                "{tool} with cloud_init {ci}: the error does not name {field:?}: {msg}"
            );
        }
        // Nothing on disk either: no state folder, no overlay, no seed.
        for n in [&name, &sandbox_name] {
            let dir = lab.vm_dir(n);
            if dir.exists() {
                leftovers.push(format!("{} holding {:?}", dir.display(), list_dir(&dir)));
            }
        }
        assert!(
            !dest.exists(),
            "a refused image_prepare wrote {}",
            dest.display()
        );
    }
    // image_prepare adds its own runcmd, so it refuses raw user_data.
    let msg = s.call_err(
        "image_prepare",
        json!({"source": base, "dest": dest, "cloud_init": {"user_data": "#cloud-config\n"},
               "timeout_s": 30}),
    );
    assert!(msg.contains("user_data"), "{msg}");
    assert!(!dest.exists());
    let names = vm_names(&mut s);
    assert!(
        names.iter().all(|n| n == vm || n == raw_vm),
        "refused launches left records: {names:?}"
    );
    assert_eq!(
        qemu_pids_mentioning(&lab.runtime()).len(),
        qemus_before,
        "a refused launch started a QEMU"
    );
    eprintln!(
        "seed ISO: {} bytes with {} bytes of user-data; raw user_data seed {} bytes",
        std::fs::metadata(&seed).unwrap().len(),
        user_data.len(),
        std::fs::metadata(&raw_seed).unwrap().len()
    );
    // Last, so that everything above is checked either way.
    assert!(
        leftovers.is_empty(),
        "refused launches left state folders behind: {leftovers:?}"
    );
}

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
    assert!(vm_names(&mut s).is_empty(), "{:?}", vm_names(&mut s));
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
