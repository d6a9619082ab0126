//! Egress (section `egress`): HTTP requests from the test guest to a server on the host, through
//! the egress proxy of a sandbox with `allow_network: ["localhost:PORT"]` against straight out
//! of a sandbox with `allow_network: true`, in one run. Each row is one guest_exec of a busybox
//! loop of `wget` requests (a process per request, as under TCG that is most of its cost), one
//! after another and four loops at once; requests/s is requests over the call's time, and the
//! added latency the difference per request; then one 64 MiB download each way.
//! `MCQEMU_BENCH_EGRESS_N` requests per loop (default 100).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{try_test_guest, HttpServer, Route, Server, VmKiller};
use crate::report::{Stats, Table};
use crate::{env_count, structured, Dirs, Res, ToolCalls};

const BOOT_TIMEOUT: Duration = Duration::from_secs(200);
const LOOP_TIMEOUT: Duration = Duration::from_secs(600);
/// Rounds of each measure (alternating proxy and direct); medians are reported.
const ROUNDS: usize = 3;
/// The large body's size.
const BIG: usize = 64 << 20;

/// The egress section; an ERROR row when something fails. Both sandboxes are destroyed.
pub fn egress_rows(table: &mut Table, dirs: &Dirs, base_image: &Path) {
    table.section("egress: requests from the guest, through the egress proxy vs direct (TCG)");
    let name = "egress section";
    let killer = VmKiller::new(dirs.tmp.path());
    let outcome = dirs.server().and_then(|mut s| {
        let r = rows(table, &mut s, &killer, base_image, dirs.tmp.path());
        for vm in ["bench-egress-proxy", "bench-egress-direct"] {
            let _ = s.tool_within("sandbox_destroy", json!({"name": vm}), BOOT_TIMEOUT);
        }
        r
    });
    table.or_error(name, outcome);
    killer.kill_all();
}

fn rows(table: &mut Table, s: &mut Server, killer: &VmKiller, base: &Path, tmp: &Path) -> Res<()> {
    let n = env_count("MCQEMU_BENCH_EGRESS_N", 100);
    let big = vec![b'x'; BIG];
    let http = HttpServer::start(vec![
        ("/r", Route::body(b"ok".to_vec())),
        ("/big", Route::body(big)),
    ]);
    let port: u16 = http
        .url("")
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or("no port in the HTTP server's URL")?;
    let host = host_rows(table, tmp.join("egress-host"), port, 500);
    table.or_error("egress proxy on the host", host);
    let tls = intercept_rows(table, tmp.join("egress-tls"), 200);
    table.or_error("egress proxy adding a secret", tls);
    let proxied = boot(
        s,
        killer,
        base,
        "bench-egress-proxy",
        json!([format!("localhost:{port}")]),
    )?;
    let direct = boot(s, killer, base, "bench-egress-direct", json!(true))?;
    let via_proxy = format!("http://localhost:{port}/r");
    let straight = format!("http://10.0.2.2:{port}/r");
    for parallel in [1usize, 4] {
        let (mut ps, mut ds) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            ps.push(requests(s, &proxied, &via_proxy, n, parallel)?);
            ds.push(requests(s, &direct, &straight, n, parallel)?);
        }
        let (p, d) = (median(ps), median(ds));
        let total = (n * parallel) as f64;
        let (rp, rd) = (total / p.as_secs_f64(), total / d.as_secs_f64());
        let added = (p.as_secs_f64() - d.as_secs_f64()) / total * 1000.0;
        table.note(&format!(
            "{parallel} loop(s) x {n} wget, median of {ROUNDS}: proxy {rp:.0} req/s, direct {rd:.0} req/s; \
             added {added:+.2} ms per request ({:.1} s vs {:.1} s)",
            p.as_secs_f64(),
            d.as_secs_f64()
        ));
    }
    let (mut ps, mut ds) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        ps.push(requests(
            s,
            &proxied,
            &format!("http://localhost:{port}/big"),
            1,
            1,
        )?);
        ds.push(requests(
            s,
            &direct,
            &format!("http://10.0.2.2:{port}/big"),
            1,
            1,
        )?);
    }
    let (p, d) = (median(ps), median(ds));
    let mbps = |t: Duration| BIG as f64 / t.as_secs_f64() / 1e6;
    table.note(&format!(
        "one {} MiB download, median of {ROUNDS}: proxy {:.0} MB/s, direct {:.0} MB/s ({:.2} s vs {:.2} s)",
        BIG >> 20,
        mbps(p),
        mbps(d),
        p.as_secs_f64(),
        d.as_secs_f64()
    ));
    let counts = s.tool("vm_info", json!({"name": proxied}))?;
    let e = &structured(&counts)?["egress"];
    table.note(&format!(
        "proxy counted {} allowed, {} refused",
        e["allowed"], e["refused"]
    ));
    Ok(())
}

