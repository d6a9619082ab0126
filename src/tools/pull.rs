//! `image_pull` and `image_catalog`: distribution cloud images downloaded and verified against
//! the publisher's own checksum file, resumable, and checked like any untrusted image before
//! they are offered for use.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::checked_image;
use super::download::CtxWatch;
use super::object;
use crate::mcp::tool::{Annotations, Args, ToolCtx, ToolDef, ToolError, ToolOutput, ToolResult};
use crate::net::{catalog, checksums, download};
use crate::state::paths;
use crate::state::roots::{self, Access};

/// The folder pulled images go to unless `path` says otherwise.
pub fn images_dir() -> PathBuf {
    paths::state_dir().join("images")
}

/// The file name a URL names (its last path segment, without query or fragment).
pub fn url_file_name(url: &str) -> Option<String> {
    let no_frag = url.split('#').next().unwrap_or(url);
    let no_query = no_frag.split('?').next().unwrap_or(no_frag);
    let after_scheme = no_query.split_once("://").map_or(no_query, |(_, r)| r);
    let (_, path) = after_scheme.split_once('/')?;
    let name = path.rsplit('/').next()?;
    let ok = !name.is_empty() && name != "." && name != ".." && !name.starts_with('.');
    ok.then(|| name.to_string())
}

/// The record kept beside a pulled image: what was verified, and when.
fn sidecar(image: &Path) -> PathBuf {
    let name = image
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    image.with_file_name(format!(".{name}.pulled.json"))
}

const PULL_DESCRIPTION: &str = "Download a distribution cloud image and verify it against the \
    publisher's checksum file (fetched first; SHA-256 or SHA-512, GNU or BSD style). Name a \
    catalog entry with image (image_catalog lists them), or give url + checksums_url. Progress \
    and cancellation as image_download; an interrupted pull keeps its partial file and the next \
    pull continues it with an HTTP Range request. Default path: the state folder's images/. \
    The image is then checked like any untrusted image (backing files, external data files). \
    Next: image_prepare turns it into an agent-ready base for sandbox_vm.";

/// `image_pull`.
pub const PULL: ToolDef = ToolDef {
    name: "image_pull",
    title: "Pull a verified cloud image",
    description: PULL_DESCRIPTION,
    input_schema: || {
        object(
            json!({
                "image": {
                    "type": ["string", "null"], "default": null,
                    "enum": catalog::names().into_iter().map(Some).chain([None]).collect::<Vec<_>>(),
                    "description": "A catalog entry (see image_catalog)."
                },
                "url": {"type": ["string", "null"], "default": null,
                        "description": "The image's http(s) URL (instead of image)."},
                "checksums_url": {
                    "type": ["string", "null"], "default": null,
                    "description": "The publisher's checksum file listing the URL's file name."
                },
                "path": {"type": ["string", "null"], "default": null,
                         "description": "Where to save it; default <state>/images/<file name>."},
                "overwrite": {"type": "boolean", "default": false}
            }),
            &[],
        )
    },
    output_schema: || {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string"}, "url": {"type": "string"},
                "checksums_url": {"type": "string"}, "bytes": {"type": "integer"},
                "algorithm": {"type": "string"}, "digest": {"type": "string"},
                "verified": {"type": "boolean"}, "resumed_from": {"type": "integer"},
                "format": {"type": "string"}
            },
            "required": ["path", "url", "bytes", "algorithm", "digest", "verified"]
        })
    },
    annotations: Annotations {
        read_only: false,
        destructive: true,
        idempotent: false,
        open_world: true,
    },
    handler: pull,
};

