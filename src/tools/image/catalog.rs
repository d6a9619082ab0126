//! `image_catalog`: the built-in catalog of cloud images image_pull
//! ([`crate::tools::image::pull`]) takes by name, each with whether it is already pulled into
//! the default folder (the listing is [`crate::ops::image::catalog`]'s).

use serde_json::json;

use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::image::catalog;
use crate::tools::presets;

const CATALOG_DESCRIPTION: &str = "List the built-in catalog of distribution cloud images \
    (Debian, Ubuntu, Fedora, Alpine, Rocky, AlmaLinux, CentOS Stream, Arch; x86_64 and \
    aarch64) that image_pull takes by name. Each has a pinned source (a dated URL and its \
    digest, pulled first) and, where the publisher has one, a latest source (a moving URL and \
    the checksum file that lists it; pulled when the dated URL is gone; a latest source \
    without a checksum file is shown, not pulled by name). For each: whether it is already \
    pulled into the default folder, from which source, its path, size, and the digest \
    verified at pull time.";

/// `image_catalog`.
pub const CATALOG: ToolDef = ToolDef {
    name: "image_catalog",
    title: "List pullable cloud images",
    description: CATALOG_DESCRIPTION,
    input_schema: || json!({"type": "object", "properties": {}, "additionalProperties": false}),
    output_schema: || {
        json!({
            "type": "object",
            "properties": {"images": {"type": "array", "items": {"type": "object", "properties": {
                "name": {"type": "string"}, "title": {"type": "string"},
                "arch": {"type": "string"}, "firmware": {"type": "string"},
                "pinned": {"type": ["object", "null"], "properties": {
                    "url": {"type": "string"}, "digest": {"type": "string"},
                    "checksums_url": {"type": ["string", "null"]}
                }},
                "latest": {"type": ["object", "null"], "properties": {
                    "url": {"type": "string"}, "checksums_url": {"type": ["string", "null"]}
                }},
                "pulled": {"type": "boolean"},
                "source": {"type": ["string", "null"], "enum": ["pinned", "latest", null]},
                "path": {"type": ["string", "null"]},
                "size": {"type": ["integer", "null"]}, "digest": {"type": ["string", "null"]},
                "algorithm": {"type": ["string", "null"]}, "pulled_at": {"type": ["string", "null"]}
            }, "required": ["name", "pinned", "latest", "pulled"]}}},
            "required": ["images"]
        })
    },
    annotations: presets::READ_ONLY,
    handler: list_catalog,
    ui: crate::mcp::tool::Ui::NONE,
};

fn list_catalog(_ctx: &ToolCtx, _args: &Args) -> ToolResult {
    crate::tools::to_output(&catalog::list())
}
