//! Untrusted agents, paths: every host path a tool reads or writes stays inside the roots, and
//! every escape is refused with nothing created, copied, fetched or connected to.
//!
//! - `..` out of a root, a symlink leaf or a symlinked parent pointing out, a hidden component
//!   below a root, protocol and `json:` pseudo-filenames, the read-only system roots.
//! - Download targets and attach sockets outside the roots.
//! - What works inside the roots: every image tool, `..` that stays inside, in-root symlinks,
//!   backing and external data files.
//! - The client's roots (MCP `roots/list`) narrow the default roots and never widen them.
//!
//! Untrusted images are in `security_images.rs`; QEMU's own command line (extra_args, the
//! seccomp sandbox, drive formats) and the quotas in `security_qemu.rs`.
//!
//! Most tests run a server whose only operator root is `<folder>/root`, with `<folder>/out`
//! beside it as the outside world ([`Fence`]).

use std::io::ErrorKind;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Paths out of the roots

#[test]
fn dotdot_out_of_a_root_is_refused_and_creates_nothing() {
    let dir = TempDir::new("sec-dotdot");
    let f = Fence::in_folder(dir.path());
    let secret = f.o("secret.qcow2");
    qcow2(&secret, "1M");
    let mut s = server_rooted_at(&f.root);
    let escape = |rel: &str| format!("{}/../out/{rel}", f.root.display());

    let err = s.call_err(
        "image_create",
        json!({"path": escape("x.qcow2"), "size": "1M"}),
    );
    assert_refused(&err, &f.o("x.qcow2"), &f.root);
    let err = s.call_err("image_info", json!({"path": escape("secret.qcow2")}));
    assert_refused(&err, &secret, &f.root);
    assert!(
        !err.contains("virtual"),
        "the refusal leaks the image: {err}"
    );
    // A deeper climb that comes back down into the outside folder.
    let deep = format!("{}/a/../../out/y.qcow2", f.root.display());
    std::fs::create_dir_all(f.r("a")).unwrap();
    let err = s.call_err("image_create", json!({"path": deep, "size": "1M"}));
    assert_refused(&err, &f.o("y.qcow2"), &f.root);
    // Copying out of the root, and into it from outside.
    qcow2(&f.r("mine.qcow2"), "1M");
    let err = s.call_err(
        "image_convert",
        json!({"source": st(&f.r("mine.qcow2")), "dest": escape("copy.qcow2")}),
    );
    assert_refused(&err, &f.o("copy.qcow2"), &f.root);
    let err = s.call_err(
        "image_convert",
        json!({"source": escape("secret.qcow2"), "dest": st(&f.r("stolen.qcow2"))}),
    );
    assert_refused(&err, &secret, &f.root);

    assert_eq!(list_dir(&f.out), vec!["secret.qcow2"], "created outside");
    assert_eq!(list_dir(&f.root), vec!["a", "mine.qcow2"], "copied in");
}

#[test]
fn a_symlink_leaf_pointing_out_is_refused() {
    let dir = TempDir::new("sec-leaf");
    let f = Fence::in_folder(dir.path());
    let victim = f.o("victim.qcow2");
    qcow2(&victim, "1M");
    let before = std::fs::read(&victim).unwrap();
    symlink(&victim, &f.r("link.qcow2"));
    let link = st(&f.r("link.qcow2")).to_string();
    let mut s = server_rooted_at(&f.root);

    let err = s.call_err("image_info", json!({"path": link}));
    assert_refused(&err, &victim, &f.root);
    let err = s.call_err(
        "image_create",
        json!({"path": link, "size": "2M", "overwrite": true}),
    );
    assert_refused(&err, &victim, &f.root);
    let err = s.call_err(
        "image_convert",
        json!({"source": link, "dest": st(&f.r("copy.qcow2"))}),
    );
    assert_refused(&err, &victim, &f.root);
    let err = s.call_err("image_resize", json!({"path": link, "size": "+1M"}));
    assert_refused(&err, &victim, &f.root);
    let err = s.call_err("image_snapshot_create", json!({"path": link, "tag": "s1"}));
    assert_refused(&err, &victim, &f.root);
    let err = s.call_err("image_snapshot_list", json!({"path": link}));
    assert_refused(&err, &victim, &f.root);
    assert_eq!(
        std::fs::read(&victim).unwrap(),
        before,
        "the outside image changed"
    );
    assert!(
        !f.r("copy.qcow2").exists(),
        "the outside image was copied in"
    );

    // A dangling link would be followed on creation: refused, and nothing appears outside.
    symlink(&f.o("new.qcow2"), &f.r("dangling.qcow2"));
    let err = s.call_err(
        "image_create",
        json!({"path": st(&f.r("dangling.qcow2")), "size": "1M"}),
    );
    assert!(err.contains("dangling.qcow2"), "{err}");
    assert_eq!(list_dir(&f.out), vec!["victim.qcow2"], "created outside");
}

