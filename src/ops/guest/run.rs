//! Running programs in a guest on behalf of other tools (sandbox_vm's cloud-init wait,
//! image_prepare): the same bounded guest_exec as the tool, and the waits built on it.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::ops::error::OpError;
use crate::ops::vm::agent::{AgentWait, CloudInitSeen};
use crate::ops::vm::cloud_init::{CloudInitOut, Waited};
use crate::ops::work::Work;

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
    let out = crate::ops::guest::exec(ctx, name, command, args, None, timeout)?;
    Ok(Ran {
        exitcode: out.exitcode,
        stdout: out.stdout,
        stderr: out.stderr,
    })
}

/// True when a [`wait_cloud_init`] report says cloud-init found no datasource (`cloud-init
/// status` names it `none`; its detail `DataSourceNone`).
pub fn saw_no_datasource(waited: &Waited) -> bool {
    let report = &waited.report;
    report["datasource"].as_str() == Some("none")
        || report["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("DataSourceNone"))
}

/// launch_vm's `wait_cloud_init`: waits for VM `name`'s agent, then for cloud-init, within
/// `wait` in all; with what the console said about cloud-init while the agent was awaited.
/// Whatever keeps the agent from answering is an error that says so (the VM keeps running:
/// launch_vm's VMs are the caller's).
pub fn agent_then_cloud_init(
    ctx: &dyn Work,
    name: &str,
    wait: Duration,
) -> Result<(Waited, CloudInitSeen), OpError> {
    let start = Instant::now();
    let rec = crate::ops::vm::records::lookup(name)?;
    let seeded = rec.cloud_init.is_some();
    let (how, saw) = crate::ops::vm::agent::wait_for_agent(ctx, name, &rec, wait)?;
    let why = match how {
        AgentWait::Ready => {
            let left = wait.saturating_sub(start.elapsed());
            let waited = wait_cloud_init(ctx, name, left)?;
            return Ok((waited, saw));
        }
        AgentWait::TimedOut => format!(
            "the guest agent of VM {name:?} did not answer within {} s (wait_cloud_init_s), so \
             cloud-init's end cannot be read",
            wait.as_secs()
        ),
        AgentWait::NoAgent(f) => crate::ops::vm::agent::no_agent_reason(name, &f, seeded),
        AgentWait::Fatal(f) => format!("{} before cloud-init finished", f.describe()),
    };
    Err(OpError::host(format!(
        "{why}. VM {name:?} is still running: vm_serial_read shows its console; stop_vm it when \
         done"
    )))
}

/// Adds a [`wait_cloud_init`] report to a launch result: beside what the launch recorded in
/// `cloud_init` (instance id, seed), and its problem, if any, to `warnings` (once: a module
/// the console already named has its warning).
pub fn report_cloud_init(
    warnings: &mut Vec<String>,
    cloud_init: &mut Option<CloudInitOut>,
    mut waited: Waited,
    saw: &CloudInitSeen,
) {
    add_failed_modules(&mut waited, saw);
    let named = saw.failed_modules();
    let new = waited.failed_modules.iter().any(|x| !named.contains(x));
    if let Some(problem) = cloud_init_problem(&waited) {
        if new || named.is_empty() {
            warnings.push(problem);
        }
    }
    cloud_init
        .get_or_insert_with(CloudInitOut::default)
        .add_waited(waited);
}

/// Sets a [`wait_cloud_init`] report's `failed_modules`: the modules its errors name and those
/// the console named while the agent was awaited.
pub fn add_failed_modules(waited: &mut Waited, saw: &CloudInitSeen) {
    let mut modules = saw.failed_modules();
    let had = std::mem::take(&mut waited.failed_modules);
    for m in had.into_iter().chain(report_modules(&waited.report)) {
        if !modules.contains(&m) {
            modules.push(m);
        }
    }
    waited.failed_modules = modules;
}

/// The modules `cloud-init status --format json`'s errors name: each error reads
/// `('module-name', SomeError(...))`.
fn report_modules(report: &Value) -> Vec<String> {
    report["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter_map(|e| {
            let rest = e.trim_start().strip_prefix("('")?;
            let name = &rest[..rest.find('\'')?];
            let plain = !name.is_empty()
                && name.len() <= 64
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            plain.then(|| name.to_string())
        })
        .collect()
}

