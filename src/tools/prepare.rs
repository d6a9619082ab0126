//! `image_prepare`: a stock cloud image turned into an agent-ready base for sandboxes. The
//! source is booted once as a sandbox (an overlay: the source is never written) with a seed
//! that installs and enables qemu-guest-agent plus the caller's own cloud-init; once cloud-init
//! has finished, its state and the machine-id are cleaned so every sandbox from the result is a
//! new instance, the guest is shut down cleanly, and the overlay is flattened into a compact
//! `dest`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use super::{object, path_arg};
use super::{params, presets};
use crate::cloudinit::CloudInit;
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::ops::guest::run as guest_run;
use crate::ops::sandbox::request::SandboxRequest;
use crate::ops::vm::agent::AgentWait;
use crate::ops::vm::launch_args::LaunchArgs;
use crate::ops::vm::stop;
use crate::qemu::img;
use crate::state::roots::Access;

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

const PREPARE_DESCRIPTION: &str = "Turn a stock cloud image (image_pull) into an agent-ready \
    base for sandbox_vm: boot it once on an overlay (source is never written) with a cloud-init \
    seed that installs and enables qemu-guest-agent plus your own cloud_init, wait for \
    cloud-init to finish, clean cloud-init's state and the machine-id (every sandbox from the \
    result is a new instance), shut the guest down cleanly, and write a compact qcow2 dest. \
    Progress at each phase; takes minutes under TCG. Reports the agent version and the OS.";

/// `image_prepare`.
pub const PREPARE: ToolDef = ToolDef {
    name: "image_prepare",
    title: "Prepare an agent-ready base image",
    description: PREPARE_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "source": {"type": "string", "minLength": 1,
                           "description": "The stock cloud image (left untouched)."},
                "dest": {"type": "string", "minLength": 1,
                         "description": "Where to write the prepared qcow2."},
                "overwrite": {"type": "boolean", "default": false},
                "cloud_init": params::cloud_init_schema(),
                "allow_network": {"type": "boolean", "default": true,
                                  "description": "Let the guest reach the network (to install \
                                                  the agent and packages)."},
                "timeout_s": {"type": "number", "minimum": 30, "maximum": 7200, "default": 1200,
                              "description": "Bound for the agent to answer and for \
                                              cloud-init to finish, each."},
                "memory_mb": params::memory_schema(),
                "cpus": params::cpus_schema(),
                "arch": params::arch_schema(),
                "firmware": params::firmware_schema(),
                "disk_size": params::disk_size_schema(),
                "kernel": {"type": "string"},
                "initrd": {"type": "string"},
                "append": {"type": "string"}
            }),
            &["source", "dest"],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "dest": {"type": "string"}, "source": {"type": "string"},
                "format": {"type": "string"}, "bytes": {"type": "integer"},
                "agent_version": {"type": ["string", "null"]}, "os": {"type": "object"},
                "cloud_init": {"type": "object"}, "duration_ms": {"type": "integer"},
                "warnings": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["dest", "source", "format", "bytes"]
        })
    },
    annotations: presets::DESTRUCTIVE_OPEN_WORLD,
    handler: prepare,
    ui: crate::mcp::tool::Ui::NONE,
};

fn prepare(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let started = std::time::Instant::now();
    let (source, dest) = source_and_dest(args)?;
    let timeout = args
        .opt_f64("timeout_s")?
        .unwrap_or(1200.0)
        .clamp(30.0, 7200.0);
    let ci = seed_with_agent(args)?;
    let name = format!(
        "prepare-{}-{}",
        std::process::id(),
        crate::clock::now_secs()
    );
    // 1. Boot on an overlay, wait for the agent and for cloud-init.
    let req = boot_request(args, &name, &source, ci, timeout)?;
    ctx.progress_now(0.0, None, "booting the source image on an overlay");
    let booted = crate::ops::sandbox::boot(ctx, &req).map_err(ToolError::from);
    let result = booted.and_then(|(out, waited, _)| {
        if let AgentWait::Fatal(f) = waited {
            return Err(ToolError::new(format!(
                "{} while the prepared VM {name:?} booted; nothing was written to dest. Last \
                 serial output: {}",
                f.describe(),
                crate::ops::sandbox::destroy::serial_tail(&out, 8)
            )));
        }
        finish(ctx, &name, &out, &dest)
    });
    // 5. The temporary VM goes, whatever happened.
    crate::ops::sandbox::destroy::destroy_quietly(ctx, &name);
    let mut out = result?;
    out["source"] = json!(source.display().to_string());
    out["duration_ms"] = json!(started.elapsed().as_millis() as u64);
    Ok(ToolOutput::json(out))
}

/// `source` and `dest`, checked against the roots; dest is neither the source nor, without
/// overwrite, an existing file.
fn source_and_dest(args: &Args) -> Result<(PathBuf, PathBuf), ToolError> {
    let source = path_arg(args, "source", Access::Read)?;
    let dest = path_arg(args, "dest", Access::Write)?;
    if dest == source {
        return Err(ToolError::new(
            "dest and source are the same file; choose another dest",
        ));
    }
    if dest.exists() && !args.bool_or("overwrite", false)? {
        return Err(ToolError::new(format!(
            "{} already exists; pass overwrite=true to replace it",
            dest.display()
        )));
    }
    Ok((source, dest))
}

