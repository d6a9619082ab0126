//! `image_prepare`: a stock cloud image turned into an agent-ready base for sandboxes (the
//! operation is [`crate::ops::image::prepare`]'s).

use serde_json::json;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::image::prepare::{self, PrepareRequest};
use crate::ops::vm::checks::Access;
use crate::ops::vm::launch_args::LaunchArgs;
use crate::tools::{object, path_arg};
use crate::tools::{params, presets};

const PREPARE_DESCRIPTION: &str = "Turn a stock cloud image (image_pull) into an agent-ready \
    base for sandbox_vm: boot it once on an overlay (source is never written) with a cloud-init \
    seed that enables a guest agent (agent: mcqemu-agent carried on the seed, no network \
    needed; or qemu-guest-agent, the image's or installed from its mirror) plus your own \
    cloud_init, wait for \
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
                "agent": {"type": "string", "enum": ["auto", "mcqemu", "qemu-ga"],
                          "default": "auto",
                          "description": "The guest agent: mcqemu (mcqemu's own, carried on \
                                          the seed: no network, no package manager), qemu-ga \
                                          (the image's, or installed from its mirror), auto \
                                          (qemu-ga where the image has it, else mcqemu)."},
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
    let text = |k: &str| args.opt_str(k).map(|v| v.map(str::to_string));
    let req = PrepareRequest {
        source: path_arg(args, "source", Access::Read)?,
        dest: path_arg(args, "dest", Access::Write)?,
        overwrite: args.bool_or("overwrite", false)?,
        timeout_s: args.number("timeout_s")?,
        cloud_init: args.0.get("cloud_init").cloned(),
        launch: LaunchArgs {
            memory_mb: args.opt_i64("memory_mb")?,
            cpus: args.opt_i64("cpus")?,
            arch: text("arch")?,
            firmware: text("firmware")?,
            kernel: text("kernel")?,
            initrd: text("initrd")?,
            append: text("append")?,
            ..LaunchArgs::default()
        },
        disk_size: text("disk_size")?,
        allow_network: args.bool_or("allow_network", true)?,
        agent: prepare::AgentChoice::parse(args.opt_str("agent")?)?,
    };
    crate::tools::to_output(&prepare::prepare(ctx, &req)?)
}
