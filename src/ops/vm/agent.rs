//! Waiting for a guest's agent: polled in short slices, ended early when QEMU dies, when the
//! console says the guest cannot go on (emergency or rescue mode, a kernel panic), or when
//! cloud-init's final message says it finished without the agent; cloud-init modules that
//! failed on the way are noted, not fatal; and what such a guest tells the caller (the cause
//! and the fix).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cloudinit::console;
use crate::ops::error::OpError;
use crate::ops::vm::cloud_init::CloudInitOut;
use crate::ops::work::Work;
use crate::qemu::vm;
use crate::qemu::{process, qga};
use crate::state::record::text;

/// Longest one agent probe may take while waiting; the wait never overshoots by more.
const POLL_SLICE: Duration = Duration::from_millis(500);

/// How a wait for the guest agent ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentWait {
    /// The agent answered.
    Ready,
    /// The wait ran out.
    TimedOut,
    /// cloud-init printed its final message and the agent still did not answer
    /// [`AFTER_CLOUD_INIT`] later: it is not coming (a stock image without qemu-guest-agent, or
    /// a seed that installs it never seen or failed).
    NoAgent(console::Finished),
    /// The console said the guest cannot go on by itself (emergency or rescue mode, a kernel
    /// panic) and the agent did not answer after it.
    Fatal(console::Fatal),
}

/// What the console said about cloud-init while the wait went on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CloudInitSeen {
    /// Modules that failed (a module named twice is kept once).
    pub failures: Vec<console::ModuleFailure>,
    /// cloud-init's final message, if it came.
    pub finished: Option<console::Finished>,
}

impl CloudInitSeen {
    fn note(&mut self, seen: &console::Seen) {
        for f in &seen.failures {
            // The module's own warning and cloud-init's generic one name it twice; a bare
            // "status: error" adds nothing once a module is named.
            let known = self.failures.iter().any(|k| k.module == f.module)
                || (f.module.is_empty() && !self.failures.is_empty());
            if !known && self.failures.len() < 16 {
                self.failures.push(f.clone());
            }
        }
        if self.finished.is_none() {
            self.finished.clone_from(&seen.finished);
        }
    }

    /// The failed modules' names.
    pub fn failed_modules(&self) -> Vec<String> {
        self.failures
            .iter()
            .filter(|f| !f.module.is_empty())
            .map(|f| f.module.clone())
            .collect()
    }

    /// cloud-init's state as far as the console tells: `error` once a module failed, `done`
    /// once it finished, else `running`.
    pub fn status(&self) -> &'static str {
        match (self.failures.is_empty(), &self.finished) {
            (false, _) => "error",
            (true, Some(_)) => "done",
            (true, None) => "running",
        }
    }

    /// One warning per failed module, quoting cloud-init's line.
    pub fn warnings(&self, vm: &str) -> Vec<String> {
        self.failures
            .iter()
            .map(|f| {
                let what = if f.module.is_empty() {
                    "cloud-init reported an error".to_string()
                } else {
                    format!("cloud-init's module {} failed", f.module)
                };
                format!(
                    "{what} in VM {vm:?} (the console says: {:?}); the VM is up, but what \
                     that module does may not have happened: guest_exec `cloud-init status \
                     --long` says more",
                    f.line
                )
            })
            .collect()
    }

    /// Adds what was seen to a launch result: `warnings`, and `status` and `failed_modules`
    /// in its `cloud_init` object (made when the launch had none and cloud-init spoke).
    pub fn add_to(
        &self,
        warnings: &mut Vec<String>,
        cloud_init: &mut Option<CloudInitOut>,
        vm: &str,
    ) {
        warnings.extend(self.warnings(vm));
        let spoke = !self.failures.is_empty() || self.finished.is_some();
        if cloud_init.is_none() && !spoke {
            return;
        }
        let c = cloud_init.get_or_insert_with(CloudInitOut::default);
        c.status = Some(self.status().to_string());
        c.failed_modules = Some(self.failed_modules());
    }
}

/// How long the agent may take to answer once cloud-init has finished: whatever cloud-init
/// installs or enables has started by then.
const AFTER_CLOUD_INIT: Duration = Duration::from_secs(10);

/// Polls the agent in short slices until it answers, QEMU dies, the console says the guest
/// cannot go on, cloud-init finishes without it (read from the serial console), or `wait` runs
/// out; with what the console said about cloud-init meanwhile.
pub fn wait_for_agent(
    ctx: &dyn Work,
    name: &str,
    rec: &crate::state::registry::Record,
    wait: Duration,
) -> Result<(AgentWait, CloudInitSeen), OpError> {
    let mut saw = CloudInitSeen::default();
    let how = wait_noting(ctx, name, rec, wait, &mut saw)?;
    Ok((how, saw))
}