/// What a [`wait_cloud_init`] report says went wrong, when cloud-init finished with status
/// `error` (a module failed) or `degraded` (newer cloud-init's recoverable errors): its own
/// error lines, for a warning the caller cannot miss.
pub fn cloud_init_problem(waited: &Waited) -> Option<String> {
    let status = waited.status.as_deref().unwrap_or_default();
    if !(status.starts_with("error") || status.starts_with("degraded")) {
        return None;
    }
    let report = &waited.report;
    let mut lines: Vec<String> = ["errors", "recoverable_errors"]
        .iter()
        .flat_map(|k| match &report[*k] {
            Value::Array(a) => a.iter().map(|e| e.to_string()).collect(),
            Value::Object(o) if !o.is_empty() => vec![Value::Object(o.clone()).to_string()],
            _ => Vec::new(),
        })
        .collect();
    if lines.is_empty() {
        lines.push("cloud-init gave no error lines".into());
    }
    let mut text = lines.join("; ");
    if text.len() > 800 {
        let cut = (0..=800)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        text.truncate(cut);
        text.push_str("...");
    }
    Some(format!(
        "cloud-init finished with status {status:?}: {text}. What the cloud_init asked for may \
         be incomplete; guest_exec `cloud-init status --long` says more"
    ))
}

/// Where cloud-init marks the end of its final stage.
pub const BOOT_FINISHED: &str = "/var/lib/cloud/instance/boot-finished";

/// Waits (at most `wait`, with progress) until cloud-init has finished in VM `name`, then
/// returns cloud-init's own report (`cloud-init status --format json`), or a clear error when
/// it did not finish in time.
pub fn wait_cloud_init(ctx: &dyn Work, name: &str, wait: Duration) -> Result<Waited, OpError> {
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
            return Err(OpError::timed_out(format!(
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
    Ok(Waited {
        wait_ms: start.elapsed().as_millis() as u64,
        exitcode: status.exitcode,
        status: report
            .get("status")
            .and_then(Value::as_str)
            .map(str::to_string),
        report,
        failed_modules: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cloud-init status --format json` of Debian 12's cloud-init 22.4 after `packages`
    /// failed for want of a network.
    const FAILED: &str = r#"{"boot_status_code": "enabled-by-generator",
        "datasource": "nocloud", "detail": "DataSourceNoCloud [seed=/dev/sr0][dsmode=net]",
        "errors": ["('package-update-upgrade-install', ProcessExecutionError(\"Unexpected error while running command.\"))"],
        "last_update": "Thu, 01 Jan 1970 00:01:17 +0000", "status": "error"}"#;

    #[test]
    fn a_failed_module_is_named_and_a_clean_finish_says_nothing() {
        let waited = |status: &str, report: Value| Waited {
            status: Some(status.to_string()),
            report,
            ..Waited::default()
        };
        let failed = waited("error", serde_json::from_str(FAILED).unwrap());
        let p = cloud_init_problem(&failed).unwrap();
        assert!(p.contains("status \"error\""), "{p}");
        assert!(p.contains("package-update-upgrade-install"), "{p}");
        let degraded = waited(
            "degraded done",
            json!({"recoverable_errors": {"WARNING": ["x failed"]}}),
        );
        assert!(cloud_init_problem(&degraded).unwrap().contains("x failed"));
        let done = waited("done", json!({"errors": []}));
        assert_eq!(cloud_init_problem(&done), None);
        let long = waited("error", json!({"errors": ["é".repeat(900)]}));
        assert!(cloud_init_problem(&long).unwrap().len() < 1200);
    }

    #[test]
    fn the_failed_modules_are_read_from_the_errors_and_the_console() {
        let mut waited = Waited {
            status: Some("error".into()),
            report: serde_json::from_str(FAILED).unwrap(),
            ..Waited::default()
        };
        let saw = CloudInitSeen {
            failures: vec![crate::cloudinit::console::ModuleFailure {
                module: "resizefs".into(),
                line: "Running module resizefs (...) failed".into(),
            }],
            finished: None,
        };
        add_failed_modules(&mut waited, &saw);
        assert_eq!(
            waited.failed_modules,
            ["resizefs", "package-update-upgrade-install"]
        );
        let odd = json!({"errors": ["('a b', X)", "no quote", "('', Y)", 3]});
        assert!(report_modules(&odd).is_empty());
    }
}
