//! The image bounds vm_screenshot and vm_screen_wait share: their parameters, typed, and the
//! [`Bounds`] built from them.

use serde::Deserialize;

use crate::mcp::tool::ToolError;
use crate::ops::screen::{self, Bounds};

/// Largest `max_edge`, `max_width` and `max_height`: the largest screen a capture accepts.
const MAX_BOUND: u32 = screen::MAX_DIM;

/// Smallest `max_bytes`.
const MIN_BYTES: usize = 16 * 1024;

crate::params! {
    /// The image bounds as a call gives them.
    #[derive(Deserialize, Default)]
    pub struct BoundArgs {
        /// Inline default 1568; with path, none.
        max_edge: Option<u32> = {"minimum": screen::MIN_EDGE, "maximum": MAX_BOUND},
        max_width: Option<u32> = {"minimum": screen::MIN_EDGE, "maximum": MAX_BOUND},
        max_height: Option<u32> = {"minimum": screen::MIN_EDGE, "maximum": MAX_BOUND},
        /// Scaled down to fit (inline default 750000).
        max_bytes: Option<usize> = {"minimum": MIN_BYTES},
    }
}

/// `v` when within `min..=max` (the schema's bounds, checked again for callers that skip it).
fn bound(key: &str, v: Option<u32>) -> Result<Option<u32>, ToolError> {
    match v {
        Some(v) if !(screen::MIN_EDGE..=MAX_BOUND).contains(&v) => Err(ToolError::new(format!(
            "{key} must be between {} and {MAX_BOUND}, not {v}; nothing was captured",
            screen::MIN_EDGE
        ))),
        v => Ok(v),
    }
}

impl BoundArgs {
    /// The bounds: an inline image gets the default edge and byte bounds unless told
    /// otherwise; a saved file none.
    pub fn bounds(self, inline: bool) -> Result<Bounds, ToolError> {
        let max_width = bound("max_width", self.max_width)?;
        let max_height = bound("max_height", self.max_height)?;
        let mut max_edge = bound("max_edge", self.max_edge)?;
        if inline && max_edge.is_none() && max_width.is_none() && max_height.is_none() {
            max_edge = Some(screen::DEFAULT_MAX_EDGE);
        }
        let max_bytes = match self.max_bytes {
            Some(v) if v < MIN_BYTES => {
                return Err(ToolError::new(format!(
                    "max_bytes must be at least {MIN_BYTES}, not {v}; nothing was captured"
                )))
            }
            Some(v) => Some(v),
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
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    #[test]
    fn inline_screenshots_are_bounded_by_default_and_files_are_not() {
        let args = |v: Value| serde_json::from_value::<BoundArgs>(v).unwrap();
        let b = args(json!({"name": "a"})).bounds(true).unwrap();
        assert_eq!(b.max_edge, Some(screen::DEFAULT_MAX_EDGE));
        assert_eq!(b.max_bytes, Some(screen::DEFAULT_MAX_BYTES));
        let b = args(json!({"name": "a"})).bounds(false).unwrap();
        assert_eq!(b, Bounds::default());
        // A width or height bound replaces the default edge; bytes keep theirs.
        let b = args(json!({"name": "a", "max_width": 1024}))
            .bounds(true)
            .unwrap();
        assert_eq!((b.max_width, b.max_edge), (Some(1024), None));
        assert_eq!(b.max_bytes, Some(screen::DEFAULT_MAX_BYTES));
        assert!(args(json!({"max_edge": 5})).bounds(true).is_err());
        assert!(args(json!({"max_bytes": 100})).bounds(true).is_err());
    }
}
