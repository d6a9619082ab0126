//! `template_create`: boot a guest, run its setup through the agent, and save it into the
//! template store (the operation is [`crate::ops::sandbox::template_create`]'s). `template_list`
//! and `template_delete` are in [`crate::tools::sandbox::template_manage`].

use serde::Deserialize;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::sandbox::pool::MAX_POOL;
use crate::ops::sandbox::request::{Root, BOOT_AGENT_WAIT};
use crate::ops::sandbox::template_create::{self, SetupStep, TemplateRequest, TEMPLATE_MEMORY_MB};
use crate::schema::Param;
use crate::tools::names::TemplateName;
use crate::tools::params::{memory_extra, Machine, SandboxCommon, NAME_PATTERN};
use crate::tools::presets;

crate::params! {
    /// One setup step: a program (not a shell) run in the build guest.
    #[derive(Deserialize)]
    struct Step {
        command: String = {"minLength": 1},
        args: Vec<String> = {"default": []},
        timeout: f64 = {"minimum": 1, "maximum": 3600, "default": 300},
    }
}

const CREATE_DESCRIPTION: &str = "Make a template for instant sandboxes: boot a guest, run setup, \
    save it running (memory and disk) and stop it. sandbox_vm {template} then clones it in well \
    under a second. Takes sandbox_vm's parameters.";

/// `template_create`.
pub const CREATE: ToolDef = ToolDef {
    name: "template_create",
    title: "Create a sandbox template",
    description: CREATE_DESCRIPTION,
    input_schema: TemplateArgs::param,
    output_schema: <crate::ops::sandbox::template_create::Created as crate::schema::Schema>::schema,
    annotations: presets::ADDITIVE,
    handler: create,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct TemplateArgs {
        name: TemplateName = {"maxLength": 48, "pattern": NAME_PATTERN},
        /// Never modified; absent: an empty 1 GiB disk (with kernel).
        base_image: Option<String> = {"minLength": 1},
        #[serde(flatten)]
        common: SandboxCommon,
        memory_mb: Option<i64> = (memory_extra(TEMPLATE_MEMORY_MB)),
        #[serde(flatten)]
        guest: Machine,
        /// Run in the guest before the save, in order; the first failure stops.
        setup: Vec<Step> = {"default": []},
        /// Clones kept started (template_pool).
        pool: Option<u64> = {"minimum": 0, "maximum": MAX_POOL},
    }
}

fn create(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let mut a: TemplateArgs = args.parse()?;
    let mut launch = a.guest.launch(a.memory_mb);
    let allow_network = a.common.onto(&mut launch)?;
    let setup = a
        .setup
        .into_iter()
        .map(|s| SetupStep {
            command: s.command,
            args: s.args,
            timeout: s.timeout,
        })
        .collect();
    let req = TemplateRequest {
        name: a.name.0,
        launch,
        allow_network,
        root: Root::given(a.base_image, a.common.oci, None, None)?,
        disk_size: a.common.disk_size,
        wait_agent_s: BOOT_AGENT_WAIT.of(a.common.wait_agent_s).as_secs_f64(),
        wait_cloud_init: a.common.wait_cloud_init,
        wait_cloud_init_s: a.common.wait_cloud_init_s,
        setup,
        pool: a.pool.unwrap_or(0),
    };
    crate::tools::to_output(&template_create::create(ctx, &req)?)
}