/// The proxy's own cost without a guest: its connection handler (the one the VM's proxy runs)
/// on a loopback listener, timed against the HTTP server straight, `n` requests each.
fn host_rows(table: &mut Table, dir: PathBuf, port: u16, n: usize) -> Res<()> {
    use mcqemu::net::egress::{proxy, rules, stats::Counters};
    use std::sync::{atomic::AtomicUsize, Arc};
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let pport = listener.local_addr().map_err(|e| e.to_string())?.port();
    let shared = proxy::Shared {
        rules: Arc::new(rules::parse_rules(&[format!("localhost:{port}")]).map_err(|e| e.msg)?),
        counters: Counters::new(&dir),
        active: Arc::new(AtomicUsize::new(0)),
        secrets: Arc::new(Vec::new()),
        authority: None,
    };
    std::thread::spawn(move || {
        for c in listener.incoming().flatten() {
            let s = shared.clone();
            std::thread::spawn(move || proxy::serve(c, s));
        }
    });
    let via = format!("GET http://localhost:{port}/r HTTP/1.1\r\nHost: localhost\r\n\r\n");
    let straight = "GET /r HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let p = Stats::of(fetch_n(pport, &via, n)?);
    let d = Stats::of(fetch_n(port, straight, n)?);
    table.time_row("egress proxy on the host: one request", n, &p, None);
    table.time_row("the same request straight", n, &d, None);
    table.note(&format!(
        "added {:+.3} ms per request (median); {:.0} vs {:.0} requests/s one after another",
        (p.median.as_secs_f64() - d.median.as_secs_f64()) * 1000.0,
        1.0 / p.median.as_secs_f64(),
        1.0 / d.median.as_secs_f64()
    ));
    Ok(())
}

/// The cost of adding a secret, on the host without a guest: HTTPS requests through the
/// proxy's connection handler to a TLS server on loopback, intercepted (the proxy ends the
/// client's TLS with its VM CA's certificate, adds the secret, and opens its own TLS to the
/// server) against a plain tunnel to the same server; a new connection and both handshakes
/// each time. Then the proxy's memory per open intercepted tunnel.
fn intercept_rows(table: &mut Table, dir: PathBuf, n: usize) -> Res<()> {
    use mcqemu::net::egress::{
        proxy, rules, secrets::ProxySecret, stats::Counters, tls::Authority,
    };
    use std::sync::{atomic::AtomicUsize, Arc};
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let up = crate::common::tls::start();
    let ca_file = dir.join("upstream-ca.pem");
    std::fs::write(&ca_file, &up.ca_pem).map_err(|e| e.to_string())?;
    let authority = Authority::new("bench", Some(&ca_file)).map_err(|e| e.msg)?;
    let proxy_ca = authority.ca_pem();
    let secret = ProxySecret {
        name: "bench".into(),
        placeholder: "mcqemu-secret-bench-0".into(),
        value: "bench-value".into(),
        hosts: vec![format!("localhost:{}", up.port)],
        header: None,
    };
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let pport = listener.local_addr().map_err(|e| e.to_string())?.port();
    let shared = proxy::Shared {
        rules: Arc::new(
            rules::parse_rules(&[
                format!("localhost:{}", up.port),
                format!("127.0.0.1:{}", up.port),
            ])
            .map_err(|e| e.msg)?,
        ),
        counters: Counters::new(&dir),
        active: Arc::new(AtomicUsize::new(0)),
        secrets: Arc::new(vec![secret]),
        authority: Some(Arc::new(authority)),
    };
    std::thread::spawn(move || {
        for c in listener.incoming().flatten() {
            let s = shared.clone();
            std::thread::spawn(move || proxy::serve(c, s));
        }
    });
    let trusting = |pem: &str| -> Res<Arc<rustls::ClientConfig>> {
        let mut roots = rustls::RootCertStore::empty();
        use rustls::pki_types::pem::PemObject;
        let der = rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
            .map_err(|e| e.to_string())?;
        roots.add(der).map_err(|e| e.to_string())?;
        let c = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(Arc::new(c))
    };
    let (ours, theirs) = (trusting(&proxy_ca)?, trusting(&up.ca_pem)?);
    let mut intercepted = Vec::with_capacity(n);
    let mut plain = Vec::with_capacity(n);
    for _ in 0..n {
        intercepted.push(tunnel_request(pport, "localhost", up.port, &ours)?);
        plain.push(tunnel_request(pport, "127.0.0.1", up.port, &theirs)?);
    }
    let added = up
        .heads
        .lock()
        .map_err(|_| "poisoned")?
        .iter()
        .filter(|h| h.contains("Bearer bench-value"))
        .count();
    if added != n {
        return Err(format!(
            "{added} of {n} intercepted requests carried the value"
        ));
    }
    // The first of each pays for a certificate and TLS set-up: reported apart.
    let (first, rest) = (intercepted[0], Stats::of(intercepted[1..].to_vec()));
    let tunnel = Stats::of(plain[1..].to_vec());
    table.time_row(
        "HTTPS via the proxy, secret added (intercepted)",
        n - 1,
        &rest,
        None,
    );
    table.time_row("HTTPS via the proxy, plain tunnel", n - 1, &tunnel, None);
    table.note(&format!(
        "added {:+.2} ms per request at p50 (goal <= 5 ms), after a first of {:.1} ms \
         (its host's certificate signed)",
        (rest.median.as_secs_f64() - tunnel.median.as_secs_f64()) * 1000.0,
        first.as_secs_f64() * 1000.0
    ));
    // Memory: tunnels held open after both handshakes, the request not yet sent.
    let rss = || -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            })
            .unwrap_or(0)
    };
    let before = rss();
    let mut held = Vec::new();
    for _ in 0..50 {
        held.push(open_tunnel(pport, "localhost", up.port, &ours)?);
    }
    std::thread::sleep(Duration::from_millis(200));
    let per = rss().saturating_sub(before) as f64 / 50.0;
    drop(held);
    table.note(&format!(
        "memory per open intercepted tunnel: {per:.0} KiB (RSS of the bench process over 50 held \
         tunnels: the proxy's thread, both TLS sessions, and this client's session too)"
    ));
    Ok(())
}

