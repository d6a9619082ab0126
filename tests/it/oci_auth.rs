//! A registry behind Docker Hub's token flow: a gate written here stands in front of Debian's
//! docker-registry and answers 401 with a `WWW-Authenticate: Bearer realm=...,service=...,
//! scope=...` challenge to any request without its token; its token endpoint hands the token
//! out for that scope. image_pull must fetch the token from the realm and pull through the
//! gate; a token the gate does not take is a refusal that says so.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::b64::b64_encode;
use crate::common::registry::Registry;
use crate::common::*;
use crate::oci::layout;
use serde_json::json;

const STEP: Duration = Duration::from_secs(120);
const SERVICE: &str = "mcq-test-registry";

/// The gate: counts of what it saw; stops on drop.
struct Gate {
    addr: String,
    tokens_issued: Arc<AtomicUsize>,
    challenged: Arc<AtomicUsize>,
    passed: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Gate {
    /// A gate on a free loopback port in front of `upstream`; its token endpoint issues
    /// `issues` (only to a request whose basic credentials are `login`, when given, as Docker
    /// Hub's does), and it lets through requests bearing `accepts`.
    fn start(
        upstream: &str,
        issues: &'static str,
        accepts: &'static str,
        login: Option<&'static str>,
    ) -> Gate {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        listener.set_nonblocking(true).unwrap();
        let g = Gate {
            addr: addr.clone(),
            tokens_issued: Arc::default(),
            challenged: Arc::default(),
            passed: Arc::default(),
            stop: Arc::default(),
        };
        let (issued, challenged, passed, stop) = (
            g.tokens_issued.clone(),
            g.challenged.clone(),
            g.passed.clone(),
            g.stop.clone(),
        );
        let upstream = upstream.to_string();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok((conn, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let _ = conn.set_nonblocking(false);
                let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
                let (up, addr) = (upstream.clone(), addr.clone());
                let (i, c, p) = (issued.clone(), challenged.clone(), passed.clone());
                std::thread::spawn(move || {
                    let _ = serve(conn, &up, &addr, (issues, accepts, login), (&i, &c, &p));
                });
            }
        });
        g
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One request (the gate closes every connection after its answer).
fn serve(
    mut conn: TcpStream,
    upstream: &str,
    addr: &str,
    (issues, accepts, login): (&str, &str, Option<&str>),
    (issued, challenged, passed): (&AtomicUsize, &AtomicUsize, &AtomicUsize),
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 64 * 1024 {
        if conn.read(&mut byte)? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.split("\r\n");
    let request = lines.next().unwrap_or("").to_string();
    let mut parts = request.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let header = |name: &str| {
        head.split("\r\n").skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    if let Some(query) = target.strip_prefix("/token?") {
        let scope = "scope=repository%3Amcq%2Fapp%3Apull";
        let service = format!("service={SERVICE}");
        if !query.split('&').any(|q| q == scope) || !query.split('&').any(|q| q == service) {
            return answer(&mut conn, "400 Bad Request", "", "");
        }
        if let Some(l) = login {
            if header("authorization").as_deref() != Some(&format!("Basic {}", b64_encode(l))) {
                let body = r#"{"details":"incorrect username or password"}"#;
                return answer(&mut conn, "401 Unauthorized", "", body);
            }
        }
        issued.fetch_add(1, Ordering::Relaxed);
        let body = format!("{{\"token\": \"{issues}\", \"expires_in\": 300}}");
        return answer(
            &mut conn,
            "200 OK",
            "Content-Type: application/json\r\n",
            &body,
        );
    }
    if header("authorization").as_deref() != Some(&format!("Bearer {accepts}")) {
        challenged.fetch_add(1, Ordering::Relaxed);
        let how = format!(
            "WWW-Authenticate: Bearer realm=\"http://{addr}/token\",service=\"{SERVICE}\",\
             scope=\"repository:mcq/app:pull\"\r\n"
        );
        return answer(&mut conn, "401 Unauthorized", &how, "");
    }
    passed.fetch_add(1, Ordering::Relaxed);
    let mut up = TcpStream::connect(upstream)?;
    let mut fwd =
        format!("{method} {target} HTTP/1.1\r\nHost: {upstream}\r\nConnection: close\r\n");
    for h in ["accept", "range"] {
        if let Some(v) = header(h) {
            fwd.push_str(&format!("{h}: {v}\r\n"));
        }
    }
    fwd.push_str("\r\n");
    up.write_all(fwd.as_bytes())?;
    std::io::copy(&mut up, &mut conn)?;
    Ok(())
}

fn answer(conn: &mut TcpStream, status: &str, headers: &str, body: &str) -> std::io::Result<()> {
    write!(
        conn,
        "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[test]
fn a_registry_behind_a_token_service_is_pulled_with_its_bearer_token() {
    let mut lab = Lab::confined("oci-auth");
    let dir = lab.dir.join("layout");
    let digest_in_layout = layout(&dir, "v1", &[]);
    let reg = Registry::start(&lab.dir.join("registry"));
    try_run(
        "skopeo",
        &[
            OsStr::new("copy"),
            OsStr::new("--dest-tls-verify=false"),
            OsStr::new(&format!("oci:{}:v1", dir.display())),
            OsStr::new(&format!("docker://{}/mcq/app:v1", reg.addr)),
        ],
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("skopeo (apt install skopeo): {e}"));

    let gate = Gate::start(&reg.addr, "tok-good", "tok-good", None);
    let r = lab.srv().call_ok_within(
        "image_pull",
        json!({"oci": format!("{}/mcq/app:v1", gate.addr)}),
        STEP,
    );
    assert_eq!(r["layers"], json!(2), "{r}");
    assert!(r["downloaded"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["config"]["user"], "1000:1000", "{r}");
    assert_ne!(
        r["digest"],
        json!(""),
        "{r} (layout had {digest_in_layout})"
    );
    assert!(
        gate.challenged.load(Ordering::Relaxed) >= 1,
        "no challenge was met"
    );
    assert!(
        gate.tokens_issued.load(Ordering::Relaxed) >= 1,
        "no token was fetched"
    );
    assert!(
        gate.passed.load(Ordering::Relaxed) >= 4,
        "manifest, config and two layers come through the gate with the token"
    );

    // A token the gate does not take: a refusal naming the registry, not a hang or a loop.
    let strict = Gate::start(&reg.addr, "tok-stale", "tok-good", None);
    let r = lab.srv().call_tool_within(
        "image_pull",
        json!({"oci": format!("{}/mcq/app:v1", strict.addr)}),
        STEP,
    );
    let e = tool_err(&r, "a token the registry refuses");
    assert!(
        e.contains("refused access") && e.contains(&strict.addr),
        "{e}"
    );
    assert_eq!(error_kind(&r), "refused");
    assert_eq!(
        strict.tokens_issued.load(Ordering::Relaxed),
        1,
        "one token, no loop"
    );
}

/// A wrong password is called one: the registry, the user and where the credentials came from
/// (the config file and its `auths` key), the token service's own words, and what to do.
#[test]
fn a_wrong_password_is_called_one() {
    let lab = Lab::confined("oci-login");
    let dir = lab.dir.join("layout");
    layout(&dir, "v1", &[]);
    let reg = Registry::start(&lab.dir.join("registry"));
    let gate = Gate::start(&reg.addr, "tok-good", "tok-good", Some("mcq:right"));
    let docker = lab.dir.join("docker");
    std::fs::create_dir_all(&docker).unwrap();
    let key = format!("http://{}", gate.addr);
    let config = json!({"auths": {&key: {"auth": b64_encode("mcq:wrong")}}});
    std::fs::write(docker.join("config.json"), config.to_string()).unwrap();
    let mut s = lab.spawn_server_with(&[("DOCKER_CONFIG", docker.to_str().unwrap())]);
    let r = s.call_tool_within(
        "image_pull",
        json!({"oci": format!("{}/mcq/app:v1", gate.addr)}),
        STEP,
    );
    let e = tool_err(&r, "a wrong password");
    for part in [
        "authentication failed".to_string(),
        gate.addr.clone(),
        "user \"mcq\"".to_string(),
        docker.join("config.json").display().to_string(),
        format!("auths key {key:?}"),
        "incorrect username or password".to_string(),
        "docker login".to_string(),
    ] {
        assert!(e.contains(&part), "{part:?} not in: {e}");
    }
    assert!(!e.contains("wrong"), "the password is never said: {e}");
    assert_eq!(error_kind(&r), "refused");
    assert_eq!(gate.tokens_issued.load(Ordering::Relaxed), 0);
}
