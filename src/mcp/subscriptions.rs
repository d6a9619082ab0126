//! `subscriptions/listen` (2026-07-28): long-lived requests whose answer is a stream of change
//! notifications. Each stream is acknowledged first (`notifications/subscriptions/acknowledged`
//! with the filter the server honours), every notification on it carries the listen request's
//! id as `_meta["io.modelcontextprotocol/subscriptionId"]`, a client ends it with
//! `notifications/cancelled` (no answer follows), and the server ends it gracefully with a
//! result carrying the same id (at shutdown).
//!
//! Honoured here: `resourcesListChanged` (when the server has resources) and
//! `resourceSubscriptions` (the URIs among them that can be subscribed to; each gets
//! `notifications/resources/updated` when it changes). Not honoured, and so left out of the
//! acknowledgment: `toolsListChanged` (the tools never change while the server runs),
//! `promptsListChanged` (no prompts). The handshake era's `resources/subscribe` and
//! `resources/unsubscribe` keep their URIs here too ([`Subscriptions::subscribe`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use jsonrpc_core::Error as RpcError;
use serde_json::{json, Map, Value};

use super::era::Era;
use super::protocol::{invalid_params, notification, response};
use super::transport::Output;

/// `_meta` key naming the stream a notification (or the closing result) belongs to.
pub const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// One open stream.
struct Listener {
    /// The listen request's id, exactly as received.
    id: Value,
    /// Whether it receives `notifications/resources/list_changed`.
    resources: bool,
    /// The resources it receives `notifications/resources/updated` for.
    uris: Vec<String>,
}

/// Most resources one stream, or the handshake era's subscriptions, may follow.
pub const MAX_SUBSCRIBED: usize = 64;

/// The open `subscriptions/listen` streams of one server, by request id (as text).
#[derive(Default)]
pub struct Subscriptions {
    open: Mutex<BTreeMap<String, Listener>>,
    /// The handshake era's `resources/subscribe` URIs.
    legacy: Mutex<BTreeSet<String>>,
}

/// The filter honoured for a request's `notifications` filter: `resourcesListChanged` when asked
/// for and `resources` is true, and the `resourceSubscriptions` that `subscribable` accepts (at
/// most [`MAX_SUBSCRIBED`]); nothing else.
pub fn honoured(
    params: &Map<String, Value>,
    resources: bool,
    subscribable: &dyn Fn(&str) -> bool,
) -> Result<Value, RpcError> {
    let filter = params
        .get("notifications")
        .and_then(Value::as_object)
        .ok_or_else(|| {
            invalid_params(
                "subscriptions/listen needs \"notifications\" (an object such as \
                 {\"resourcesListChanged\": true})",
            )
        })?;
    let mut out = json!({});
    if resources && filter.get("resourcesListChanged") == Some(&Value::Bool(true)) {
        out["resourcesListChanged"] = json!(true);
    }
    if let Some(asked) = filter
        .get("resourceSubscriptions")
        .and_then(Value::as_array)
    {
        let mut uris: Vec<&str> = Vec::new();
        for u in asked.iter().filter_map(Value::as_str) {
            if resources && subscribable(u) && !uris.contains(&u) && uris.len() < MAX_SUBSCRIBED {
                uris.push(u);
            }
        }
        if !uris.is_empty() {
            out["resourceSubscriptions"] = json!(uris);
        }
    }
    Ok(out)
}

impl Subscriptions {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Listener>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens the stream of request `id` with the honoured filter `filter`: sends the
    /// acknowledgment, then registers it (under one lock, so no notification of the stream can
    /// precede its acknowledgment). False when a stream with that id is already open.
    pub fn open(&self, out: &Output, id: &Value, filter: Value) -> bool {
        let key = id.to_string();
        let mut open = self.lock();
        if open.contains_key(&key) {
            return false;
        }
        let resources = filter.get("resourcesListChanged") == Some(&Value::Bool(true));
        let uris = filter
            .get("resourceSubscriptions")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        out.send(&notification(
            "notifications/subscriptions/acknowledged",
            json!({ "_meta": { META_SUBSCRIPTION_ID: id }, "notifications": filter }),
        ));
        open.insert(
            key,
            Listener {
                id: id.clone(),
                resources,
                uris,
            },
        );
        true
    }

    /// True when a stream with request id `key` (as text) is open.
    pub fn is_open(&self, key: &str) -> bool {
        self.lock().contains_key(key)
    }

    /// Ends the stream the client cancelled (request id as text): true when there was one. No
    /// answer is sent for it.
    pub fn cancel(&self, key: &str) -> bool {
        self.lock().remove(key).is_some()
    }

    /// True when some stream wants resource list changes.
    pub fn wants_resources(&self) -> bool {
        self.lock().values().any(|l| l.resources)
    }

    /// Sends `notifications/resources/list_changed` on every stream that asked for it.
    pub fn resources_changed(&self, out: &Output) {
        for l in self.lock().values().filter(|l| l.resources) {
            out.send(&notification(
                "notifications/resources/list_changed",
                json!({ "_meta": { META_SUBSCRIPTION_ID: l.id } }),
            ));
        }
    }

    /// The handshake era's `resources/subscribe`: false when [`MAX_SUBSCRIBED`] are followed
    /// already.
    pub fn subscribe(&self, uri: &str) -> bool {
        let mut l = self.legacy.lock().unwrap_or_else(|p| p.into_inner());
        if l.len() >= MAX_SUBSCRIBED && !l.contains(uri) {
            return false;
        }
        l.insert(uri.to_string());
        true
    }

