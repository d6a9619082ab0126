//! Secrets that never enter the sandbox: a Debian root with curl (mmdebstrap, so root only, as
//! oci_roots) names the operator's secret `github`; its programs hold a placeholder, and the
//! egress proxy swaps in the value only in requests to the secret's host. Two upstreams on
//! 127.0.0.1 stand in for the world: an HTTPS one with a CA of the test's own (the proxy
//! trusts it through MCQEMU_EGRESS_UPSTREAM_CA) and a plain HTTP one. Then the value is looked
//! for everywhere it must not be: the guest's environment, its disk, its memory (dumped
//! through QMP), every tool result, the server's and the proxy's logs.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::tls::{self, answer, Heads};
use crate::common::*;
use crate::oci::layout;

const STEP: Duration = Duration::from_secs(300);
/// The secret's value: looked for everywhere afterwards.
const VALUE: &str = "ghp_TheRealValue0f7b3c9d1e5a2468ace";

/// A plain HTTP upstream on 127.0.0.1: its port and what it received.
fn plain_upstream() -> (u16, Heads) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let heads: Heads = Arc::default();
    let h = heads.clone();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
            answer(c, &h);
        }
    });
    (port, heads)
}

/// Writes the operator's secrets file at `path` with `mode`.
fn secrets_file(path: &Path, port: u16, mode: u32) {
    let body = json!({"github": {"value": VALUE, "hosts": [format!("localhost:{port}")],
                                 "guest_env": "GITHUB_TOKEN"}});
    std::fs::write(path, body.to_string()).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Whether `needle` is anywhere in the file at `path` (read a piece at a time).
fn file_holds(path: &Path, needle: &[u8]) -> bool {
    let mut f = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; 8 << 20];
    let mut carry: Vec<u8> = Vec::new();
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            return false;
        }
        carry.extend_from_slice(&buf[..n]);
        if carry.windows(needle.len()).any(|w| w == needle) {
            return true;
        }
        let keep = carry.len().saturating_sub(needle.len());
        carry.drain(..keep);
    }
}

/// Guest RAM dumped through the VM's monitor (pmemsave) into `dest`.
fn dump_memory(runtime: &Path, vm: &str, bytes: u64, dest: &Path) {
    use std::io::BufRead;
    let sock = runtime.join(vm).join("qmp.sock");
    let s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut r = std::io::BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    for cmd in [
        json!({"execute": "qmp_capabilities"}),
        json!({"execute": "pmemsave", "arguments": {"val": 0, "size": bytes,
               "filename": dest.to_str().unwrap()}}),
    ] {
        writeln!(w, "{cmd}").unwrap();
        loop {
            line.clear();
            r.read_line(&mut line).unwrap();
            if line.contains("\"return\"") || line.contains("\"error\"") {
                assert!(line.contains("\"return\""), "{cmd}: {line}");
                break;
            }
        }
    }
}