#[test]
fn a_symlinked_parent_folder_pointing_out_is_refused() {
    let dir = TempDir::new("sec-parent");
    let f = Fence::in_folder(dir.path());
    let victim = f.o("victim.qcow2");
    qcow2(&victim, "1M");
    symlink(&f.out, &f.r("sub"));
    std::fs::create_dir_all(f.r("real")).unwrap();
    symlink(&f.out, &f.r("real/deeper"));
    let mut s = server_rooted_at(&f.root);

    for via in ["sub", "real/deeper"] {
        let err = s.call_err(
            "image_create",
            json!({"path": st(&f.r(&format!("{via}/new.qcow2"))), "size": "1M"}),
        );
        assert_refused(&err, &f.o("new.qcow2"), &f.root);
        let err = s.call_err(
            "image_info",
            json!({"path": st(&f.r(&format!("{via}/victim.qcow2")))}),
        );
        assert_refused(&err, &victim, &f.root);
        let err = s.call_err(
            "image_convert",
            json!({"source": st(&f.r(&format!("{via}/victim.qcow2"))),
                   "dest": st(&f.r("copy.qcow2"))}),
        );
        assert_refused(&err, &victim, &f.root);
    }
    assert_eq!(list_dir(&f.out), vec!["victim.qcow2"], "created outside");
    assert_eq!(list_dir(&f.root), vec!["real", "sub"], "copied in");
}

#[test]
fn hidden_paths_below_a_root_are_refused() {
    let dir = TempDir::new("sec-hidden");
    let f = Fence::in_folder(dir.path());
    std::fs::create_dir_all(f.r(".ssh")).unwrap();
    std::fs::create_dir_all(f.r("vms/.cache")).unwrap();
    qcow2(&f.r(".hidden.qcow2"), "1M");
    let mut s = server_rooted_at(&f.root);

    for rel in [".ssh/x.qcow2", ".x.qcow2", "vms/.cache/y.qcow2"] {
        let target = f.r(rel);
        let err = s.call_err("image_create", json!({"path": st(&target), "size": "1M"}));
        assert_refused(&err, &target, &f.root);
        assert!(err.contains("hidden"), "{err}");
        assert!(!target.exists(), "{rel} was created");
    }
    let hidden = f.r(".hidden.qcow2");
    let err = s.call_err("image_info", json!({"path": st(&hidden)}));
    assert_refused(&err, &hidden, &f.root);
    let err = s.call_err(
        "image_convert",
        json!({"source": st(&hidden), "dest": st(&f.r("copy.qcow2"))}),
    );
    assert_refused(&err, &hidden, &f.root);
    assert!(!f.r("copy.qcow2").exists());
    // A symlink with a plain name onto a hidden file is judged by where it leads.
    symlink(&hidden, &f.r("plain.qcow2"));
    let err = s.call_err("image_info", json!({"path": st(&f.r("plain.qcow2"))}));
    assert_refused(&err, &hidden, &f.root);
    assert!(list_dir(&f.r(".ssh")).is_empty());
    assert!(list_dir(&f.r("vms/.cache")).is_empty());
}

