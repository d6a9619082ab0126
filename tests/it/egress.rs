//! Egress by name (`allow_network` rules) over MCP, against the built binary, real QEMU and the
//! test guest: two HTTP servers on 127.0.0.1 stand in for the world, one allowed as
//! `localhost:PORT`, the other not. Nothing here reaches beyond this machine.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{json, Value};

const SLOW: Duration = Duration::from_secs(240);
const PROXY: &str = "10.0.2.2 3128";

fn sandbox_args(base: &Path, rules: Value) -> Value {
    let g = test_guest();
    json!({
        "name": "egress", "base_image": base.to_str().unwrap(), "kernel": g.kernel,
        "initrd": g.initrd, "append": g.append, "memory_mb": 128, "cpus": 1,
        "wait_agent_s": 90, "allow_network": rules,
    })
}

/// `sh -c script` in the guest (guest_exec adds the proxy to its environment): exit code,
/// stdout and stderr.
fn run_sh(s: &mut Server, script: &str) -> (i64, String, String) {
    run_sh_in(s, "egress", script)
}

fn run_sh_in(s: &mut Server, vm: &str, script: &str) -> (i64, String, String) {
    let r = s.call_ok_within(
        "guest_exec",
        json!({"name": vm, "command": "sh", "args": ["-c", script], "timeout": 30}),
        SLOW,
    );
    let text = |k: &str| r[k].as_str().unwrap_or_default().to_string();
    (
        r["exitcode"].as_i64().unwrap_or(-1),
        text("stdout"),
        text("stderr"),
    )
}

fn connect_script(target: &str, path: &str) -> String {
    format!(
        "printf 'CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\nGET {path} HTTP/1.0\\r\\n\
         Host: localhost\\r\\n\\r\\n' | nc -w 10 {PROXY}"
    )
}

/// What must hold from the guest, with the lab's server or a restarted one.
fn check_from_guest(s: &mut Server, allowed: u16, other: u16) {
    // Plain HTTP by absolute URL through the proxy busybox wget learns from http_proxy.
    let (rc, out, err) = run_sh(s, &format!("wget -q -O - http://localhost:{allowed}/hello"));
    assert_eq!((rc, out.as_str()), (0, "allowed-A"), "allowed HTTP: {err}");
    // HTTPS goes by CONNECT: a tunnel to the allowed server (plain HTTP inside it here).
    let (_, out, _) = run_sh(
        s,
        &connect_script(&format!("localhost:{allowed}"), "/hello"),
    );
    assert!(
        out.starts_with("HTTP/1.1 200 Connection established"),
        "{out}"
    );
    assert!(out.ends_with("allowed-A"), "CONNECT tunnel: {out}");
    // The same host on another port, the allowed server by IP literal, the other server.
    for url in [
        format!("http://localhost:{other}/hello"),
        format!("http://127.0.0.1:{allowed}/hello"),
    ] {
        let (rc, out, err) = run_sh(s, &format!("wget -q -O - {url}"));
        assert!(
            rc != 0 && !out.contains("allowed"),
            "{url} got through: {out}"
        );
        assert!(err.contains("403"), "{url}: {err}");
    }
    let (_, out, _) = run_sh(
        s,
        &connect_script(&format!("127.0.0.1:{allowed}"), "/hello"),
    );
    assert!(
        out.starts_with("HTTP/1.1 403") && out.contains("IP address"),
        "{out}"
    );
    let (_, out, _) = run_sh(s, &connect_script(&format!("localhost:{other}"), "/hello"));
    assert!(
        out.starts_with("HTTP/1.1 403") && out.contains("allow_network rules"),
        "{out}"
    );
    // No direct connection leaves the guest: not to the host, not to the allowed server.
    for port in [allowed, other] {
        let (rc, out, _) = run_sh(
            s,
            &format!("wget -Y off -q -T 5 -O - http://10.0.2.2:{port}/hello"),
        );
        assert!(
            rc != 0 && out.is_empty(),
            "direct to host port {port}: {out}"
        );
    }
    // Nor to this machine's own outside address (what the world would be, without leaving it).
    if let Some((addr, listener)) = outside_listener() {
        let script = format!("wget -Y off -q -T 5 -O - http://{addr}/ 2>&1; echo rc=$?");
        let (rc, out, _) = run_sh(s, &script);
        assert!(rc == 0 && !out.contains("rc=0"), "direct to {addr}: {out}");
        listener.set_nonblocking(true).unwrap();
        assert!(
            listener.accept().is_err(),
            "the guest reached {addr} directly"
        );
    }
}