#[test]
fn a_secret_reaches_its_host_and_is_nowhere_in_the_sandbox() {
    let lab = Lab::without_server("sec", 1);
    let image = lab.dir.join("curl");
    layout(&image, "v1", &["--curl"]);
    let ca = lab.dir.join("upstream-ca.pem");
    let up = tls::start();
    std::fs::write(&ca, &up.ca_pem).unwrap();
    let (tls_port, tls_heads) = (up.port, up.heads.clone());
    let (plain_port, plain_heads) = plain_upstream();
    let file = lab.dir.join("secrets.json");
    secrets_file(&file, tls_port, 0o600);
    let mut s = lab.spawn_server_with(&[
        ("MCQEMU_SECRETS", file.to_str().unwrap()),
        ("MCQEMU_EGRESS_UPSTREAM_CA", ca.to_str().unwrap()),
    ]);
    let mut results: Vec<String> = Vec::new();
    let oci = format!("oci:{}:v1", image.display());
    let rules = json!([
        format!("localhost:{tls_port}"),
        format!("127.0.0.1:{tls_port}"),
        format!("127.0.0.1:{plain_port}")
    ]);

    // Refused clearly, before anything starts: a name the file lacks, secrets without
    // rules, a file others may read.
    let e = s.call_err_within(
        "sandbox_vm",
        json!({"oci": oci, "name": "nope", "allow_network": rules, "secrets": ["gitlab"]}),
        STEP,
    );
    assert!(
        e.contains("no secret named \"gitlab\"") && e.contains("github"),
        "{e}"
    );
    let e = s.call_err_within(
        "sandbox_vm",
        json!({"oci": oci, "name": "nope", "secrets": ["github"]}),
        STEP,
    );
    assert!(e.contains("allow_network"), "{e}");
    secrets_file(&file, tls_port, 0o644);
    let e = s.call_err_within(
        "sandbox_vm",
        json!({"oci": oci, "name": "nope", "allow_network": rules, "secrets": ["github"]}),
        STEP,
    );
    assert!(e.contains("chmod 600"), "{e}");
    secrets_file(&file, tls_port, 0o600);
    results.push(e);

    let sb = s.call_ok_within(
        "sandbox_vm",
        json!({"oci": oci, "name": "sec", "cpus": 1, "memory_mb": 512, "wait_agent_s": 150,
               "allow_network": rules, "secrets": ["github"]}),
        STEP,
    );
    lab.track(&sb);
    assert_eq!(sb["agent_ready"], json!(true), "{sb}");
    results.push(sb.to_string());
    // The upstreams are on the host's loopback, which the guest's no_proxy names: unset here,
    // as a sandbox reaching a real host by name never needs.
    let sh = |s: &mut Server, script: &str| -> Value {
        s.call_ok_within(
            "guest_exec",
            json!({"name": "sec", "command": "bash",
                   "args": ["-c", format!("unset no_proxy NO_PROXY; {script}")]}),
            STEP,
        )
    };

    // HTTPS to the secret's host: the upstream receives the value.
    let r = sh(
        &mut s,
        &format!(
            "curl -sS -H \"Authorization: Bearer $GITHUB_TOKEN\" \
             https://localhost:{tls_port}/with-secret"
        ),
    );
    results.push(r.to_string());
    assert_eq!(r["stdout"], json!("ok"), "{r}");
    let got = tls_heads.lock().unwrap().clone();
    assert!(
        got.iter().any(|h| h.starts_with("GET /with-secret ")
            && h.contains(&format!("Authorization: Bearer {VALUE}\r\n"))),
        "{got:?}"
    );
    // A name the rules allow but the secret does not: only the placeholder arrives.
    let r = sh(
        &mut s,
        &format!(
            "curl -sS -H \"Authorization: Bearer $GITHUB_TOKEN\" \
             http://127.0.0.1:{plain_port}/elsewhere"
        ),
    );
    results.push(r.to_string());
    assert_eq!(r["stdout"], json!("ok"), "{r}");
    let got = plain_heads.lock().unwrap().clone();
    let head = got
        .iter()
        .find(|h| h.starts_with("GET /elsewhere "))
        .unwrap();
    assert!(
        head.contains("Bearer mcqemu-secret-github-") && !head.contains(VALUE),
        "{head}"
    );
    // A tunnel to a host without a secret stays a plain tunnel: curl trusting only the
    // upstream's own CA sees the upstream's certificate, and the placeholder arrives.
    let pem = std::fs::read_to_string(&ca).unwrap();
    let w = s.call_ok(
        "guest_file_write",
        json!({"name": "sec", "path": "/tmp/upstream-ca.pem", "content": pem}),
    );
    results.push(w.to_string());
    let r = sh(
        &mut s,
        &format!(
            "curl -sS --cacert /tmp/upstream-ca.pem -H \"Authorization: Bearer $GITHUB_TOKEN\" \
             https://127.0.0.1:{tls_port}/tunnel"
        ),
    );
    results.push(r.to_string());
    assert_eq!(r["stdout"], json!("ok"), "{r}");
    let got = tls_heads.lock().unwrap().clone();
    let head = got.iter().find(|h| h.starts_with("GET /tunnel ")).unwrap();
    assert!(
        head.contains("Bearer mcqemu-secret-github-") && !head.contains(VALUE),
        "{head}"
    );

    // The guest holds the placeholder, never the value.
    let r = sh(&mut s, "env; cat /proc/1/environ | tr '\\0' '\\n'");
    results.push(r.to_string());
    let env = r["stdout"].as_str().unwrap_or("");
    let placeholder = env
        .lines()
        .find_map(|l| l.strip_prefix("GITHUB_TOKEN="))
        .unwrap_or_else(|| panic!("no GITHUB_TOKEN in {env}"))
        .to_string();
    assert!(placeholder.starts_with("mcqemu-secret-github-"), "{env}");
    let info = s.call_ok("vm_info", json!({"name": "sec"}));
    results.push(info.to_string());

    // Nowhere: memory (dumped through QMP; the placeholder is found there, so the dump
    // holds what the guest holds), disk, results, logs.
    let dump = lab.dir.join("ram.dump");
    dump_memory(&lab.runtime(), "sec", 512 << 20, &dump);
    assert!(
        file_holds(&dump, placeholder.as_bytes()),
        "the dump does not even hold the placeholder"
    );
    assert!(
        !file_holds(&dump, VALUE.as_bytes()),
        "the value is in guest memory"
    );
    let _ = std::fs::remove_file(&dump);
    let vm_dir = lab.state().join("vms").join("sec");
    let mut disks = 0;
    for f in std::fs::read_dir(&vm_dir).unwrap().flatten() {
        let p = f.path();
        if p.is_file() {
            assert!(
                !file_holds(&p, VALUE.as_bytes()),
                "{} holds the value",
                p.display()
            );
            disks += usize::from(p.extension().is_some_and(|e| e == "qcow2"));
        }
    }
    assert!(
        disks > 0,
        "no disk overlay looked at in {}",
        vm_dir.display()
    );
    for r in &results {
        assert!(!r.contains(VALUE), "a tool result holds the value: {r}");
    }
    let log = std::fs::read_to_string(vm_dir.join("egress.log")).unwrap_or_default();
    assert!(
        log.contains("added the secrets github") && !log.contains(VALUE),
        "the proxy's log: {log}"
    );
    assert!(
        !s.stderr_text().contains(VALUE),
        "the server's log holds the value"
    );
    s.call_ok_within("sandbox_destroy", json!({"name": "sec"}), STEP);
    s.assert_alive();
}
