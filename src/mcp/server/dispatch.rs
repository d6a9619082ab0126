//! Dispatch: each input line becomes a message, a notification or a request; a request is
//! answered inline, or handed to the tool calls ([`super::calls`]) and the resource side
//! ([`super::listening`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::state::Server;
use crate::mcp::era::{no_version, Era};
use crate::mcp::protocol::*;

impl Server {
    /// Handles one raw input line (already split and size-capped).
    pub fn handle_bytes(self: &Arc<Self>, bytes: &[u8]) {
        let text = match std::str::from_utf8(bytes) {
            Ok(t) => t,
            Err(e) => {
                return self.send(&error_response(
                    &Value::Null,
                    parse_error(format!("input is not valid UTF-8: {e}")),
                ))
            }
        };
        // JSON's own whitespace only: a line of other Unicode spaces is a parse error.
        if text.trim_matches([' ', '\t', '\r', '\n']).is_empty() {
            return;
        }
        let msg: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                return self.send(&error_response(
                    &Value::Null,
                    parse_error(format!("invalid JSON: {e}")),
                ))
            }
        };
        self.handle_message(msg);
    }

    pub(super) fn handle_message(self: &Arc<Self>, msg: Value) {
        let obj = match msg {
            Value::Object(o) => o,
            Value::Array(_) => {
                return self.send(&error_response(
                    &Value::Null,
                    invalid_request(
                        "JSON-RPC batches are not supported by MCP; send one message per line",
                    ),
                ))
            }
            _ => {
                return self.send(&error_response(
                    &Value::Null,
                    invalid_request("a JSON-RPC message must be an object"),
                ))
            }
        };
        let id = obj.get("id").cloned();
        let id_ok = matches!(
            id,
            None | Some(Value::String(_)) | Some(Value::Number(_)) | Some(Value::Null)
        );
        let reply_id = if id_ok {
            id.clone().unwrap_or(Value::Null)
        } else {
            Value::Null
        };
        if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return self.send(&error_response(
                &reply_id,
                invalid_request("missing or wrong \"jsonrpc\": must be \"2.0\""),
            ));
        }
        if !id_ok || id == Some(Value::Null) {
            return self.send(&error_response(
                &Value::Null,
                invalid_request("\"id\" must be a string or a number (MCP forbids null ids)"),
            ));
        }
        let method = match obj.get("method") {
            Some(Value::String(m)) => m.clone(),
            Some(_) => {
                return self.send(&error_response(
                    &reply_id,
                    invalid_request("\"method\" must be a string"),
                ))
            }
            None => {
                if obj.contains_key("result") || obj.contains_key("error") {
                    // A client's response: only roots/list is ever asked, so nothing else waits.
                    self.roots.on_response(&obj);
                    return;
                }
                return self.send(&error_response(
                    &reply_id,
                    invalid_request("missing \"method\""),
                ));
            }
        };
        let params = match obj.get("params") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(p)) => p.clone(),
            Some(_) => {
                if id.is_none() {
                    return;
                }
                return self.send(&error_response(
                    &reply_id,
                    invalid_params("\"params\" must be an object"),
                ));
            }
        };
        match id {
            None => self.handle_notification(&method, &params),
            Some(id) => self.handle_request(id, &method, params),
        }
    }

    pub(super) fn handle_notification(&self, method: &str, params: &Map<String, Value>) {
        if method == "notifications/cancelled" {
            if let Some(req) = params.get("requestId") {
                let key = req.to_string();
                // A listen stream the client ends: no answer follows.
                if self.subs.cancel(&key) {
                    return;
                }
                if let Ok(mut map) = self.inflight.lock() {
                    if let Some(flag) = map.get(&key) {
                        flag.store(true, Ordering::SeqCst);
                        crate::log::stderr("info", &format!("request {key} cancelled by client"));
                        // A call still waiting for a worker is dropped: it never runs.
                        if self.workers.cancel_queued(&key) {
                            map.remove(&key);
                        }
                    }
                }
            }
        }
        if method == "notifications/initialized" {
            self.ready.store(true, Ordering::SeqCst);
        }
        if method == "notifications/initialized" || method == "notifications/roots/list_changed" {
            self.roots.ask(&self.out);
        }
        // Every other notification needs nothing from us.
    }

    pub(super) fn handle_request(
        self: &Arc<Self>,
        id: Value,
        method: &str,
        params: Map<String, Value>,
    ) {
        let era = match Era::of_request(method, &params) {
            Ok(era) => era,
            Err(e) => return self.send(&error_response(&id, e)),
        };
        let result = if era.is_modern() {
            match method {
                "server/discover" => Ok(json!({
                    "supportedVersions": all_versions(),
                    "capabilities": self.capabilities(),
                    "instructions": self.instructions,
                })),
                "tools/list" => return self.list_tools(&id, &params, era),
                "tools/call" => return self.call_tool(id, params, era),
                "subscriptions/listen" => return self.listen(id, &params),
                "resources/list" | "resources/templates/list" | "resources/read"
                    if self.resources.is_some() =>
                {
                    return self.resource_request(id, method, params, era)
                }
                // ping and logging/setLevel are gone from 2026-07-28 (the log level travels
                // in each request's _meta), so they are unknown methods there.
                _ => Err(method_not_found(method)),
            }
        } else {
            let resource_method = matches!(
                method,
                "resources/list"
                    | "resources/templates/list"
                    | "resources/read"
                    | "resources/subscribe"
                    | "resources/unsubscribe"
            );
            let known = matches!(
                method,
                "initialize"
                    | "ping"
                    | "server/discover"
                    | "tools/list"
                    | "tools/call"
                    | "logging/setLevel"
            ) || (resource_method && self.resources.is_some());
            if !known {
                Err(method_not_found(method))
            } else if !matches!(method, "initialize" | "ping")
                && !self.initialized.load(Ordering::SeqCst)
            {
                Err(no_version(method))
            } else {
                match method {
                    "initialize" => self.initialize(&params),
                    "server/discover" => Ok(json!({
                        "supportedVersions": all_versions(),
                        "capabilities": self.capabilities(),
                        "serverInfo": server_info(),
                        "instructions": self.instructions,
                    })),
                    "resources/subscribe" | "resources/unsubscribe" => {
                        return self.subscribe_request(&id, method, &params)
                    }
                    _ if resource_method => return self.resource_request(id, method, params, era),
                    "tools/list" => return self.list_tools(&id, &params, era),
                    "logging/setLevel" => self.set_level(&params),
                    "tools/call" => return self.call_tool(id, params, era),
                    _ => Ok(json!({})),
                }
            }
        };
        match result {
            Ok(mut r) => {
                era.stamp(&mut r, method == "server/discover");
                self.send(&response(&id, r))
            }
            Err(e) => self.send(&error_response(&id, e)),
        }
    }

    pub(super) fn initialize(
        self: &Arc<Self>,
        params: &Map<String, Value>,
    ) -> Result<Value, jsonrpc_core::Error> {
        let requested = params
            .get("protocolVersion")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid_params("initialize needs \"protocolVersion\" (a string)"))?;
        self.initialized.store(true, Ordering::SeqCst);
        self.roots.on_initialize(params);
        // The list as it is now, before the answer: any change after it is notified.
        self.start_watch();
        Ok(json!({
            "protocolVersion": negotiate(requested),
            "capabilities": self.capabilities(),
            "serverInfo": server_info(),
            "instructions": self.instructions,
        }))
    }

    pub(super) fn set_level(
        &self,
        params: &Map<String, Value>,
    ) -> Result<Value, jsonrpc_core::Error> {
        let level = params.get("level").and_then(Value::as_str).unwrap_or("");
        let rank = log_level_rank(level).ok_or_else(|| {
            invalid_params(format!(
                "unknown log level {level:?}; use one of {}",
                LOG_LEVELS.join(", ")
            ))
        })?;
        self.log_level.store(rank, Ordering::Relaxed);
        Ok(json!({}))
    }

    /// Answers tools/list from the pre-serialized definitions, building the line by hand
    /// (the definitions are ~40 KB of JSON that never change).
    pub(super) fn list_tools(&self, id: &Value, params: &Map<String, Value>, era: Era) {
        match self.listing.page(self.tools, id, params.get("cursor"), era) {
            Ok(line) => {
                self.out.send_line(line.into_bytes());
            }
            Err(e) => self.send(&error_response(id, e)),
        }
    }
}