    /// The handshake era's `resources/unsubscribe`.
    pub fn unsubscribe(&self, uri: &str) {
        self.legacy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uri);
    }

    /// Every resource someone follows now.
    pub fn followed(&self) -> BTreeSet<String> {
        let mut all: BTreeSet<String> = self
            .legacy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for l in self.lock().values() {
            all.extend(l.uris.iter().cloned());
        }
        all
    }

    /// Sends `notifications/resources/updated` for `uri` to whoever follows it: each stream
    /// that asked (tagged with its id) and, when `legacy` (a handshake-era client that
    /// initialized), the plain notification for `resources/subscribe`.
    pub fn updated(&self, out: &Output, uri: &str, legacy: bool) {
        for l in self
            .lock()
            .values()
            .filter(|l| l.uris.iter().any(|u| u == uri))
        {
            out.send(&notification(
                "notifications/resources/updated",
                json!({ "uri": uri, "_meta": { META_SUBSCRIPTION_ID: l.id } }),
            ));
        }
        let followed = self
            .legacy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(uri);
        if legacy && followed {
            out.send(&notification(
                "notifications/resources/updated",
                json!({ "uri": uri }),
            ));
        }
    }

    /// Ends every stream gracefully: each listen request gets its result, carrying its id.
    pub fn close_all(&self, out: &Output) {
        let open = std::mem::take(&mut *self.lock());
        for l in open.into_values() {
            out.send(&response(&l.id, closing_result(&l.id)));
        }
    }
}

/// The result that ends a stream gracefully.
fn closing_result(id: &Value) -> Value {
    let mut r = json!({ "_meta": { META_SUBSCRIPTION_ID: id } });
    Era::Modern { log_rank: None }.stamp(&mut r, false);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if let Ok(mut b) = self.0.lock() {
                b.extend_from_slice(buf);
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn sent(sink: &Sink) -> Vec<Value> {
        let bytes = sink.0.lock().map(|b| b.clone()).unwrap_or_default();
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn filter(v: Value) -> Map<String, Value> {
        json!({ "notifications": v })
            .as_object()
            .cloned()
            .unwrap_or_default()
    }

    #[test]
    fn resource_lists_and_subscribable_resources_are_honoured() {
        let all = filter(json!({"toolsListChanged": true, "promptsListChanged": true,
            "resourcesListChanged": true,
            "resourceSubscriptions": ["mcqemu://vm/a/serial", "mcqemu://vm/a/screen", 7]}));
        let serial_only = |u: &str| u.ends_with("/serial");
        assert_eq!(
            honoured(&all, true, &serial_only).ok(),
            Some(json!({"resourcesListChanged": true,
                "resourceSubscriptions": ["mcqemu://vm/a/serial"]}))
        );
        assert_eq!(honoured(&all, false, &serial_only).ok(), Some(json!({})));
        assert!(honoured(&Map::new(), true, &serial_only).is_err());
    }

    #[test]
    fn updates_go_to_who_follows_the_resource() {
        let sink = Sink::default();
        let out = Output::new(Box::new(sink.clone()));
        let subs = Subscriptions::default();
        let f = json!({"resourceSubscriptions": ["u://a"]});
        assert!(subs.open(&out, &json!(5), f));
        assert!(subs.subscribe("u://b"));
        assert_eq!(subs.followed().len(), 2);
        subs.updated(&out, "u://a", true);
        subs.updated(&out, "u://b", true);
        subs.updated(&out, "u://c", true);
        subs.unsubscribe("u://b");
        subs.updated(&out, "u://b", true);
        let got = sent(&sink);
        let updates: Vec<&Value> = got
            .iter()
            .filter(|m| m["method"] == "notifications/resources/updated")
            .collect();
        assert_eq!(updates.len(), 2, "{got:?}");
        assert_eq!(
            updates[0]["params"]["_meta"][META_SUBSCRIPTION_ID],
            json!(5)
        );
        assert_eq!(updates[1]["params"], json!({"uri": "u://b"}));
    }

    #[test]
    fn acknowledged_first_tagged_by_id_and_closed_with_a_result() {
        let sink = Sink::default();
        let out = Output::new(Box::new(sink.clone()));
        let subs = Subscriptions::default();
        assert!(subs.open(&out, &json!("l1"), json!({"resourcesListChanged": true})));
        assert!(!subs.open(&out, &json!("l1"), json!({})));
        assert!(subs.open(&out, &json!(2), json!({})));
        assert!(subs.wants_resources());
        subs.resources_changed(&out);
        assert!(subs.cancel("2"));
        assert!(!subs.cancel("2"));
        subs.close_all(&out);
        assert!(!subs.is_open("\"l1\""));
        let msgs = sent(&sink);
        let methods: Vec<&str> = msgs
            .iter()
            .map(|m| m["method"].as_str().unwrap_or("(result)"))
            .collect();
        assert_eq!(
            methods,
            [
                "notifications/subscriptions/acknowledged",
                "notifications/subscriptions/acknowledged",
                "notifications/resources/list_changed",
                "(result)"
            ]
        );
        assert_eq!(msgs[0]["params"]["_meta"][META_SUBSCRIPTION_ID], "l1");
        assert_eq!(msgs[1]["params"]["notifications"], json!({}));
        assert_eq!(msgs[2]["params"]["_meta"][META_SUBSCRIPTION_ID], "l1");
        assert_eq!(msgs[3]["id"], "l1");
        assert_eq!(msgs[3]["result"]["resultType"], "complete");
        assert_eq!(msgs[3]["result"]["_meta"][META_SUBSCRIPTION_ID], "l1");
    }
}
