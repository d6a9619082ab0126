//! cloud-init seeds over MCP, against the built binary and real QEMU: the NoCloud seed
//! launch_vm writes, read back by independent readers (isoinfo through Rock Ridge and Joliet,
//! bsdtar) and its YAML by a real YAML parser (PyYAML), with the quoting cases that break
//! hand-written YAML; refusals of bad `cloud_init` fields that start nothing; a fresh
//! instance-id at every launch. No guest boots here (cloud_init_boot.rs has those).

use crate::common::cloud_guest::{self as cg, *};
use crate::common::*;
use serde_json::{json, Value};

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
            "file={},format=raw,if=none,media=cdrom,readonly=on",
            seed.display()
        )),
        "the seed is not a read-only CD-ROM: {argv}"
    );
    // On virtio-scsi, which every cloud kernel has (Debian's cloud flavour lacks AHCI).
    assert!(
        argv.contains("virtio-scsi-pci,id=mcq-scsi") && argv.contains("scsi-cd,bus=mcq-scsi.0"),
        "the seed is not on a virtio-scsi CD-ROM: {argv}"
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
    let names = cg::vm_names(&mut s);
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
