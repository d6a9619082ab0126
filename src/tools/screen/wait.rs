//! See: vm_screen_wait, the MCP side of [`crate::ops::screen::wait`].

use std::time::Duration;

use serde::Deserialize;
use serde_json::json;

use crate::b64;
use crate::mcp::tool::{Args, ToolCtx, ToolDef, ToolError, ToolResult};
use crate::ops::screen::parse_hash;
use crate::ops::screen::wait::{self as screen_wait, WaitRequest};
use crate::ops::screen::{Rect, MAX_DIM};
use crate::schema::Param;
use crate::tools::names::VmName;
use crate::tools::presets;
use crate::tools::screen::params::BoundArgs;

const DESCRIPTION: &str = "Wait until the screen differs from the last screenshot (or from since, \
    a hash), then holds still for stable_ms, and return it as vm_screenshot does, with changed, \
    stable and waited_ms; on timeout the screen as it is and a reason. region limits what counts. \
    Instead of sleeping and polling.";

/// `vm_screen_wait`.
pub const SCREEN_WAIT: ToolDef = ToolDef {
    name: "vm_screen_wait",
    title: "Wait for the screen",
    description: DESCRIPTION,
    input_schema: WaitArgs::param,
    output_schema: <crate::ops::screen::wait::Settled as crate::schema::Schema>::schema,
    annotations: presets::READ_ONLY_WAIT,
    handler: screen_wait,
    ui: presets::OPENS_VIEW,
};

crate::params! {
    /// A rectangle of the screen, in its pixels.
    #[derive(Deserialize)]
    struct RegionArgs {
        x: u32 = {"minimum": 0, "maximum": MAX_DIM},
        y: u32 = {"minimum": 0, "maximum": MAX_DIM},
        width: u32 = {"minimum": 0, "maximum": MAX_DIM},
        height: u32 = {"minimum": 0, "maximum": MAX_DIM},
    }
}

crate::params! {
    #[derive(Deserialize)]
    struct WaitArgs {
        name: VmName,
        /// How long it must hold still.
        stable_ms: u64 = {"minimum": 100, "maximum": 60000, "default": 1000},
        timeout_s: f64 = {"minimum": 0, "maximum": screen_wait::MAX_TIMEOUT.as_secs(), "default": 30},
        /// A screenshot's hash to differ from.
        since: Option<String> = {"pattern": "^[0-9a-f]{16}$"},
        /// Screen pixels; only changes here count.
        region: Option<RegionArgs>,
        #[serde(flatten)]
        bounds: BoundArgs,
    }
}

/// The `region` argument, if given: a non-empty rectangle.
fn region_of(r: Option<RegionArgs>) -> Result<Option<Rect>, ToolError> {
    let Some(r) = r else {
        return Ok(None);
    };
    for (k, v) in [
        ("x", r.x),
        ("y", r.y),
        ("width", r.width),
        ("height", r.height),
    ] {
        if v > MAX_DIM {
            return Err(ToolError::new(format!(
                "region.{k} must be an integer from 0 to {MAX_DIM}; nothing was waited for"
            )));
        }
    }
    if r.width == 0 || r.height == 0 {
        return Err(ToolError::new(
            "region must be at least 1x1 pixels; nothing was waited for",
        ));
    }
    Ok(Some(Rect {
        x: r.x,
        y: r.y,
        width: r.width,
        height: r.height,
    }))
}

/// The arguments as the wait's request.
fn request(a: WaitArgs) -> Result<WaitRequest, ToolError> {
    let since = match a.since {
        None => None,
        Some(s) => Some(parse_hash(&s).ok_or_else(|| {
            ToolError::new(format!(
                "since {s:?} is not a screenshot's hash (16 hex digits); nothing was waited for"
            ))
        })?),
    };
    Ok(WaitRequest {
        stable_ms: a.stable_ms,
        timeout: Duration::from_secs_f64(a.timeout_s),
        region: region_of(a.region)?,
        since,
        bounds: a.bounds.bounds(true)?,
    })
}

fn screen_wait(ctx: &ToolCtx, args: &Args) -> ToolResult {
    let a: WaitArgs = args.parse()?;
    let name = a.name.0.clone();
    let (settled, png) = screen_wait::settle(ctx, &name, &request(a)?)?;
    let mut out = crate::tools::to_output(&settled)?;
    out.extra
        .push(json!({"type": "image", "data": b64::encode(&png), "mimeType": "image/png"}));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    #[test]
    fn arguments_become_a_request_and_bad_ones_are_named() {
        let args = |v: Value| {
            Args::new(v.as_object().unwrap().clone())
                .parse::<WaitArgs>()
                .unwrap()
        };
        let checked =
            |v: Value| crate::mcp::call::check(&SCREEN_WAIT, v.as_object().unwrap().clone());
        let r = request(args(json!({"name": "a"}))).unwrap();
        assert_eq!((r.stable_ms, r.timeout), (1000, Duration::from_secs(30)));
        assert_eq!((r.region, r.since), (None, None));
        // The bounds are the schema's, checked before the handler runs.
        let e = checked(json!({"name": "a", "timeout_s": 9999}))
            .err()
            .unwrap();
        assert_eq!(e.kind.code(), "invalid_argument", "{}", e.msg);
        assert!(e.msg.contains("timeout_s"), "{}", e.msg);
        let r = request(
            checked(json!({
                "name": "a", "stable_ms": 250, "timeout_s": 600, "since": "00000000000000ff",
                "region": {"x": 1, "y": 2, "width": 3, "height": 4}
            }))
            .unwrap()
            .parse()
            .unwrap(),
        )
        .unwrap();
        assert_eq!(r.timeout, screen_wait::MAX_TIMEOUT);
        assert_eq!((r.stable_ms, r.since), (250, Some(255)));
        assert_eq!(
            r.region,
            Some(Rect {
                x: 1,
                y: 2,
                width: 3,
                height: 4
            })
        );
        let err = |v: Value| request(args(v)).err().unwrap().msg;
        assert!(err(json!({"name": "a", "since": "xyz"})).contains("since"));
        let e = err(json!({"name": "a", "region": {"x": 0, "y": 0, "width": 0, "height": 5}}));
        assert!(e.contains("1x1"), "{e}");
        let e = checked(json!({"name": "a", "region": {"x": -1, "y": 0, "width": 1, "height": 1}}))
            .err()
            .unwrap();
        assert!(e.msg.contains("region.x"), "{}", e.msg);
    }
}
