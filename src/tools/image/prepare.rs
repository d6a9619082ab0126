//! `image_prepare`: a stock cloud image turned into an agent-ready base for sandboxes (the
//! operation is [`crate::ops::image::prepare`]'s).

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::image::prepare::{self, PrepareRequest};
use crate::ops::vm::checks::{checked_path, Access};
use crate::ops::vm::launch::DEFAULT_MEMORY_MB;
use crate::schema::Param;
use crate::tools::params::{cloud_init_extra, memory_extra, Machine};
use crate::tools::presets;

const PREPARE_DESCRIPTION: &str = "Turn a cloud image (image_pull) into an agent-ready base for \
    sandbox_vm: boot it once on an overlay with a seed that enables a guest agent plus your \
    cloud_init, wait for cloud-init, clean its state and the machine-id, shut down, and write a \
    compact qcow2 dest. Takes minutes under TCG; progress at each phase.";

/// `image_prepare`.
pub const PREPARE: ToolDef = ToolDef {
    name: "image_prepare",
    title: "Prepare an agent-ready base image",
    description: PREPARE_DESCRIPTION,
    input_schema: PrepareArgs::param,
    output_schema: <crate::ops::image::prepare::Prepared as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE_OPEN_WORLD,
    handler: prepare,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct PrepareArgs {
        /// The stock cloud image (left untouched).
        source: String = {"minLength": 1},
        /// Where to write the prepared qcow2.
        dest: String = {"minLength": 1},
        overwrite: bool = {"default": false},
        cloud_init: Option<Map<String, Value>> = (cloud_init_extra()),
        /// mcqemu: carried on the seed, no network needed; qemu-ga: the image's or installed;
        /// auto: qemu-ga where present.
        agent: String = {"enum": ["auto", "mcqemu", "qemu-ga"], "default": "auto"},
        /// To install the agent and packages.
        allow_network: bool = {"default": true},
        /// For the agent, then for cloud-init.
        timeout_s: f64 = {"minimum": 30, "maximum": 7200, "default": 1200},
        memory_mb: Option<i64> = (memory_extra(DEFAULT_MEMORY_MB)),
        /// e.g. "20G"; at least the base's (the default); cloud-init grows the root to fill it.
        disk_size: Option<String> = {"minLength": 1},
        #[serde(flatten)]
        guest: Machine,
    }
}

fn prepare(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: PrepareArgs = args.parse()?;
    let req = PrepareRequest {
        source: checked_path(&a.source, "source", Access::Read)?,
        dest: checked_path(&a.dest, "dest", Access::Write)?,
        overwrite: a.overwrite,
        timeout_s: a.timeout_s,
        cloud_init: a.cloud_init.map(Value::Object),
        launch: a.guest.launch(a.memory_mb),
        disk_size: a.disk_size,
        allow_network: a.allow_network,
        agent: prepare::AgentChoice::parse(Some(&a.agent))?,
    };
    crate::tools::to_output(&prepare::prepare(ctx, &req)?)
}
