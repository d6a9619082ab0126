//! A VM's egress proxy from the server's side: started beside QEMU for a VM with
//! `allow_network` rules (`mcqemu egress-proxy`, its own process, so it outlives this server
//! as the VM does), found again through its ready file, shown by vm_info, and taught to guest
//! programs through their environment.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::net::egress::netns::Join;
use crate::net::egress::process::{CA_FILE, GUEST_URL, READY_FILE};
/// An egress rule as a sandbox's `allow_network` names it, and how many a sandbox may have.
pub use crate::net::egress::rules::{Rule, MAX_RULES};
use crate::net::egress::secrets::ProxySecret;
use crate::net::egress::stats;
use crate::ops::error::OpError;
use crate::qemu::forwards::Forward;
use crate::qemu::vm;
use crate::state::registry::Record;
use std::io::Write;

/// How long the proxy may take to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// A proxy just started for a launch.
pub struct Started {
    child: Option<Child>,
    /// Its PID.
    pub pid: i32,
    /// The thread whose network namespace QEMU joins.
    pub tid: i32,
}

impl Started {
    /// The namespaces a QEMU joins, opened afresh for each spawn.
    pub fn join(&self) -> Result<Join, OpError> {
        Join::open(self.pid, self.tid).map_err(|e| {
            OpError::not_found(format!(
                "the egress proxy of this VM is gone ({e}); launch again"
            ))
        })
    }

    /// The launch failed: end the proxy (it would otherwise wait for a QEMU that never comes).
    pub fn abandon(mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The launch worked: a thread reaps the proxy when it ends with its VM.
    pub fn keep(mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = std::thread::Builder::new()
                .name(format!("egress-{}-reaper", self.pid))
                .spawn(move || c.wait());
        }
    }
}

/// Starts VM `name`'s proxy with `rules`, the host side of its `forwards` and its `secrets`
/// (given on a pipe: never in its arguments, environment or a file), and waits until it is
/// ready.
pub fn start(
    name: &str,
    rules: &[Rule],
    forwards: &[Forward],
    secrets: &[ProxySecret],
) -> Result<Started, OpError> {
    let rt = vm::runtime_dir(name);
    let sd = vm::state_dir(name);
    end_stale(&rt);
    let _ = std::fs::remove_file(rt.join(READY_FILE));
    let _ = std::fs::remove_file(rt.join("qemu.pid"));
    let exe = std::env::current_exe()
        .map_err(|e| OpError::host(format!("cannot find mcqemu's own binary: {e}")))?;
    let log_path = sd.join("egress.log");
    let log = std::fs::File::create(&log_path)
        .map_err(|e| OpError::host(format!("cannot create {}: {e}", log_path.display())))?;
    let log2 = log.try_clone().map_err(|e| OpError::host(e.to_string()))?;
    let mut cmd = Command::new(exe);
    cmd.arg("egress-proxy")
        .arg("--runtime")
        .arg(&rt)
        .arg("--state")
        .arg(&sd);
    for r in rules {
        cmd.arg("--rule").arg(r.text());
    }
    for f in forwards {
        cmd.arg("--forward").arg(format!("{}:{}", f.addr, f.host));
    }
    if !secrets.is_empty() {
        cmd.arg("--secrets-stdin");
        // The operator's extra CA for hosts the proxy speaks TLS to (a test's upstream).
        if let Some(ca) = std::env::var_os("MCQEMU_EGRESS_UPSTREAM_CA").filter(|v| !v.is_empty()) {
            cmd.arg("--upstream-ca").arg(ca);
        }
    }
    // Nothing of the server's environment (an MCP client's keys, say) reaches the proxy.
    cmd.env_clear()
        .stdin(if secrets.is_empty() {
            Stdio::null()
        } else {
            Stdio::piped()
        })
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log2));
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| OpError::host(format!("cannot start the egress proxy: {e}")))?;
    if let Some(mut pipe) = child.stdin.take() {
        let given = serde_json::to_vec(secrets)
            .map_err(|e| OpError::host(format!("cannot hand over the secrets: {e}")));
        let sent = given.and_then(|b| {
            pipe.write_all(&b)
                .map_err(|e| OpError::host(format!("cannot hand over the secrets: {e}")))
        });
        drop(pipe);
        if let Err(e) = sent {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    }
    wait_ready(child, &rt, &log_path)
}

