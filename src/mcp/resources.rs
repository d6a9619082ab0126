//! MCP resources, protocol side: what a server offers as resources ([`Provider`]), the
//! `resources/list`, `resources/templates/list` and `resources/read` results, their errors per
//! era, and noticing when the list changes ([`Watch`]). What the resources are (VM consoles and
//! screens) is the provider's business (`tools::resources`); who hears of a change is the server's business
//! (handshake era: `notifications/resources/list_changed`; 2026-07-28: the
//! `subscriptions/listen` streams of [`super::subscriptions`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use jsonrpc_core::Error as RpcError;
use serde_json::{json, Map, Value};

use super::era::Era;
use super::protocol::{invalid_params, rpc_error};

/// The handshake era's code for a resource that does not exist (2024-11-05 … 2025-11-25).
pub const RESOURCE_NOT_FOUND_LEGACY: i64 = -32002;
/// JSON-RPC's internal error, for a resource that exists but could not be read.
pub const INTERNAL_ERROR: i64 = -32603;

/// Why a resource could not be read; each message says what to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// No such resource (an unknown URI, or a VM that is gone).
    NotFound(String),
    /// The resource exists but could not be read now (a stopped or wedged VM).
    Failed(String),
}

/// The resources a server offers. Every method is bounded in time: `read` must answer within a
/// few seconds whatever the thing it reads is doing.
pub trait Provider: Send + Sync {
    /// The resources there are now (MCP `Resource` objects, each with `uri` and `name`), in a
    /// stable order.
    fn list(&self) -> Vec<Value>;
    /// The URI templates (MCP `ResourceTemplate` objects); fixed for the life of the process.
    fn templates(&self) -> Vec<Value>;
    /// The contents of the resource at `uri` (MCP `TextResourceContents` or
    /// `BlobResourceContents`, at least one).
    fn read(&self, uri: &str) -> Result<Vec<Value>, ReadError>;
    /// A cheap token that changes whenever [`Provider::list`] may have changed (say a file's
    /// identity and time); None when there is no cheaper way than listing.
    fn stamp(&self) -> Option<String>;
    /// A cheap token that changes whenever the resource at `uri` may have changed, for its
    /// subscribers; None: it cannot be subscribed to (or does not exist).
    fn version(&self, _uri: &str) -> Option<String> {
        None
    }
}

/// Refuses a `cursor`: every listing fits one page, so no cursor was ever handed out.
fn no_cursor(params: &Map<String, Value>) -> Result<(), RpcError> {
    match params.get("cursor") {
        None | Some(Value::Null) => Ok(()),
        Some(_) => Err(invalid_params(
            "invalid cursor: this server lists every resource in one page and never hands out a \
             nextCursor; list again without one",
        )),
    }
}

/// The `resources/list` result.
pub fn list_result(
    p: &dyn Provider,
    params: &Map<String, Value>,
    era: Era,
) -> Result<Value, RpcError> {
    no_cursor(params)?;
    let mut r = json!({ "resources": p.list() });
    // The list follows the VMs: never fresh for long, and specific to this host.
    era.stamp_live(&mut r);
    Ok(r)
}

/// The `resources/templates/list` result.
pub fn templates_result(
    p: &dyn Provider,
    params: &Map<String, Value>,
    era: Era,
) -> Result<Value, RpcError> {
    no_cursor(params)?;
    let mut r = json!({ "resourceTemplates": p.templates() });
    // Fixed for a given binary, like tools/list.
    era.stamp(&mut r, true);
    Ok(r)
}

/// The `uri` parameter of `resources/read`.
pub fn read_uri(params: &Map<String, Value>) -> Result<String, RpcError> {
    params
        .get("uri")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| {
            invalid_params(
                "resources/read needs \"uri\" (a string such as mcqemu://vm/NAME/serial); \
                 resources/list shows the resources there are",
            )
        })
}

/// The `resources/read` result for `uri`, or its error in the words of `era`.
pub fn read_result(p: &dyn Provider, uri: &str, era: Era) -> Result<Value, RpcError> {
    match p.read(uri) {
        Ok(contents) => {
            let mut r = json!({ "contents": contents });
            // A console and a screen change all the time.
            era.stamp_live(&mut r);
            Ok(r)
        }
        Err(e) => Err(read_error(uri, &e, era)),
    }
}

/// A read failure as a JSON-RPC error: a missing resource is -32602 in 2026-07-28 ("Resource
/// not found" moved there from -32002, which the handshake era uses), a failed read -32603;
/// both carry the URI in `data`.
pub fn read_error(uri: &str, e: &ReadError, era: Era) -> RpcError {
    let data = Some(json!({ "uri": uri }));
    match e {
        ReadError::NotFound(msg) if era.is_modern() => {
            rpc_error(invalid_params("").code.code(), msg.clone(), data)
        }
        ReadError::NotFound(msg) => rpc_error(RESOURCE_NOT_FOUND_LEGACY, msg.clone(), data),
        ReadError::Failed(msg) => rpc_error(INTERNAL_ERROR, msg.clone(), data),
    }
}

/// Notices changes of a provider's list: the URIs last seen, and the stamp they were seen at.
#[derive(Default)]
pub struct Watch {
    started: AtomicBool,
    last: Mutex<Option<(Option<String>, Vec<String>)>>,
}

