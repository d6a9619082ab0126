//! `image_catalog`: the built-in catalog of cloud images image_pull ([`super::pull`]) takes
//! by name, each with whether it is already pulled into the default folder.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::presets;
use super::pull::{images_dir, sidecar, url_file_name};
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolOutput, ToolResult};
use crate::net::catalog;

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

/// The image pulled from `url` into `dir`, when its record says so: path, size and record.
fn pulled_from(dir: &Path, url: &str) -> Option<(PathBuf, u64, Value)> {
    let file = dir.join(url_file_name(url)?);
    let meta = std::fs::metadata(&file).ok()?;
    let record: Value = serde_json::from_slice(&std::fs::read(sidecar(&file)).ok()?).ok()?;
    let ours = record["url"] == url || record["catalog_url"] == url;
    ours.then_some((file, meta.len(), record))
}

fn list_catalog(_ctx: &ToolCtx, _args: &Args) -> ToolResult {
    let dir = images_dir();
    let images: Vec<Value> = catalog::ENTRIES
        .iter()
        .map(|e| {
            let found = [
                e.pinned.map(|p| ("pinned", p.url)),
                e.latest.map(|l| ("latest", l.url)),
            ]
            .into_iter()
            .flatten()
            .find_map(|(kind, url)| pulled_from(&dir, url).map(|f| (kind, f)));
            let (source, path, size, record) = match found {
                Some((kind, (file, size, record))) => (
                    Some(kind),
                    Some(file.display().to_string()),
                    Some(size),
                    Some(record),
                ),
                None => (None, None, None, None),
            };
            json!({
                "name": e.name, "title": e.title, "arch": e.arch, "firmware": e.firmware,
                "pinned": e.pinned.map(|p| json!({
                    "url": p.url, "digest": p.digest, "checksums_url": p.checksums_url,
                })),
                "latest": e.latest.map(|l| json!({
                    "url": l.url, "checksums_url": l.checksums_url,
                })),
                "pulled": source.is_some(), "source": source, "path": path, "size": size,
                "digest": record.as_ref().and_then(|r| r.get("digest").cloned()),
                "algorithm": record.as_ref().and_then(|r| r.get("algorithm").cloned()),
                "pulled_at": record.as_ref().and_then(|r| r.get("pulled_at").cloned()),
            })
        })
        .collect();
    Ok(ToolOutput::json(json!({ "images": images })))
}