/// A listener on this machine's non-loopback address (found without sending a packet), if it
/// has one.
fn outside_listener() -> Option<(std::net::SocketAddr, std::net::TcpListener)> {
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    probe.connect("192.0.2.1:9").ok()?;
    let ip = probe.local_addr().ok()?.ip();
    if ip.is_loopback() || ip.is_unspecified() {
        return None;
    }
    let l = std::net::TcpListener::bind((ip, 0)).ok()?;
    Some((l.local_addr().ok()?, l))
}

/// A port forward still works: the proxy listens on the host port and relays into the VM's
/// network, to QEMU's forward there.
fn forward_reaches_the_guest(s: &mut Server, host_port: u64, guest_port: u64) {
    use std::io::Read;
    let script = format!("echo hello-forward | nc -l -p {guest_port}");
    s.call_ok(
        "guest_exec",
        json!({"name": "egress", "command": "sh", "background": true, "args": ["-c", script]}),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut got = String::new();
        if let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", host_port as u16)) {
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let _ = c.read_to_string(&mut got);
        }
        if got.contains("hello-forward") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "port forward {host_port} never answered: {got:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn egress_info(s: &mut Server) -> Value {
    let info = s.call_ok("vm_info", json!({"name": "egress"}));
    assert_eq!(
        info["egress_proxy"],
        json!("http://10.0.2.2:3128"),
        "{info}"
    );
    info["egress"].clone()
}

