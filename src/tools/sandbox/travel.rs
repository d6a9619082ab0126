//! template_push, template_pull and sandbox_push: templates and running sandboxes moved between
//! hosts through an OCI registry or layout (the operations are
//! [`crate::ops::sandbox::travel`]'s; sandbox_vm {"from"} starts a pushed sandbox).

use serde::Deserialize;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::sandbox::travel::{sandbox as moving, template as travel};
use crate::schema::Param;
use crate::tools::names::{TemplateName, VmName};
use crate::tools::{presets, to_output};

const PUSH_DESCRIPTION: &str = "Send a template to an OCI registry or layout, for \
    template_pull on other hosts. Sends only what the destination lacks.";

/// `template_push`.
pub const PUSH: ToolDef = ToolDef {
    name: "template_push",
    title: "Push a template to a registry",
    description: PUSH_DESCRIPTION,
    input_schema: PushArgs::param,
    output_schema: <travel::Pushed as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE_OPEN_WORLD,
    handler: push,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct PushArgs {
        name: TemplateName,
        /// REG/NAME:TAG or oci:DIR[:TAG].
        reference: String = {"minLength": 1, "maxLength": 512},
    }
}

fn push(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: PushArgs = args.parse()?;
    to_output(&travel::push(ctx, &a.name.0, &a.reference)?)
}

const PULL_DESCRIPTION: &str = "Bring a pushed template into this host's templates, checked \
    against its digests and this host's QEMU first. Then sandbox_vm {template} clones it.";

/// `template_pull`.
pub const PULL: ToolDef = ToolDef {
    name: "template_pull",
    title: "Pull a template from a registry",
    description: PULL_DESCRIPTION,
    input_schema: PullArgs::param,
    output_schema: <travel::Pulled as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE_OPEN_WORLD,
    handler: pull,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct PullArgs {
        /// REG/NAME:TAG, REG/NAME@sha256:... or oci:DIR[:TAG].
        reference: String = {"minLength": 1, "maxLength": 512},
        /// Default: its pushed name.
        name: Option<TemplateName>,
    }
}

fn pull(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: PullArgs = args.parse()?;
    let name = a.name.map(|n| n.0);
    to_output(&travel::pull(ctx, &a.reference, name.as_deref())?)
}

const SANDBOX_PUSH_DESCRIPTION: &str = "Send a running sandbox as it is now (it runs on) to \
    an OCI registry or layout; sandbox_vm {from} starts it on any host, its programs going on. \
    Host folders never travel.";

/// `sandbox_push`.
pub const SANDBOX_PUSH: ToolDef = ToolDef {
    name: "sandbox_push",
    title: "Push a running sandbox to a registry",
    description: SANDBOX_PUSH_DESCRIPTION,
    input_schema: SandboxPushArgs::param,
    output_schema: <moving::Pushed as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE_OPEN_WORLD,
    handler: sandbox_push,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct SandboxPushArgs {
        name: VmName,
        /// REG/NAME:TAG or oci:DIR[:TAG].
        reference: String = {"minLength": 1, "maxLength": 512},
        /// Push without its host folders: unmounted for the capture, mounted again after.
        #[serde(default)]
        without_mounts: bool = {"default": false},
    }
}

fn sandbox_push(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: SandboxPushArgs = args.parse()?;
    to_output(&moving::push(
        ctx,
        &a.name.0,
        &a.reference,
        a.without_mounts,
    )?)
}
