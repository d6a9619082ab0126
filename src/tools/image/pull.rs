//! `image_pull`: distribution cloud images downloaded and verified (the operation is
//! [`crate::ops::image::pull`]). `image_catalog` is in [`crate::tools::image::catalog`].

use serde::Deserialize;

use crate::mcp::tool::ToolError;
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolResult};
use crate::ops::container::pull as oci;
use crate::ops::image::catalog;
use crate::ops::image::pull::{self, PullRequest, Wanted};
use crate::schema::Param;
use crate::tools::presets;

const PULL_DESCRIPTION: &str = "Download a cloud image and verify it: image names a catalog entry \
    (image_catalog; its pinned URL and digest, else its latest URL with the publisher's checksum \
    file), or url with checksums_url. Resumes an interrupted pull; progress and cancellation. \
    Default path: the state folder's images/. Next: image_prepare. Or oci: a container image made \
    an ext4 VM root (cached by digest), which sandbox_vm {oci} boots; config gives its Env, \
    WorkingDir, User, Entrypoint, Cmd and ExposedPorts.";

/// `image_pull`.
pub const PULL: ToolDef = ToolDef {
    name: "image_pull",
    title: "Pull a verified cloud image",
    description: PULL_DESCRIPTION,
    input_schema: PullArgs::param,
    output_schema: <pull::Fetched as crate::schema::Schema>::schema,
    annotations: presets::DESTRUCTIVE_OPEN_WORLD,
    handler: pull,
    ui: crate::mcp::tool::Ui::NONE,
};

crate::params! {
    #[derive(Deserialize)]
    struct PullArgs {
        /// A catalog entry (see image_catalog).
        image: Option<String> = {"enum": catalog::names()},
        /// The image's http(s) URL (instead of image).
        url: Option<String>,
        /// The publisher's checksum file (or bare digest).
        checksums_url: Option<String>,
        /// Default <state>/images/.
        path: Option<String>,
        /// A container image: python:3.12-slim, REG/NAME:tag, oci:DIR[:tag], docker-archive:FILE.
        oci: Option<String>,
        /// With oci; default x86_64.
        arch: Option<String> = {"enum": ["x86_64", "aarch64"]},
        overwrite: bool = {"default": false},
    }
}

fn pull(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: PullArgs = args.parse()?;
    if let Some(reference) = a.oci {
        if a.image.is_some() || a.url.is_some() || a.path.is_some() {
            return Err(ToolError::of(
                crate::mcp::tool_error::ErrorKind::InvalidArgument,
                "oci makes a root of a container image: give it alone (not with image, url or \
                 path; the root's place is the state folder's oci/)",
            ));
        }
        let req = oci::OciRequest {
            reference,
            arch: a.arch.unwrap_or_else(|| "x86_64".to_string()),
        };
        return crate::tools::to_output(&pull::pull_wanted(ctx, &Wanted::Oci(req))?);
    }
    let req = PullRequest {
        image: a.image,
        url: a.url,
        checksums_url: a.checksums_url,
        path: a.path,
        overwrite: a.overwrite,
    };
    crate::tools::to_output(&pull::pull_wanted(ctx, &Wanted::Image(req))?)
}
