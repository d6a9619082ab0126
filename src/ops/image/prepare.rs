//! image_prepare: a stock cloud image turned into an agent-ready base for sandboxes. The
//! source is booted once as a sandbox (an overlay: the source is never written) with a seed
//! that enables a guest agent plus the caller's own cloud-init: mcqemu-agent carried on the
//! seed itself (no network needed), or qemu-guest-agent, kept where the image has it and
//! installed from the guest's package mirror otherwise ([`AgentChoice`]); once cloud-init
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
use crate::ops::sandbox::request::{Root, SandboxRequest};
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

/// Copies mcqemu-agent off the seed (a file of its own there, beside user-data: the seed is
/// mounted read-only by its label for the copy) and enables it: qemu-ga, if the image has one,
/// is stopped and masked (both cannot serve the one port), then the unit (from write_files)
/// is started; a guest without systemd gets the agent started in the background.
const OURS_SETUP: &str = "m=$(mktemp -d) && \
    dev=$(blkid -L cidata 2>/dev/null || blkid -L CIDATA 2>/dev/null || echo /dev/sr0) && \
    mount -o ro \"$dev\" \"$m\" && cp \"$m/mcqemu-agent\" /usr/local/sbin/mcqemu-agent && \
    chmod 0755 /usr/local/sbin/mcqemu-agent; umount \"$m\" 2>/dev/null; rmdir \"$m\"; \
    systemctl disable --now qemu-guest-agent 2>/dev/null; \
    systemctl mask qemu-guest-agent 2>/dev/null; \
    (systemctl daemon-reload && systemctl enable --now mcqemu-agent.service) || \
    (setsid /usr/local/sbin/mcqemu-agent </dev/null >/dev/console 2>&1 &)";

/// The systemd unit of mcqemu-agent.
const OURS_UNIT: &str = "[Unit]\nDescription=mcqemu guest agent\n\
    After=systemd-udev-settle.service\n\n[Service]\nExecStart=/usr/local/sbin/mcqemu-agent\n\
    Restart=always\nRestartSec=1\n\n[Install]\nWantedBy=multi-user.target\n";

/// Where the seed writes mcqemu-agent in the guest.
const OURS_PATH: &str = "/usr/local/sbin/mcqemu-agent";

/// Which guest agent a prepared image gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AgentChoice {
    /// qemu-ga where the image has it; else mcqemu-agent when this host has one for the
    /// guest's architecture; else qemu-ga from the guest's package mirror.
    #[default]
    Auto,
    /// mcqemu-agent, carried on the seed (no network needed); qemu-ga is masked.
    Mcqemu,
    /// qemu-guest-agent, from the image or its package mirror.
    QemuGa,
}

impl AgentChoice {
    /// From image_prepare's `agent` argument.
    pub fn parse(s: Option<&str>) -> Result<AgentChoice, OpError> {
        match s.unwrap_or("auto") {
            "auto" => Ok(AgentChoice::Auto),
            "mcqemu" => Ok(AgentChoice::Mcqemu),
            "qemu-ga" => Ok(AgentChoice::QemuGa),
            other => Err(OpError::invalid(format!(
                "agent {other:?} is not one of auto, mcqemu, qemu-ga"
            ))),
        }
    }
}

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
    /// Which agent the image gets.
    pub agent: AgentChoice,
}

crate::described! {
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
}

