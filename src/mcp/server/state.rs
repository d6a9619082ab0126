//! The server's state, shared by the reader, the workers, the watch and the signal thread,
//! and the small things every part of the server does with it (send a message, register a
//! request as in flight, cancel, wait for the workers).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::mcp::client_roots::{ClientRoots, RootsHook};
use crate::mcp::era::Era;
use crate::mcp::listing::Listing;
use crate::mcp::protocol::{capabilities, invalid_request, log_level_rank};
use crate::mcp::resources::{Provider, Watch};
use crate::mcp::subscriptions::Subscriptions;
use crate::mcp::tool::{Logger, ToolDef};
use crate::mcp::transport::Output;
use crate::mcp::workers::Workers;

/// Tools per `tools/list` page unless `MCQEMU_TOOLS_PAGE_SIZE` says otherwise.
const DEFAULT_PAGE_SIZE: usize = 100;

/// The server state shared by the reader, the workers and the signal thread.
pub struct Server {
    pub(super) out: Arc<Output>,
    pub(super) tools: &'static [ToolDef],
    /// What `initialize` and `server/discover` tell the model about the server.
    pub(super) instructions: &'static str,
    /// tools/list pages, from definitions serialized once.
    pub(super) listing: Listing,
    pub(super) inflight: Mutex<HashMap<String, Arc<AtomicBool>>>,
    pub(super) workers: Arc<Workers>,
    pub(super) log_level: Arc<AtomicUsize>,
    /// Set once a handshake-era client sent `initialize`.
    pub(super) initialized: AtomicBool,
    /// Set once it sent `notifications/initialized`: list-changed notifications may go out.
    pub(super) ready: AtomicBool,
    /// The client's roots, asked for when it declares them.
    pub(super) roots: ClientRoots,
    /// What the server offers as resources (None: no resources capability at all).
    pub(super) resources: Option<Arc<dyn Provider>>,
    /// Notices changes of the resource list, once someone may want to hear of them.
    pub(super) watch: Watch,
    /// The open `subscriptions/listen` streams (2026-07-28) and the handshake era's
    /// `resources/subscribe` URIs.
    pub(super) subs: Subscriptions,
    /// Set once the thread that tells followers of resource changes runs.
    pub(super) updates_started: AtomicBool,
}

impl Server {
    /// A server writing to `out` and serving `tools`.
    pub fn new(out: Arc<Output>, tools: &'static [ToolDef]) -> Arc<Self> {
        Self::with_roots_hook(out, tools, None)
    }

    /// A server that also asks a client declaring the `roots` capability for its roots and
    /// hands them to `hook`.
    pub fn with_roots_hook(
        out: Arc<Output>,
        tools: &'static [ToolDef],
        hook: Option<RootsHook>,
    ) -> Arc<Self> {
        Self::with_resources(out, (tools, crate::mcp::protocol::INSTRUCTIONS), hook, None)
    }

    /// A server with a roots hook (see [`Server::with_roots_hook`]) that also offers
    /// `resources` (the `resources` capability, `resources/*`, list-changed notifications),
    /// serving `tools` with the `instructions` that fit them.
    pub fn with_resources(
        out: Arc<Output>,
        (tools, instructions): (&'static [ToolDef], &'static str),
        hook: Option<RootsHook>,
        resources: Option<Arc<dyn Provider>>,
    ) -> Arc<Self> {
        let page_size = std::env::var("MCQEMU_TOOLS_PAGE_SIZE")
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .filter(|n| *n > 0)
            .unwrap_or(DEFAULT_PAGE_SIZE);
        Arc::new(Server {
            out,
            tools,
            instructions,
            listing: Listing::new(page_size),
            inflight: Mutex::new(HashMap::new()),
            workers: Arc::new(Workers::default()),
            log_level: Arc::new(AtomicUsize::new(log_level_rank("info").unwrap_or(1))),
            initialized: AtomicBool::new(false),
            ready: AtomicBool::new(false),
            roots: ClientRoots::new(hook),
            resources,
            watch: Watch::default(),
            subs: Subscriptions::default(),
            updates_started: AtomicBool::new(false),
        })
    }

    /// The capabilities this server declares: resources only when it has them.
    pub(super) fn capabilities(&self) -> Value {
        capabilities(self.resources.is_some())
    }

    pub(super) fn wait_idle(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while self.workers.busy() > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    pub(super) fn cancel_all(&self) {
        if let Ok(map) = self.inflight.lock() {
            for flag in map.values() {
                flag.store(true, Ordering::SeqCst);
            }
        }
    }

    pub(super) fn send(&self, msg: &Value) {
        self.out.send(msg);
    }

    /// The log sink for one call: the level `logging/setLevel` chose in the handshake era; in
    /// 2026-07-28 only the level the request itself opted in to (none: stderr only).
    pub(super) fn logger(&self, era: Era) -> Logger {
        match era {
            Era::Handshake => Logger::new(Some(self.out.clone()), self.log_level.clone()),
            Era::Modern { log_rank } => Logger::new(
                Some(self.out.clone()),
                Arc::new(AtomicUsize::new(log_rank.unwrap_or(usize::MAX))),
            ),
        }
    }

    /// Registers `id` as in flight (the key cancellation finds it by); the error for an id
    /// already in flight, a tool call's or a listen stream's.
    pub(super) fn claim(&self, id: &Value) -> Result<Arc<AtomicBool>, jsonrpc_core::Error> {
        let key = id.to_string();
        let mut map = match self.inflight.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        if map.contains_key(&key) || self.subs.is_open(&key) {
            return Err(invalid_request(format!(
                "request id {key} is already in flight; use a fresh id"
            )));
        }
        let cancel = Arc::new(AtomicBool::new(false));
        map.insert(key, cancel.clone());
        Ok(cancel)
    }
}
