//! `image_catalog`: the built-in catalog of cloud images image_pull
//! ([`crate::tools::image::pull`]) takes by name, each with whether it is already pulled into
//! the default folder (the listing is [`crate::ops::image::catalog`]'s).

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::image::catalog;
use crate::schema::Param;
use crate::tools::presets;

const CATALOG_DESCRIPTION: &str = "The catalog of cloud images image_pull takes by name (Debian, \
    Ubuntu, Fedora, Alpine, Rocky, AlmaLinux, CentOS Stream, Arch; x86_64 and aarch64): each \
    entry's pinned and latest sources, and whether it is pulled, where, and its verified digest.";

/// `image_catalog`.
pub const CATALOG: ToolDef = ToolDef {
    name: "image_catalog",
    title: "List pullable cloud images",
    description: CATALOG_DESCRIPTION,
    input_schema: presets::NoArgs::param,
    output_schema: <crate::ops::image::catalog::Catalog as crate::schema::Schema>::schema,
    annotations: presets::READ_ONLY,
    handler: list_catalog,
    ui: crate::mcp::tool::Ui::NONE,
};

fn list_catalog(_ctx: &ToolCtx, _args: &Args) -> ToolResult {
    crate::tools::to_output(&catalog::list())
}