/// The caller's cloud_init, checked, with the agent's installation added to its runcmd.
fn seed_with_agent(args: &Args) -> Result<Value, ToolError> {
    let mut ci = match args.0.get("cloud_init") {
        None | Some(Value::Null) => json!({}),
        Some(v) => v.clone(),
    };
    CloudInit::parse(&ci)?;
    if ci.get("user_data").is_some() {
        return Err(ToolError::new(
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

/// The temporary sandbox that boots `source` on an overlay with seed `ci`, waiting up to
/// `timeout` for its agent and for cloud-init.
fn boot_request(
    args: &Args,
    name: &str,
    source: &Path,
    ci: Value,
    timeout: f64,
) -> Result<SandboxRequest, ToolError> {
    let text = |k: &str| args.opt_str(k).map(|v| v.map(str::to_string));
    Ok(SandboxRequest {
        name: Some(name.to_string()),
        base_image: Some(source.display().to_string()),
        disk_size: text("disk_size")?,
        launch: LaunchArgs {
            memory_mb: args.opt_i64("memory_mb")?,
            cpus: args.opt_i64("cpus")?,
            arch: text("arch")?,
            firmware: text("firmware")?,
            kernel: text("kernel")?,
            initrd: text("initrd")?,
            append: text("append")?,
            port_forwards: Some(Vec::new()),
            cloud_init: Some(ci),
            ..LaunchArgs::default()
        },
        allow_network: args.bool_or("allow_network", true)?,
        wait_agent_s: Some(timeout),
        wait_cloud_init: true,
        wait_cloud_init_s: Some(timeout),
        ..SandboxRequest::default()
    })
}

/// Steps 2-4: the agent and OS reported, the instance cleaned, the guest stopped, the overlay
/// flattened into `dest`.
fn finish(ctx: &ToolCtx, name: &str, booted: &Value, dest: &Path) -> Result<Value, ToolError> {
    if booted["agent_ready"] != json!(true) {
        let serial = crate::ops::sandbox::destroy::serial_tail(booted, 8);
        if let Some(ds) = booted["cloud_init"]["console"]["datasource"].as_str() {
            return Err(ToolError::new(format!(
                "cloud-init finished in the prepared VM {name:?} (datasource {ds}) but the guest \
                 agent never started: installing qemu-guest-agent failed. The guest needs \
                 allow_network=true and a package mirror it can reach (its own, or one written \
                 into its sources through cloud_init write_files). Nothing was written to dest. \
                 Last serial output: {serial}"
            )));
        }
        return Err(ToolError::new(format!(
            "the guest agent never answered in the prepared VM {name:?} within timeout_s and \
             cloud-init never reported finishing on the serial console; the image may lack \
             cloud-init, a serial console, or network to install qemu-guest-agent \
             (allow_network). Nothing was written to dest. Last serial output: {serial}"
        )));
    }
    let overlay = booted["overlay"].as_str().unwrap_or_default().to_string();
    ctx.progress_now(1.0, None, "cloud-init finished; reading the agent and OS");
    let info = crate::ops::guest::info(name)?;
    ctx.progress_now(2.0, None, "cleaning cloud-init state and the machine-id");
    let cleaned = guest_run::run(ctx, name, "sh", &["-c", CLEAN], Duration::from_secs(120))?;
    if cleaned.exitcode != Some(0) {
        return Err(ToolError::new(format!(
            "cleaning the guest (cloud-init's state, /etc/machine-id left present and empty) \
             failed (exit {:?}); nothing was written to dest: {}",
            cleaned.exitcode,
            cleaned.stderr.trim()
        )));
    }
    ctx.progress_now(3.0, None, "shutting the guest down");
    stop::stop(ctx, name, false, Duration::from_secs(180)).map_err(|e| {
        ToolError::new(format!(
            "the prepared guest did not shut down cleanly: {}",
            e.0
        ))
    })?;
    ctx.progress_now(4.0, None, "writing the compact image");
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
    if let Err(e) = converted.map_err(ToolError::from).and_then(|()| {
        std::fs::rename(&tmp, dest)
            .map_err(|e| ToolError::new(format!("cannot place {}: {e}", dest.display())))
    }) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let bytes = std::fs::metadata(dest).map(|m| m.len()).unwrap_or(0);
    Ok(json!({
        "dest": dest.display().to_string(),
        "format": "qcow2",
        "bytes": bytes,
        "agent_version": info.get("version").cloned().unwrap_or(Value::Null),
        "os": info.get("os").cloned().unwrap_or(json!({})),
        "cloud_init": booted.get("cloud_init").cloned().unwrap_or(json!({})),
        "warnings": booted.get("warnings").cloned().unwrap_or(json!([])),
    }))
}
