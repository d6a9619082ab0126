//! The two protocol eras a request can belong to, and what each asks of a reply.
//!
//! A request whose `params._meta` names `io.modelcontextprotocol/protocolVersion` is a
//! 2026-07-28 ("modern") request: it carries its own version, client capabilities and log
//! level, and its result must say `resultType`, identify the server in `_meta`, and carry cache
//! hints when the method is cacheable. Any other request belongs to the handshake era
//! (2024-11-05 … 2025-11-25), which `initialize` opens. `initialize` with a `protocolVersion` is
//! always handshake-era, even when a client stamps the envelope on it (the spec: "an initialize
//! request selects legacy semantics"); `initialize` with the envelope and no `protocolVersion`
//! is a 2026-07-28 request for a method that revision removed: -32601, like `ping` there.

use jsonrpc_core::Error as RpcError;
use serde_json::{json, Map, Value};

use super::protocol::{
    all_versions, invalid_params, log_level_rank, rpc_error, server_info, LOG_LEVELS, META_VERSION,
    MODERN_VERSIONS, UNSUPPORTED_VERSION,
};

/// JSON-RPC's code for a method the server does not know.
const METHOD_NOT_FOUND: i64 = -32601;

/// `_meta` key carrying the client's capabilities on a modern request (required).
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` key carrying the log level a modern request opts in to (optional).
pub const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
/// `_meta` key identifying the server on every modern result.
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// How long a client may cache `tools/list` and `server/discover`: both are fixed for a given
/// binary (the tool set and capabilities never change while it runs), so a day, the longest
/// the official SDKs honour.
pub const CACHE_TTL_MS: u64 = 24 * 60 * 60 * 1000;

/// The era a request is served in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Era {
    /// Handshake era: the version was fixed by `initialize`.
    Handshake,
    /// 2026-07-28: stateless; `log_rank` is the level the request opted in to (None: no log
    /// notifications for it at all).
    Modern {
        /// Position in [`LOG_LEVELS`] of the requested minimum level.
        log_rank: Option<usize>,
    },
}

impl Era {
    /// Reads the era off a request: `Ok(Handshake)` when it has no version envelope (or is
    /// `initialize`), `Ok(Modern)` for a well-formed 2026-07-28 envelope, and the spec's error
    /// for a malformed or unsupported one.
    pub fn of_request(method: &str, params: &Map<String, Value>) -> Result<Era, RpcError> {
        let meta = match params.get("_meta").and_then(Value::as_object) {
            Some(m) if m.contains_key(META_VERSION) => Some(m),
            _ => None,
        };
        if method == "initialize" {
            if meta.is_some() && !params.contains_key("protocolVersion") {
                return Err(initialize_removed());
            }
            return Ok(Era::Handshake);
        }
        let Some(meta) = meta else {
            return Ok(Era::Handshake);
        };
        let version = meta
            .get(META_VERSION)
            .and_then(Value::as_str)
            .ok_or_else(|| {
                invalid_params(format!(
                    "params._meta[\"{META_VERSION}\"] must be a string such as \"2026-07-28\""
                ))
            })?;
        if !meta
            .get(META_CLIENT_CAPABILITIES)
            .is_some_and(Value::is_object)
        {
            return Err(invalid_params(format!(
                "params._meta is missing the required envelope key \
                 {META_CLIENT_CAPABILITIES} (an object; {{}} declares no capabilities)"
            )));
        }
        if !MODERN_VERSIONS.contains(&version) {
            return Err(unsupported_version(&json!(version)));
        }
        let log_rank = match meta.get(META_LOG_LEVEL) {
            None | Some(Value::Null) => None,
            Some(level) => Some(level.as_str().and_then(log_level_rank).ok_or_else(|| {
                invalid_params(format!(
                    "params._meta[\"{META_LOG_LEVEL}\"] must be one of {}",
                    LOG_LEVELS.join(", ")
                ))
            })?),
        };
        Ok(Era::Modern { log_rank })
    }

    /// True for a 2026-07-28 request.
    pub fn is_modern(self) -> bool {
        matches!(self, Era::Modern { .. })
    }

    /// Adds what this era requires of a result: for modern requests `resultType` and the server
    /// stamp, plus cache hints when `cacheable`. Handshake-era results are left as they are.
    pub fn stamp(self, result: &mut Value, cacheable: bool) {
        if !self.is_modern() {
            return;
        }
        if let Some(obj) = result.as_object_mut() {
            obj.insert("resultType".into(), json!("complete"));
            if cacheable {
                obj.insert("ttlMs".into(), json!(CACHE_TTL_MS));
                obj.insert("cacheScope".into(), json!("public"));
            }
            let meta = obj.entry("_meta").or_insert_with(|| json!({}));
            if let Some(meta) = meta.as_object_mut() {
                meta.insert(META_SERVER_INFO.into(), server_info());
            }
        }
    }

    /// [`Era::stamp`] for a result that is cacheable but changes at any moment and belongs to
    /// this host (`resources/list`, `resources/read`): `ttlMs` 0 (stale at once) and
    /// `cacheScope` `private`.
    pub fn stamp_live(self, result: &mut Value) {
        self.stamp(result, false);
        if !self.is_modern() {
            return;
        }
        if let Some(obj) = result.as_object_mut() {
            obj.insert("ttlMs".into(), json!(0));
            obj.insert("cacheScope".into(), json!("private"));
        }
    }

    /// The same fields as [`Era::stamp`], as JSON text to splice before a result's closing brace
    /// (for results built by hand, like `tools/list`): empty for the handshake era.
    pub fn stamp_fields(self, cacheable: bool) -> String {
        let mut v = json!({});
        self.stamp(&mut v, cacheable);
        match v.as_object() {
            Some(o) if !o.is_empty() => o
                .iter()
                .map(|(k, v)| format!(",{}:{}", json!(k), v))
                .collect(),
            _ => String::new(),
        }
    }
}

/// The spec's -32022 error for a version this server does not speak, naming every version it
/// does (handshake-era ones included, so a dual-era client knows it may fall back).
pub fn unsupported_version(requested: &Value) -> RpcError {
    let supported = all_versions();
    rpc_error(
        UNSUPPORTED_VERSION,
        format!(
            "unsupported protocol version {requested}; this server speaks {}",
            supported.join(", ")
        ),
        Some(json!({ "supported": supported, "requested": requested })),
    )
}

/// The answer to an `initialize` carrying the 2026-07-28 envelope and no `protocolVersion`:
/// that revision removed the method (-32601, as for `ping`; the conformance suite, SEP-2575,
/// expects it). The message names both ways in and every version spoken.
pub fn initialize_removed() -> RpcError {
    let supported = all_versions();
    rpc_error(
        METHOD_NOT_FOUND,
        format!(
            "method not found: initialize (protocol 2026-07-28 removed it: its requests carry the \
             version in params._meta, and server/discover describes the server). To use the \
             handshake instead, send initialize with \"protocolVersion\" (2025-11-25 or \
             earlier). This server speaks {}",
            supported.join(", ")
        ),
        Some(json!({ "supported": supported })),
    )
}

/// The error for a request that carries no version on a connection that never initialized:
/// malformed in the 2026-07-28 revision (-32602), and premature in the handshake era.
pub fn no_version(method: &str) -> RpcError {
    invalid_params(format!(
        "{method} carries no protocol version and this connection has not initialized: send \
         initialize first (protocol 2025-11-25 and earlier), or put \"{META_VERSION}\" and \
         \"{META_CLIENT_CAPABILITIES}\" in params._meta (protocol 2026-07-28)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(meta: Value) -> Map<String, Value> {
        json!({ "_meta": meta })
            .as_object()
            .cloned()
            .unwrap_or_default()
    }

    #[test]
    fn requests_without_an_envelope_are_handshake_era() {
        assert_eq!(
            Era::of_request("tools/list", &Map::new()),
            Ok(Era::Handshake)
        );
        let progress_only = params(json!({"progressToken": 1}));
        assert_eq!(
            Era::of_request("tools/call", &progress_only),
            Ok(Era::Handshake)
        );
        let mut enveloped =
            params(json!({META_VERSION: "2026-07-28", META_CLIENT_CAPABILITIES: {}}));
        enveloped.insert("protocolVersion".into(), json!("2025-11-25"));
        assert_eq!(
            Era::of_request("initialize", &enveloped),
            Ok(Era::Handshake)
        );
        assert_eq!(
            Era::of_request("initialize", &Map::new()),
            Ok(Era::Handshake)
        );
    }

    #[test]
    fn initialize_with_the_envelope_and_no_protocol_version_is_a_removed_method() {
        for meta in [
            json!({META_VERSION: "2026-07-28", META_CLIENT_CAPABILITIES: {}}),
            json!({META_VERSION: "2099-01-01"}),
        ] {
            let e = Era::of_request("initialize", &params(meta)).err();
            let e = e.map(|e| (e.code.code(), e.message, e.data));
            let (code, message, data) = e.unwrap_or_default();
            assert_eq!(code, -32601);
            assert!(message.contains("server/discover"), "{message}");
            assert!(data.unwrap_or_default()["supported"]
                .as_array()
                .is_some_and(|s| s.contains(&json!("2026-07-28"))));
        }
    }

    #[test]
    fn a_full_envelope_is_modern_with_its_log_level() {
        let p = params(json!({META_VERSION: "2026-07-28", META_CLIENT_CAPABILITIES: {}}));
        assert_eq!(
            Era::of_request("tools/list", &p),
            Ok(Era::Modern { log_rank: None })
        );
        let p = params(json!({
            META_VERSION: "2026-07-28", META_CLIENT_CAPABILITIES: {}, META_LOG_LEVEL: "warning"
        }));
        assert_eq!(
            Era::of_request("tools/list", &p),
            Ok(Era::Modern {
                log_rank: log_level_rank("warning")
            })
        );
    }

    #[test]
    fn malformed_envelopes_are_invalid_params_and_unknown_versions_32022() {
        let no_caps = params(json!({META_VERSION: "2026-07-28"}));
        assert_eq!(
            Era::of_request("tools/list", &no_caps).map_err(|e| e.code.code()),
            Err(-32602)
        );
        let bad_type = params(json!({META_VERSION: 7, META_CLIENT_CAPABILITIES: {}}));
        assert_eq!(
            Era::of_request("tools/list", &bad_type).map_err(|e| e.code.code()),
            Err(-32602)
        );
        let bad_level = params(json!({
            META_VERSION: "2026-07-28", META_CLIENT_CAPABILITIES: {}, META_LOG_LEVEL: "loud"
        }));
        assert_eq!(
            Era::of_request("tools/list", &bad_level).map_err(|e| e.code.code()),
            Err(-32602)
        );
        for v in ["2099-01-01", "2025-11-25"] {
            let p = params(json!({META_VERSION: v, META_CLIENT_CAPABILITIES: {}}));
            let e = Era::of_request("tools/list", &p)
                .err()
                .map(|e| (e.code.code(), e.data));
            let (code, data) = e.unwrap_or_default();
            assert_eq!(code, -32022);
            let data = data.unwrap_or_default();
            assert_eq!(data["requested"], v);
            assert!(data["supported"]
                .as_array()
                .is_some_and(|s| s.contains(&json!("2026-07-28"))));
        }
    }

    #[test]
    fn modern_stamp_has_result_type_server_info_and_cache_hints() {
        let era = Era::Modern { log_rank: None };
        let mut r = json!({"tools": []});
        era.stamp(&mut r, true);
        assert_eq!(r["resultType"], "complete");
        assert_eq!(r["cacheScope"], "public");
        assert_eq!(r["ttlMs"], CACHE_TTL_MS);
        assert_eq!(r["_meta"][META_SERVER_INFO]["name"], "mcqemu");
        let mut call = json!({"content": []});
        era.stamp(&mut call, false);
        assert!(call.get("ttlMs").is_none());
        let mut live = json!({"resources": []});
        era.stamp_live(&mut live);
        assert_eq!(
            (live["ttlMs"].as_u64(), live["cacheScope"].as_str()),
            (Some(0), Some("private"))
        );
        assert_eq!(live["resultType"], "complete");
        let mut legacy = json!({"tools": []});
        Era::Handshake.stamp_live(&mut legacy);
        Era::Handshake.stamp(&mut legacy, true);
        assert_eq!(legacy, json!({"tools": []}));
        assert_eq!(Era::Handshake.stamp_fields(true), "");
        let spliced: Value =
            serde_json::from_str(&format!("{{\"tools\":[]{}}}", era.stamp_fields(true)))
                .unwrap_or_default();
        assert_eq!(spliced["resultType"], "complete");
    }
}