fn wait_noting(
    ctx: &dyn Work,
    name: &str,
    rec: &crate::state::registry::Record,
    wait: Duration,
    saw: &mut CloudInitSeen,
) -> Result<AgentWait, OpError> {
    let Some(sock_path) = text(&rec.qga_socket).map(PathBuf::from) else {
        return Ok(AgentWait::TimedOut);
    };
    let mut console = text(&rec.serial_log).map(|p| console::Watch::from_end(Path::new(p)));
    let mut cloud_init_done: Option<(Instant, console::Finished)> = None;
    let deadline = Instant::now() + wait;
    let start = Instant::now();
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(AgentWait::TimedOut);
        }
        ctx.check_cancel()?;
        if let Some(pid) = vm::pid(rec) {
            if !process::alive(pid) {
                let log = text(&rec.serial_log)
                    .map(|p| tail(Path::new(p), 5))
                    .unwrap_or_default();
                return Err(OpError::host(format!(
                    "QEMU for sandbox {name:?} exited while waiting for the guest agent. Last \
                     serial output: {log}"
                )));
            }
        }
        let slice = POLL_SLICE.min(deadline - now);
        let probe = qga::with_agent(&sock_path, slice, |q| {
            crate::qemu::agent_calls::ping(q, slice.max(Duration::from_millis(50)))
        });
        let seen = console
            .as_mut()
            .map(console::Watch::poll_all)
            .unwrap_or_default();
        saw.note(&seen);
        if probe.is_ok() {
            return Ok(AgentWait::Ready);
        }
        if let Some(fatal) = seen.fatal {
            // Checked once more: the console's word alone does not end a wait for an agent
            // that answers.
            let probe = qga::with_agent(&sock_path, POLL_SLICE, |q| {
                crate::qemu::agent_calls::ping(q, POLL_SLICE)
            });
            return Ok(if probe.is_ok() {
                AgentWait::Ready
            } else {
                AgentWait::Fatal(fatal)
            });
        }
        if cloud_init_done.is_none() {
            if let Some(f) = seen.finished {
                cloud_init_done = Some((Instant::now(), f));
            }
        }
        let what = match &cloud_init_done {
            Some((at, f)) if at.elapsed() >= AFTER_CLOUD_INIT => {
                return Ok(AgentWait::NoAgent(f.clone()))
            }
            Some(_) => "cloud-init has finished; waiting briefly for the guest agent",
            None => "waiting for the guest agent",
        };
        ctx.progress(
            start.elapsed().as_secs_f64(),
            Some(wait.as_secs_f64()),
            what,
        );
        let left = deadline.saturating_duration_since(Instant::now());
        std::thread::sleep(Duration::from_millis(100).min(left));
    }
}

/// What a guest that finished cloud-init without an agent tells the caller: the cause and the
/// fix. `seeded`: a cloud-init seed was attached.
pub fn no_agent_reason(name: &str, f: &console::Finished, seeded: bool) -> String {
    if seeded && f.no_datasource() {
        return unseen_seed_reason(name, &f.datasource);
    }
    format!(
        "cloud-init finished in VM {name:?} (datasource {}) and no guest agent answered {} s \
         later: the image has no running qemu-guest-agent (stock cloud images ship without it). \
         Make an agent-ready base with image_prepare, or install and enable qemu-guest-agent \
         through cloud_init (packages, with allow_network=true)",
        if f.datasource.is_empty() {
            "none"
        } else {
            &f.datasource
        },
        AFTER_CLOUD_INIT.as_secs()
    )
}

/// The cause and fix of a cloud-init that ran without the seed attached to it.
pub fn unseen_seed_reason(name: &str, datasource: &str) -> String {
    format!(
        "the guest of VM {name:?} never saw its cloud-init seed: cloud-init ran with no \
         datasource ({}), so hostname, users, runcmd and write_files were not applied. The seed \
         is a CD-ROM labelled cidata on a virtio-scsi controller; the guest needs the \
         virtio_scsi, sr_mod and isofs drivers (every distribution cloud kernel has them) and a \
         cloud-init whose datasource_list includes NoCloud. Check with guest_exec `lsblk` or \
         vm_serial_read; an image without them needs its kernel or cloud-init configuration \
         changed",
        if datasource.is_empty() {
            "DataSourceNone"
        } else {
            datasource
        }
    )
}

/// The last `lines` lines of a serial log, joined with ` | ` (bounded: its last 4 KiB).
pub fn tail(path: &Path, lines: usize) -> String {
    crate::state::tail::read_last(path, 4096)
        .map(|t| t.last_lines(lines).join(" | "))
        .unwrap_or_else(|_| "(no serial log)".into())
}