#[test]
fn protocol_and_json_names_are_refused_as_paths() {
    let dir = TempDir::new("sec-proto");
    let f = Fence::in_folder(dir.path());
    let wire = Tripwire::new();
    qcow2(&f.r("mine.qcow2"), "1M");
    let mut s = server_rooted_at(&f.root);
    let json_name = format!(
        r#"json:{{"driver":"qcow2","file":{{"driver":"file","filename":"{}"}}}}"#,
        f.r("mine.qcow2").display()
    );
    let nbd = format!("nbd://127.0.0.1:{}/x", wire.port());
    let file_url = format!("file:{}", f.r("mine.qcow2").display());
    for name in [&json_name, &nbd, &file_url] {
        let err = s.call_err("image_info", json!({"path": name}));
        // Named as given (quoted, so a json: name shows its quotes escaped).
        assert!(err.contains(&format!("{name:?}")), "{err}");
        assert!(err.contains("refused"), "{err}");
        let err = s.call_err("image_create", json!({"path": name, "size": "1M"}));
        assert!(err.contains("refused"), "{err}");
        let err = s.call_err(
            "image_convert",
            json!({"source": st(&f.r("mine.qcow2")), "dest": name}),
        );
        assert!(err.contains("refused"), "{err}");
        let err = s.call_err(
            "image_convert",
            json!({"source": name, "dest": st(&f.r("copy.qcow2"))}),
        );
        assert!(err.contains("refused"), "{err}");
        let err = s.call_err(
            "image_create",
            json!({"path": st(&f.r("over.qcow2")), "size": "1M", "backing_file": name}),
        );
        assert!(err.contains("refused"), "{err}");
    }
    wire.assert_untouched("protocol names");
    assert_eq!(list_dir(&f.root), vec!["mine.qcow2"]);
}

#[test]
fn system_folders_are_read_only_roots() {
    let mut s = Server::ready();
    let target = PathBuf::from(format!("/usr/share/mcq-sec-{}.qcow2", std::process::id()));
    let err = s.call_err("image_create", json!({"path": st(&target), "size": "1M"}));
    assert!(err.contains(st(&target)), "{err}");
    assert!(err.contains("never written"), "{err}");
    assert!(!target.exists(), "created in /usr/share");
}

// ---------------------------------------------------------------------------------------------
// Downloads and attach sockets

#[test]
fn a_download_outside_the_roots_is_refused_before_fetching() {
    let body = pseudo_random(256 * 1024, 9);
    let http = HttpServer::start(vec![("disk.img", Route::body(body.clone()))]);
    let dir = TempDir::new("sec-dl");
    let f = Fence::in_folder(dir.path());
    std::fs::create_dir_all(f.r(".cache")).unwrap();
    symlink(&f.out, &f.r("sub"));
    let mut s = server_rooted_at(&f.root);

    let cases = [
        (st(&f.o("dl.img")).to_string(), f.o("dl.img")),
        (format!("{}/../out/dl.img", f.root.display()), f.o("dl.img")),
        (st(&f.r("sub/dl.img")).to_string(), f.o("dl.img")),
        (st(&f.r(".cache/dl.img")).to_string(), f.r(".cache/dl.img")),
    ];
    for (path, target) in &cases {
        let err = s.call_err(
            "image_download",
            json!({"url": http.url("disk.img"), "path": path}),
        );
        assert_refused(&err, target, &f.root);
        assert!(!target.exists(), "{path}: downloaded anyway");
    }
    assert!(http.hits().is_empty(), "fetched anyway: {:?}", http.hits());
    assert!(list_dir(&f.out).is_empty(), "{:?}", list_dir(&f.out));
    assert!(list_dir(&f.r(".cache")).is_empty());

    // Inside the root it works.
    let ok = s.call_ok(
        "image_download",
        json!({"url": http.url("disk.img"), "path": st(&f.r("dl.img")),
               "sha256": sha256_hex(&body)}),
    );
    assert_eq!(ok["path"], st(&f.r("dl.img")));
    assert_eq!(std::fs::read(f.r("dl.img")).unwrap(), body);
    assert_eq!(http.hits(), vec!["/disk.img"]);
}

