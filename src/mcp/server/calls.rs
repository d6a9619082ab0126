//! `tools/call`: the call is checked against its tool's schema, then runs on a worker with its
//! own cancel flag, progress reporter and logger; its answer goes out when it ends (none when
//! the client cancelled it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use jsonrpc_core::Error as RpcError;
use serde_json::{Map, Value};

use super::state::Server;
use crate::mcp::call;
use crate::mcp::client_roots::ROOTS_WAIT;
use crate::mcp::era::Era;
use crate::mcp::protocol::{error_response, invalid_params, response};
use crate::mcp::tool::{error_result, Args, Progress, ToolCtx, ToolDef, ToolError};
use crate::mcp::workers::Job;

/// A call's result as the response to request `id`, stamped for `era`.
fn answer(id: &Value, era: Era, mut result: Value) -> Value {
    era.stamp(&mut result, false);
    response(id, result)
}

/// Runs a checked call's handler (the one call path, `mcp::call`); a tool error and a panic
/// alike become an error result, so a panicking handler still answers and releases its slot.
fn run_handler(tool: &ToolDef, ctx: &ToolCtx, args: Args) -> Value {
    match call::run(tool, ctx, args) {
        Ok(out) => out.to_result(),
        Err(e) => error_result(&e),
    }
}

impl Server {
    /// The tool a `tools/call` names and its arguments, or the error for the request.
    fn tool_and_args(
        &self,
        params: &Map<String, Value>,
    ) -> Result<(&'static ToolDef, Map<String, Value>), RpcError> {
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid_params("tools/call needs \"name\" (a string)"))?;
        // An unknown tool is a protocol error (the spec's), not a tool error.
        let tool = call::find(self.tools, name).map_err(|e| invalid_params(e.msg))?;
        let args = match params.get("arguments") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(a)) => a.clone(),
            Some(_) => return Err(invalid_params("\"arguments\" must be an object")),
        };
        Ok((tool, args))
    }

    /// Runs a checked call on a worker (see the module doc); the worker pool's refusal is the
    /// call's error result.
    pub(super) fn call_tool(self: &Arc<Self>, id: Value, params: Map<String, Value>, era: Era) {
        let (tool, args) = match self.tool_and_args(&params) {
            Ok(t) => t,
            Err(e) => return self.send(&error_response(&id, e)),
        };
        let name = tool.name;
        let args = match call::check(tool, args) {
            Ok(args) => args,
            Err(err) => return self.send(&answer(&id, era, error_result(&err))),
        };
        let cancel = match self.claim(&id) {
            Ok(c) => c,
            Err(e) => return self.send(&error_response(&id, e)),
        };
        let progress = params
            .get("_meta")
            .and_then(|m| m.get("progressToken"))
            .filter(|t| t.is_string() || t.is_number())
            .map(|t| Progress::new(t.clone(), self.out.clone()));
        let ctx = ToolCtx::new(cancel.clone(), progress, self.logger(era));
        let key = id.to_string();
        let job = Job {
            key: key.clone(),
            name: name.to_string(),
            run: self.call_job(tool, id.clone(), args, ctx, cancel, era),
        };
        if let Err(e) = self.workers.submit(job) {
            if let Ok(mut map) = self.inflight.lock() {
                map.remove(&key);
            }
            let err = ToolError::new(format!("{name}: {e}"));
            self.send(&answer(&id, era, error_result(&err)));
        }
    }

    /// What a worker runs for one call: waits for the client's roots (handshake era), runs
    /// the handler, releases the request id, notices a changed resource list (a call that added
    /// or removed a VM says so before its answer), then answers unless cancelled.
    fn call_job(
        self: &Arc<Self>,
        tool: &'static ToolDef,
        id: Value,
        args: Args,
        ctx: ToolCtx,
        cancel: Arc<AtomicBool>,
        era: Era,
    ) -> Box<dyn FnOnce() + Send> {
        let server = Arc::clone(self);
        Box::new(move || {
            if era == Era::Handshake {
                server.roots.wait_ready(ROOTS_WAIT);
            }
            let result = run_handler(tool, &ctx, args);
            if let Ok(mut map) = server.inflight.lock() {
                map.remove(&id.to_string());
            }
            server.check_resources();
            if !cancel.load(Ordering::SeqCst) {
                server.send(&answer(&id, era, result));
            }
        })
    }
}
