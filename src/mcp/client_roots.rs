//! The client's roots (MCP `roots/list`). A handshake-era client that declares the `roots`
//! capability is asked for its roots once it has initialized, and again after each
//! `notifications/roots/list_changed`; the answer goes to a hook (the server's path policy,
//! which this layer knows nothing about). Tool calls wait, briefly and boundedly, for an
//! outstanding answer, so the first call after start-up is already judged by the client's roots.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::transport::Output;

/// Receives the client's roots as folders (None: the client has none, or would not say).
pub type RootsHook = fn(Option<Vec<PathBuf>>);

/// How long a tool call waits for an outstanding `roots/list` answer.
pub const ROOTS_WAIT: Duration = Duration::from_secs(2);

/// The state of the roots conversation with one client.
#[derive(Default)]
pub struct ClientRoots {
    hook: Option<RootsHook>,
    declared: AtomicBool,
    pending: AtomicBool,
    next: AtomicU64,
    asked: Mutex<Option<String>>,
}

impl ClientRoots {
    /// A conversation that hands answers to `hook` (None: roots are never asked for).
    pub fn new(hook: Option<RootsHook>) -> Self {
        ClientRoots {
            hook,
            ..ClientRoots::default()
        }
    }

    /// Notes whether the client's `initialize` declared the `roots` capability.
    pub fn on_initialize(&self, params: &Map<String, Value>) {
        let declared = params
            .get("capabilities")
            .and_then(|c| c.get("roots"))
            .is_some_and(Value::is_object);
        self.declared.store(declared, Ordering::SeqCst);
    }

    /// Asks the client for its roots, when it declared them.
    pub fn ask(&self, out: &Output) {
        if self.hook.is_none() || !self.declared.load(Ordering::SeqCst) {
            return;
        }
        let id = format!("mcq-roots-{}", self.next.fetch_add(1, Ordering::SeqCst) + 1);
        if let Ok(mut asked) = self.asked.lock() {
            *asked = Some(id.clone());
        }
        self.pending.store(true, Ordering::SeqCst);
        out.send(&json!({"jsonrpc": "2.0", "id": id, "method": "roots/list", "params": {}}));
    }

    /// Takes a client's response: true when it answered our latest `roots/list`.
    pub fn on_response(&self, msg: &Map<String, Value>) -> bool {
        let id = msg.get("id").and_then(Value::as_str);
        let ours = match self.asked.lock() {
            Ok(mut asked) if asked.is_some() && asked.as_deref() == id => {
                *asked = None;
                true
            }
            _ => false,
        };
        if !ours {
            return false;
        }
        let roots = msg
            .get("result")
            .and_then(|r| r.get("roots"))
            .and_then(Value::as_array)
            .map(|list| {
                list.iter()
                    .filter_map(|r| r.get("uri").and_then(Value::as_str))
                    .filter_map(file_uri_to_path)
                    .collect::<Vec<_>>()
            });
        if roots.is_none() {
            crate::log::stderr(
                "warning",
                "the client did not list its roots; the default roots stay in force",
            );
        }
        if let Some(hook) = self.hook {
            hook(roots);
        }
        self.pending.store(false, Ordering::SeqCst);
        true
    }

    /// Waits (at most `limit`) for an outstanding `roots/list` answer.
    pub fn wait_ready(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.pending.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The path of a `file://` URI (percent-decoded), or None for any other URI.
pub fn file_uri_to_path(uri: &str) -> Option<PathBuf> {
    let rest = uri.strip_prefix("file://")?;
    let path = rest.strip_prefix("localhost").unwrap_or(rest);
    if !path.starts_with('/') {
        return None;
    }
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    if out.contains(&0) {
        return None;
    }
    use std::os::unix::ffi::OsStringExt;
    Some(PathBuf::from(std::ffi::OsString::from_vec(out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_uris_decode_and_others_are_ignored() {
        assert_eq!(
            file_uri_to_path("file:///home/u/my%20proj"),
            Some(PathBuf::from("/home/u/my proj"))
        );
        assert_eq!(
            file_uri_to_path("file://localhost/tmp"),
            Some(PathBuf::from("/tmp"))
        );
        assert_eq!(file_uri_to_path("https://x/y"), None);
        assert_eq!(file_uri_to_path("file://host/tmp"), None);
        assert_eq!(file_uri_to_path("file:///a%00b"), None);
        assert_eq!(file_uri_to_path("file:///a%zz"), None);
        assert_eq!(file_uri_to_path("file:///a%2"), Some(PathBuf::from("/a%2")));
    }
}