#[test]
fn an_attach_socket_outside_the_roots_is_refused_before_connecting() {
    let dir = short_runtime_dir("sec-att");
    let f = Fence::in_folder(dir.path());
    let outside = UnixListener::bind(f.o("qmp.sock")).expect("bind");
    outside.set_nonblocking(true).unwrap();
    let inside = UnixListener::bind(f.r("qmp.sock")).expect("bind");
    inside.set_nonblocking(true).unwrap();
    let state = dir.subdir("s");
    let runtime = dir.subdir("r");
    let mut s = Server::try_start_with(
        TempDir::new("srv"),
        &state,
        &runtime,
        &[("MCQEMU_ROOTS", st(&f.root))],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    s.initialize(NEWEST);

    let err = s.call_err(
        "attach_vm",
        json!({"name": "intruder", "qmp_socket": st(&f.o("qmp.sock"))}),
    );
    assert_refused(&err, &f.o("qmp.sock"), &f.root);
    let err = s.call_err(
        "attach_vm",
        json!({"name": "intruder", "qmp_socket": format!("{}/../out/qmp.sock", f.root.display())}),
    );
    assert_refused(&err, &f.o("qmp.sock"), &f.root);
    // A guest-agent socket outside, beside a monitor inside: refused before either is used.
    let err = s.call_err(
        "attach_vm",
        json!({"name": "intruder", "qmp_socket": st(&f.r("qmp.sock")),
               "qga_socket": st(&f.o("qmp.sock"))}),
    );
    assert_refused(&err, &f.o("qmp.sock"), &f.root);
    for (l, which) in [(&outside, "outside"), (&inside, "inside")] {
        match l.accept() {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            other => panic!("the {which} socket was connected to: {other:?}"),
        }
    }
    assert!(
        vm_names(&mut s).is_empty(),
        "a refused attach left a record"
    );
}

// ---------------------------------------------------------------------------------------------
// What works inside the roots

#[test]
fn image_tools_work_inside_the_roots() {
    let dir = TempDir::new("sec-inside");
    let f = Fence::in_folder(dir.path());
    std::fs::create_dir_all(f.r("sub")).unwrap();
    let mut s = server_rooted_at(&f.root);
    let a = f.r("a.qcow2");

    let out = s.call_ok("image_create", json!({"path": st(&a), "size": "16M"}));
    assert_eq!(out["format"], "qcow2", "{out}");
    // `..` that stays inside the root is fine: it is resolved, not refused by its spelling.
    let b = format!("{}/sub/../b.raw", f.root.display());
    let out = s.call_ok(
        "image_create",
        json!({"path": b, "size": "1M", "format": "raw"}),
    );
    assert_eq!(out["format"], "raw", "{out}");
    assert!(f.r("b.raw").is_file());
    let out = s.call_ok("image_info", json!({"path": st(&a), "backing_chain": true}));
    assert_eq!(out["virtual_size"], 16 << 20, "{out}");
    // An overlay on an image inside the root, and its chain.
    let over = f.r("over.qcow2");
    let out = s.call_ok(
        "image_create",
        json!({"path": st(&over), "size": "16M", "backing_file": st(&a)}),
    );
    assert_eq!(out["backing_file"], st(&a), "{out}");
    let out = s.call_ok(
        "image_info",
        json!({"path": st(&over), "backing_chain": true}),
    );
    assert_eq!(out["chain"].as_array().map(Vec::len), Some(2), "{out}");
    // A symlink inside the root onto an image inside the root.
    symlink(&a, &f.r("alias.qcow2"));
    s.call_ok("image_info", json!({"path": st(&f.r("alias.qcow2"))}));
    let flat = f.r("flat.raw");
    s.call_ok(
        "image_convert",
        json!({"source": st(&over), "dest": st(&flat), "format": "raw"}),
    );
    assert_eq!(qemu_img_info(&flat)["format"], "raw");
    let out = s.call_ok("image_resize", json!({"path": st(&a), "size": "+1M"}));
    assert_eq!(out["virtual_size"], 17 << 20, "{out}");
    s.call_ok(
        "image_snapshot_create",
        json!({"path": st(&a), "tag": "s1"}),
    );
    let out = s.call_ok("image_snapshot_list", json!({"path": st(&a)}));
    assert_eq!(out["snapshots"][0]["tag"], "s1", "{out}");
    // An external data file inside the root is fine too.
    let ext = f.r("ext.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        &format!("data_file={}", f.r("ext.data").display()),
        st(&ext),
        "1M",
    ]);
    s.call_ok(
        "image_info",
        json!({"path": st(&ext), "backing_chain": true}),
    );
    s.call_ok(
        "image_convert",
        json!({"source": st(&ext), "dest": st(&f.r("ext-flat.qcow2"))}),
    );
    assert!(f.r("ext-flat.qcow2").is_file());
    assert!(list_dir(&f.out).is_empty());
}

// ---------------------------------------------------------------------------------------------
// The client's roots

/// Starts a server without operator roots (HOME is `home`, so the default roots are `home` and
/// the temporary folder), initializes it declaring the `roots` capability, and answers its
/// `roots/list` with `client_roots`. Returns the server.
fn server_with_client_roots(home: &Path, client_roots: &[&str]) -> Server {
    let mut s = Server::start_with_env(&[("MCQEMU_ROOTS", ""), ("HOME", st(home))]);
    let mut params = initialize_params(NEWEST);
    params["capabilities"] = json!({"roots": {"listChanged": true}});
    let init = s.request("initialize", params);
    assert!(init.get("result").is_some(), "{init}");
    s.notify("notifications/initialized", json!({}));
    answer_roots_list(&mut s, client_roots);
    s
}

