//! Running programs in a guest on behalf of other tools (sandbox_vm's cloud-init wait,
//! image_prepare): the same bounded guest_exec as the tool, and the waits built on it.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::error::OpError;
use super::work::Work;

/// What a program run in the guest did.
#[derive(Debug, Clone)]
pub struct Ran {
    /// Its exit code (None when a signal ended it).
    pub exitcode: Option<i64>,
    /// Its standard output (capped like guest_exec's).
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

/// Runs `command args...` in VM `name` through its agent, within `timeout`.
pub fn run(
    ctx: &dyn Work,
    name: &str,
    command: &str,
    args: &[&str],
    timeout: Duration,
) -> Result<Ran, OpError> {
    let out = super::guest::exec(ctx, name, command, args, None, timeout)?;
    Ok(Ran {
        exitcode: out.get("exitcode").and_then(Value::as_i64),
        stdout: out["stdout"].as_str().unwrap_or_default().to_string(),
        stderr: out["stderr"].as_str().unwrap_or_default().to_string(),
    })
}

/// True when a [`wait_cloud_init`] report says cloud-init found no datasource (`cloud-init
/// status` names it `none`; its detail `DataSourceNone`).
pub fn saw_no_datasource(waited: &Value) -> bool {
    let report = &waited["report"];
    report["datasource"].as_str() == Some("none")
        || report["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("DataSourceNone"))
}

/// Where cloud-init marks the end of its final stage.
pub const BOOT_FINISHED: &str = "/var/lib/cloud/instance/boot-finished";

/// Waits (at most `wait`, with progress) until cloud-init has finished in VM `name`, then
/// returns cloud-init's own report (`cloud-init status --format json`), or a clear error when
/// it did not finish in time.
pub fn wait_cloud_init(ctx: &dyn Work, name: &str, wait: Duration) -> Result<Value, OpError> {
    let start = Instant::now();
    let deadline = start + wait;
    loop {
        ctx.check_cancel()?;
        let probe = run(
            ctx,
            name,
            "test",
            &["-e", BOOT_FINISHED],
            Duration::from_secs(10),
        );
        if matches!(
            probe,
            Ok(Ran {
                exitcode: Some(0),
                ..
            })
        ) {
            break;
        }
        if Instant::now() >= deadline {
            return Err(OpError::new(format!(
                "cloud-init in VM {name:?} did not finish within {} s ({BOOT_FINISHED} is not \
                 there yet); the VM is running: check vm_serial_read, or run `cloud-init status \
                 --long` with guest_exec",
                wait.as_secs()
            )));
        }
        ctx.progress(
            start.elapsed().as_secs_f64(),
            Some(wait.as_secs_f64()),
            "waiting for cloud-init to finish",
        );
        let left = deadline.saturating_duration_since(Instant::now());
        std::thread::sleep(Duration::from_secs(2).min(left));
    }
    let status = run(
        ctx,
        name,
        "cloud-init",
        &["status", "--format", "json"],
        Duration::from_secs(60),
    )?;
    let report: Value = serde_json::from_str(status.stdout.trim()).unwrap_or_else(
        |_| json!({"status": "unknown", "output": status.stdout, "stderr": status.stderr}),
    );
    Ok(json!({
        "finished": true,
        "wait_ms": start.elapsed().as_millis() as u64,
        "exitcode": status.exitcode,
        "status": report.get("status").cloned().unwrap_or(Value::Null),
        "report": report,
    }))
}
