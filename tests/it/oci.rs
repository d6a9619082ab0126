//! Container images made VM roots (image_pull's `oci`), over MCP against the built binary: an
//! OCI layout written by `tests/oci/build_layout.py` (two layers: whiteouts, an opaque
//! folder, a hard link, setuid with a file capability, a file owned by 1000:1000, a device
//! node), read back from the ext4 root with e2fsprogs' debugfs, and compared with what umoci
//! (the reference unpacker) makes of the same image. A second pull builds nothing; a blob that
//! does not match its digest and a layer that climbs out with '..' are refused, leaving
//! nothing behind. An image pushed (by skopeo) to Debian's docker-registry on 127.0.0.1 is
//! pulled over the distribution API, kept by digest, not downloaded again, and a broken-off
//! layer download is resumed with a Range request.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::registry::Registry;
use crate::common::*;
use serde_json::json;

const STEP: Duration = Duration::from_secs(120);

/// Writes an OCI layout with `tests/oci/build_layout.py`; the manifest digest.
pub fn layout(dir: &Path, tag: &str, extra: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oci/build_layout.py");
    let mut args: Vec<&OsStr> = vec![script.as_os_str(), dir.as_os_str(), OsStr::new(tag)];
    args.extend(extra.iter().map(OsStr::new));
    let out = try_run("python3", &args, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"));
    String::from_utf8(out).unwrap().trim().to_string()
}

fn debugfs(image: &str, cmd: &str) -> String {
    // e2fsprogs is in /usr/sbin, which an ordinary user's PATH lacks.
    let tool = ["/usr/sbin/debugfs", "/sbin/debugfs"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .unwrap_or("debugfs");
    let out = try_run(
        tool,
        &[OsStr::new("-R"), OsStr::new(cmd), OsStr::new(image)],
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    String::from_utf8_lossy(&out).into_owned()
}

/// Every path below `root` with its type, permission bits and (files) content.
fn tree(root: &Path) -> BTreeMap<String, (char, u32, Vec<u8>)> {
    fn walk(dir: &Path, rel: &str, out: &mut BTreeMap<String, (char, u32, Vec<u8>)>) {
        use std::os::unix::fs::PermissionsExt;
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = format!("{rel}{}", e.file_name().to_string_lossy());
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            // Permission bits only: debugfs's rdump chowns after its chmod, which clears a
            // setuid bit (the root's own inode is checked with stat above).
            let mode = m.permissions().mode() & 0o777;
            if m.is_dir() {
                out.insert(name.clone(), ('d', mode, Vec::new()));
                walk(&e.path(), &format!("{name}/"), out);
            } else if m.file_type().is_symlink() {
                let t = std::fs::read_link(e.path()).unwrap();
                out.insert(name, ('l', 0, t.to_string_lossy().as_bytes().to_vec()));
            } else if m.is_file() {
                out.insert(name, ('f', mode, std::fs::read(e.path()).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, "", &mut out);
    out
}

#[test]
fn a_container_image_becomes_a_root_with_the_images_owners_and_whiteouts() {
    let mut lab = Lab::confined("oci");
    let dir = lab.dir.join("layout");
    let digest = layout(&dir, "v1", &[]);
    let reference = format!("oci:{}:v1", dir.display());

    let r = lab
        .srv()
        .call_ok_within("image_pull", json!({"oci": reference}), STEP);
    assert_eq!(r["digest"], json!(digest), "{r}");
    assert_eq!(
        (&r["source"], &r["cached"], &r["layers"], &r["platform"]),
        (
            &json!("oci"),
            &json!(false),
            &json!(2),
            &json!("linux/amd64")
        ),
        "{r}"
    );
    assert_eq!(r["config"]["user"], "1000:1000", "{r}");
    assert_eq!(r["config"]["working_dir"], "/home/user", "{r}");
    assert_eq!(
        r["config"]["env"][1], "GREETING=hello from the image",
        "{r}"
    );
    assert_eq!(r["config"]["exposed_ports"], json!(["8080/tcp"]), "{r}");
    assert!(
        r["skipped"][0].as_str().unwrap().contains("dev/null"),
        "{r}"
    );
    let root = r["path"].as_str().unwrap().to_string();
    assert!(root.starts_with(lab.state().to_str().unwrap()), "{root}");

    // What the ext4 root holds, read by e2fsprogs: the image's owners, modes and capability.
    let ping = debugfs(&root, "stat /usr/bin/ping");
    assert!(
        ping.contains("Mode:  04755") && ping.contains("Links: 2"),
        "{ping}"
    );
    assert!(debugfs(&root, "ea_list /usr/bin/ping").contains("security.capability"));
    let own = debugfs(&root, "stat /home/user/own");
    assert!(
        own.contains("User:  1000") && own.contains("Group:  1000"),
        "{own}"
    );
    assert!(own.contains("Mode:  0600"), "{own}");
    assert_eq!(debugfs(&root, "cat /etc/a"), "two");
    for gone in ["/etc/gone", "/opt/keep/old", "/dev/null"] {
        let st = debugfs(&root, &format!("stat {gone}"));
        assert!(!st.contains("Inode:"), "{gone} is in the root: {st}");
    }
    assert_eq!(debugfs(&root, "cat /opt/keep/new"), "new");

    // The same tree as umoci's, the reference unpacker (paths, types, modes, content).
    let dump = lab.dir.join("dump");
    std::fs::create_dir(&dump).unwrap();
    debugfs(&root, &format!("rdump / {}", dump.display()));
    let bundle = lab.dir.join("bundle");
    try_run(
        "umoci",
        &[
            OsStr::new("unpack"),
            OsStr::new("--rootless"),
            OsStr::new("--image"),
            OsStr::new(&format!("{}:v1", dir.display())),
            bundle.as_os_str(),
        ],
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("umoci (apt install umoci; .ci/setup-host does): {e}"));
    let mut ours = tree(&dump);
    let mut theirs = tree(&bundle.join("rootfs"));
    // mcqemu's own folder holds the image's config for the agent.
    let config = String::from_utf8(ours[".mcqemu/image"].2.clone()).unwrap();
    assert!(
        config.contains("env GREETING=hello from the image\nworkdir /home/user\nuser 1000 1000\n"),
        "{config}"
    );
    ours.retain(|k, _| k != "lost+found" && !k.starts_with("dev") && !k.starts_with(".mcqemu"));
    theirs.retain(|k, _| !k.starts_with("dev"));
    assert_eq!(
        ours, theirs,
        "our root differs from umoci's unpack of the same image"
    );

    // A second pull of the same image builds nothing.
    let again = lab
        .srv()
        .call_ok_within("image_pull", json!({"oci": reference}), STEP);
    assert_eq!(
        (&again["cached"], &again["path"]),
        (&json!(true), &r["path"])
    );
}

/// Only lock files are in the root cache (and the image store, without a scratch folder of an
/// import): no root, no scratch folder of a failed build.
fn assert_nothing_built(cache: &Path) {
    if let Ok(d) = std::fs::read_dir(cache.join("store")) {
        let names: Vec<String> = d
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().all(|n| n == "oci-layout" || n == "blobs"),
            "the store holds {names:?}"
        );
    }
    let left: Vec<String> = std::fs::read_dir(cache)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        left.iter().all(|n| n.ends_with(".lock") || n == "store"),
        "left behind: {left:?}"
    );
}

#[test]
fn a_tampered_blob_and_a_hostile_layer_are_refused_and_leave_nothing() {
    let mut lab = Lab::confined("oci-bad");
    let dir = lab.dir.join("layout");
    layout(&dir, "v1", &[]);
    // Flip a byte of the second (plain tar) layer: its digest no longer matches.
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    let blob = |d: &str| -> PathBuf {
        dir.join("blobs/sha256")
            .join(d.trim_start_matches("sha256:"))
    };
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(blob(index["manifests"][0]["digest"].as_str().unwrap())).unwrap(),
    )
    .unwrap();
    let layer = blob(manifest["layers"][1]["digest"].as_str().unwrap());
    let mut bytes = std::fs::read(&layer).unwrap();
    bytes[600] ^= 1;
    std::fs::write(&layer, &bytes).unwrap();
    let r = lab.srv().call_tool_within(
        "image_pull",
        json!({"oci": format!("oci:{}:v1", dir.display())}),
        STEP,
    );
    let e = tool_err(&r, "a tampered layer");
    assert!(e.contains("does not match its digest"), "{e}");
    assert_eq!(error_kind(&r), "refused");
    let cache = lab.state().join("oci");
    assert_nothing_built(&cache);

    let evil = lab.dir.join("evil-layout");
    layout(&evil, "v1", &["--hostile"]);
    let r = lab.srv().call_tool_within(
        "image_pull",
        json!({"oci": format!("oci:{}:v1", evil.display())}),
        STEP,
    );
    let e = tool_err(&r, "a layer climbing out");
    assert!(e.contains("'..'"), "{e}");
    assert_eq!(error_kind(&r), "refused");
    assert!(!lab.state().join("oci/evil").exists() && !lab.dir.join("evil").exists());
    assert_nothing_built(&cache);

    // A file that is not a docker save tarball.
    let junk = lab.dir.join("junk.tar");
    std::fs::write(&junk, b"not a tarball at all").unwrap();
    let r = lab.srv().call_tool_within(
        "image_pull",
        json!({"oci": format!("docker-archive:{}", junk.display())}),
        STEP,
    );
    let e = tool_err(&r, "a docker-archive that is not one");
    assert!(e.contains("docker save"), "{e}");
    assert_eq!(error_kind(&r), "invalid_argument");
    assert_nothing_built(&cache);
}

#[test]
fn a_docker_save_tarball_becomes_the_same_root() {
    let mut lab = Lab::confined("oci-arch");
    let dir = lab.dir.join("layout");
    layout(&dir, "v1", &[]);
    let archive = lab.dir.join("app.tar");
    try_run(
        "skopeo",
        &[
            OsStr::new("copy"),
            OsStr::new(&format!("oci:{}:v1", dir.display())),
            OsStr::new(&format!("docker-archive:{}:mcq/app:v1", archive.display())),
        ],
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("skopeo (apt install skopeo): {e}"));
    let r = lab.srv().call_ok_within(
        "image_pull",
        json!({"oci": format!("docker-archive:{}", archive.display())}),
        STEP,
    );
    assert_eq!(
        (&r["source"], &r["layers"], &r["config"]["user"]),
        (&json!("oci"), &json!(2), &json!("1000:1000")),
        "{r}"
    );
    let root = r["path"].as_str().unwrap();
    assert_eq!(debugfs(root, "cat /etc/a"), "two");
    assert!(debugfs(root, "stat /usr/bin/ping").contains("Mode:  04755"));
    let again = lab.srv().call_ok_within(
        "image_pull",
        json!({"oci": format!("docker-archive:{}", archive.display())}),
        STEP,
    );
    assert_eq!(
        (&again["digest"], &again["cached"]),
        (&r["digest"], &json!(true)),
        "the same archive is the same image: {again}"
    );
}

#[test]
fn an_image_pulled_from_a_registry_is_kept_by_digest_and_not_downloaded_twice() {
    let mut lab = Lab::confined("oci-reg");
    let dir = lab.dir.join("layout");
    layout(&dir, "v1", &[]);
    let reg = Registry::start(&lab.dir.join("registry"));
    let dest = format!("docker://{}/mcq/app:v1", reg.addr);
    try_run(
        "skopeo",
        &[
            OsStr::new("copy"),
            OsStr::new("--dest-tls-verify=false"),
            OsStr::new(&format!("oci:{}:v1", dir.display())),
            OsStr::new(&dest),
        ],
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("skopeo (apt install skopeo): {e}"));

    let reference = format!("{}/mcq/app:v1", reg.addr);
    let r = lab
        .srv()
        .call_ok_within("image_pull", json!({"oci": reference}), STEP);
    assert_eq!(
        (&r["source"], &r["cached"]),
        (&json!("oci"), &json!(false)),
        "{r}"
    );
    // The manifest as the registry serves it (skopeo writes it anew when it pushes).
    let raw = try_run(
        "skopeo",
        &[
            OsStr::new("inspect"),
            OsStr::new("--raw"),
            OsStr::new("--tls-verify=false"),
            OsStr::new(&dest),
        ],
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        r["digest"],
        json!(format!("sha256:{}", sha256_hex(&raw))),
        "{r}"
    );
    assert!(r["downloaded"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(debugfs(r["path"].as_str().unwrap(), "cat /etc/a"), "two");
    assert_eq!(r["config"]["user"], "1000:1000", "{r}");

    // Everything is held now: nothing is downloaded, nothing built.
    let again = lab
        .srv()
        .call_ok_within("image_pull", json!({"oci": reference}), STEP);
    assert_eq!(
        (&again["downloaded"], &again["cached"]),
        (&json!(0), &json!(true)),
        "{again}"
    );

    // An interrupted pull resumes: half of a layer left as its .partial file (as a broken-off
    // download leaves it) is continued with a Range request, not fetched again.
    let store = lab.state().join("oci/store/blobs/sha256");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(store.join(sha256_hex(&raw))).unwrap()).unwrap();
    let big = store.join(
        manifest["layers"][0]["digest"]
            .as_str()
            .unwrap()
            .trim_start_matches("sha256:"),
    );
    let whole = std::fs::read(&big).unwrap();
    let half = whole.len() / 2;
    std::fs::remove_file(&big).unwrap();
    std::fs::write(big.with_extension("partial"), &whole[..half]).unwrap();
    let _ = std::fs::remove_dir_all(
        lab.state().join("oci").join(
            again["digest"]
                .as_str()
                .unwrap()
                .trim_start_matches("sha256:"),
        ),
    );
    let resumed = lab
        .srv()
        .call_ok_within("image_pull", json!({"oci": reference}), STEP);
    assert_eq!(
        resumed["downloaded"],
        json!(whole.len() - half),
        "only the missing half came: {resumed}"
    );
    assert_eq!(std::fs::read(&big).unwrap(), whole);
    assert!(!big.with_extension("partial").exists());
    assert_eq!(resumed["cached"], json!(false), "the root was built again");

    // A name the registry does not have.
    let r = lab.srv().call_tool_within(
        "image_pull",
        json!({"oci": format!("{}/mcq/nothing:v1", reg.addr)}),
        STEP,
    );
    let e = tool_err(&r, "a missing image");
    assert!(e.contains("HTTP 404"), "{e}");
    assert_eq!(error_kind(&r), "not_found");
}