#[test]
fn a_sandbox_reaches_only_the_names_it_was_allowed() {
    test_guest();
    let a = HttpServer::start(vec![("/hello", Route::body(b"allowed-A".to_vec()))]);
    let b = HttpServer::start(vec![("/hello", Route::body(b"other-B".to_vec()))]);
    let port = |h: &HttpServer| {
        h.url("")
            .rsplit(':')
            .next()
            .unwrap()
            .trim_end_matches('/')
            .parse::<u16>()
            .unwrap()
    };
    let (pa, pb) = (port(&a), port(&b));
    let lab = Lab::without_server("egress", 1);
    let base = lab.dir.join("base.qcow2");
    let (ok, out, err) = run_tool(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", base.to_str().unwrap(), "64M"],
    );
    assert!(ok, "qemu-img create failed: {out}{err}");
    let mut s = lab.spawn_server();

    // Malformed rules are refused with nothing started.
    for bad in [
        json!(["http://localhost/"]),
        json!(["a..b"]),
        json!(["localhost:0"]),
    ] {
        let e = s.call_err("sandbox_vm", sandbox_args(&base, bad.clone()));
        assert!(
            e.contains("allow_network") && e.contains("nothing was started"),
            "{bad}: {e}"
        );
    }
    let g = test_guest();
    let e = s.call_err(
        "launch_vm",
        json!({"name": "egress", "kernel": g.kernel,
        "allow_network": ["*"]}),
    );
    assert!(e.contains("allow_network"), "{e}");
    let listed = s.call_ok("list_vms", json!({}));
    assert_eq!(listed["vms"], json!([]), "{listed}");
    assert!(!lab.vm_dir("egress").join("egress.log").exists());

    let t0 = Instant::now();
    let r = s.call_tool_within(
        "sandbox_vm",
        sandbox_args(&base, json!([format!("localhost:{pa}")])),
        SLOW,
    );
    lab.track(&r);
    let sb = tool_ok(&r, "sandbox_vm");
    assert_eq!(sb["agent_ready"], json!(true), "{sb}");
    eprintln!("sandbox with rules ready in {:?}", t0.elapsed());
    assert_eq!(
        sb["egress"]["egress_proxy"],
        json!("http://10.0.2.2:3128"),
        "{sb}"
    );

    check_from_guest(&mut s, pa, pb);
    // The sandbox's own forward (auto:22), and one added live and removed.
    forward_reaches_the_guest(&mut s, sb["port_forwards"][0]["host"].as_u64().unwrap(), 22);
    let added = s.call_ok(
        "vm_port_forward",
        json!({"name": "egress", "add": ["auto:8080"]}),
    );
    let live = added["added"][0]["host"].as_u64().unwrap();
    forward_reaches_the_guest(&mut s, live, 8080);
    s.call_ok(
        "vm_port_forward",
        json!({"name": "egress", "remove": [live.to_string()]}),
    );
    let gone = std::net::TcpStream::connect(("127.0.0.1", live as u16));
    assert!(gone.is_err(), "{live} is still forwarded");
    // An explicit env wins over the proxy guest_exec adds.
    let r = s.call_ok(
        "guest_exec",
        json!({"name": "egress", "command": "sh",
        "args": ["-c", "echo $http_proxy"], "env": {"http_proxy": "http://elsewhere:1"}}),
    );
    assert_eq!(r["stdout"], json!("http://elsewhere:1\n"), "{r}");
    std::thread::sleep(Duration::from_millis(400));
    let e = egress_info(&mut s);
    assert_eq!(e["rules"], json!([format!("localhost:{pa}")]), "{e}");
    assert_eq!(e["proxy_running"], json!(true), "{e}");
    assert!(
        e["allowed"].as_u64() >= Some(2) && e["refused"].as_u64() >= Some(4),
        "{e}"
    );
    let last = e["last_refused"].to_string();
    assert!(
        last.contains(&format!("localhost:{pb}")) && last.contains("127.0.0.1"),
        "{e}"
    );
    let refused_before = e["refused"].as_u64().unwrap();
    assert!(
        b.hits().is_empty(),
        "the other server was reached: {:?}",
        b.hits()
    );

    // The proxy outlives the server: a restarted one sees the same, and it still holds.
    drop(s);
    let mut s = lab.spawn_server();
    check_from_guest(&mut s, pa, pb);
    std::thread::sleep(Duration::from_millis(400));
    let e = egress_info(&mut s);
    assert!(e["refused"].as_u64().unwrap() >= refused_before + 4, "{e}");
    assert!(
        b.hits().is_empty(),
        "the other server was reached: {:?}",
        b.hits()
    );

    // A fork's copy gets a proxy of its own with the same rules; so does a resumed sandbox.
    let f = s.call_ok_within("sandbox_fork", json!({"name": "egress"}), SLOW);
    lab.killer.track(&f["copies"][0]);
    let copy = f["copies"][0]["name"].as_str().unwrap().to_string();
    let (rc, out, err) = run_sh_in(
        &mut s,
        &copy,
        &format!("wget -q -O - http://localhost:{pa}/hello"),
    );
    assert_eq!((rc, out.as_str()), (0, "allowed-A"), "from the fork: {err}");
    let (rc, _, err) = run_sh_in(
        &mut s,
        &copy,
        &format!("wget -q -O - http://localhost:{pb}/hello"),
    );
    assert!(rc != 0 && err.contains("403"), "from the fork: {err}");
    let ci = s.call_ok("vm_info", json!({"name": copy}));
    assert_eq!(ci["egress"]["proxy_running"], json!(true), "{ci}");
    assert_ne!(ci["egress"]["proxy_pid"], e["proxy_pid"], "{ci}");
    s.call_ok_within("sandbox_destroy", json!({"name": copy}), SLOW);
    // A forward added live is part of the VM from then on: a resume starts it again.
    let kept = s.call_ok(
        "vm_port_forward",
        json!({"name": "egress", "add": ["auto:8081"]}),
    )["added"][0]["host"]
        .as_u64()
        .unwrap();
    s.call_ok_within("sandbox_suspend", json!({"name": "egress"}), SLOW);
    let r = s.call_ok_within("sandbox_resume", json!({"name": "egress"}), SLOW);
    lab.killer.track(&r);
    let forwards = r["port_forwards"].to_string();
    assert!(forwards.contains(&format!("\"host\":{kept}")), "{r}");
    forward_reaches_the_guest(&mut s, kept, 8081);
    let (rc, out, err) = run_sh(&mut s, &format!("wget -q -O - http://localhost:{pa}/hello"));
    assert_eq!(
        (rc, out.as_str()),
        (0, "allowed-A"),
        "after a resume: {err}"
    );
    let (rc, out, _) = run_sh(
        &mut s,
        &format!("wget -Y off -q -T 5 -O - http://10.0.2.2:{pa}/hello"),
    );
    assert!(rc != 0 && out.is_empty(), "direct after a resume: {out}");
    assert!(
        b.hits().is_empty(),
        "the other server was reached: {:?}",
        b.hits()
    );
    let e = egress_info(&mut s);

    // The proxy ends with its VM.
    let pid = e["proxy_pid"].as_i64().unwrap() as i32;
    s.call_ok_within("sandbox_destroy", json!({"name": "egress"}), SLOW);
    let deadline = Instant::now() + Duration::from_secs(5);
    while pid_alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!pid_alive(pid), "the egress proxy outlived its VM");
}

