//! Guest-agent operations several tools use: a session to a VM's agent, a program run to its
//! end (guest_exec, cloud-init waits, image_prepare, clones' clocks), the agent's and OS's
//! identity.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::records::lookup;
use super::session;
use crate::b64;
use crate::mcp::tool::{ToolCtx, ToolError};
use crate::qemu::qga::{Qga, QgaError};

/// How long guest_exec holds one agent session while polling before letting others in. While
/// no host is connected qemu-ga drains the program's output slowly, so stay connected most of
/// the time, but never keep other agent calls to this VM waiting for more than about a second.
const EXEC_POLL_WINDOW: Duration = Duration::from_secs(1);

/// Runs `f` on a synced agent session of VM `name`; failures are explained for that VM.
pub fn with_guest<T>(
    name: &str,
    cmd: &str,
    f: impl FnOnce(&mut Qga) -> Result<T, QgaError>,
) -> Result<T, ToolError> {
    let rec = lookup(name)?;
    session::agent(name, &rec, cmd, |q| Ok(f(q)?))
}

/// Most bytes of stdout or stderr that guest_exec returns; the rest is cut and flagged.
/// The agent itself keeps 16 MiB, far more than an agent can read in a tool result.
pub const MAX_OUTPUT: usize = 1024 * 1024;

/// Decodes one captured stream, capped at [`MAX_OUTPUT`]; true when it was cut here or by the
/// agent.
fn decode_stream(v: &Value, data: &str, flag: &str) -> (String, bool) {
    let mut bytes = v
        .get(data)
        .and_then(Value::as_str)
        .and_then(|s| b64::decode(s).ok())
        .unwrap_or_default();
    let mut cut = v.get(flag).and_then(Value::as_bool).unwrap_or(false);
    if bytes.len() > MAX_OUTPUT {
        bytes.truncate(MAX_OUTPUT);
        cut = true;
    }
    (String::from_utf8_lossy(&bytes).into_owned(), cut)
}

/// Runs `command argv...` in VM `name` through its agent (with `stdin`, within `timeout`,
/// with progress), and returns guest_exec's result: exit code or signal, capped output.
pub fn exec(
    ctx: &ToolCtx,
    name: &str,
    command: &str,
    argv: &[&str],
    stdin: Option<&str>,
    timeout: Duration,
) -> Result<Value, ToolError> {
    let name = name.to_string();
    let mut req = json!({"path": command, "arg": argv, "capture-output": true});
    if let Some(input) = stdin {
        req["input-data"] = json!(b64::encode(input.as_bytes()));
    }
    let started = Instant::now();
    let deadline = started + timeout;
    let mut slice = Duration::from_millis(5);
    let mut pid: Option<i64> = None;
    loop {
        // Poll over one session held for a window, sleeping while connected: while no host
        // client is connected, qemu-ga throttles its main loop (it sleeps on every wake-up of
        // the disconnected virtio port), and drains the program's output pipes so slowly that
        // 1 MB of stdout takes ~10 s instead of ~0.4 s and a chatty program stalls on a full
        // pipe. The first window also starts the program, so a quick command needs one
        // session (a reconnect right after a hang-up costs ~100 ms). Releasing the session
        // between windows lets other callers take turns.
        let label = if pid.is_none() {
            "guest-exec"
        } else {
            "guest-exec-status"
        };
        let window_end = Instant::now() + EXEC_POLL_WINDOW;
        let step = with_guest(&name, label, |q| {
            let pid = match pid {
                Some(p) => p,
                None => {
                    let r =
                        q.execute_within("guest-exec", Some(req.clone()), Duration::from_secs(30))?;
                    let p = r.get("pid").and_then(Value::as_i64).ok_or_else(|| {
                        QgaError::Garbage(format!("guest-exec returned no pid: {r}"))
                    })?;
                    ctx.log.log(
                        "info",
                        &format!("guest_exec in {name}: {command} (guest pid {p})"),
                    );
                    pid = Some(p);
                    p
                }
            };
            loop {
                // The final status carries the whole capture (up to 16 MiB of stdout and of
                // stderr, in base64): under TCG that reply alone can take several seconds.
                let status = q.execute_within(
                    "guest-exec-status",
                    Some(json!({"pid": pid})),
                    crate::qemu::qga::COMMAND_TIMEOUT,
                )?;
                if status.get("exited").and_then(Value::as_bool) == Some(true) {
                    return Ok(Some(status));
                }
                ctx.progress(
                    started.elapsed().as_secs_f64(),
                    Some(timeout.as_secs_f64()),
                    &format!("{command} running in the guest (pid {pid})"),
                );
                let now = Instant::now();
                if ctx.cancelled() || now >= deadline || now >= window_end {
                    return Ok(None);
                }
                std::thread::sleep(slice.min(deadline - now));
                slice = (slice * 2).min(Duration::from_millis(250));
            }
        })?;
        let pid = pid.unwrap_or(0);
        if let Some(status) = step {
            let stdout = decode_stream(&status, "out-data", "out-truncated");
            let stderr = decode_stream(&status, "err-data", "err-truncated");
            return Ok(json!({
                "name": name,
                "pid": pid,
                "exitcode": status.get("exitcode").and_then(Value::as_i64),
                "signal": status.get("signal").and_then(Value::as_i64),
                "stdout": stdout.0,
                "stderr": stderr.0,
                "stdout_truncated": stdout.1,
                "stderr_truncated": stderr.1,
                "duration_ms": started.elapsed().as_millis() as u64,
            }));
        }
        if ctx.cancelled() {
            return Err(ToolError::new(format!(
                "cancelled; {command} is still running in the guest as pid {pid}"
            )));
        }
        if Instant::now() >= deadline {
            return Err(ToolError::new(format!(
                "{command} did not finish within {} s; it is still running in the guest as pid \
                 {pid} (stop it with guest_exec command=\"kill\" args=[\"{pid}\"])",
                timeout.as_secs_f64()
            )));
        }
        // Between windows, give other agent callers a moment to take the session.
        std::thread::sleep(
            Duration::from_millis(20).min(deadline.saturating_duration_since(Instant::now())),
        );
    }
}

/// The agent's version, the guest OS and the agent commands enabled: guest_info's result.
pub fn info(name: &str) -> Result<Value, ToolError> {
    let (info, os) = with_guest(name, "guest-info", |q| {
        let info = q.execute_within("guest-info", None, Duration::from_secs(10))?;
        let os = q
            .execute_within("guest-get-osinfo", None, Duration::from_secs(10))
            .ok();
        Ok((info, os))
    })?;
    let mut enabled = Vec::new();
    let mut disabled = Vec::new();
    for c in info
        .get("supported_commands")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let n = c
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if c.get("enabled").and_then(Value::as_bool).unwrap_or(true) {
            enabled.push(n);
        } else {
            disabled.push(n);
        }
    }
    Ok(json!({
        "name": name,
        "version": info.get("version").and_then(Value::as_str).unwrap_or(""),
        "os": os,
        "enabled_commands": enabled,
        "disabled_commands": disabled,
    }))
}
