//! `image_pull`: distribution cloud images downloaded and verified (the operation is
//! [`crate::ops::image::pull`]). `image_catalog` is in [`crate::tools::image::catalog`].

use serde_json::json;

use crate::mcp::tool::ToolError;
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::mcp::tool_error::INVALID_ARGUMENT;
use crate::ops::container::pull as oci;
use crate::ops::image::catalog;
use crate::ops::image::pull::{self, PullRequest};
use crate::tools::object;
use crate::tools::presets;

const PULL_DESCRIPTION: &str = "Download a distribution cloud image and verify it. Name a \
    catalog entry with image (image_catalog lists them): its pinned, dated URL is pulled first \
    and checked against the digest the catalog pins (no checksum file needed); when the \
    publisher has removed it (HTTP 404 or 410) the entry's moving 'latest' URL is pulled \
    instead, checked against the publisher's checksum file. A pinned digest that does not \
    match is an error, never a reason to fall back. source in the result says which was used. \
    Or give url + checksums_url: the checksum file (fetched first) in GNU or BSD style (also \
    PGP clear-signed), or a per-file bare digest like Alpine's <image>.sha512; SHA-256 or \
    SHA-512. Progress and cancellation as image_download; an interrupted pull keeps its \
    partial file and the next pull continues it with an HTTP Range request. Default path: the \
    state folder's images/. The image is then checked like any untrusted image (backing \
    files, external data files). Next: image_prepare turns it into an agent-ready base for \
    sandbox_vm. Or give oci: a container image (python:3.12-slim, ghcr.io/org/img:tag, \
    REG/NAME@sha256:..., oci:DIR[:tag] (an OCI image layout) or docker-archive:FILE (a docker \
    save tarball)), made into an ext4 VM root once per \
    image digest with the image's owners, modes and file capabilities (every blob checked \
    against its digest; whiteouts applied; hostile layers refused); config in the result is \
    the image's Env, WorkingDir, User, Entrypoint, Cmd and ExposedPorts. sandbox_vm and \
    template_create take oci too and boot the root.";

/// `image_pull`.
pub const PULL: ToolDef = ToolDef {
    name: "image_pull",
    title: "Pull a verified cloud image",
    description: PULL_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "image": {
                    "type": "string",
                    "enum": catalog::names(),
                    "description": "A catalog entry (see image_catalog)."
                },
                "url": {"type": "string",
                        "description": "The image's http(s) URL (instead of image)."},
                "checksums_url": {
                    "type": "string",
                    "description": "The publisher's checksum file listing the URL's file name, \
                                    or holding its bare digest."
                },
                "path": {"type": "string",
                         "description": "Where to save it; default <state>/images/<file name>."},
                "oci": {
                    "type": "string",
                    "description": "A container image to make a VM root: a registry reference \
                                    (python:3.12-slim, ghcr.io/org/img:tag, \
                                    127.0.0.1:5000/x:y), oci:DIR[:tag] or \
                                    docker-archive:FILE (instead of image or url)."
                },
                "arch": {
                    "type": "string", "enum": ["x86_64", "aarch64"],
                    "description": "With oci: the guest architecture whose variant is built \
                                    (default x86_64)."
                },
                "overwrite": {"type": "boolean", "default": false}
            }),
            &[],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "url": {"type": "string", "description": "The URL downloaded."},
                "source": {
                    "type": "string", "enum": ["pinned", "latest", "url", "oci"],
                    "description": "pinned: the catalog's dated URL, checked against its \
                                    pinned digest; latest: the entry's moving URL, checked \
                                    against its checksum file (the pinned URL was gone); url: \
                                    the url + checksums_url given; oci: a container image made \
                                    a root (digest is its manifest's)."
                },
                "image": {"type": ["string", "null"], "description": "The catalog entry."},
                "catalog_url": {
                    "type": ["string", "null"],
                    "description": "The catalog's URL for the source (url differs under \
                                    MCQEMU_CATALOG_MIRROR)."
                },
                "checksums_url": {
                    "type": ["string", "null"],
                    "description": "The checksum file used; null for a pinned digest."
                },
                "pinned_gone": {
                    "type": ["object", "null"],
                    "properties": {"url": {"type": "string"}, "status": {"type": "integer"}},
                    "description": "The pinned URL that was gone, when source is latest."
                },
                "bytes": {"type": "integer"},
                "algorithm": {"type": "string"}, "digest": {"type": "string"},
                "verified": {"type": "boolean"}, "resumed_from": {"type": "integer"},
                "format": {"type": "string"},
                "platform": {"type": "string", "description": "oci: linux/amd64 or linux/arm64."},
                "layers": {"type": "integer", "description": "oci: layers applied."},
                "cached": {"type": "boolean",
                           "description": "oci: the root was already built for this digest."},
                "downloaded": {"type": "integer",
                               "description": "oci: bytes fetched from the registry (0: all held)."},
                "config": {
                    "type": "object",
                    "description": "oci: the image's program defaults.",
                    "properties": {
                        "env": {"type": "array", "items": {"type": "string"}},
                        "working_dir": {"type": "string"},
                        "user": {"type": "string"},
                        "entrypoint": {"type": "array", "items": {"type": "string"}},
                        "cmd": {"type": "array", "items": {"type": "string"}},
                        "exposed_ports": {"type": "array", "items": {"type": "string"}}
                    }
                },
                "skipped": {"type": "array", "items": {"type": "string"},
                            "description": "oci: entries left out (devices, fifos)."}
            },
            "required": ["path", "url", "source", "bytes", "algorithm", "digest", "verified"]
        })
    },
    annotations: presets::DESTRUCTIVE_OPEN_WORLD,
    handler: pull,
    ui: crate::mcp::tool::Ui::NONE,
};

fn pull(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let text = |k: &str| args.opt_str(k).map(|v| v.map(str::to_string));
    if let Some(reference) = text("oci")? {
        if args.get("image").is_some() || args.get("url").is_some() || args.get("path").is_some() {
            return Err(ToolError::of(
                INVALID_ARGUMENT,
                "oci makes a root of a container image: give it alone (not with image, url or \
                 path; the root's place is the state folder's oci/)",
            ));
        }
        let req = oci::OciRequest {
            reference,
            arch: text("arch")?.unwrap_or_else(|| "x86_64".to_string()),
        };
        return crate::tools::to_output(&oci::pull(ctx, &req)?);
    }
    let req = PullRequest {
        image: text("image")?,
        url: text("url")?,
        checksums_url: text("checksums_url")?,
        path: text("path")?,
        overwrite: args.bool_or("overwrite", false)?,
    };
    crate::tools::to_output(&pull::pull(ctx, &req)?)
}
