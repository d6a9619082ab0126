//! guest_exec as one typed request: its checks (env names, cwd), the egress proxy's
//! environment added for a VM with network rules, then a foreground run ([`run`]: output at
//! the end, or live) or a background start ([`start`]). The tools layer only parses
//! arguments into an [`ExecRequest`].

use std::time::Duration;

use serde::Serialize;

use super::background::{self, Started};
use super::spool::{self, Launch};
use super::{run_program, Executed};
use crate::ops::error::OpError;
use crate::ops::vm::egress;
use crate::ops::work::Work;
use crate::state::record::Record;

/// guest_exec.
#[derive(Debug, Clone, Default)]
pub struct ExecRequest {
    /// The VM.
    pub name: String,
    /// The program.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Text for its standard input.
    pub stdin: Option<String>,
    /// Added to its environment.
    pub env: Vec<(String, String)>,
    /// Its working folder.
    pub cwd: Option<String>,
    /// How long a foreground run may take.
    pub timeout: Duration,
    /// Stream its output in the call's progress while it runs.
    pub live: bool,
}

/// The request's environment, checked, with the egress proxy's added where the VM has rules
/// (and, where it has secrets, the guest made to trust the proxy's CA first).
fn environment(ctx: &dyn Work, req: &ExecRequest) -> Result<Vec<(String, String)>, OpError> {
    spool::check_env(&req.env)?;
    if let Some(c) = &req.cwd {
        spool::check_cwd(c)?;
    }
    let rec = crate::state::registry::shared()
        .load()
        .get(&req.name)
        .cloned();
    if let Some(rec) = &rec {
        trust_proxy(ctx, &req.name, rec)?;
    }
    Ok(egress::guest_env(rec.as_ref(), req.env.clone()))
}

/// Once per VM with secrets: writes its proxy's CA certificate into the guest (as root, with
/// the guest's own shell), so that TLS to the secrets' hosts, which the proxy intercepts,
/// verifies. The CA's key never leaves the proxy.
fn trust_proxy(ctx: &dyn Work, name: &str, rec: &Record) -> Result<(), OpError> {
    let trusted = rec.egress.as_ref().and_then(|e| e.trusted) == Some(true);
    if trusted || egress::secrets_of(rec).is_empty() {
        return Ok(());
    }
    let pem = egress::ca_pem(name).ok_or_else(|| {
        OpError::not_found(format!(
            "VM {name:?} has secrets, and its egress proxy's CA certificate is gone (the proxy \
             is not running?); vm_info shows the proxy"
        ))
    })?;
    let args = vec!["-c".to_string(), egress::TRUST_SCRIPT.to_string()];
    let launch = Launch {
        command: "/bin/sh",
        args: &args,
        stdin: Some(&pem),
        ..Launch::default()
    };
    let ran = run_program(ctx, name, &launch, Duration::from_secs(30), false);
    if !matches!(&ran, Ok(r) if r.exitcode == Some(0)) {
        // A root without a shell (or whose shell failed): the two files through the agent,
        // without the system bundle.
        let said = match &ran {
            Ok(r) => r.stderr.trim().to_string(),
            Err(e) => e.to_string(),
        };
        for path in [egress::GUEST_CA_FILE, egress::GUEST_CA_BUNDLE] {
            super::files::write(&super::files::WriteRequest {
                name: name.to_string(),
                path: path.to_string(),
                data: pem.as_bytes().to_vec(),
                append: false,
            })
            .map_err(|e| {
                OpError::host(format!(
                    "cannot make VM {name:?} trust its egress proxy's CA (/bin/sh: {said}; \
                     writing {path}: {e}); TLS to its secrets' hosts will not verify"
                ))
            })?;
        }
    }
    egress::mark_trusted(name)
}

/// The request as the program to start, with `env` (checked, egress added) as its environment.
fn program<'a>(req: &'a ExecRequest, env: &'a [(String, String)]) -> Launch<'a> {
    Launch {
        command: &req.command,
        args: &req.args,
        stdin: req.stdin.as_deref(),
        env,
        cwd: req.cwd.as_deref(),
        image_user: true,
        ..Launch::default()
    }
}

/// guest_exec's result: the program's end, or a handle to it in the background.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Execution {
    /// It ran to its end.
    Ran(Executed),
    /// It runs on in the background.
    Started(Started),
}

impl crate::schema::Schema for Execution {
    fn schema() -> serde_json::Value {
        crate::schema::any_of(vec![Executed::schema(), Started::schema()])
    }
}

/// guest_exec: runs the program to its end, or with `background` starts it.
pub fn exec(ctx: &dyn Work, req: &ExecRequest, background: bool) -> Result<Execution, OpError> {
    if background {
        start(ctx, req).map(Execution::Started)
    } else {
        run(ctx, req).map(Execution::Ran)
    }
}

/// Runs the program in the foreground: its output and exit code once it ends (or its timeout).
pub fn run(ctx: &dyn Work, req: &ExecRequest) -> Result<Executed, OpError> {
    let env = environment(ctx, req)?;
    run_program(ctx, &req.name, &program(req, &env), req.timeout, req.live)
}

/// Starts the program in the background: a handle for guest_exec_status and guest_exec_kill.
pub fn start(ctx: &dyn Work, req: &ExecRequest) -> Result<Started, OpError> {
    let env = environment(ctx, req)?;
    background::start(&req.name, &program(req, &env))
}
