//! guest_exec as one typed request: its checks (env names, cwd), the egress proxy's
//! environment added for a VM with network rules, then a foreground run ([`run`]: output at
//! the end, or live) or a background start ([`start`]). The tools layer only parses
//! arguments into an [`ExecRequest`].

use std::time::Duration;

use super::background::{self, Started};
use super::spool::{self, Launch};
use super::{run_program, Executed};
use crate::ops::error::OpError;
use crate::ops::work::Work;

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

/// The request's environment, checked, with the egress proxy's added where the VM has rules.
fn environment(req: &ExecRequest) -> Result<Vec<(String, String)>, OpError> {
    spool::check_env(&req.env)?;
    if let Some(c) = &req.cwd {
        spool::check_cwd(c)?;
    }
    Ok(crate::ops::vm::egress::guest_env(
        &req.name,
        req.env.clone(),
    ))
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

/// Runs the program in the foreground: its output and exit code once it ends (or its timeout).
pub fn run(ctx: &dyn Work, req: &ExecRequest) -> Result<Executed, OpError> {
    let env = environment(req)?;
    run_program(ctx, &req.name, &program(req, &env), req.timeout, req.live)
}

/// Starts the program in the background: a handle for guest_exec_status and guest_exec_kill.
pub fn start(req: &ExecRequest) -> Result<Started, OpError> {
    let env = environment(req)?;
    background::start(&req.name, &program(req, &env))
}
