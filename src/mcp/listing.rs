//! tools/list: pages of the tool definitions, each serialized once and joined per page (the
//! definitions are ~40 KB of JSON that never change while the server runs), with opaque
//! cursors.

use std::sync::OnceLock;

use jsonrpc_core::Error as RpcError;
use serde_json::Value;

use super::era::Era;
use super::protocol::invalid_params;
use super::tool::ToolDef;

/// One server's tool listing.
pub struct Listing {
    json: OnceLock<Vec<String>>,
    page_size: usize,
}

impl Listing {
    /// A listing that serves `page_size` tools per page.
    pub fn new(page_size: usize) -> Self {
        Listing {
            json: OnceLock::new(),
            page_size: page_size.max(1),
        }
    }

    /// The whole response line for a tools/list request with `id` and `cursor`, or the error
    /// for a cursor that was not ours.
    pub fn page(
        &self,
        tools: &[ToolDef],
        id: &Value,
        cursor: Option<&Value>,
        era: Era,
    ) -> Result<String, RpcError> {
        let all = self.json.get_or_init(|| {
            tools
                .iter()
                .map(|t| serde_json::to_string(&t.to_json()).unwrap_or_default())
                .collect()
        });
        let start = match cursor {
            None | Some(Value::Null) => 0,
            Some(c) => c
                .as_str()
                .and_then(decode_cursor)
                .filter(|n| *n > 0 && *n < all.len())
                .ok_or_else(|| {
                    invalid_params("invalid cursor: pass back a nextCursor exactly as received")
                })?,
        };
        let end = (start + self.page_size).min(all.len());
        let mut line = String::with_capacity(64 * 1024);
        line.push_str("{\"jsonrpc\":\"2.0\",\"id\":");
        line.push_str(&serde_json::to_string(id).unwrap_or_else(|_| "null".into()));
        line.push_str(",\"result\":{\"tools\":[");
        line.push_str(&all[start..end].join(","));
        line.push(']');
        if end < all.len() {
            line.push_str(",\"nextCursor\":");
            line.push_str(&serde_json::to_string(&encode_cursor(end)).unwrap_or_default());
        }
        line.push_str(&era.stamp_fields(true));
        line.push_str("}}");
        Ok(line)
    }
}

fn encode_cursor(offset: usize) -> String {
    format!("mcq-{:x}", offset ^ 0x5a5a)
}

fn decode_cursor(c: &str) -> Option<usize> {
    let hex = c.strip_prefix("mcq-")?;
    usize::from_str_radix(hex, 16).ok().map(|n| n ^ 0x5a5a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_and_rejects_garbage() {
        assert_eq!(decode_cursor(&encode_cursor(17)), Some(17));
        assert_eq!(decode_cursor("17"), None);
        assert_eq!(decode_cursor("mcq-zz"), None);
    }
}
