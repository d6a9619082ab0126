//! image_prepare: a stock cloud image turned into an agent-ready base for sandboxes. The
//! source is booted once as a sandbox (an overlay: the source is never written) with a seed
//! that installs and enables qemu-guest-agent plus the caller's own cloud-init; once cloud-init
//! has finished, its state and the machine-id are cleaned so every sandbox from the result is a
//! new instance, the guest is shut down cleanly, and the overlay is flattened into a compact
//! `dest`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};

use crate::cloudinit::CloudInit;
use crate::ops::error::OpError;
use crate::ops::guest::run as guest_run;
use crate::ops::sandbox::request::SandboxRequest;
use crate::ops::sandbox::result::Sandboxed;
use crate::ops::vm::agent::AgentWait;
use crate::ops::vm::cloud_init::CloudInitOut;
use crate::ops::vm::launch_args::LaunchArgs;
use crate::ops::vm::stop;
use crate::ops::work::Work;
use crate::qemu::img;

/// Installs qemu-guest-agent where it is missing (apt, dnf, apk) and starts it: portable
/// enough for the catalog's distributions, and a no-op on images that already have it.
const AGENT_SETUP: &str = "command -v qemu-ga >/dev/null 2>&1 || \
    (command -v apt-get >/dev/null && apt-get update && apt-get install -y qemu-guest-agent) || \
    (command -v dnf >/dev/null && dnf install -y qemu-guest-agent) || \
    (command -v apk >/dev/null && apk add qemu-guest-agent); \
    systemctl enable --now qemu-guest-agent 2>/dev/null || \
    (rc-update add qemu-guest-agent default && rc-service qemu-guest-agent start)";

/// Forgets this boot: cloud-init runs again on the next one, with a new machine-id.
/// /etc/machine-id is left present and empty whatever cloud-init did with it (22.4 removes it;
/// newer versions write "uninitialized"): a missing file makes every boot a systemd first boot,
/// whose systemd-firstboot prompts on the console and stalls the boot into emergency mode,
/// while an empty one only asks for a new ID (machine-id(5)), as Debian's own images ship it.
const CLEAN: &str = "(cloud-init clean --logs --machine-id 2>/dev/null || \
    cloud-init clean --logs) && rm -f /etc/machine-id && : > /etc/machine-id && \
    chmod 0444 /etc/machine-id && rm -f /var/lib/dbus/machine-id && sync && \
    test -f /etc/machine-id && ! test -s /etc/machine-id && ! test -L /etc/machine-id";

/// image_prepare's request; `source` and `dest` already checked against the roots.
#[derive(Debug, Clone, Default)]
pub struct PrepareRequest {
    /// The stock image read (never written).
    pub source: PathBuf,
    /// The prepared image written.
    pub dest: PathBuf,
    /// Replace an existing dest.
    pub overwrite: bool,
    /// How long the boot may take (agent and cloud-init), seconds.
    pub timeout_s: f64,
    /// The caller's own cloud_init (structured fields only).
    pub cloud_init: Option<Value>,
    /// The temporary VM's launch parameters (memory, vCPUs, arch, firmware, kernel, ...).
    pub launch: LaunchArgs,
    /// The overlay's size.
    pub disk_size: Option<String>,
    /// Network for the guest (to install the agent).
    pub allow_network: bool,
}

/// What image_prepare made (in this order).
#[derive(Debug, Clone, Serialize)]
pub struct Prepared {
    /// The prepared image.
    pub dest: String,
    /// Always qcow2.
    pub format: &'static str,
    /// Its size.
    pub bytes: u64,
    /// The guest agent's version.
    pub agent_version: String,
    /// The guest OS as the agent reports it (absent when it does not).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub os: Option<Value>,
    /// cloud-init's report of the boot.
    pub cloud_init: CloudInitOut,
    /// What went wrong but did not stop it.
    pub warnings: Vec<String>,
    /// The stock image.
    pub source: String,
    /// How long it took.
    pub duration_ms: u64,
}

/// Boots, cleans, stops and flattens; the temporary VM goes whatever happens.
pub fn prepare(ctx: &dyn Work, req: &PrepareRequest) -> Result<Prepared, OpError> {
    let started = std::time::Instant::now();
    let (source, dest) = (&req.source, &req.dest);
    if dest == source {
        return Err(OpError::new(
            "dest and source are the same file; choose another dest",
        ));
    }
    if dest.exists() && !req.overwrite {
        return Err(OpError::new(format!(
            "{} already exists; pass overwrite=true to replace it",
            dest.display()
        )));
    }
    let timeout = req.timeout_s.clamp(30.0, 7200.0);
    let ci = seed_with_agent(req.cloud_init.as_ref())?;
    let name = format!(
        "prepare-{}-{}",
        std::process::id(),
        crate::clock::now_secs()
    );
    // 1. Boot on an overlay, wait for the agent and for cloud-init.
    let boot = SandboxRequest {
        name: Some(name.clone()),
        base_image: Some(source.display().to_string()),
        disk_size: req.disk_size.clone(),
        launch: LaunchArgs {
            port_forwards: Some(Vec::new()),
            cloud_init: Some(ci),
            ..req.launch.clone()
        },
        allow_network: req.allow_network,
        wait_agent_s: Some(timeout),
        wait_cloud_init: true,
        wait_cloud_init_s: Some(timeout),
        ..SandboxRequest::default()
    };
    ctx.progress(0.0, None, "booting the source image on an overlay");
    let booted = crate::ops::sandbox::boot(ctx, &boot);
    let result = booted.and_then(|(out, waited, _)| {
        if let AgentWait::Fatal(f) = waited {
            return Err(OpError::new(format!(
                "{} while the prepared VM {name:?} booted; nothing was written to dest. Last \
                 serial output: {}",
                f.describe(),
                crate::ops::sandbox::destroy::serial_tail(&out.launched, 8)
            )));
        }
        finish(ctx, &name, &out, dest)
    });
    // 5. The temporary VM goes, whatever happened.
    crate::ops::sandbox::destroy::destroy_quietly(ctx, &name);
    let mut out = result?;
    out.source = source.display().to_string();
    out.duration_ms = started.elapsed().as_millis() as u64;
    Ok(out)
}

