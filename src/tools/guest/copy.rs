//! guest_copy_in and guest_copy_out: the MCP side of `ops::copy` (schemas, arguments,
//! progress, the result's shape).

use serde::Deserialize;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::guest::copy::{self, CopyIn, CopyOut};
use crate::ops::guest::stream::Watch;
use crate::schema::Param;
use crate::tools::names::VmName;
use crate::tools::presets;

/// Progress and cancellation of a copy, as the call's context reports them.
struct CtxWatch<'a>(&'a ToolCtx, &'static str);

impl Watch for CtxWatch<'_> {
    fn progress(&self, bytes: u64, total: u64, files: u64) {
        let mib = |b: u64| b as f64 / 1048576.0;
        let total_f = (total >= bytes && total > 0).then_some(total as f64);
        self.0.progress(
            bytes as f64,
            total_f,
            &format!(
                "{}: {files} files, {:.1} of {:.1} MiB",
                self.1,
                mib(bytes),
                mib(total.max(bytes))
            ),
        );
    }

    fn cancelled(&self) -> bool {
        self.0.cancelled()
    }
}

crate::params! {
    #[derive(Deserialize)]
    struct InArgs {
        name: VmName,
        /// The source: a host path.
        host_path: String = {"minLength": 1},
        /// The destination: a guest (absolute) path.
        guest_path: String = {"minLength": 1},
        /// Replace an existing destination (file or whole folder).
        overwrite: bool = {"default": false},
    }
}

crate::params! {
    #[derive(Deserialize)]
    struct OutArgs {
        name: VmName,
        /// The source: a guest (absolute) path.
        guest_path: String = {"minLength": 1},
        /// The destination: a host path.
        host_path: String = {"minLength": 1},
        /// Replace an existing destination (file or whole folder).
        overwrite: bool = {"default": false},
    }
}

const IN_DESCRIPTION: &str = "Copy a host file or folder tree (in the roots) into the guest at \
    guest_path as one tar stream. Modes, mtimes and symlinks are kept, hidden names (.git, .ssh) \
    left out; nothing partial stays on failure. The guest needs sh and tar (busybox will do). \
    Sends progress.";

/// `guest_copy_in`.
pub const COPY_IN: ToolDef = ToolDef {
    name: "guest_copy_in",
    title: "Copy files into the guest",
    description: IN_DESCRIPTION,
    input_schema: InArgs::param,
    output_schema: <copy::Copied as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE_IDEMPOTENT,
    handler: copy_in,
    ui: crate::mcp::tool::Ui::NONE,
};

fn copy_in(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: InArgs = args.parse()?;
    let req = CopyIn {
        name: a.name.0,
        host_path: a.host_path,
        guest_path: a.guest_path,
        overwrite: a.overwrite,
    };
    crate::tools::to_output(&copy::copy_in(&req, &CtxWatch(ctx, "guest_copy_in"))?)
}

const OUT_DESCRIPTION: &str =
    "Copy a guest file or folder tree to host_path (in the roots) as one \
    tar stream. Modes (no setuid), mtimes and symlinks are kept; entries leaving the destination \
    are refused; nothing partial stays on failure. The guest needs sh and tar. Sends progress.";

/// `guest_copy_out`.
pub const COPY_OUT: ToolDef = ToolDef {
    name: "guest_copy_out",
    title: "Copy files out of the guest",
    description: OUT_DESCRIPTION,
    input_schema: OutArgs::param,
    output_schema: <copy::Copied as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE_IDEMPOTENT,
    handler: copy_out,
    ui: crate::mcp::tool::Ui::NONE,
};

fn copy_out(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: OutArgs = args.parse()?;
    let req = CopyOut {
        name: a.name.0,
        guest_path: a.guest_path,
        host_path: a.host_path,
        overwrite: a.overwrite,
    };
    crate::tools::to_output(&copy::copy_out(&req, &CtxWatch(ctx, "guest_copy_out"))?)
}
