//! `image_download` over MCP against a small HTTP server on 127.0.0.1.

use std::time::Duration;

use crate::common::*;
use serde_json::{json, Value};

/// A server and a download folder inside its temp dir.
fn setup() -> (Server, std::path::PathBuf) {
    let s = Server::ready();
    let dir = s.tmp.subdir("downloads");
    (s, dir)
}

#[test]
fn sha256_helper_matches_known_vectors() {
    assert_eq!(
        sha256_hex(b""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        sha256_hex(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(
        sha256_hex(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
    );
}

#[test]
fn correct_checksum_places_the_file() {
    let body = pseudo_random(3 * 1024 * 1024 + 123, 11);
    let digest = sha256_hex(&body);
    let http = HttpServer::start(vec![("disk.img", Route::body(body.clone()))]);
    let (mut s, dir) = setup();
    let dest = dir.join("disk.img");
    let out = s.call_ok(
        "image_download",
        json!({"url": http.url("disk.img"), "path": dest.to_str().unwrap(),
               "sha256": digest.to_uppercase()}),
    );
    assert_eq!(out["path"], dest.to_str().unwrap());
    assert_eq!(out["bytes"], body.len());
    assert_eq!(out["sha256"], digest);
    assert_eq!(out["verified"], true);
    assert_eq!(out["url"], http.url("disk.img"));
    assert_eq!(std::fs::read(&dest).unwrap(), body);
    assert_eq!(list_dir(&dir), vec!["disk.img"], "no temporary files left");
    assert_eq!(http.hits(), vec!["/disk.img"]);

    // Without a checksum: downloaded and hashed, but not "verified".
    let dest2 = dir.join("unverified.img");
    let out = s.call_ok(
        "image_download",
        json!({"url": http.url("disk.img"), "path": dest2.to_str().unwrap()}),
    );
    assert_eq!(out["verified"], false);
    assert_eq!(out["sha256"], digest);
    assert_eq!(sha256_hex(&std::fs::read(&dest2).unwrap()), digest);
    // The "sha256:" prefix is accepted.
    let dest3 = dir.join("prefixed.img");
    s.call_ok(
        "image_download",
        json!({"url": http.url("disk.img"), "path": dest3.to_str().unwrap(),
               "sha256": format!("sha256:{digest}")}),
    );
    assert_eq!(
        list_dir(&dir),
        vec!["disk.img", "prefixed.img", "unverified.img"]
    );
}

#[test]
fn empty_body_downloads_as_empty_file() {
    let http = HttpServer::start(vec![("empty", Route::body(Vec::new()))]);
    let (mut s, dir) = setup();
    let dest = dir.join("empty.img");
    let out = s.call_ok(
        "image_download",
        json!({"url": http.url("empty"), "path": dest.to_str().unwrap(),
               "sha256": sha256_hex(b"")}),
    );
    assert_eq!(out["bytes"], 0);
    assert_eq!(std::fs::metadata(&dest).unwrap().len(), 0);
}

#[test]
fn wrong_checksum_leaves_nothing() {
    let body = pseudo_random(512 * 1024, 5);
    let http = HttpServer::start(vec![("disk.img", Route::body(body.clone()))]);
    let (mut s, dir) = setup();
    let dest = dir.join("disk.img");
    let wrong = sha256_hex(b"something else");
    let err = s.call_err(
        "image_download",
        json!({"url": http.url("disk.img"), "path": dest.to_str().unwrap(), "sha256": wrong}),
    );
    assert!(err.contains("checksum mismatch"), "{err}");
    assert!(
        err.contains(&wrong) && err.contains(&sha256_hex(&body)),
        "{err}"
    );
    assert!(
        list_dir(&dir).is_empty(),
        "left behind: {:?}",
        list_dir(&dir)
    );
}

#[test]
fn malformed_checksum_is_refused_before_downloading() {
    let http = HttpServer::start(vec![("disk.img", Route::body(vec![1, 2, 3]))]);
    let (mut s, dir) = setup();
    let err = s.call_err(
        "image_download",
        json!({"url": http.url("disk.img"), "path": dir.join("d").to_str().unwrap(),
               "sha256": "abc123"}),
    );
    assert!(err.contains("sha256"), "{err}");
    assert!(http.hits().is_empty(), "nothing should be fetched");
    assert!(list_dir(&dir).is_empty());
}

#[test]
fn http_404_is_reported() {
    let http = HttpServer::start(vec![]);
    let (mut s, dir) = setup();
    let dest = dir.join("missing.img");
    let err = s.call_err(
        "image_download",
        json!({"url": http.url("missing.img"), "path": dest.to_str().unwrap()}),
    );
    assert!(err.contains("404"), "{err}");
    assert!(
        list_dir(&dir).is_empty(),
        "left behind: {:?}",
        list_dir(&dir)
    );
    let http500 = HttpServer::start(vec![("boom", Route::Status(500))]);
    let err = s.call_err(
        "image_download",
        json!({"url": http500.url("boom"), "path": dest.to_str().unwrap()}),
    );
    assert!(err.contains("500"), "{err}");
    assert!(list_dir(&dir).is_empty());
}

#[test]
fn connection_cut_mid_body_leaves_nothing() {
    let http = HttpServer::start(vec![(
        "cut.img",
        Route::Truncated {
            claimed: 2 * 1024 * 1024,
            data: std::sync::Arc::new(pseudo_random(300 * 1024, 9)),
        },
    )]);
    let (mut s, dir) = setup();
    let dest = dir.join("cut.img");
    let err = s.call_err(
        "image_download",
        json!({"url": http.url("cut.img"), "path": dest.to_str().unwrap()}),
    );
    assert!(
        err.contains("retry") || err.contains("closed") || err.contains("failed"),
        "{err}"
    );
    assert!(
        list_dir(&dir).is_empty(),
        "left behind: {:?}",
        list_dir(&dir)
    );
}

#[test]
fn connection_refused_is_reported() {
    // Bind, note the port, and close: nothing listens there now.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (mut s, dir) = setup();
    let err = s.call_err(
        "image_download",
        json!({"url": format!("http://127.0.0.1:{port}/x.img"),
               "path": dir.join("x.img").to_str().unwrap()}),
    );
    assert!(err.contains("127.0.0.1"), "{err}");
    assert!(list_dir(&dir).is_empty());
}

#[test]
fn non_http_schemes_are_refused() {
    let (mut s, dir) = setup();
    let dest = dir.join("x.img");
    for url in [
        "file:///etc/hostname",
        "ftp://127.0.0.1/x.img",
        "gopher://127.0.0.1/x",
        "/etc/hostname",
        "http://",
    ] {
        let err = s.call_err(
            "image_download",
            json!({"url": url, "path": dest.to_str().unwrap()}),
        );
        assert!(err.contains("http") || err.contains("host"), "{url}: {err}");
    }
    assert!(list_dir(&dir).is_empty());
}

#[test]
fn existing_file_is_kept_without_overwrite() {
    let body = b"new content".to_vec();
    let http = HttpServer::start(vec![("f", Route::body(body.clone()))]);
    let (mut s, dir) = setup();
    let dest = dir.join("f.img");
    std::fs::write(&dest, b"old content").unwrap();
    let err = s.call_err(
        "image_download",
        json!({"url": http.url("f"), "path": dest.to_str().unwrap()}),
    );
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(std::fs::read(&dest).unwrap(), b"old content");
    // A failed overwrite keeps the old file too.
    let err = s.call_err(
        "image_download",
        json!({"url": http.url("f"), "path": dest.to_str().unwrap(), "overwrite": true,
               "sha256": sha256_hex(b"not it")}),
    );
    assert!(err.contains("checksum"), "{err}");
    assert_eq!(std::fs::read(&dest).unwrap(), b"old content");
    s.call_ok(
        "image_download",
        json!({"url": http.url("f"), "path": dest.to_str().unwrap(), "overwrite": true}),
    );
    assert_eq!(std::fs::read(&dest).unwrap(), body);
    assert_eq!(list_dir(&dir), vec!["f.img"]);
}

#[test]
fn max_bytes_is_enforced() {
    let body = pseudo_random(200 * 1024, 4);
    let http = HttpServer::start(vec![("big", Route::body(body.clone()))]);
    let (mut s, dir) = setup();
    let dest = dir.join("big.img");
    let err = s.call_err(
        "image_download",
        json!({"url": http.url("big"), "path": dest.to_str().unwrap(), "max_bytes": 1000}),
    );
    assert!(err.contains("max_bytes"), "{err}");
    assert!(list_dir(&dir).is_empty());
    let out = s.call_ok(
        "image_download",
        json!({"url": http.url("big"), "path": dest.to_str().unwrap(),
               "max_bytes": body.len()}),
    );
    assert_eq!(out["bytes"], body.len());
}

#[test]
fn missing_folder_is_refused() {
    let http = HttpServer::start(vec![("f", Route::body(vec![0; 10]))]);
    let (mut s, dir) = setup();
    let err = s.call_err(
        "image_download",
        json!({"url": http.url("f"), "path": dir.join("no/such/dir/f.img").to_str().unwrap()}),
    );
    assert!(err.contains("does not exist"), "{err}");
    assert!(list_dir(&dir).is_empty());
}

#[test]
fn progress_is_reported() {
    let body = pseudo_random(3 << 20, 21);
    let http = HttpServer::start(vec![(
        "p.img",
        // About 2.4 s: progress goes out at most twice a second, first after half a second.
        Route::trickle(body.clone(), 32 * 1024, Duration::from_millis(25)),
    )]);
    let (mut s, dir) = setup();
    let dest = dir.join("p.img");
    let (resp, others) = s.request_full(
        "tools/call",
        json!({"name": "image_download",
               "arguments": {"url": http.url("p.img"), "path": dest.to_str().unwrap()},
               "_meta": {"progressToken": "tok"}}),
    );
    tool_ok(&resp["result"], "image_download");
    let values: Vec<f64> = others
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .inspect(|m| assert_eq!(m["params"]["progressToken"], "tok"))
        .map(|m| m["params"]["progress"].as_f64().unwrap())
        .collect();
    assert!(values.len() >= 3, "progress: {values:?}");
    assert!(values.windows(2).all(|w| w[0] < w[1]), "{values:?}");
    // The final update may fall inside the rate gap: it is dropped then, never waited for.
    assert!(*values.last().unwrap() <= body.len() as f64, "{values:?}");
    let with_total: Vec<&Value> = others
        .iter()
        .filter(|m| m["params"]["total"].is_number())
        .collect();
    assert!(!with_total.is_empty());
    assert!(with_total
        .iter()
        .all(|m| m["params"]["total"].as_f64() == Some(body.len() as f64)));
}

#[test]
fn chunked_body_downloads_and_a_cut_chunked_body_leaves_nothing() {
    let body = pseudo_random(100 * 1024 + 7, 13);
    let http = HttpServer::start(vec![
        (
            "whole",
            Route::Chunked {
                data: std::sync::Arc::new(body.clone()),
                complete: true,
            },
        ),
        (
            "cut",
            Route::Chunked {
                data: std::sync::Arc::new(body.clone()),
                complete: false,
            },
        ),
    ]);
    let (mut s, dir) = setup();
    let out = s.call_ok(
        "image_download",
        json!({"url": http.url("whole"), "path": dir.join("whole.img").to_str().unwrap()}),
    );
    assert_eq!(out["bytes"], body.len());
    assert_eq!(std::fs::read(dir.join("whole.img")).unwrap(), body);
    let r = s.call_tool(
        "image_download",
        json!({"url": http.url("cut"), "path": dir.join("cut.img").to_str().unwrap()}),
    );
    assert_eq!(
        r["isError"], true,
        "a chunked body cut short was accepted: {r}"
    );
    assert_eq!(list_dir(&dir), vec!["whole.img"]);
}

#[test]
fn redirects_are_followed() {
    let body = pseudo_random(10_000, 17);
    let http = HttpServer::start(vec![("real.img", Route::body(body.clone()))]);
    let target = http.url("real.img");
    let hop = HttpServer::start(vec![("old.img", Route::Redirect(302, target.clone()))]);
    let (mut s, dir) = setup();
    let out = s.call_ok(
        "image_download",
        json!({"url": hop.url("old.img"), "path": dir.join("r.img").to_str().unwrap()}),
    );
    assert_eq!(out["final_url"], target);
    assert_eq!(out["url"], hop.url("old.img"));
    assert_eq!(std::fs::read(dir.join("r.img")).unwrap(), body);
    // A redirect to a non-http scheme is not followed into the file system.
    let evil = HttpServer::start(vec![(
        "evil",
        Route::Redirect(302, "file:///etc/hostname".into()),
    )]);
    let r = s.call_tool(
        "image_download",
        json!({"url": evil.url("evil"), "path": dir.join("evil.img").to_str().unwrap()}),
    );
    let err = tool_err(&r, "redirect to file://");
    assert!(err.contains("file"), "{err}");
    assert_eq!(list_dir(&dir), vec!["r.img"]);
    // Relative redirects resolve against the URL that sent them; loops end.
    let rel = HttpServer::start(vec![
        ("a/start", Route::Redirect(301, "next".into())),
        ("a/next", Route::Redirect(307, "/final.img".into())),
        ("final.img", Route::body(body.clone())),
        ("loop", Route::Redirect(302, "loop".into())),
    ]);
    let out = s.call_ok(
        "image_download",
        json!({"url": rel.url("a/start"), "path": dir.join("rel.img").to_str().unwrap()}),
    );
    assert_eq!(out["final_url"], rel.url("final.img"));
    assert_eq!(std::fs::read(dir.join("rel.img")).unwrap(), body);
    let err = s.call_err(
        "image_download",
        json!({"url": rel.url("loop"), "path": dir.join("loop.img").to_str().unwrap()}),
    );
    assert!(err.contains("redirect"), "{err}");
    assert_eq!(list_dir(&dir), vec!["r.img", "rel.img"]);
}
