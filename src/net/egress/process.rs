//! `mcqemu egress-proxy`: the process that serves one VM's egress proxy. It makes the VM's
//! empty network (see [`super::netns`]), listens there on [`GUEST_PORT`] for the guest and on
//! the host for the VM's port forwards, says it is ready in `egress.json` in the VM's runtime
//! folder, and ends once the QEMU that joined its network has ended (or none came).

use crate::kind::Failed;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::forwards::{control_loop, Dial, Forwards, CONTROL_SOCKET};
use super::netns;
use super::proxy::{self, Shared};
use super::rules::{parse_rules, Rule};
use super::secrets::ProxySecret;
use super::stats::Counters;
use super::tls::Authority;
use std::io::Read;

/// The port the proxy listens on inside the VM's network (the guest reaches it at 10.0.2.2).
pub const GUEST_PORT: u16 = 3128;
/// The proxy's URL as the guest uses it.
pub const GUEST_URL: &str = "http://10.0.2.2:3128";
/// The ready file, in the VM's runtime folder.
pub const READY_FILE: &str = "egress.json";
/// How long a forward's port may stay in use at start (the VM's previous proxy closing).
const FORWARD_WAIT: Duration = Duration::from_secs(3);
/// How long the proxy waits for its QEMU to appear.
pub const QEMU_WAIT: Duration = Duration::from_secs(120);

/// The proxy's parameters.
#[derive(Debug)]
pub struct Config {
    runtime: PathBuf,
    state: PathBuf,
    rules: Vec<Rule>,
    forwards: Vec<(Ipv4Addr, u16)>,
    /// Secrets come as JSON on stdin (never in arguments, files or the environment).
    secrets_stdin: bool,
    /// A PEM file of extra CAs an upstream host may be verified against (a test's upstream).
    upstream_ca: Option<PathBuf>,
}

/// The file in the VM's runtime folder holding the certificate of its proxy's CA, for the
/// guest to trust.
pub const CA_FILE: &str = "egress-ca.pem";
/// Largest secrets document read from stdin.
const MAX_SECRETS: u64 = 1 << 20;

/// The subcommand's arguments (`--runtime`, `--state`, rules and forwards).
pub fn parse_args(args: &[String]) -> Result<Config, Failed> {
    let (mut runtime, mut state, mut rules, mut forwards) = (None, None, Vec::new(), Vec::new());
    let (mut secrets_stdin, mut upstream_ca) = (false, None);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--secrets-stdin" {
            secrets_stdin = true;
            continue;
        }
        let value = it
            .next()
            .ok_or(Failed::host(format!("{flag} needs a value")))?;
        match flag.as_str() {
            "--runtime" => runtime = Some(PathBuf::from(value)),
            "--state" => state = Some(PathBuf::from(value)),
            "--rule" => rules.push(value.clone()),
            "--upstream-ca" => upstream_ca = Some(PathBuf::from(value)),
            "--forward" => {
                let (a, p) = value
                    .rsplit_once(':')
                    .ok_or(Failed::host("--forward takes ADDR:PORT"))?;
                let a: Ipv4Addr = a
                    .parse()
                    .map_err(|_| Failed::host(format!("bad address {a:?}")))?;
                forwards.push((
                    a,
                    p.parse()
                        .map_err(|_| Failed::host(format!("bad port {p:?}")))?,
                ));
            }
            other => return Err(Failed::host(format!("unknown option {other:?}"))),
        }
    }
    Ok(Config {
        runtime: runtime.ok_or(Failed::host("--runtime is required"))?,
        state: state.ok_or(Failed::host("--state is required"))?,
        rules: parse_rules(&rules)?,
        forwards,
        secrets_stdin,
        upstream_ca,
    })
}

/// The secrets given on stdin, and the authority that intercepts their hosts' tunnels (none
/// without secrets: then no tunnel is ever opened). The CA's certificate is written for the
/// guest; its key stays in this process.
fn secrets_of(c: &Config) -> Result<(Vec<ProxySecret>, Option<Arc<Authority>>), Failed> {
    if !c.secrets_stdin {
        return Ok((Vec::new(), None));
    }
    let mut text = Vec::new();
    std::io::Read::read_to_end(&mut std::io::stdin().take(MAX_SECRETS), &mut text)
        .map_err(|e| Failed::host(format!("cannot read the secrets: {e}")))?;
    let secrets: Vec<ProxySecret> = serde_json::from_slice(&text)
        .map_err(|e| Failed::host(format!("the secrets given are not a list: {e}")))?;
    if secrets.is_empty() {
        return Ok((secrets, None));
    }
    let vm = c
        .runtime
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let authority = Authority::new(&vm, c.upstream_ca.as_deref())?;
    write_atomic(&c.runtime.join(CA_FILE), authority.ca_pem().as_bytes())?;
    Ok((secrets, Some(Arc::new(authority))))
}

/// Can this host make a VM's empty network (for `mcqemu doctor`)?
pub fn probe() -> Result<(), Failed> {
    netns::enter_user_namespace()?;
    std::thread::spawn(netns::enter_net_namespace)
        .join()
        .map_err(|_| Failed::host("the probe thread panicked"))?
}