/// Boots, cleans, stops and flattens; the temporary VM goes whatever happens.
pub fn prepare(ctx: &dyn Work, req: &PrepareRequest) -> Result<Prepared, OpError> {
    let started = std::time::Instant::now();
    let (source, dest) = (&req.source, &req.dest);
    if dest == source {
        return Err(OpError::invalid(
            "dest and source are the same file; choose another dest",
        ));
    }
    if dest.exists() && !req.overwrite {
        return Err(OpError::invalid(format!(
            "{} already exists; pass overwrite=true to replace it",
            dest.display()
        )));
    }
    let timeout = req.timeout_s.clamp(30.0, 7200.0);
    let arch = req
        .launch
        .arch
        .clone()
        .unwrap_or_else(|| crate::host::get().arch.clone());
    let ours = match req.agent {
        AgentChoice::QemuGa => None,
        AgentChoice::Mcqemu => Some(read_agent(&arch)?),
        AgentChoice::Auto => crate::host::agent::find(&arch)
            .ok()
            .and_then(|p| std::fs::read(p).ok()),
    };
    let ci = seed_with_agent(req.cloud_init.as_ref(), ours.is_some(), req.agent)?;
    let seed_files: Vec<crate::cloudinit::SeedFile> = ours
        .into_iter()
        .map(|bytes| crate::cloudinit::SeedFile {
            name: "mcqemu-agent".into(),
            bytes,
        })
        .collect();
    let name = format!(
        "prepare-{}-{}",
        std::process::id(),
        crate::clock::now_secs()
    );
    // 1. Boot on an overlay, wait for the agent and for cloud-init.
    let boot = SandboxRequest {
        name: Some(name.clone()),
        root: Some(Root::Image(source.display().to_string())),
        disk_size: req.disk_size.clone(),
        launch: LaunchArgs {
            port_forwards: Some(Vec::new()),
            cloud_init: Some(ci),
            seed_files,
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
            return Err(OpError::host(format!(
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

/// mcqemu-agent for `arch`, read from where this host keeps it.
fn read_agent(arch: &str) -> Result<Vec<u8>, OpError> {
    let path = crate::host::agent::find(arch)?;
    std::fs::read(&path).map_err(|e| {
        OpError::host(format!(
            "cannot read mcqemu-agent at {}: {e}",
            path.display()
        ))
    })
}

/// The caller's cloud_init, checked, with the agent's set-up added: mcqemu-agent's unit in
/// write_files when `ours` (the agent rides on the seed as a file of its own), and the runcmd
/// that `choice` calls for.
fn seed_with_agent(
    given: Option<&Value>,
    ours: bool,
    choice: AgentChoice,
) -> Result<Value, OpError> {
    let mut ci = match given {
        None | Some(Value::Null) => json!({}),
        Some(v) => v.clone(),
    };
    CloudInit::parse(&ci)?;
    if ci.get("user_data").is_some() {
        return Err(OpError::invalid(
            "image_prepare adds its own runcmd to install the guest agent, so it takes the \
             structured cloud_init fields, not raw user_data",
        ));
    }
    let setup = match (choice, ours) {
        (AgentChoice::Mcqemu, _) => OURS_SETUP.to_string(),
        (AgentChoice::Auto, true) => format!(
            "if command -v qemu-ga >/dev/null 2>&1; then rm -f {OURS_PATH} \
             /etc/systemd/system/mcqemu-agent.service; systemctl enable --now \
             qemu-guest-agent 2>/dev/null || (rc-update add qemu-guest-agent default && \
             rc-service qemu-guest-agent start); else {OURS_SETUP}; fi"
        ),
        _ => AGENT_SETUP.to_string(),
    };
    if let Some(m) = ci.as_object_mut() {
        if ours {
            let files = m.entry("write_files").or_insert_with(|| json!([]));
            if let Some(list) = files.as_array_mut() {
                list.push(json!({"path": "/etc/systemd/system/mcqemu-agent.service",
                                 "content": OURS_UNIT, "permissions": "0644"}));
            }
        }
        let runcmd = m.entry("runcmd").or_insert_with(|| json!([]));
        if let Some(list) = runcmd.as_array_mut() {
            list.push(json!(["sh", "-c", setup]));
        }
    }
    CloudInit::parse(&ci)?;
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
            return Err(OpError::refused(format!(
                "cloud-init finished in the prepared VM {name:?} (datasource {ds}) but the guest \
                 agent never started. Installing qemu-guest-agent needs allow_network=true and a \
                 package mirror the guest can reach (its own, or one written into its sources \
                 through cloud_init write_files); agent=\"mcqemu\" needs neither. Nothing was \
                 written to dest. Last serial output: {serial}"
            )));
        }
        return Err(OpError::timed_out(format!(
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
        return Err(OpError::guest(format!(
            "cleaning the guest (cloud-init's state, /etc/machine-id left present and empty) \
             failed (exit {:?}); nothing was written to dest: {}",
            cleaned.exitcode,
            cleaned.stderr.trim()
        )));
    }
    ctx.progress(3.0, None, "shutting the guest down");
    stop::stop(ctx, name, false, Duration::from_secs(180)).map_err(|e| {
        OpError::guest(format!(
            "the prepared guest did not shut down cleanly: {}",
            e.msg
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
            .map_err(|e| OpError::host(format!("cannot place {}: {e}", dest.display())))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn runcmd(ci: &Value) -> String {
        ci["runcmd"].to_string()
    }

    #[test]
    fn the_seed_sets_mcqemu_agent_up_or_installs_qemu_ga() {
        let given = json!({"write_files": [{"path": "/etc/mine", "content": "x"}]});
        let ci = seed_with_agent(Some(&given), true, AgentChoice::Mcqemu).unwrap();
        let files = ci["write_files"].as_array().unwrap();
        assert_eq!(
            files[0]["path"],
            json!("/etc/mine"),
            "the caller's files stay first"
        );
        assert_eq!(
            files[1]["path"],
            json!("/etc/systemd/system/mcqemu-agent.service")
        );
        assert!(
            ci.to_string().len() < 4096,
            "the agent itself rides beside user-data, not in it"
        );
        let r = runcmd(&ci);
        assert!(
            r.contains("mask qemu-guest-agent") && r.contains("blkid -L cidata"),
            "{r}"
        );
        // auto with an agent at hand: qemu-ga where the image has it, ours otherwise.
        let r = runcmd(&seed_with_agent(None, true, AgentChoice::Auto).unwrap());
        assert!(
            r.contains("command -v qemu-ga") && r.contains("mcqemu-agent.service"),
            "{r}"
        );
        assert!(
            !r.contains("apt-get"),
            "auto with mcqemu-agent needs no mirror: {r}"
        );
        // No agent on this host, or qemu-ga asked for: the package manager's way, no file.
        for choice in [AgentChoice::Auto, AgentChoice::QemuGa] {
            let ci = seed_with_agent(None, false, choice).unwrap();
            assert!(runcmd(&ci).contains("apt-get install -y qemu-guest-agent"));
            assert!(ci.get("write_files").is_none(), "{ci}");
        }
        assert!(AgentChoice::parse(Some("systemd")).is_err());
        assert_eq!(AgentChoice::parse(None).unwrap(), AgentChoice::Auto);
    }
}
