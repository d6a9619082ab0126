//! The image bounds vm_screenshot and vm_screen_wait share: their schemas and the
//! [`Bounds`] built from a call's arguments.

use serde_json::{json, Value};

use crate::mcp::tool::{Args, ToolError};
use crate::ops::screen::{self, Bounds};

/// Largest `max_edge`, `max_width` and `max_height`: the largest screen a capture accepts.
const MAX_BOUND: i64 = screen::MAX_DIM as i64;

/// Smallest `max_bytes`.
const MIN_BYTES: i64 = 16 * 1024;

/// `max_edge`.
pub fn max_edge_schema() -> Value {
    json!({
        "type": "integer", "minimum": screen::MIN_EDGE, "maximum": MAX_BOUND,
        "description": "Largest longer edge of the image (inline default 1568 when \
            neither max_width nor max_height is given; with path, none)."
    })
}

/// `max_width`.
pub fn max_width_schema() -> Value {
    json!({
        "type": "integer", "minimum": screen::MIN_EDGE, "maximum": MAX_BOUND,
        "description": "Largest image width."
    })
}

/// `max_height`.
pub fn max_height_schema() -> Value {
    json!({
        "type": "integer", "minimum": screen::MIN_EDGE, "maximum": MAX_BOUND,
        "description": "Largest image height."
    })
}

/// `max_bytes`.
pub fn max_bytes_schema() -> Value {
    json!({
        "type": "integer", "minimum": MIN_BYTES,
        "description": "Largest PNG in bytes: a larger one is scaled down until it \
            fits (inline default 750000; with path, none)."
    })
}

/// A positive integer argument no larger than `max`, if given.
fn bound_arg(args: &Args, key: &str, min: i64, max: i64) -> Result<Option<u32>, ToolError> {
    match args.opt_i64(key)? {
        None => Ok(None),
        Some(v) if (min..=max).contains(&v) => Ok(Some(v as u32)),
        Some(v) => Err(ToolError::new(format!(
            "{key} must be between {min} and {max}, not {v}; nothing was captured"
        ))),
    }
}

/// The screenshot's bounds from its arguments: inline, the longer edge defaults to
/// [`screen::DEFAULT_MAX_EDGE`] unless a width or height bound is given, and the PNG to
/// [`screen::DEFAULT_MAX_BYTES`]; saved to a file, only the bounds given apply.
pub fn bounds(args: &Args, inline: bool) -> Result<Bounds, ToolError> {
    let max_width = bound_arg(args, "max_width", i64::from(screen::MIN_EDGE), MAX_BOUND)?;
    let max_height = bound_arg(args, "max_height", i64::from(screen::MIN_EDGE), MAX_BOUND)?;
    let mut max_edge = bound_arg(args, "max_edge", i64::from(screen::MIN_EDGE), MAX_BOUND)?;
    if inline && max_edge.is_none() && max_width.is_none() && max_height.is_none() {
        max_edge = Some(screen::DEFAULT_MAX_EDGE);
    }
    let max_bytes = match args.opt_i64("max_bytes")? {
        Some(v) if v < MIN_BYTES => {
            return Err(ToolError::new(format!(
                "max_bytes must be at least {MIN_BYTES}, not {v}; nothing was captured"
            )))
        }
        Some(v) => Some(usize::try_from(v).unwrap_or(usize::MAX)),
        None if inline => Some(screen::DEFAULT_MAX_BYTES),
        None => None,
    };
    Ok(Bounds {
        max_width,
        max_height,
        max_edge,
        max_bytes,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    #[test]
    fn inline_screenshots_are_bounded_by_default_and_files_are_not() {
        let args = |v: Value| Args::new(v.as_object().unwrap().clone());
        let b = bounds(&args(json!({"name": "a"})), true).unwrap();
        assert_eq!(b.max_edge, Some(screen::DEFAULT_MAX_EDGE));
        assert_eq!(b.max_bytes, Some(screen::DEFAULT_MAX_BYTES));
        let b = bounds(&args(json!({"name": "a"})), false).unwrap();
        assert_eq!(b, Bounds::default());
        // A width or height bound replaces the default edge; bytes keep theirs.
        let b = bounds(&args(json!({"name": "a", "max_width": 1024})), true).unwrap();
        assert_eq!((b.max_width, b.max_edge), (Some(1024), None));
        assert_eq!(b.max_bytes, Some(screen::DEFAULT_MAX_BYTES));
        assert!(bounds(&args(json!({"max_edge": 5})), true).is_err());
        assert!(bounds(&args(json!({"max_bytes": 100})), true).is_err());
    }
}