/// The caller's cloud_init, checked, with the agent's installation added to its runcmd.
fn seed_with_agent(given: Option<&Value>) -> Result<Value, OpError> {
    let mut ci = match given {
        None | Some(Value::Null) => json!({}),
        Some(v) => v.clone(),
    };
    CloudInit::parse(&ci)?;
    if ci.get("user_data").is_some() {
        return Err(OpError::new(
            "image_prepare adds its own runcmd to install the guest agent, so it takes the \
             structured cloud_init fields, not raw user_data",
        ));
    }
    if let Some(m) = ci.as_object_mut() {
        let runcmd = m.entry("runcmd").or_insert_with(|| json!([]));
        if let Some(list) = runcmd.as_array_mut() {
            list.push(json!(["sh", "-c", AGENT_SETUP]));
        }
    }
    Ok(ci)
}

/// Steps 2-4: the agent and OS reported, the instance cleaned, the guest stopped, the overlay
/// flattened into `dest`.
fn finish(
    ctx: &dyn Work,
    name: &str,
    booted: &Sandboxed,
    dest: &Path,
) -> Result<Prepared, OpError> {
    if !booted.agent_ready {
        let serial = crate::ops::sandbox::destroy::serial_tail(&booted.launched, 8);
        let console = booted
            .launched
            .cloud_init
            .as_ref()
            .and_then(|c| c.console.as_ref());
        if let Some(ds) = console.map(|c| c.datasource.as_str()) {
            return Err(OpError::new(format!(
                "cloud-init finished in the prepared VM {name:?} (datasource {ds}) but the guest \
                 agent never started: installing qemu-guest-agent failed. The guest needs \
                 allow_network=true and a package mirror it can reach (its own, or one written \
                 into its sources through cloud_init write_files). Nothing was written to dest. \
                 Last serial output: {serial}"
            )));
        }
        return Err(OpError::new(format!(
            "the guest agent never answered in the prepared VM {name:?} within timeout_s and \
             cloud-init never reported finishing on the serial console; the image may lack \
             cloud-init, a serial console, or network to install qemu-guest-agent \
             (allow_network). Nothing was written to dest. Last serial output: {serial}"
        )));
    }
    let overlay = booted.overlay.clone().unwrap_or_default();
    ctx.progress(1.0, None, "cloud-init finished; reading the agent and OS");
    let info = crate::ops::guest::info(name)?;
    ctx.progress(2.0, None, "cleaning cloud-init state and the machine-id");
    let cleaned = guest_run::run(ctx, name, "sh", &["-c", CLEAN], Duration::from_secs(120))?;
    if cleaned.exitcode != Some(0) {
        return Err(OpError::new(format!(
            "cleaning the guest (cloud-init's state, /etc/machine-id left present and empty) \
             failed (exit {:?}); nothing was written to dest: {}",
            cleaned.exitcode,
            cleaned.stderr.trim()
        )));
    }
    ctx.progress(3.0, None, "shutting the guest down");
    stop::stop(ctx, name, false, Duration::from_secs(180)).map_err(|e| {
        OpError::new(format!(
            "the prepared guest did not shut down cleanly: {}",
            e.0
        ))
    })?;
    ctx.progress(4.0, None, "writing the compact image");
    let tmp = dest.with_file_name(format!(
        ".{}.prepare-{}",
        dest.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    let converted = img::convert(Path::new(&overlay), "qcow2", &tmp, "qcow2", false, &|| {
        ctx.cancelled()
    });
    if let Err(e) = converted.map_err(OpError::from).and_then(|()| {
        std::fs::rename(&tmp, dest)
            .map_err(|e| OpError::new(format!("cannot place {}: {e}", dest.display())))
    }) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let bytes = std::fs::metadata(dest).map(|m| m.len()).unwrap_or(0);
    Ok(Prepared {
        dest: dest.display().to_string(),
        format: "qcow2",
        bytes,
        agent_version: info.version,
        os: info.os,
        cloud_init: booted.launched.cloud_init.clone().unwrap_or_default(),
        warnings: booted.launched.warnings.clone(),
        source: String::new(),
        duration_ms: 0,
    })
}