/// A clone of a template (made without rules) gets its rules at start: the proxy and the empty
/// network come with the clone, and its warm pool is not used for it.
#[test]
fn a_template_clone_reaches_only_the_names_it_was_allowed() {
    test_guest();
    let a = HttpServer::start(vec![("/hello", Route::body(b"allowed-A".to_vec()))]);
    let b = HttpServer::start(vec![("/hello", Route::body(b"other-B".to_vec()))]);
    let port = |h: &HttpServer| {
        let url = h.url("");
        url.trim_end_matches('/')
            .rsplit(':')
            .next()
            .unwrap()
            .parse::<u16>()
            .unwrap()
    };
    let (pa, pb) = (port(&a), port(&b));
    let mut lab = Lab::new("egress-tpl");
    let g = test_guest();
    let s = lab.srv();
    s.call_ok_within(
        "template_create",
        json!({"name": "egress-tpl", "kernel": g.kernel, "initrd": g.initrd, "append": g.append,
               "memory_mb": 128, "cpus": 1, "wait_agent_s": 120}),
        SLOW,
    );
    let r = s.call_tool_within(
        "sandbox_vm",
        json!({"template": "egress-tpl", "name": "egress-clone",
               "allow_network": [format!("localhost:{pa}")]}),
        SLOW,
    );
    lab.track(&r);
    let c = tool_ok(&r, "sandbox_vm");
    assert_eq!(
        c["egress"]["egress_proxy"],
        json!("http://10.0.2.2:3128"),
        "{c}"
    );
    let s = lab.srv();
    let (rc, out, err) = run_sh_in(
        s,
        "egress-clone",
        &format!("wget -q -O - http://localhost:{pa}/hello"),
    );
    assert_eq!((rc, out.as_str()), (0, "allowed-A"), "{err}");
    let (rc, _, err) = run_sh_in(
        s,
        "egress-clone",
        &format!("wget -q -O - http://localhost:{pb}/hello"),
    );
    assert!(rc != 0 && err.contains("403"), "{err}");
    let (rc, out, _) = run_sh_in(
        s,
        "egress-clone",
        &format!("wget -Y off -q -T 5 -O - http://10.0.2.2:{pb}/hello"),
    );
    assert!(rc != 0 && out.is_empty(), "direct from the clone: {out}");
    assert!(
        b.hits().is_empty(),
        "the other server was reached: {:?}",
        b.hits()
    );
    s.call_ok_within("sandbox_destroy", json!({"name": "egress-clone"}), SLOW);
    s.call_ok("template_delete", json!({"name": "egress-tpl"}));
}