/// A CONNECT to `host`:`port` through the proxy at `pport`, TLS over it trusting `tls`.
fn open_tunnel(
    pport: u16,
    host: &str,
    port: u16,
    tls: &std::sync::Arc<rustls::ClientConfig>,
) -> Res<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    let mut c = TcpStream::connect(("127.0.0.1", pport)).map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(
        c,
        "CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if c.read(&mut b).map_err(|e| e.to_string())? == 0 {
            return Err("the proxy closed the CONNECT".into());
        }
        head.push(b[0]);
    }
    if !head.starts_with(b"HTTP/1.1 200") {
        return Err(format!("CONNECT: {}", String::from_utf8_lossy(&head)));
    }
    let name =
        rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| e.to_string())?;
    let conn = rustls::ClientConnection::new(tls.clone(), name).map_err(|e| e.to_string())?;
    let mut s = rustls::StreamOwned::new(conn, c);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock).map_err(|e| e.to_string())?;
    }
    Ok(s)
}

/// One HTTPS request through a new tunnel; its time.
fn tunnel_request(
    pport: u16,
    host: &str,
    port: u16,
    tls: &std::sync::Arc<rustls::ClientConfig>,
) -> Res<Duration> {
    let t0 = Instant::now();
    let mut s = open_tunnel(pport, host, port, tls)?;
    write!(
        s,
        "GET /r HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer mcqemu-secret-bench-0\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut body = Vec::new();
    match s.read_to_end(&mut body) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
        Err(e) => return Err(e.to_string()),
    }
    if !body.ends_with(b"ok") {
        return Err(format!(
            "unexpected answer: {}",
            String::from_utf8_lossy(&body)
        ));
    }
    Ok(t0.elapsed())
}

fn fetch_n(port: u16, request: &str, n: usize) -> Res<Vec<Duration>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        let mut c = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
        c.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        c.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
        let mut body = Vec::new();
        c.read_to_end(&mut body).map_err(|e| e.to_string())?;
        out.push(t0.elapsed());
        if !body.ends_with(b"ok") {
            return Err(format!(
                "unexpected answer: {}",
                String::from_utf8_lossy(&body)
            ));
        }
    }
    Ok(out)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn boot(s: &mut Server, killer: &VmKiller, base: &Path, name: &str, net: Value) -> Res<String> {
    let g = try_test_guest()?;
    let t0 = Instant::now();
    let r = s.tool_within(
        "sandbox_vm",
        json!({"name": name, "base_image": base, "kernel": g.kernel, "initrd": g.initrd,
               "append": g.append, "memory_mb": 128, "cpus": 1, "wait_agent_s": 120,
               "allow_network": net, "port_forwards": []}),
        BOOT_TIMEOUT,
    )?;
    let sb = structured(&r)?;
    killer.track(sb);
    if sb["agent_ready"] != json!(true) {
        return Err(format!("sandbox {name}: agent not ready: {sb}"));
    }
    println!("    {name} ready in {:.1} s", t0.elapsed().as_secs_f64());
    Ok(name.to_string())
}

/// One guest_exec running `parallel` loops of `n` wget requests of `url`; its round trip.
fn requests(s: &mut Server, vm: &str, url: &str, n: usize, parallel: usize) -> Res<Duration> {
    let one = format!(
        "i=0; while [ $i -lt {n} ]; do wget -q -O /dev/null {url} || exit 1; i=$((i+1)); done"
    );
    let script = format!(
        "rm -f /tmp/egress-fail; for j in $(seq {parallel}); do ( {one} ) || touch \
         /tmp/egress-fail & done; wait; [ ! -e /tmp/egress-fail ]"
    );
    let t0 = Instant::now();
    let r = s.tool_within(
        "guest_exec",
        json!({"name": vm, "command": "sh", "args": ["-c", script], "timeout": 600}),
        LOOP_TIMEOUT,
    )?;
    let took = t0.elapsed();
    let out = structured(&r)?;
    if out["exitcode"] != json!(0) {
        return Err(format!("wget loop in {vm} failed: {out}"));
    }
    Ok(took)
}
