//! Protocol constants and message builders: versions, error codes, JSON-RPC envelopes.

use jsonrpc_core::{Error as RpcError, ErrorCode};
use serde_json::{json, Value};

/// Protocol versions answered by `initialize`, oldest first. The newest is the fallback.
pub const INIT_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// The stateless revision: no `initialize`, the version travels in every request's `_meta`.
pub const STATELESS_VERSION: &str = "2026-07-28";

/// Versions answered per request (the version in each request's `_meta`), oldest first.
pub const MODERN_VERSIONS: &[&str] = &[STATELESS_VERSION];

/// `_meta` key carrying the protocol version in the stateless revision.
pub const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";

/// Error code for a protocol version the server does not speak (stateless revision).
pub const UNSUPPORTED_VERSION: i64 = -32022;

/// Every version this server speaks, in any style.
pub fn all_versions() -> Vec<&'static str> {
    let mut v = INIT_VERSIONS.to_vec();
    v.extend_from_slice(MODERN_VERSIONS);
    v
}

/// The newest version `initialize` can answer with.
pub fn newest_init_version() -> &'static str {
    INIT_VERSIONS[INIT_VERSIONS.len() - 1]
}

/// Picks the version to answer an `initialize` with: the requested one when supported, else
/// the newest.
pub fn negotiate(requested: &str) -> &'static str {
    INIT_VERSIONS
        .iter()
        .find(|v| **v == requested)
        .copied()
        .unwrap_or_else(newest_init_version)
}

/// The server's name, version and title as MCP's `serverInfo`.
pub fn server_info() -> Value {
    json!({
        "name": "mcqemu",
        "title": "mcqemu: QEMU virtual machines for agents",
        "version": env!("CARGO_PKG_VERSION"),
    })
}

/// What the server offers, as MCP capabilities: tools (a fixed set), logging, and resources
/// with list-changed notifications when `resources` is true (only then are they served).
pub fn capabilities(resources: bool) -> Value {
    let mut caps = json!({ "tools": { "listChanged": false }, "logging": {} });
    if resources {
        caps["resources"] = json!({ "listChanged": true, "subscribe": true });
        // MCP Apps: the live view is a ui:// resource.
        caps["extensions"] = json!({
            "io.modelcontextprotocol/ui": { "mimeTypes": ["text/html;profile=mcp-app"] }
        });
    }
    caps
}

/// A short orientation for agents, sent in `initialize` and `server/discover`.
pub use super::instructions::INSTRUCTIONS;

/// A JSON-RPC error object with optional data.
pub fn rpc_error(code: i64, message: impl Into<String>, data: Option<Value>) -> RpcError {
    RpcError {
        code: ErrorCode::from(code),
        message: message.into(),
        data,
    }
}

/// Standard code for a parse error (bad JSON, bad UTF-8, oversize line).
pub fn parse_error(message: impl Into<String>) -> RpcError {
    rpc_error(ErrorCode::ParseError.code(), message, None)
}

/// Standard code for a message that is JSON but not a valid request.
pub fn invalid_request(message: impl Into<String>) -> RpcError {
    rpc_error(ErrorCode::InvalidRequest.code(), message, None)
}

/// Standard code for a method the server does not know.
pub fn method_not_found(method: &str) -> RpcError {
    rpc_error(
        ErrorCode::MethodNotFound.code(),
        format!("method not found: {method}"),
        None,
    )
}

/// Standard code for bad params (wrong shape, unknown tool, bad cursor).
pub fn invalid_params(message: impl Into<String>) -> RpcError {
    rpc_error(ErrorCode::InvalidParams.code(), message, None)
}

/// A JSON-RPC success envelope; the id is echoed exactly as received.
pub fn response(id: &Value, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

/// A JSON-RPC error envelope; the id is echoed exactly, or null when it could not be read.
pub fn error_response(id: &Value, err: RpcError) -> Value {
    let mut e = json!({ "code": err.code.code(), "message": err.message });
    if let Some(data) = err.data {
        e["data"] = data;
    }
    json!({ "jsonrpc": "2.0", "id": id, "error": e })
}

/// A JSON-RPC notification envelope.
pub fn notification(method: &str, params: Value) -> Value {
    json!({ "jsonrpc": "2.0", "method": method, "params": params })
}

/// MCP log levels (syslog order, least severe first).
pub const LOG_LEVELS: &[&str] = &[
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

/// Position of a log level in [`LOG_LEVELS`], or None for an unknown name.
pub fn log_level_rank(level: &str) -> Option<usize> {
    LOG_LEVELS.iter().position(|l| *l == level)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_echoes_supported_and_falls_back_to_newest() {
        assert_eq!(negotiate("2024-11-05"), "2024-11-05");
        assert_eq!(negotiate("2025-06-18"), "2025-06-18");
        assert_eq!(negotiate("1999-01-01"), "2025-11-25");
        assert_eq!(negotiate(STATELESS_VERSION), "2025-11-25");
    }

    #[test]
    fn error_envelope_echoes_id_and_data() {
        let v = error_response(&json!("abc"), rpc_error(-32022, "x", Some(json!({"a": 1}))));
        assert_eq!(v["id"], "abc");
        assert_eq!(v["error"]["code"], -32022);
        assert_eq!(v["error"]["data"]["a"], 1);
    }
}