fn wait_ready(mut child: Child, rt: &Path, log: &Path) -> Result<Started, OpError> {
    let pid = child.id() as i32;
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(r) = ready(rt).filter(|r| r.0 == pid) {
            return Ok(Started {
                child: Some(child),
                pid,
                tid: r.1,
            });
        }
        let exited = matches!(child.try_wait(), Ok(Some(_)));
        if exited || Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let tail: String = text
                .chars()
                .rev()
                .take(600)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            return Err(OpError::host(format!(
                "the egress proxy for allow_network rules did not start: {}. Nothing was \
                 started; allow_network true or false needs no proxy",
                tail.trim()
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A proxy of an earlier run of this VM that has not yet noticed its QEMU ended: ended now,
/// so that the host ports of its forwards are free again.
fn end_stale(rt: &Path) {
    let Some((pid, _)) = ready(rt) else {
        return;
    };
    // SAFETY: kill(2) on a PID whose command line said it is an egress proxy.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(2);
    while ready(rt).is_some() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The ready file of a VM's proxy: its PID and network thread, when it names a live one.
fn ready(rt: &Path) -> Option<(i32, i32)> {
    let text = std::fs::read_to_string(rt.join(READY_FILE)).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    let pid = v.get("pid")?.as_i64()? as i32;
    let tid = v.get("netns_tid")?.as_i64()? as i32;
    // Its own: a proxy process whose arguments name this runtime folder (not a reused PID).
    let own: Vec<u8> = format!("\0--runtime\0{}\0", rt.display()).into_bytes();
    let alive = std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
        c.windows(12).any(|w| w == b"egress-proxy") && c.windows(own.len()).any(|w| w == own)
    });
    alive.then_some((pid, tid))
}

/// The record's rules, when the VM has them.
pub fn rules_of(rec: &Record) -> Option<Vec<String>> {
    rec.egress.as_ref()?.rules.clone()
}

/// The record's rules, parsed again (for a fork's copies and a resume, which get a proxy of
/// their own with the same rules).
pub fn rules_from(rec: &Record) -> Result<Vec<Rule>, OpError> {
    let list = rules_of(rec).unwrap_or_default();
    crate::net::egress::rules::parse_rules(&list)
        .map_err(|e| OpError::host(format!("the record's allow_network rules: {e}")))
}

/// What vm_info says of a VM's egress: its rules, the proxy's URL and whether it runs, and
/// its counters (None for a VM without rules).
pub fn info(name: &str, rec: &Record) -> Option<EgressInfo> {
    let rules = rules_of(rec)?;
    let counts = stats::read(&vm::state_dir(name).join(stats::FILE)).unwrap_or_default();
    let proxy = ready(&vm::runtime_dir(name));
    Some(EgressInfo {
        rules,
        secrets: secrets_of(rec).into_iter().map(|s| s.name).collect(),
        egress_proxy: GUEST_URL,
        proxy_pid: proxy.map(|p| p.0),
        proxy_running: proxy.is_some(),
        allowed: counts.allowed,
        refused: counts.refused,
        last_refused: counts.last_refused,
        bytes: counts.bytes,
    })
}

crate::described! {
    /// A VM's egress as vm_info shows it (in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct EgressInfo {
        /// Its rules as given.
        pub rules: Vec<String>,
        /// The operator's secrets its proxy adds, by name (their values are never shown).
        pub secrets: Vec<String>,
        /// The proxy's URL in the guest.
        pub egress_proxy: &'static str,
        /// The proxy's PID, when it runs.
        pub proxy_pid: Option<i32>,
        /// Whether it runs.
        pub proxy_running: bool,
        /// Connections let through.
        pub allowed: u64,
        /// Connections refused.
        pub refused: u64,
        /// The latest refused names.
        pub last_refused: Vec<String>,
        /// Bytes carried.
        pub bytes: u64,
    }
}

/// The proxy variables a guest program of a VM with rules gets, under any `env` the caller
/// gave (an explicit variable wins); with secrets, their placeholders and the variables that
/// make programs trust the proxy's CA.
pub fn guest_env(rec: Option<&Record>, mut env: Vec<(String, String)>) -> Vec<(String, String)> {
    let Some(rec) = rec.filter(|r| rules_of(r).is_some()) else {
        return env;
    };
    let mut add = |k: &str, v: &str| {
        if !env.iter().any(|(e, _)| e == k) {
            env.push((k.to_string(), v.to_string()));
        }
    };
    for (k, v) in proxy_env() {
        add(k, v);
    }
    let placed = secrets_of(rec);
    if !placed.is_empty() {
        for s in &placed {
            add(&s.guest_env, &s.placeholder);
        }
        for k in ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"] {
            add(k, GUEST_CA_BUNDLE);
        }
        add("NODE_EXTRA_CA_CERTS", GUEST_CA_FILE);
    }
    env
}

/// Where the guest keeps the proxy's CA certificate.
pub const GUEST_CA_FILE: &str = "/run/mcqemu/egress-ca.pem";
/// The guest's system roots and the proxy's CA in one file (programs told by SSL_CERT_FILE
/// and its kin still reach hosts without secrets, whose tunnels stay plain).
pub const GUEST_CA_BUNDLE: &str = "/run/mcqemu/ca-bundle.pem";
/// Writes the CA into the guest, into its system bundle when it has Debian's or Alpine's (so
/// programs that read only that trust it too), and the bundle of both; reads the CA on stdin.
pub const TRUST_SCRIPT: &str = "set -e; d=/run/mcqemu; mkdir -p $d; cat > $d/egress-ca.pem;     b=/etc/ssl/certs/ca-certificates.crt;     if [ -f $b ] && ! grep -qF \"$(sed -n 2p $d/egress-ca.pem)\" $b; then     cat $d/egress-ca.pem >> $b; fi;     if [ -f $b ]; then cat $b > $d/ca-bundle.pem; else cat $d/egress-ca.pem > $d/ca-bundle.pem; fi";

/// The secrets placed in VM `rec` (names and placeholders).
pub fn secrets_of(rec: &Record) -> Vec<crate::state::record::PlacedSecret> {
    rec.egress
        .as_ref()
        .and_then(|e| e.secrets.clone())
        .unwrap_or_default()
}

/// The certificate of VM `name`'s proxy CA (PEM), when its proxy made one.
pub fn ca_pem(name: &str) -> Option<String> {
    std::fs::read_to_string(vm::runtime_dir(name).join(CA_FILE)).ok()
}

/// Remembers that VM `name`'s guest trusts its proxy's CA now.
pub fn mark_trusted(name: &str) -> Result<(), OpError> {
    let vm_name = name.to_string();
    crate::state::registry::shared().update(move |vms| {
        if let Some(e) = vms.get_mut(&vm_name).and_then(|r| r.egress.as_mut()) {
            e.trusted = Some(true);
        }
        Ok::<_, crate::state::registry::RegistryError>(())
    })?;
    Ok(())
}

/// The environment that points programs at the proxy.
pub fn proxy_env() -> [(&'static str, &'static str); 5] {
    [
        ("http_proxy", GUEST_URL),
        ("https_proxy", GUEST_URL),
        ("HTTP_PROXY", GUEST_URL),
        ("HTTPS_PROXY", GUEST_URL),
        ("no_proxy", "localhost,127.0.0.1,::1"),
    ]
}