/// Runs the proxy until its VM ends.
pub fn run(c: &Config) -> Result<(), Failed> {
    let (secrets, authority) = secrets_of(c)?;
    netns::enter_user_namespace()?;
    let (ready_tx, ready_rx) = mpsc::channel();
    let (dial_tx, dial_rx) = mpsc::channel::<Dial>();
    std::thread::Builder::new()
        .name("egress-netns".into())
        .spawn(move || inside(ready_tx, dial_rx))
        .map_err(|e| Failed::host(format!("cannot start a thread: {e}")))?;
    let (tid, listener) = ready_rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| Failed::host("the network namespace thread did not start"))??;
    netns::drop_privileges()?;
    let counters = Counters::new(&c.state);
    let writer = counters.clone();
    spawn("egress-stats", move || {
        writer.writer(Duration::from_millis(200))
    })?;
    let forwards = Forwards::new(dial_tx);
    for &(addr, port) in &c.forwards {
        forwards.add_within(addr, port, FORWARD_WAIT)?;
    }
    let control_path = c.runtime.join(CONTROL_SOCKET);
    let _ = std::fs::remove_file(&control_path);
    let control = UnixListener::bind(&control_path)
        .map_err(|e| Failed::host(format!("cannot listen on {}: {e}", control_path.display())))?;
    spawn("egress-control", move || control_loop(control, forwards))?;
    let shared = Shared {
        rules: Arc::new(c.rules.clone()),
        counters: counters.clone(),
        active: Arc::new(AtomicUsize::new(0)),
        secrets: Arc::new(secrets),
        authority,
    };
    spawn("egress-accept", move || accept_loop(listener, shared))?;
    let ready = c.runtime.join(READY_FILE);
    let rules: Vec<String> = c.rules.iter().map(Rule::text).collect();
    let info = json!({"pid": std::process::id(), "netns_tid": tid, "url": GUEST_URL,
                      "rules": rules});
    write_atomic(&ready, info.to_string().as_bytes())?;
    watch_qemu(&c.runtime, tid);
    counters.save_if_changed();
    let _ = std::fs::remove_file(&ready);
    let _ = std::fs::remove_file(&control_path);
    Ok(())
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), Failed> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(|_| ())
        .map_err(|e| Failed::host(format!("cannot start a thread: {e}")))
}

/// The thread that lives in the VM's network: makes it, listens for the guest there, hands
/// the listener over, then dials into it for the port forwards.
fn inside(ready: mpsc::Sender<Result<(i32, TcpListener), Failed>>, dials: mpsc::Receiver<Dial>) {
    let setup = netns::enter_net_namespace()
        .and_then(|()| {
            TcpListener::bind((Ipv4Addr::LOCALHOST, GUEST_PORT))
                .map_err(|e| Failed::host(format!("cannot listen in the VM's network: {e}")))
        })
        .and_then(|l| netns::drop_privileges().map(|()| l));
    // SAFETY: gettid has no arguments.
    let tid = unsafe { libc::gettid() };
    let _ = ready.send(setup.map(|l| (tid, l)));
    for (port, reply) in dials {
        let addr = (Ipv4Addr::LOCALHOST, port).into();
        let _ = reply.send(TcpStream::connect_timeout(&addr, Duration::from_secs(5)));
    }
}

fn accept_loop(listener: TcpListener, shared: Shared) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let s = shared.clone();
        let _ = std::thread::Builder::new()
            .name("egress-conn".into())
            .spawn(move || proxy::serve(conn, s));
    }
}

/// Returns once the QEMU in our network has ended, or when none joined within [`QEMU_WAIT`].
fn watch_qemu(runtime: &Path, tid: i32) {
    let ours = netns::net_ns_id(&format!("/proc/self/task/{tid}"));
    let pidfile = runtime.join("qemu.pid");
    let started = Instant::now();
    let mut seen: Option<i32> = None;
    loop {
        std::thread::sleep(Duration::from_millis(250));
        match seen {
            Some(pid) => {
                if netns::net_ns_id(&format!("/proc/{pid}")) != ours || zombie(pid) {
                    return;
                }
            }
            None => {
                let pid = std::fs::read_to_string(&pidfile)
                    .ok()
                    .and_then(|t| t.trim().parse::<i32>().ok());
                match pid {
                    Some(p)
                        if ours.is_some() && netns::net_ns_id(&format!("/proc/{p}")) == ours =>
                    {
                        seen = Some(p)
                    }
                    _ if started.elapsed() > QEMU_WAIT || !runtime.is_dir() => return,
                    _ => {}
                }
            }
        }
    }
}

fn zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
                .unwrap_or(true)
        })
        .unwrap_or(true)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Failed> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| Failed::host(format!("cannot write {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_parse_and_bad_ones_are_refused() {
        let a = |v: &[&str]| parse_args(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let c = a(&[
            "--runtime",
            "/r",
            "--state",
            "/s",
            "--rule",
            "x.org",
            "--forward",
            "127.0.0.1:2222",
        ])
        .unwrap();
        assert_eq!((c.rules.len(), c.forwards[0].1), (1, 2222));
        assert!(a(&["--runtime", "/r"]).is_err());
        assert!(a(&["--runtime", "/r", "--state", "/s", "--rule", "http://x"]).is_err());
        assert!(a(&["--bogus", "1"]).is_err());
    }
}
