//! `image_pull` and `image_catalog` over MCP against a small HTTP server on 127.0.0.1: checksum
//! files in GNU and BSD style and Alpine's per-file bare digest, SHA-256 and SHA-512, refusals
//! that download nothing, interrupted pulls continued with HTTP Range (and restarted when the
//! server cannot or the file changed), cancellation, pulls by catalog name through
//! `MCQEMU_CATALOG_MIRROR` (the pinned URL first, the moving one when it is gone, never on a
//! mismatch), and what the catalog reports as pulled.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{json, Value};

/// SHA-512 of `data` as lower-case hex.
fn sha512_hex(data: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA512, data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A server and an empty folder for its pulls.
fn setup() -> (Server, PathBuf) {
    let s = Server::ready();
    let dir = s.tmp.subdir("pulls");
    (s, dir)
}

/// The server's default pull folder, `<state>/images`.
fn images_dir(s: &Server) -> PathBuf {
    s.tmp.join("state").join("images")
}

/// A raw image `len` bytes long (pseudo-random data: no format's magic, so qemu-img takes it
/// as raw).
fn raw_image(len: usize, seed: u64) -> Vec<u8> {
    pseudo_random(len, seed)
}

/// A real qcow2 image's bytes.
fn qcow2_image(s: &Server) -> Vec<u8> {
    let path = s.tmp.join("made.qcow2");
    let (ok, _, err) = run_tool(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", path.to_str().unwrap(), "16M"],
    );
    assert!(ok, "qemu-img create: {err}");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    bytes
}

/// A GNU-style checksum file (`HEX  name`) with a few other entries around `name`'s.
fn gnu_sums(name: &str, hex: &str) -> String {
    format!(
        "{}  other-cloud.qcow2\n{hex}  {name}\n{}  {name}.sig\n",
        sha256_hex(b"other"),
        sha256_hex(b"sig")
    )
}

/// `pulls/.NAME.partial` and `pulls/.NAME.partial.json`.
fn partials(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    (
        dir.join(format!(".{name}.partial")),
        dir.join(format!(".{name}.partial.json")),
    )
}

/// Checks a successful pull's result against the data served.
fn assert_pulled(out: &Value, dest: &Path, data: &[u8], algorithm: &str, resumed_from: u64) {
    let digest = match algorithm {
        "sha256" => sha256_hex(data),
        "sha512" => sha512_hex(data),
        other => panic!("unknown algorithm {other}"),
    };
    assert_eq!(out["path"], dest.to_str().unwrap(), "{out}");
    assert_eq!(out["bytes"], data.len(), "{out}");
    assert_eq!(out["algorithm"], algorithm, "{out}");
    assert_eq!(out["digest"], digest, "{out}");
    assert_eq!(out["verified"], true, "{out}");
    assert_eq!(out["resumed_from"], resumed_from, "{out}");
    let on_disk = std::fs::read(dest).unwrap();
    assert!(
        on_disk == data,
        "the pulled file differs from what was served"
    );
}

/// The folder holds the image and its pull record, nothing else (no partial files).
fn assert_only_image(dir: &Path, name: &str) {
    assert_eq!(
        list_dir(dir),
        vec![format!(".{name}.pulled.json"), name.to_string()],
        "unexpected files in {}",
        dir.display()
    );
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn sha512_helper_matches_known_vectors() {
    assert_eq!(
        sha512_hex(b"abc"),
        "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a\
         2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f"
    );
}

#[test]
fn gnu_sha256_list_is_verified() {
    let data = raw_image(2 * 1024 * 1024 + 333, 1);
    let name = "disk-amd64.img";
    let http = HttpServer::start(vec![
        (name, Route::body(data.clone())),
        (
            "SHA256SUMS",
            Route::body(gnu_sums(name, &sha256_hex(&data)).into_bytes()),
        ),
    ]);
    let (mut s, dir) = setup();
    let dest = dir.join(name);
    let out = s.call_ok(
        "image_pull",
        json!({"url": http.url(name), "checksums_url": http.url("SHA256SUMS"),
               "path": dest.to_str().unwrap()}),
    );
    assert_pulled(&out, &dest, &data, "sha256", 0);
    assert_eq!(out["url"], http.url(name));
    assert_eq!(out["checksums_url"], http.url("SHA256SUMS"));
    assert_eq!(out["format"], "raw");
    // The checksum file first, then the image once.
    assert_eq!(
        http.hits(),
        vec!["/SHA256SUMS".to_string(), format!("/{name}")]
    );
    assert_only_image(&dir, name);
    // The record beside it says what was verified.
    let record = read_json(&dir.join(format!(".{name}.pulled.json")));
    assert_eq!(record["url"], http.url(name));
    assert_eq!(record["checksums_url"], http.url("SHA256SUMS"));
    assert_eq!(record["algorithm"], "sha256");
    assert_eq!(record["digest"], sha256_hex(&data));
    assert_eq!(record["bytes"], data.len());
    assert!(record["pulled_at"].is_string(), "{record}");

    // Pulling again keeps the file unless overwrite is asked for.
    let args = json!({"url": http.url(name), "checksums_url": http.url("SHA256SUMS"),
                      "path": dest.to_str().unwrap()});
    let err = s.call_err("image_pull", args.clone());
    assert!(err.contains("already exists"), "{err}");
    let mut again = args;
    again["overwrite"] = json!(true);
    let out = s.call_ok("image_pull", again);
    assert_pulled(&out, &dest, &data, "sha256", 0);
    assert_only_image(&dir, name);
}

#[test]
fn gnu_sha512_binary_mode_list_is_verified_into_the_default_folder() {
    let data = raw_image(1024 * 1024 + 7, 2);
    let name = "debian-13-genericcloud-amd64.raw";
    // SHA512SUMS as `sha512sum -b` writes it, upper-case here.
    let sums = format!(
        "{}  debian-13-genericcloud-arm64.raw\n{} *{name}\n",
        sha512_hex(b"arm"),
        sha512_hex(&data).to_uppercase()
    );
    let http = HttpServer::start(vec![
        (name, Route::body(data.clone())),
        ("SHA512SUMS", Route::body(sums.into_bytes())),
    ]);
    let mut s = Server::ready();
    let out = s.call_ok(
        "image_pull",
        json!({"url": http.url(name), "checksums_url": http.url("SHA512SUMS")}),
    );
    let images = images_dir(&s);
    assert_pulled(&out, &images.join(name), &data, "sha512", 0);
    assert_eq!(out["format"], "raw");
    assert_only_image(&images, name);
}

#[test]
fn bsd_sha256_list_inside_a_pgp_signed_message_is_verified() {
    let mut s = Server::ready();
    let data = qcow2_image(&s);
    let name = "Fedora-Cloud-Base-Generic-43-1.6.x86_64.qcow2";
    // As Fedora publishes it: a clearsigned BSD-style list.
    let sums = format!(
        "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\n\
         # Fedora-Cloud-Base-Generic-43-1.6.x86_64.qcow2: {} bytes\n\
         SHA256 (Fedora-Cloud-Base-Generic-43-1.6.x86_64.raw.xz) = {}\n\
         SHA256 ({name}) = {}\n\
         -----BEGIN PGP SIGNATURE-----\n\niQIzBAEBCAAdFiEE\n=abcd\n-----END PGP SIGNATURE-----\n",
        data.len(),
        sha256_hex(b"xz"),
        sha256_hex(&data)
    );
    let http = HttpServer::start(vec![
        (name, Route::body(data.clone())),
        (
            "Fedora-Cloud-43-1.6-x86_64-CHECKSUM",
            Route::body(sums.into_bytes()),
        ),
    ]);
    let dir = s.tmp.subdir("pulls");
    let dest = dir.join(name);
    let out = s.call_ok(
        "image_pull",
        json!({"url": http.url(name),
               "checksums_url": http.url("Fedora-Cloud-43-1.6-x86_64-CHECKSUM"),
               "path": dest.to_str().unwrap()}),
    );
    assert_pulled(&out, &dest, &data, "sha256", 0);
    assert_eq!(out["format"], "qcow2");
    assert_only_image(&dir, name);
}

#[test]
fn bsd_sha512_list_is_verified() {
    let data = raw_image(700 * 1024 + 1, 3);
    let name = "generic_alpine-3.22.2-x86_64-bios-cloudinit-r0.img";
    let sums = format!(
        "SHA512 (other.img) = {}\nSHA512 ({name}) = {}\n",
        sha512_hex(b"other"),
        sha512_hex(&data)
    );
    let http = HttpServer::start(vec![
        (name, Route::body(data.clone())),
        ("sums.sha512", Route::body(sums.into_bytes())),
    ]);
    let (mut s, dir) = setup();
    let dest = dir.join(name);
    let out = s.call_ok(
        "image_pull",
        json!({"url": http.url(name), "checksums_url": http.url("sums.sha512"),
               "path": dest.to_str().unwrap()}),
    );
    assert_pulled(&out, &dest, &data, "sha512", 0);
    assert_only_image(&dir, name);
}

#[test]
fn checksum_mismatch_leaves_no_file() {
    let data = raw_image(600 * 1024, 4);
    let wrong256 = sha256_hex(b"not the image");
    let wrong512 = sha512_hex(b"not the image");
    let http = HttpServer::start(vec![
        ("a.img", Route::ranged(Arc::new(data.clone()), "\"a1\"")),
        ("b.img", Route::body(data.clone())),
        (
            "SUMS256",
            Route::body(format!("{wrong256}  a.img\n").into_bytes()),
        ),
        (
            "SUMS512",
            Route::body(format!("SHA512 (b.img) = {wrong512}\n").into_bytes()),
        ),
    ]);
    let (mut s, dir) = setup();
    for (file, sums, wrong, right) in [
        ("a.img", "SUMS256", &wrong256, sha256_hex(&data)),
        ("b.img", "SUMS512", &wrong512, sha512_hex(&data)),
    ] {
        let err = s.call_err(
            "image_pull",
            json!({"url": http.url(file), "checksums_url": http.url(sums),
                   "path": dir.join(file).to_str().unwrap()}),
        );
        assert!(err.contains("checksum mismatch"), "{err}");
        assert!(
            err.contains(wrong.as_str()) && err.contains(&right),
            "{err}"
        );
        assert!(
            list_dir(&dir).is_empty(),
            "left behind (dest, .partial or .partial.json): {:?}",
            list_dir(&dir)
        );
    }
    // Into the default folder too.
    let err = s.call_err(
        "image_pull",
        json!({"url": http.url("a.img"), "checksums_url": http.url("SUMS256")}),
    );
    assert!(err.contains("checksum mismatch"), "{err}");
    assert!(
        list_dir(&images_dir(&s)).is_empty(),
        "{:?}",
        list_dir(&images_dir(&s))
    );
    // Nothing was kept to continue: the next attempt starts from the first byte.
    let _ = s.call_err(
        "image_pull",
        json!({"url": http.url("a.img"), "checksums_url": http.url("SUMS256"),
               "path": dir.join("a.img").to_str().unwrap()}),
    );
    let last = http.requests().pop().unwrap();
    assert_eq!(last.path, "/a.img");
    assert_eq!(last.header("range"), None, "a discarded pull was continued");
}

#[test]
fn a_name_missing_from_the_list_is_refused_and_nothing_is_downloaded() {
    let name = "disk.qcow2";
    let data = raw_image(64 * 1024, 5);
    // Near misses only: another file, a longer name, a prefix, and an MD5 of the right name.
    let sums = format!(
        "{}  other.qcow2\n{}  {name}.sig\n{}  disk.qcow\nd41d8cd98f00b204e9800998ecf8427e  {name}\n\
         SHA256 (disk.qcow2.CHECKSUM) = {}\n",
        sha256_hex(&data),
        sha256_hex(&data),
        sha256_hex(&data),
        sha256_hex(&data)
    );
    let http = HttpServer::start(vec![
        (name, Route::body(data)),
        ("SHA256SUMS", Route::body(sums.into_bytes())),
    ]);
    let (mut s, dir) = setup();
    let err = s.call_err(
        "image_pull",
        json!({"url": http.url(name), "checksums_url": http.url("SHA256SUMS"),
               "path": dir.join(name).to_str().unwrap()}),
    );
    assert!(err.contains("lists no"), "{err}");
    assert!(err.contains(name), "{err}");
    assert!(err.contains("nothing was downloaded"), "{err}");
    assert_eq!(http.hits(), vec!["/SHA256SUMS"], "the image was requested");
    assert!(list_dir(&dir).is_empty(), "{:?}", list_dir(&dir));
    // The default folder stays empty as well.
    let err = s.call_err(
        "image_pull",
        json!({"url": http.url(name), "checksums_url": http.url("SHA256SUMS")}),
    );
    assert!(err.contains("lists no"), "{err}");
    assert_eq!(http.hits(), vec!["/SHA256SUMS", "/SHA256SUMS"]);
    assert!(list_dir(&images_dir(&s)).is_empty());
}

#[test]
fn arguments_are_checked_before_any_request() {
    let http = HttpServer::start(vec![]);
    let (mut s, dir) = setup();
    let dest = dir.join("x.img");
    let cases = [
        (json!({}), "give image"),
        (json!({"url": http.url("x.img")}), "checksums_url"),
        (
            json!({"image": "debian-12", "url": http.url("x.img"),
                   "checksums_url": http.url("S")}),
            "not both",
        ),
        (
            json!({"url": "file:///etc/hostname", "checksums_url": http.url("S")}),
            "http",
        ),
        (
            json!({"url": http.url("x.img"), "checksums_url": "ftp://127.0.0.1/S"}),
            "http",
        ),
        (
            json!({"url": http.url("dir/"), "checksums_url": http.url("S"),
                   "path": dest.to_str().unwrap()}),
            "names no file",
        ),
        (
            json!({"url": http.url("x.img"), "checksums_url": http.url("S"),
                   "path": "/etc/x.img"}),
            "path",
        ),
    ];
    for (args, want) in cases {
        let r = s.call_tool("image_pull", args.clone());
        let err = if r["isError"] == true {
            tool_err(&r, "image_pull")
        } else {
            panic!("{args} was accepted: {r}")
        };
        assert!(err.contains(want), "{args}: {err}");
    }
    // An unknown catalog name is refused (by the schema's enum), and the error lists the names.
    let err = s.call_err("image_pull", json!({"image": "no-such-distro"}));
    assert!(err.contains("no-such-distro"), "{err}");
    let catalog = s.call_ok("image_catalog", json!({}));
    for e in catalog["images"].as_array().unwrap() {
        let name = e["name"].as_str().unwrap();
        assert!(
            err.contains(&format!("\"{name}\"")),
            "{name} not listed: {err}"
        );
    }
    assert!(http.hits().is_empty(), "{:?}", http.hits());
    assert!(list_dir(&dir).is_empty());
}

#[test]
fn an_interrupted_pull_keeps_its_partial_file_and_resumes_with_range() {
    let data = Arc::new(raw_image(3 * 1024 * 1024 + 17, 6));
    let cut = 1024 * 1024 + 5;
    let name = "ubuntu-24.04-server-cloudimg-amd64.img";
    // Once with an ETag, once with only Last-Modified: either is the validator.
    let validators = [
        (Some("\"5f3e-62a1b\""), None),
        (None, Some("Tue, 14 Oct 2025 08:12:31 GMT")),
    ];
    for (etag, modified) in validators {
        let ranged = |cut_after: Option<usize>| Route::Ranged {
            data: Arc::clone(&data),
            etag: etag.map(str::to_string),
            last_modified: modified.map(str::to_string),
            cut_after,
            chunk: 64 * 1024,
            delay: Duration::ZERO,
        };
        let http = HttpServer::start(vec![
            (name, ranged(Some(cut))),
            (
                "SHA256SUMS",
                Route::body(gnu_sums(name, &sha256_hex(&data)).into_bytes()),
            ),
        ]);
        let (mut s, dir) = setup();
        let dest = dir.join(name);
        let args = json!({"url": http.url(name), "checksums_url": http.url("SHA256SUMS"),
                          "path": dest.to_str().unwrap()});
        let err = s.call_err("image_pull", args.clone());
        assert!(
            err.contains("closed") || err.contains("connection") || err.contains("retry"),
            "{err}"
        );
        // The partial file is kept, with what arrived, beside the record of what it is.
        let (part, meta) = partials(&dir, name);
        assert!(!dest.exists(), "an interrupted pull placed the file");
        let kept = std::fs::read(&part).unwrap_or_else(|e| panic!("{}: {e}", part.display()));
        assert_eq!(kept.len(), cut, "bytes kept");
        assert!(
            kept == data[..cut],
            "the kept part differs from what was sent"
        );
        let info = read_json(&meta);
        assert_eq!(info["url"], http.url(name), "{info}");
        assert_eq!(info["validator"], json!(etag.or(modified)), "{info}");

        // The server is whole again; the next pull continues where the last one stopped.
        http.set_route(name, ranged(None));
        let out = s.call_ok("image_pull", args);
        assert_pulled(&out, &dest, &data, "sha256", cut as u64);
        let reqs = http.requests();
        let last = reqs.last().unwrap();
        assert_eq!(last.path, format!("/{name}"));
        let range = format!("bytes={cut}-");
        assert_eq!(last.header("range"), Some(range.as_str()), "{last:?}");
        assert_eq!(last.header("if-range"), etag.or(modified), "{last:?}");
        // One request for the image per pull: the resumed one was not fetched again whole.
        let image_gets = reqs.iter().filter(|r| r.path == format!("/{name}")).count();
        assert_eq!(image_gets, 2, "{reqs:?}");
        assert_only_image(&dir, name);
    }
}

#[test]
fn a_server_without_range_support_gets_a_full_restart() {
    let data = raw_image(2 * 1024 * 1024 + 99, 7);
    let cut = 700 * 1024 + 3;
    let name = "disk.img";
    let http = HttpServer::start(vec![
        (
            name,
            Route::Truncated {
                claimed: data.len(),
                data: Arc::new(data[..cut].to_vec()),
            },
        ),
        (
            "SUMS",
            Route::body(gnu_sums(name, &sha256_hex(&data)).into_bytes()),
        ),
    ]);
    let (mut s, dir) = setup();
    let dest = dir.join(name);
    let args = json!({"url": http.url(name), "checksums_url": http.url("SUMS"),
                      "path": dest.to_str().unwrap()});
    s.call_err("image_pull", args.clone());
    let (part, meta) = partials(&dir, name);
    assert_eq!(std::fs::metadata(&part).unwrap().len(), cut as u64);
    assert_eq!(read_json(&meta)["validator"], Value::Null);
    // Route::body ignores Range and answers 200 with the whole file.
    http.set_route(name, Route::body(data.clone()));
    let out = s.call_ok("image_pull", args);
    assert_pulled(&out, &dest, &data, "sha256", 0);
    let last = http.requests().pop().unwrap();
    let range = format!("bytes={cut}-");
    assert_eq!(
        last.header("range"),
        Some(range.as_str()),
        "the pull did not try to resume"
    );
    assert_eq!(last.header("if-range"), None, "no validator was known");
    assert_only_image(&dir, name);
}

#[test]
fn a_changed_file_restarts_from_the_first_byte() {
    let old = Arc::new(raw_image(2 * 1024 * 1024, 8));
    let new = Arc::new(raw_image(2 * 1024 * 1024 + 4096, 9));
    let cut = 512 * 1024;
    let name = "debian-12-genericcloud-amd64.raw";
    let sums = |d: &[u8]| Route::body(format!("{}  {name}\n", sha512_hex(d)).into_bytes());
    let http = HttpServer::start(vec![
        (
            name,
            Route::Ranged {
                data: Arc::clone(&old),
                etag: Some("\"v1\"".into()),
                last_modified: None,
                cut_after: Some(cut),
                chunk: 64 * 1024,
                delay: Duration::ZERO,
            },
        ),
        ("SHA512SUMS", sums(&old)),
    ]);
    let (mut s, dir) = setup();
    let dest = dir.join(name);
    let args = json!({"url": http.url(name), "checksums_url": http.url("SHA512SUMS"),
                      "path": dest.to_str().unwrap()});
    s.call_err("image_pull", args.clone());
    assert_eq!(
        std::fs::metadata(partials(&dir, name).0).unwrap().len(),
        cut as u64
    );
    // The publisher replaces the image (new ETag) and its checksum file.
    http.set_route(name, Route::ranged(Arc::clone(&new), "\"v2\""));
    http.set_route("SHA512SUMS", sums(&new));
    let out = s.call_ok("image_pull", args);
    assert_pulled(&out, &dest, &new, "sha512", 0);
    let last = http.requests().pop().unwrap();
    assert_eq!(last.header("if-range"), Some("\"v1\""), "{last:?}");
    assert_only_image(&dir, name);
}

#[test]
fn a_partial_file_of_another_url_is_not_continued() {
    let a = raw_image(1024 * 1024, 10);
    let b = raw_image(1024 * 1024, 11);
    let name = "disk.img";
    let http = HttpServer::start(vec![
        (
            "a/disk.img",
            Route::Ranged {
                data: Arc::new(a.clone()),
                etag: Some("\"same\"".into()),
                last_modified: None,
                cut_after: Some(100 * 1024),
                chunk: 64 * 1024,
                delay: Duration::ZERO,
            },
        ),
        ("b/disk.img", Route::ranged(Arc::new(b.clone()), "\"same\"")),
        (
            "a/SUMS",
            Route::body(gnu_sums(name, &sha256_hex(&a)).into_bytes()),
        ),
        (
            "b/SUMS",
            Route::body(gnu_sums(name, &sha256_hex(&b)).into_bytes()),
        ),
    ]);
    let (mut s, dir) = setup();
    let dest = dir.join(name);
    s.call_err(
        "image_pull",
        json!({"url": http.url("a/disk.img"), "checksums_url": http.url("a/SUMS"),
               "path": dest.to_str().unwrap()}),
    );
    assert!(partials(&dir, name).0.exists());
    let out = s.call_ok(
        "image_pull",
        json!({"url": http.url("b/disk.img"), "checksums_url": http.url("b/SUMS"),
               "path": dest.to_str().unwrap()}),
    );
    assert_pulled(&out, &dest, &b, "sha256", 0);
    let last = http.requests().pop().unwrap();
    assert_eq!(last.path, "/b/disk.img");
    assert_eq!(last.header("range"), None, "{last:?}");
    assert_only_image(&dir, name);
}

#[test]
fn a_cancelled_pull_leaves_no_file() {
    // 8 MiB at 32 KiB per 20 ms: about 5 s, certainly still running when cancelled.
    let data = Arc::new(raw_image(8 << 20, 12));
    let name = "slow.img";
    let http = HttpServer::start(vec![
        (
            name,
            Route::Ranged {
                data: Arc::clone(&data),
                etag: Some("\"slow\"".into()),
                last_modified: None,
                cut_after: None,
                chunk: 32 * 1024,
                delay: Duration::from_millis(20),
            },
        ),
        (
            "SUMS",
            Route::body(gnu_sums(name, &sha256_hex(&data)).into_bytes()),
        ),
    ]);
    let (mut s, dir) = setup();
    let id = json!("pull-to-cancel");
    s.send_request(
        &id,
        "tools/call",
        json!({"name": "image_pull",
               "arguments": {"url": http.url(name), "checksums_url": http.url("SUMS"),
                             "path": dir.join(name).to_str().unwrap()},
               "_meta": {"progressToken": "p"}}),
    );
    // Wait until bytes are in the partial file, then cancel.
    let (part, _) = partials(&dir, name);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(&part).map_or(0, |m| m.len()) < 256 * 1024 {
        assert!(
            Instant::now() < deadline,
            "the pull never started: {:?}",
            list_dir(&dir)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    s.notify(
        "notifications/cancelled",
        json!({"requestId": id, "reason": "test"}),
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while !list_dir(&dir).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        list_dir(&dir).is_empty(),
        "left behind 5 s after the cancel: {:?}",
        list_dir(&dir)
    );
    let others = s.assert_alive();
    assert!(
        others.iter().all(|m| m.get("id") != Some(&id)),
        "the cancelled call was answered: {others:?}"
    );
    // Nothing is continued afterwards: a new pull starts from the first byte.
    http.set_route(name, Route::ranged(Arc::clone(&data), "\"slow\""));
    let out = s.call_ok(
        "image_pull",
        json!({"url": http.url(name), "checksums_url": http.url("SUMS"),
               "path": dir.join(name).to_str().unwrap()}),
    );
    assert_pulled(&out, &dir.join(name), &data, "sha256", 0);
    assert_eq!(http.requests().pop().unwrap().header("range"), None);
}

#[test]
fn the_catalog_lists_every_entry_unpulled_on_a_fresh_state() {
    let mut s = Server::ready();
    let out = s.call_ok("image_catalog", json!({}));
    let images = out["images"].as_array().expect("images");
    assert!(images.len() >= 20, "{out}");
    let mut names = Vec::new();
    for e in images {
        let name = e["name"].as_str().expect("name").to_string();
        for key in ["title", "arch", "firmware"] {
            assert!(e[key].as_str().is_some_and(|v| !v.is_empty()), "{key}: {e}");
        }
        // A pinned source: a dated https URL and its digest; a latest source: a moving https
        // URL and (when known) its checksum file. At least one can be pulled.
        let pinned = &e["pinned"];
        if !pinned.is_null() {
            assert!(
                pinned["url"].as_str().unwrap().starts_with("https://"),
                "{e}"
            );
            let digest = pinned["digest"].as_str().unwrap();
            let (algo, hex) = digest.split_once(':').expect("algo:hex");
            let len = match algo {
                "sha256" => 64,
                "sha512" => 128,
                other => panic!("{other}: {e}"),
            };
            assert_eq!(hex.len(), len, "{e}");
        }
        let latest = &e["latest"];
        if !latest.is_null() {
            assert!(
                latest["url"].as_str().unwrap().starts_with("https://"),
                "{e}"
            );
            assert_ne!(latest["url"], pinned["url"], "{e}");
        }
        for sums in [&pinned["checksums_url"], &latest["checksums_url"]] {
            assert!(
                sums.is_null() || sums.as_str().unwrap().starts_with("https://"),
                "{e}"
            );
        }
        assert!(
            !pinned.is_null() || latest["checksums_url"].is_string(),
            "nothing to pull: {e}"
        );
        assert!(
            ["x86_64", "aarch64"].contains(&e["arch"].as_str().unwrap()),
            "{e}"
        );
        assert!(
            ["bios", "uefi"].contains(&e["firmware"].as_str().unwrap()),
            "{e}"
        );
        assert_eq!(e["pulled"], false, "{e}");
        for key in ["source", "path", "size", "digest", "algorithm", "pulled_at"] {
            assert_eq!(e[key], Value::Null, "{key}: {e}");
        }
        assert!(!names.contains(&name), "duplicate {name}");
        names.push(name);
    }
    for want in [
        "debian-13",
        "ubuntu-26.04",
        "fedora-44",
        "alpine-3.23-arm64",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
    }
    // image_pull takes exactly these names.
    let tools = s.result("tools/list", json!({}));
    let pull = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "image_pull")
        .expect("image_pull listed");
    let mut offered: Vec<String> = pull["inputSchema"]["properties"]["image"]["enum"]
        .as_array()
        .expect("an enum of catalog names")
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    offered.sort();
    names.sort();
    assert_eq!(offered, names);
}

/// The catalog's URLs are on the internet, which the tests cannot reach. A pull of a local URL
/// whose file name is a catalog entry's, into the default folder, lands where the catalog looks
/// but is not that entry (its record names another URL), so the entry stays unpulled. A record
/// naming the catalog URL (what a pull of that URL writes) makes it pulled. (Pulls by name
/// through `MCQEMU_CATALOG_MIRROR` record the catalog URL as `catalog_url`: see
/// `a_pull_by_name_falls_back_to_the_latest_url_when_the_pinned_one_is_gone`.)
#[test]
fn the_catalog_counts_only_pulls_of_its_own_url() {
    let mut s = Server::ready();
    let catalog = s.call_ok("image_catalog", json!({}));
    let entry = catalog["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "debian-12")
        .expect("debian-12 in the catalog")
        .clone();
    let catalog_url = entry["pinned"]["url"].as_str().unwrap().to_string();
    let file = catalog_url.rsplit('/').next().unwrap().to_string();
    let data = qcow2_image(&s);
    let http = HttpServer::start(vec![
        (file.as_str(), Route::body(data.clone())),
        (
            "SHA512SUMS",
            Route::body(format!("{}  {file}\n", sha512_hex(&data)).into_bytes()),
        ),
    ]);
    let out = s.call_ok(
        "image_pull",
        json!({"url": http.url(&file), "checksums_url": http.url("SHA512SUMS")}),
    );
    let images = images_dir(&s);
    let dest = images.join(&file);
    assert_pulled(&out, &dest, &data, "sha512", 0);
    assert_only_image(&images, &file);
    let entry_of = |s: &mut Server, name: &str| {
        let out = s.call_ok("image_catalog", json!({}));
        out["images"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .unwrap()
            .clone()
    };
    let e = entry_of(&mut s, "debian-12");
    assert_eq!(e["pulled"], false, "a pull of another URL counted: {e}");
    assert_eq!(e["path"], Value::Null, "{e}");

    // The record a pull by name writes: the catalog URL. Then the entry is pulled.
    let sidecar = images.join(format!(".{file}.pulled.json"));
    let mut record = read_json(&sidecar);
    assert_eq!(record["url"], http.url(&file));
    record["url"] = json!(catalog_url);
    std::fs::write(&sidecar, record.to_string()).unwrap();
    let e = entry_of(&mut s, "debian-12");
    assert_eq!(e["pulled"], true, "{e}");
    assert_eq!(e["source"], "pinned", "{e}");
    assert_eq!(e["path"], dest.to_str().unwrap());
    assert_eq!(e["size"], data.len());
    assert_eq!(e["digest"], sha512_hex(&data));
    assert_eq!(e["algorithm"], "sha512");
    assert_eq!(e["pulled_at"], record["pulled_at"]);
    assert!(e["pulled_at"].is_string());
    // Every other entry is still unpulled; without the image the record alone does not count.
    let all = s.call_ok("image_catalog", json!({}));
    let pulled: Vec<&Value> = all["images"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["pulled"] == true)
        .collect();
    assert_eq!(pulled.len(), 1, "{all}");
    std::fs::remove_file(&dest).unwrap();
    assert_eq!(entry_of(&mut s, "debian-12")["pulled"], false);
}

/// Two pulls to one path at once share the fixed `.NAME.partial` file. The second one takes
/// the first one's partial file for an interrupted pull: it asks for the rest with Range and
/// cuts the file to the length it saw while the first is still writing, so the first one's
/// later writes land past a hole of zeros. The first one hashed the bytes it received, not the
/// file, and places the corrupt file with `verified: true`. (Here the second pull's connection
/// drops at once, so it writes nothing into the hole; it reproduces every run.) A fix: hold a
/// lock on the partial file (or refuse a second pull to a path being pulled), and verify what
/// is on disk.
#[test]
fn concurrent_pulls_to_one_path_never_place_a_corrupt_file() {
    let data = Arc::new(raw_image(32 << 20, 13));
    let name = "race.img";
    let ranged = |cut_after: Option<usize>, delay: Duration| Route::Ranged {
        data: Arc::clone(&data),
        etag: Some("\"r\"".into()),
        last_modified: None,
        cut_after,
        chunk: 64 * 1024,
        delay,
    };
    let http = HttpServer::start(vec![
        (name, ranged(None, Duration::from_millis(1))),
        (
            "SUMS",
            Route::body(gnu_sums(name, &sha256_hex(&data)).into_bytes()),
        ),
    ]);
    let (mut s, dir) = setup();
    let dest = dir.join(name);
    let args = json!({"url": http.url(name), "checksums_url": http.url("SUMS"),
                      "path": dest.to_str().unwrap()});
    let first = s.start_call("image_pull", args.clone());
    let (part, _) = partials(&dir, name);
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::metadata(&part).map_or(0, |m| m.len()) < 8 << 20 {
        assert!(Instant::now() < deadline, "the first pull never got going");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The second pull's response ends before its body.
    http.set_route(name, ranged(Some(0), Duration::ZERO));
    let second = s.start_call("image_pull", args);
    let second = s.finish_call(&second, Duration::from_secs(60));
    let first = s.finish_call(&first, Duration::from_secs(60));
    for (which, r) in [("first", &first), ("second", &second)] {
        if r["isError"] == false {
            let out = tool_ok(r, which);
            assert_eq!(out["digest"], sha256_hex(&data), "{which}: {out}");
        }
    }
    if dest.exists() {
        let on_disk = std::fs::read(&dest).unwrap();
        let first_bad = on_disk.iter().zip(data.iter()).position(|(a, b)| a != b);
        assert!(
            on_disk.len() == data.len() && first_bad.is_none(),
            "placed a file that differs from the image (first difference at {first_bad:?}, \
             {} of {} bytes); first pull: {}; second pull: {}",
            on_disk.len(),
            data.len(),
            first["structuredContent"],
            second["content"]
        );
    }
}

/// The records beside a pull, `.NAME.partial.json` and `.NAME.pulled.json`, are written with
/// `std::fs::write`, which follows a symlink left at their name: a pull overwrites the link's
/// target, outside the roots too. (The partial file itself is opened with O_NOFOLLOW.)
#[test]
fn pull_records_are_not_written_through_symlinks() {
    let tmp = TempDir::new("pull-links");
    let state = tmp.subdir("state");
    let runtime = tmp.subdir("runtime");
    let dir = tmp.subdir("pulls");
    let victims = [tmp.join("victim1.txt"), tmp.join("victim2.txt")];
    for v in &victims {
        std::fs::write(v, "outside the roots").unwrap();
    }
    let data = Arc::new(raw_image(256 * 1024, 14));
    let http = HttpServer::start(vec![
        (
            "cut.img",
            Route::Ranged {
                data: Arc::clone(&data),
                etag: Some("\"c\"".into()),
                last_modified: None,
                cut_after: Some(1000),
                chunk: 64 * 1024,
                delay: Duration::ZERO,
            },
        ),
        ("ok.img", Route::body(data.to_vec())),
        (
            "SUMS",
            Route::body(format!("{0}  cut.img\n{0}  ok.img\n", sha256_hex(&data)).into_bytes()),
        ),
    ]);
    std::os::unix::fs::symlink(&victims[0], dir.join(".cut.img.partial.json")).unwrap();
    std::os::unix::fs::symlink(&victims[1], dir.join(".ok.img.pulled.json")).unwrap();
    let roots = dir.to_str().unwrap().to_string();
    let mut s = Server::try_start_with(
        TempDir::new("srv"),
        &state,
        &runtime,
        &[("MCQEMU_ROOTS", roots.as_str())],
    )
    .unwrap();
    s.initialize(NEWEST);
    for file in ["cut.img", "ok.img"] {
        let _ = s.call_tool(
            "image_pull",
            json!({"url": http.url(file), "checksums_url": http.url("SUMS"),
                   "path": dir.join(file).to_str().unwrap()}),
        );
    }
    for v in &victims {
        assert_eq!(
            std::fs::read_to_string(v).unwrap(),
            "outside the roots",
            "{} was overwritten through a symlink",
            v.display()
        );
    }
}

/// Alpine publishes one `<image>.sha512` per image holding the bare hex digest (no file
/// name): it verifies the image it was given for, and a wrong one refuses it.
#[test]
fn alpine_per_file_bare_sha512_is_verified() {
    let mut s = Server::ready();
    let data = qcow2_image(&s);
    let name = "nocloud_alpine-3.23.4-x86_64-uefi-cloudinit-r0.qcow2";
    let sums = format!("{name}.sha512");
    let other = "nocloud_alpine-3.23.4-aarch64-uefi-cloudinit-r0.qcow2";
    let http = HttpServer::start(vec![
        (name, Route::body(data.clone())),
        (
            sums.as_str(),
            Route::body(format!("{}\n", sha512_hex(&data)).into_bytes()),
        ),
        (other, Route::body(data.clone())),
        (
            "other.sha512",
            Route::body(format!("{}\n", sha512_hex(b"another build")).into_bytes()),
        ),
    ]);
    let dir = s.tmp.subdir("pulls");
    let dest = dir.join(name);
    let out = s.call_ok(
        "image_pull",
        json!({"url": http.url(name), "checksums_url": http.url(&sums),
               "path": dest.to_str().unwrap()}),
    );
    assert_pulled(&out, &dest, &data, "sha512", 0);
    assert_eq!(out["source"], "url");
    assert_eq!(out["checksums_url"], http.url(&sums));
    assert_eq!(out["format"], "qcow2");
    assert_eq!(http.hits(), vec![format!("/{sums}"), format!("/{name}")]);
    assert_only_image(&dir, name);
    // A bare digest of another build: a mismatch, nothing left behind.
    let err = s.call_err(
        "image_pull",
        json!({"url": http.url(other), "checksums_url": http.url("other.sha512"),
               "path": dir.join(other).to_str().unwrap()}),
    );
    assert!(err.contains("checksum mismatch"), "{err}");
    assert!(err.contains(&sha512_hex(b"another build")), "{err}");
    assert_only_image(&dir, name);
}

/// A server started with `MCQEMU_CATALOG_MIRROR` pointing at `http`, so pulls by name fetch
/// `https://HOST/PATH` as `http://127.0.0.1:PORT/HOST/PATH`.
fn mirrored(http: &HttpServer) -> Server {
    let mut s = Server::start_with_env(&[("MCQEMU_CATALOG_MIRROR", http.url("").as_str())]);
    s.initialize(NEWEST);
    s
}

/// A catalog entry as image_catalog shows it.
fn catalog_entry(s: &mut Server, name: &str) -> Value {
    let out = s.call_ok("image_catalog", json!({}));
    out["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in the catalog: {out}"))
        .clone()
}

/// The mirror's path for a catalog URL: `https://HOST/PATH` → `HOST/PATH`.
fn route_of(url: &Value) -> String {
    url.as_str()
        .unwrap()
        .strip_prefix("https://")
        .unwrap()
        .to_string()
}

/// The last segment of a catalog URL.
fn file_of(url: &Value) -> String {
    url.as_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_string()
}

/// Publishers remove dated folders: the pinned URL answers 404 (Debian) or 410 (Ubuntu), and
/// the pull takes the moving URL, verified against its checksum file (Debian's SHA512SUMS,
/// Ubuntu's SHA256SUMS with the `*` binary marker), and says so.
#[test]
fn a_pull_by_name_falls_back_to_the_latest_url_when_the_pinned_one_is_gone() {
    let http = HttpServer::start(vec![]);
    let mut s = mirrored(&http);
    let images = images_dir(&s);

    // Debian 12: the dated folder is gone (404; the server's answer for an unknown path).
    let e = catalog_entry(&mut s, "debian-12");
    let (pinned, latest) = (&e["pinned"], &e["latest"]);
    let data = raw_image(1024 * 1024 + 11, 20);
    let file = file_of(&latest["url"]);
    let sums = format!(
        "{}  {}\n{}  {file}\n",
        sha512_hex(b"arm64 build"),
        file.replace("amd64", "arm64"),
        sha512_hex(&data)
    );
    http.set_route(&route_of(&latest["url"]), Route::body(data.clone()));
    http.set_route(
        &route_of(&latest["checksums_url"]),
        Route::body(sums.into_bytes()),
    );
    let out = s.call_ok("image_pull", json!({"image": "debian-12"}));
    let dest = images.join(&file);
    assert_pulled(&out, &dest, &data, "sha512", 0);
    assert_eq!(out["source"], "latest", "{out}");
    assert_eq!(out["image"], "debian-12");
    assert_eq!(out["catalog_url"], latest["url"]);
    assert_eq!(out["url"], http.url(&route_of(&latest["url"])));
    assert_eq!(
        out["checksums_url"],
        http.url(&route_of(&latest["checksums_url"]))
    );
    assert_eq!(
        out["pinned_gone"],
        json!({"url": http.url(&route_of(&pinned["url"])), "status": 404})
    );
    // The pinned image first, then the checksum file, then the moving image.
    assert_eq!(
        http.hits(),
        vec![
            format!("/{}", route_of(&pinned["url"])),
            format!("/{}", route_of(&latest["checksums_url"])),
            format!("/{}", route_of(&latest["url"])),
        ]
    );
    assert_only_image(&images, &file);
    let record = read_json(&images.join(format!(".{file}.pulled.json")));
    assert_eq!(record["source"], "latest", "{record}");
    assert_eq!(record["catalog_url"], latest["url"], "{record}");
    // The catalog counts it, from its latest source.
    let e = catalog_entry(&mut s, "debian-12");
    assert_eq!(e["pulled"], true, "{e}");
    assert_eq!(e["source"], "latest", "{e}");
    assert_eq!(e["path"], dest.to_str().unwrap());
    assert_eq!(e["digest"], sha512_hex(&data));
    assert_eq!(catalog_entry(&mut s, "debian-12-arm64")["pulled"], false);

    // Ubuntu 24.04 on arm64: 410 Gone, into a given path.
    let e = catalog_entry(&mut s, "ubuntu-24.04-arm64");
    let (pinned, latest) = (&e["pinned"], &e["latest"]);
    assert_eq!(file_of(&pinned["url"]), file_of(&latest["url"]));
    let data = raw_image(900 * 1024 + 5, 21);
    let file = file_of(&latest["url"]);
    let sums = format!(
        "{} *{}\n{} *{file}\n",
        sha256_hex(b"amd64 build"),
        file.replace("arm64", "amd64"),
        sha256_hex(&data)
    );
    http.set_route(&route_of(&pinned["url"]), Route::Status(410));
    http.set_route(&route_of(&latest["url"]), Route::body(data.clone()));
    http.set_route(
        &route_of(&latest["checksums_url"]),
        Route::body(sums.into_bytes()),
    );
    let dir = s.tmp.subdir("pulls");
    let dest = dir.join("ubuntu.img");
    let before = http.hits().len();
    let out = s.call_ok(
        "image_pull",
        json!({"image": "ubuntu-24.04-arm64", "path": dest.to_str().unwrap()}),
    );
    assert_pulled(&out, &dest, &data, "sha256", 0);
    assert_eq!(out["source"], "latest", "{out}");
    assert_eq!(out["pinned_gone"]["status"], 410, "{out}");
    assert_eq!(
        http.hits()[before..],
        [
            format!("/{}", route_of(&pinned["url"])),
            format!("/{}", route_of(&latest["checksums_url"])),
            format!("/{}", route_of(&latest["url"])),
        ]
    );
    assert_only_image(&dir, "ubuntu.img");
}

/// The pinned URL answers, but with other bytes than the pinned digest: an error naming both
/// digests, nothing kept, and the moving URL is not tried. A server error on the pinned URL
/// (not 404/410) is not a reason to fall back either.
#[test]
fn a_pinned_digest_mismatch_is_an_error_and_never_falls_back() {
    let http = HttpServer::start(vec![]);
    let mut s = mirrored(&http);
    let images = images_dir(&s);
    let e = catalog_entry(&mut s, "debian-13");
    let (pinned, latest) = (&e["pinned"], &e["latest"]);
    let data = raw_image(512 * 1024, 22);
    let pinned_hex = pinned["digest"]
        .as_str()
        .unwrap()
        .strip_prefix("sha512:")
        .unwrap()
        .to_string();
    http.set_route(&route_of(&pinned["url"]), Route::body(data.clone()));
    // A moving image that would verify, had the pull fallen back.
    http.set_route(&route_of(&latest["url"]), Route::body(data.clone()));
    http.set_route(
        &route_of(&latest["checksums_url"]),
        Route::body(format!("{}  {}\n", sha512_hex(&data), file_of(&latest["url"])).into_bytes()),
    );
    let err = s.call_err("image_pull", json!({"image": "debian-13"}));
    assert!(err.contains("checksum mismatch"), "{err}");
    assert!(
        err.contains(&pinned_hex) && err.contains(&sha512_hex(&data)),
        "{err}"
    );
    assert_eq!(http.hits(), vec![format!("/{}", route_of(&pinned["url"]))]);
    assert!(list_dir(&images).is_empty(), "{:?}", list_dir(&images));
    assert_eq!(catalog_entry(&mut s, "debian-13")["pulled"], false);

    http.set_route(&route_of(&pinned["url"]), Route::Status(500));
    let err = s.call_err("image_pull", json!({"image": "debian-13"}));
    assert!(err.contains("HTTP 500"), "{err}");
    assert!(
        !http.hits().iter().any(|h| h.contains("/daily/")),
        "fell back: {:?}",
        http.hits()
    );
    assert!(list_dir(&images).is_empty(), "{:?}", list_dir(&images));
}

/// A pinned URL gone with nothing verified to fall back to: Fedora has no moving URL, Rocky's
/// has no known checksum file. The error says so and what to do; nothing else is fetched.
#[test]
fn a_gone_pin_without_a_verified_moving_url_says_what_to_do() {
    let http = HttpServer::start(vec![]);
    let mut s = mirrored(&http);
    let fedora = catalog_entry(&mut s, "fedora-44");
    assert_eq!(fedora["latest"], Value::Null, "{fedora}");
    let err = s.call_err("image_pull", json!({"image": "fedora-44"}));
    assert!(err.contains("HTTP 404"), "{err}");
    assert!(
        err.contains("fedora-44") && err.contains("newer pin"),
        "{err}"
    );
    assert!(err.contains("url + checksums_url"), "{err}");
    assert_eq!(
        http.hits(),
        vec![format!("/{}", route_of(&fedora["pinned"]["url"]))]
    );

    let rocky = catalog_entry(&mut s, "rocky-10");
    assert_eq!(rocky["latest"]["checksums_url"], Value::Null, "{rocky}");
    let err = s.call_err("image_pull", json!({"image": "rocky-10"}));
    assert!(err.contains("HTTP 404"), "{err}");
    assert!(
        err.contains(rocky["latest"]["url"].as_str().unwrap()),
        "the moving URL is named: {err}"
    );
    assert!(err.contains("checksums_url"), "{err}");
    assert_eq!(http.hits().len(), 2, "{:?}", http.hits());
    assert!(list_dir(&images_dir(&s)).is_empty());
}