fn uris(p: &dyn Provider) -> Vec<String> {
    p.list()
        .iter()
        .filter_map(|r| r.get("uri").and_then(Value::as_str).map(str::to_string))
        .collect()
}

impl Watch {
    /// Takes the current list as the baseline the first time (true then: the caller starts
    /// whatever polls [`Watch::changed`]); later calls do nothing and return false.
    pub fn start(&self, p: &dyn Provider) -> bool {
        if self.started.swap(true, Ordering::SeqCst) {
            return false;
        }
        let seen = (p.stamp(), uris(p));
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(seen);
        true
    }

    /// True once [`Watch::start`] ran.
    pub fn started(&self) -> bool {
        self.started.load(Ordering::SeqCst)
    }

    /// True when the list differs from the one last seen (which it then becomes). Cheap while
    /// the provider's stamp stays the same. Concurrent callers see each change once.
    pub fn changed(&self, p: &dyn Provider) -> bool {
        if !self.started() {
            return false;
        }
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let stamp = p.stamp();
        if let Some((seen_stamp, _)) = last.as_ref() {
            if stamp.is_some() && stamp == *seen_stamp {
                return false;
            }
        }
        let now = uris(p);
        let differs = last.as_ref().is_none_or(|(_, seen)| *seen != now);
        *last = Some((stamp, now));
        differs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A provider whose list the test sets.
    #[derive(Default)]
    struct Fake {
        names: Mutex<Vec<String>>,
        stamp: Mutex<Option<String>>,
    }

    impl Provider for Fake {
        fn list(&self) -> Vec<Value> {
            let names = self.names.lock().map(|n| n.clone()).unwrap_or_default();
            names
                .iter()
                .map(|n| json!({"uri": format!("x://{n}"), "name": n}))
                .collect()
        }
        fn templates(&self) -> Vec<Value> {
            vec![json!({"uriTemplate": "x://{n}", "name": "x"})]
        }
        fn read(&self, uri: &str) -> Result<Vec<Value>, ReadError> {
            match uri {
                "x://a" => Ok(vec![json!({"uri": uri, "text": "a"})]),
                "x://stuck" => Err(ReadError::Failed("stuck; retry".into())),
                _ => Err(ReadError::NotFound(format!("no {uri}"))),
            }
        }
        fn stamp(&self) -> Option<String> {
            self.stamp.lock().ok().and_then(|s| s.clone())
        }
    }

    impl Fake {
        fn set(&self, names: &[&str], stamp: Option<&str>) {
            if let Ok(mut n) = self.names.lock() {
                *n = names.iter().map(|s| s.to_string()).collect();
            }
            if let Ok(mut s) = self.stamp.lock() {
                *s = stamp.map(str::to_string);
            }
        }
    }

    const MODERN: Era = Era::Modern { log_rank: None };

    #[test]
    fn a_watch_reports_each_change_once_and_trusts_an_unchanged_stamp() {
        let p = Fake::default();
        let w = Watch::default();
        assert!(!w.changed(&p), "not started: nothing to compare with");
        p.set(&["a"], Some("1"));
        assert!(w.start(&p));
        assert!(!w.start(&p));
        assert!(!w.changed(&p));
        p.set(&["a", "b"], Some("2"));
        assert!(w.changed(&p));
        assert!(!w.changed(&p));
        // Same stamp: not even listed.
        p.set(&["a"], Some("2"));
        assert!(!w.changed(&p));
        // A new stamp with the same list is no change.
        p.set(&["a", "b"], Some("3"));
        assert!(!w.changed(&p));
        // Without stamps every check lists.
        p.set(&["b"], None);
        assert!(w.changed(&p));
        assert!(!w.changed(&p));
    }

    #[test]
    fn results_and_errors_follow_the_era() {
        let p = Fake::default();
        p.set(&["a"], None);
        let none = Map::new();
        let r = list_result(&p, &none, MODERN).unwrap_or_default();
        assert_eq!(r["resources"][0]["uri"], "x://a");
        assert_eq!(
            (r["ttlMs"].as_u64(), r["cacheScope"].as_str()),
            (Some(0), Some("private"))
        );
        let r = list_result(&p, &none, Era::Handshake).unwrap_or_default();
        assert!(r.get("ttlMs").is_none() && r.get("resultType").is_none());
        let r = templates_result(&p, &none, MODERN).unwrap_or_default();
        assert_eq!(r["cacheScope"], "public");
        let mut cursor = Map::new();
        cursor.insert("cursor".into(), json!("c"));
        assert!(list_result(&p, &cursor, MODERN).is_err());
        let r = read_result(&p, "x://a", MODERN).unwrap_or_default();
        assert_eq!(r["contents"][0]["text"], "a");
        assert_eq!(r["resultType"], "complete");
        let code = |uri: &str, era: Era| read_result(&p, uri, era).map_err(|e| e.code.code());
        assert_eq!(code("x://gone", MODERN), Err(-32602));
        assert_eq!(code("x://gone", Era::Handshake), Err(-32002));
        assert_eq!(code("x://stuck", MODERN), Err(-32603));
        let e = read_result(&p, "x://gone", MODERN)
            .err()
            .and_then(|e| e.data);
        assert_eq!(e, Some(json!({"uri": "x://gone"})));
    }
}
