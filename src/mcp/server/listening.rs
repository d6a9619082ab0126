//! The server's resource side: `resources/*` requests on the workers, 2026-07-28
//! `subscriptions/listen` streams, and the watch that notices when the resource list changes.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::state::Server;
use crate::mcp::era::Era;
use crate::mcp::protocol::{
    error_response, invalid_request, method_not_found, notification, response, rpc_error,
};
use crate::mcp::resources;
use crate::mcp::subscriptions;
use crate::mcp::workers::Job;

/// How often the watch thread looks for resource list changes (each tool call also looks when
/// it ends, before its answer).
const WATCH_INTERVAL: Duration = Duration::from_millis(500);
/// How often followed resources are looked at for changes.
const UPDATE_INTERVAL: Duration = Duration::from_secs(1);

impl Server {
    /// `resources/list`, `resources/templates/list` (answered at once) and `resources/read`
    /// (on a worker: a screen capture takes up to a few seconds, and must not hold up the
    /// reader).
    pub(super) fn resource_request(
        self: &Arc<Self>,
        id: Value,
        method: &str,
        params: Map<String, Value>,
        era: Era,
    ) {
        let Some(provider) = self.resources.clone() else {
            return self.send(&error_response(&id, method_not_found(method)));
        };
        let answer = match method {
            "resources/list" => resources::list_result(provider.as_ref(), &params, era),
            "resources/templates/list" => {
                resources::templates_result(provider.as_ref(), &params, era)
            }
            _ => {
                let uri = match resources::read_uri(&params) {
                    Ok(u) => u,
                    Err(e) => return self.send(&error_response(&id, e)),
                };
                let cancel = match self.claim(&id) {
                    Ok(c) => c,
                    Err(e) => return self.send(&error_response(&id, e)),
                };
                let key = id.to_string();
                let server = Arc::clone(self);
                let job_key = key.clone();
                let reply_id = id.clone();
                let run = move || {
                    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        resources::read_result(provider.as_ref(), &uri, era)
                    }))
                    .unwrap_or_else(|_| {
                        Err(rpc_error(
                            resources::INTERNAL_ERROR,
                            "internal error (reading the resource panicked); this is a bug \
                             in mcqemu, please report it",
                            Some(json!({ "uri": uri })),
                        ))
                    });
                    if let Ok(mut map) = server.inflight.lock() {
                        map.remove(&job_key);
                    }
                    if !cancel.load(Ordering::SeqCst) {
                        server.send(&match read {
                            Ok(r) => response(&reply_id, r),
                            Err(e) => error_response(&reply_id, e),
                        });
                    }
                };
                let job = Job {
                    key: key.clone(),
                    name: "resources-read".into(),
                    run: Box::new(run),
                };
                if let Err(e) = self.workers.submit(job) {
                    if let Ok(mut map) = self.inflight.lock() {
                        map.remove(&key);
                    }
                    self.send(&error_response(
                        &id,
                        rpc_error(resources::INTERNAL_ERROR, e.to_string(), None),
                    ));
                }
                return;
            }
        };
        match answer {
            Ok(r) => self.send(&response(&id, r)),
            Err(e) => self.send(&error_response(&id, e)),
        }
    }

    /// `subscriptions/listen` (2026-07-28): acknowledges the stream with the filter honoured
    /// and keeps it open until the client cancels it or the server shuts down.
    pub(super) fn listen(self: &Arc<Self>, id: Value, params: &Map<String, Value>) {
        let provider = self.resources.clone();
        let subscribable = |u: &str| provider.as_ref().is_some_and(|p| p.version(u).is_some());
        let filter = match subscriptions::honoured(params, self.resources.is_some(), &subscribable)
        {
            Ok(f) => f,
            Err(e) => return self.send(&error_response(&id, e)),
        };
        let key = id.to_string();
        let in_flight = self
            .inflight
            .lock()
            .map(|m| m.contains_key(&key))
            .unwrap_or(false);
        if filter.get("resourcesListChanged").is_some() {
            // The list as it is now, before the acknowledgment.
            self.start_watch();
        }
        let follows = filter.get("resourceSubscriptions").is_some();
        if in_flight || !self.subs.open(&self.out, &id, filter) {
            return self.send(&error_response(
                &id,
                invalid_request(format!(
                    "request id {key} is already in flight; use a fresh id"
                )),
            ));
        }
        if follows {
            self.start_updates();
        }
    }

    /// The handshake era's `resources/subscribe` and `resources/unsubscribe` (answered at once):
    /// a resource that cannot be followed is refused with a reason.
    pub(super) fn subscribe_request(
        self: &Arc<Self>,
        id: &Value,
        method: &str,
        params: &Map<String, Value>,
    ) {
        let Some(provider) = self.resources.clone() else {
            return self.send(&error_response(id, method_not_found(method)));
        };
        let uri = match params.get("uri").and_then(Value::as_str) {
            Some(u) => u.to_string(),
            None => {
                return self.send(&error_response(
                    id,
                    crate::mcp::protocol::invalid_params(format!(
                        "{method} needs \"uri\" (such as mcqemu://vm/NAME/metrics)"
                    )),
                ))
            }
        };
        if method == "resources/unsubscribe" {
            self.subs.unsubscribe(&uri);
            return self.send(&response(id, json!({})));
        }
        if provider.version(&uri).is_none() {
            return self.send(&error_response(
                id,
                crate::mcp::protocol::invalid_params(format!(
                    "{uri:?} cannot be subscribed to: only a VM's serial console and metrics \
                     (mcqemu://vm/NAME/serial, mcqemu://vm/NAME/metrics) of a VM that exists \
                     can; read a screen with resources/read or wait for it with vm_screen_wait"
                )),
            ));
        }
        if !self.subs.subscribe(&uri) {
            return self.send(&error_response(
                id,
                crate::mcp::protocol::invalid_params(format!(
                    "at most {} resources can be followed at once; unsubscribe from one first",
                    subscriptions::MAX_SUBSCRIBED
                )),
            ));
        }
        self.start_updates();
        self.send(&response(id, json!({})));
    }

    /// Starts the thread that tells followers when their resources changed, once: it looks at
    /// each followed resource's version every second.
    pub(super) fn start_updates(self: &Arc<Self>) {
        let Some(provider) = self.resources.clone() else {
            return;
        };
        if self.updates_started.swap(true, Ordering::SeqCst) {
            return;
        }
        let weak: Weak<Server> = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("resources-updates".into())
            .spawn(move || {
                let mut seen: std::collections::BTreeMap<String, Option<String>> =
                    Default::default();
                loop {
                    std::thread::sleep(UPDATE_INTERVAL);
                    let Some(server) = weak.upgrade() else {
                        return;
                    };
                    if server.out.is_closed() {
                        return;
                    }
                    let followed = server.subs.followed();
                    seen.retain(|u, _| followed.contains(u));
                    for uri in followed {
                        let now = provider.version(&uri);
                        match seen.insert(uri.clone(), now.clone()) {
                            Some(before) if before != now => {
                                let legacy = server.ready.load(Ordering::SeqCst);
                                server.subs.updated(&server.out, &uri, legacy);
                            }
                            _ => {}
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            self.updates_started.store(false, Ordering::SeqCst);
            crate::log::stderr(
                "warning",
                &format!("cannot start the resource updates ({e}); subscribers hear nothing"),
            );
        }
    }

    /// Takes the resource list as it is now and starts the watch thread, once.
    pub(super) fn start_watch(self: &Arc<Self>) {
        let Some(provider) = self.resources.clone() else {
            return;
        };
        if !self.watch.start(provider.as_ref()) {
            return;
        }
        let weak: Weak<Server> = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("resources-watch".into())
            .spawn(move || loop {
                std::thread::sleep(WATCH_INTERVAL);
                let Some(server) = weak.upgrade() else {
                    return;
                };
                if server.out.is_closed() {
                    return;
                }
                server.check_resources();
            });
        if let Err(e) = spawned {
            crate::log::stderr(
                "warning",
                &format!(
                    "cannot start the resource watch ({e}); list changes are noticed only when a \
                     tool call ends"
                ),
            );
        }
    }

    /// Tells whoever listens when the resource list changed since it was last looked at: a
    /// handshake-era client that initialized, and every listen stream that asked.
    pub(super) fn check_resources(&self) {
        let Some(provider) = &self.resources else {
            return;
        };
        if !self.watch.changed(provider.as_ref()) {
            return;
        }
        if self.ready.load(Ordering::SeqCst) {
            self.send(&notification(
                "notifications/resources/list_changed",
                json!({}),
            ));
        }
        self.subs.resources_changed(&self.out);
    }
}