fn pull(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let (url, sums_url) = match (args.opt_str("image")?, args.opt_str("url")?) {
        (Some(name), None) => {
            let e = catalog::find(name).ok_or_else(|| {
                ToolError::new(format!(
                    "no catalog image {name:?}; image_catalog lists: {}",
                    catalog::names().join(", ")
                ))
            })?;
            (e.url.to_string(), e.checksums_url.to_string())
        }
        (None, Some(url)) => {
            let sums = args.opt_str("checksums_url")?.ok_or_else(|| {
                ToolError::new(
                    "url needs checksums_url: the publisher's checksum file that lists it \
                     (every pulled image is verified)",
                )
            })?;
            (url.to_string(), sums.to_string())
        }
        (Some(_), Some(_)) => return Err(ToolError::new("give image or url, not both")),
        (None, None) => {
            return Err(ToolError::new(
                "give image (a catalog entry; image_catalog lists them) or url + checksums_url",
            ))
        }
    };
    download::check_url(&url)?;
    download::check_url(&sums_url)?;
    let file_name = url_file_name(&url).ok_or_else(|| {
        ToolError::new(format!(
            "{url} names no file to look up in the checksum file"
        ))
    })?;
    let dest = match args.opt_str("path")? {
        Some(p) => roots::check_str(p, Access::Write)
            .map_err(|e| ToolError::new(format!("parameter 'path': {e}")))?,
        None => {
            let dir = images_dir();
            std::fs::create_dir_all(&dir)
                .map_err(|e| ToolError::new(format!("cannot create {}: {e}", dir.display())))?;
            roots::check(&dir.join(&file_name), Access::Write)?
        }
    };
    ctx.progress_now(0.0, None, "fetching the checksum file");
    let sums = download::fetch_small(&sums_url, checksums::MAX_BYTES)?;
    let text = String::from_utf8_lossy(&sums);
    let (algo, digest) = checksums::find(&text, &file_name).ok_or_else(|| {
        ToolError::new(format!(
            "{sums_url} lists no SHA-256 or SHA-512 checksum for {file_name:?}; check the URL \
             and the checksum file (nothing was downloaded)"
        ))
    })?;
    ctx.check_cancel()?;
    let req = download::Request {
        url: &url,
        dest: &dest,
        algo,
        expect: Some(digest.clone()),
        overwrite: args.bool_or("overwrite", false)?,
        max_bytes: None,
        resume: true,
    };
    let done = download::download(&req, &CtxWatch(ctx))?;
    ctx.progress_now(done.bytes as f64, Some(done.bytes as f64), "verified");
    // A pulled image is data from the network: checked like any other before it is offered.
    let checked = match checked_image(&dest, "pulled image", None) {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_file(&dest);
            return Err(ToolError::new(format!("{e}; the pulled file was removed")));
        }
    };
    let record = json!({
        "url": url, "checksums_url": sums_url, "algorithm": algo.name(), "digest": digest,
        "bytes": done.bytes, "format": checked.format,
        "pulled_at": crate::clock::iso8601(crate::clock::now_secs()),
    });
    let _ = crate::state::beneath::write_replace(&sidecar(&dest), record.to_string().as_bytes());
    Ok(ToolOutput::json(json!({
        "path": dest.display().to_string(),
        "url": url,
        "checksums_url": sums_url,
        "bytes": done.bytes,
        "algorithm": algo.name(),
        "digest": done.digest,
        "verified": true,
        "resumed_from": done.resumed_from,
        "format": checked.format,
    })))
}

const CATALOG_DESCRIPTION: &str = "List the built-in catalog of distribution cloud images \
    (Debian, Ubuntu, Fedora, Alpine; x86_64 and aarch64) that image_pull takes by name, and \
    for each whether it is already pulled into the default folder: path, size, and the digest \
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
                "url": {"type": "string"}, "checksums_url": {"type": "string"},
                "pulled": {"type": "boolean"}, "path": {"type": ["string", "null"]},
                "size": {"type": ["integer", "null"]}, "digest": {"type": ["string", "null"]},
                "algorithm": {"type": ["string", "null"]}, "pulled_at": {"type": ["string", "null"]}
            }, "required": ["name", "url", "pulled"]}}},
            "required": ["images"]
        })
    },
    annotations: Annotations {
        read_only: true,
        destructive: false,
        idempotent: true,
        open_world: false,
    },
    handler: list_catalog,
};

fn list_catalog(_ctx: &ToolCtx, _args: &Args) -> ToolResult {
    let dir = images_dir();
    let images: Vec<Value> = catalog::ENTRIES
        .iter()
        .map(|e| {
            let file = url_file_name(e.url).map(|n| dir.join(n));
            let meta = file.as_ref().and_then(|f| std::fs::metadata(f).ok());
            let record: Option<Value> = file
                .as_ref()
                .and_then(|f| std::fs::read(sidecar(f)).ok())
                .and_then(|b| serde_json::from_slice(&b).ok())
                .filter(|r: &Value| r["url"] == e.url);
            let pulled = meta.is_some() && record.is_some();
            json!({
                "name": e.name, "title": e.title, "arch": e.arch, "firmware": e.firmware,
                "url": e.url, "checksums_url": e.checksums_url, "pulled": pulled,
                "path": if pulled { file.map(|f| f.display().to_string()) } else { None },
                "size": if pulled { meta.map(|m| m.len()) } else { None },
                "digest": record.as_ref().and_then(|r| r.get("digest").cloned()),
                "algorithm": record.as_ref().and_then(|r| r.get("algorithm").cloned()),
                "pulled_at": record.as_ref().and_then(|r| r.get("pulled_at").cloned()),
            })
        })
        .collect();
    Ok(ToolOutput::json(json!({ "images": images })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_come_from_the_url_path() {
        assert_eq!(
            url_file_name("https://h/a/b/disk.qcow2?x=1#y").as_deref(),
            Some("disk.qcow2")
        );
        assert_eq!(
            url_file_name("http://h:8080/disk.img").as_deref(),
            Some("disk.img")
        );
        assert_eq!(url_file_name("https://h/"), None);
        assert_eq!(url_file_name("https://h"), None);
        assert_eq!(url_file_name("https://h/a/.."), None);
        for e in catalog::ENTRIES {
            assert!(url_file_name(e.url).is_some(), "{}", e.url);
            assert!(
                e.checksums_url.starts_with("https://"),
                "{}",
                e.checksums_url
            );
        }
    }
}