/// Reads the server's next `roots/list` request and answers it with `dirs` as file:// URIs.
fn answer_roots_list(s: &mut Server, dirs: &[&str]) {
    let ask = loop {
        let m = s
            .recv(Duration::from_secs(10))
            .expect("the server did not ask for the client's roots");
        if m["method"] == "roots/list" {
            break m;
        }
        assert!(
            m.get("id").is_none() || m.get("method").is_some(),
            "an unexpected response: {m}"
        );
    };
    let id = ask["id"].clone();
    assert!(
        id.as_str().is_some_and(|i| i.starts_with("mcq-roots-")),
        "roots/list id: {ask}"
    );
    let roots: Vec<Value> = dirs
        .iter()
        .map(|d| json!({"uri": format!("file://{d}"), "name": "project"}))
        .collect();
    s.send(&json!({"jsonrpc": "2.0", "id": id, "result": {"roots": roots}}));
}

#[test]
fn the_client_roots_narrow_the_default_roots() {
    let dir = TempDir::new("sec-client");
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let home = base.join("home");
    let client = base.join("client");
    let other = base.join("other");
    for d in [&home, &client, &other] {
        std::fs::create_dir_all(d).unwrap();
    }

    // Without client roots the default (home and the temporary folder) reaches `other`.
    let mut plain = Server::start_with_env(&[("MCQEMU_ROOTS", ""), ("HOME", st(&home))]);
    plain.initialize(NEWEST);
    plain.call_ok(
        "image_create",
        json!({"path": st(&other.join("default.qcow2")), "size": "1M"}),
    );
    drop(plain);

    let mut s = server_with_client_roots(&home, &[st(&client)]);
    let out = s.call_ok(
        "image_create",
        json!({"path": st(&client.join("ok.qcow2")), "size": "1M"}),
    );
    assert_eq!(out["format"], "qcow2");
    let refused = other.join("no.qcow2");
    let err = s.call_err("image_create", json!({"path": st(&refused), "size": "1M"}));
    assert_refused(&err, &refused, &client);
    assert!(!refused.exists(), "created outside the client's root");
    let err = s.call_err(
        "image_info",
        json!({"path": st(&other.join("default.qcow2"))}),
    );
    assert_refused(&err, &other.join("default.qcow2"), &client);
    // The home folder is in the default too, but not in the client's roots.
    let err = s.call_err(
        "image_create",
        json!({"path": st(&home.join("h.qcow2")), "size": "1M"}),
    );
    assert_refused(&err, &home.join("h.qcow2"), &client);

    // The client's roots change: the server asks again and follows.
    s.notify("notifications/roots/list_changed", json!({}));
    answer_roots_list(&mut s, &[st(&other)]);
    s.call_ok(
        "image_create",
        json!({"path": st(&other.join("now.qcow2")), "size": "1M"}),
    );
    let err = s.call_err(
        "image_create",
        json!({"path": st(&client.join("then.qcow2")), "size": "1M"}),
    );
    assert_refused(&err, &client.join("then.qcow2"), &other);
    assert_eq!(list_dir(&client), vec!["ok.qcow2"]);
    assert_eq!(list_dir(&other), vec!["default.qcow2", "now.qcow2"]);
    assert!(list_dir(&home).is_empty());
}

#[test]
fn the_client_roots_never_widen_the_default_roots() {
    let dir = TempDir::new("sec-widen");
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let home = base.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let var_tmp = std::fs::canonicalize("/var/tmp").unwrap();
    let mut s = server_with_client_roots(&home, &["/var", "/etc"]);
    let outside = var_tmp.join(format!("mcq-sec-widen-{}.qcow2", std::process::id()));
    let err = s.call_err("image_create", json!({"path": st(&outside), "size": "1M"}));
    assert!(
        err.contains(st(&outside)) && err.contains("--root"),
        "{err}"
    );
    assert!(!outside.exists(), "the client widened the roots");
    let err = s.call_err("image_info", json!({"path": "/etc/hostname"}));
    assert!(err.contains("--root"), "{err}");
    // Nor does the default stay: a client root outside it leaves none of the default.
    let err = s.call_err(
        "image_create",
        json!({"path": st(&home.join("h.qcow2")), "size": "1M"}),
    );
    assert!(err.contains("--root"), "{err}");
    assert!(list_dir(&home).is_empty());
}
