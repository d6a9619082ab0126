//! The MCP server: one reader thread turns lines into requests ([`dispatch`]); instant
//! requests are answered inline, each `tools/call` ([`calls`]) and `resources/read`
//! ([`listening`]) runs on a worker thread (bounded count) with its own cancel flag (and, for
//! tools, progress reporter). A watch thread notices when the resource list changes and tells
//! whoever listens. The state they share is [`Server`] ([`state`]).

use std::io::BufRead;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::client_roots::RootsHook;
use super::protocol::{error_response, parse_error};
use super::resources::Provider;
use super::tool::ToolDef;
use super::transport::{Line, LineReader, Output, MAX_LINE_BYTES};

mod calls;
mod dispatch;
mod listening;
mod state;

pub use state::Server;

/// How long in-flight calls may run on after stdin closes before they are cancelled.
const EOF_GRACE: Duration = Duration::from_secs(2);
/// How long cancelled calls get to wind down before the server exits anyway.
const CANCEL_GRACE: Duration = Duration::from_secs(3);

impl Server {
    /// Reads requests until EOF, then lets in-flight calls finish (bounded) and returns.
    pub fn run<R: BufRead>(self: &Arc<Self>, input: R) {
        let mut reader = LineReader::new(input, MAX_LINE_BYTES);
        loop {
            match reader.next_line() {
                Line::Eof => break,
                Line::TooLong(n) => {
                    self.send(&error_response(
                        &Value::Null,
                        parse_error(format!(
                            "line of {n} bytes exceeds the {MAX_LINE_BYTES}-byte limit; send \
                             smaller messages"
                        )),
                    ));
                }
                Line::Data(bytes) => self.handle_bytes(&bytes),
            }
        }
        self.shutdown(EOF_GRACE);
    }

    /// Ends in-flight work: waits up to `grace` for calls to finish, then cancels them and
    /// waits a bounded time more.
    pub fn shutdown(&self, grace: Duration) {
        // Listen streams end gracefully, each with its result.
        self.subs.close_all(&self.out);
        if !self.wait_idle(grace) {
            self.cancel_all();
            self.wait_idle(CANCEL_GRACE);
        }
    }
}

/// Serves MCP on stdin/stdout until EOF or SIGTERM/SIGINT, offering `tools` (with the
/// instructions that fit them) and, when given, `resources`. Returns the process exit code.
pub fn serve_stdio(
    tools: (&'static [ToolDef], &'static str),
    resources: Option<Arc<dyn Provider>>,
    roots_hook: Option<RootsHook>,
) -> i32 {
    let out = Arc::new(Output::new(Box::new(std::io::stdout())));
    let server = Server::with_resources(out, tools, roots_hook, resources);
    install_signal_handler(Arc::clone(&server));
    crate::log::stderr(
        "info",
        &format!("mcqemu {} serving MCP on stdio", env!("CARGO_PKG_VERSION")),
    );
    let stdin = std::io::stdin();
    server.run(stdin.lock());
    0
}

fn install_signal_handler(server: Arc<Server>) {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = match signal_hook::iterator::Signals::new([SIGTERM, SIGINT]) {
        Ok(s) => s,
        Err(e) => {
            crate::log::stderr("warn", &format!("cannot install signal handlers: {e}"));
            return;
        }
    };
    let _ = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                crate::log::stderr("info", &format!("signal {sig}: shutting down"));
                server.subs.close_all(&server.out);
                server.cancel_all();
                server.wait_idle(CANCEL_GRACE);
                std::process::exit(0);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Mutex;

    /// A sink the tests can read back.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::ErrorKind::Other)?
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    const fn stub(name: &'static str) -> ToolDef {
        ToolDef {
            name,
            title: name,
            description: "a stub",
            input_schema: || json!({"type": "object"}),
            output_schema: || json!({"type": "object"}),
            annotations: super::super::tool::Annotations {
                read_only: true,
                destructive: false,
                idempotent: true,
                open_world: false,
            },
            handler: |_, _| Ok(super::super::tool::ToolOutput::json(json!({}))),
            ui: crate::mcp::tool::Ui::NONE,
        }
    }

    static FIRST: [ToolDef; 1] = [stub("first")];
    static SECOND: [ToolDef; 1] = [stub("second")];

    fn listed(tools: &'static [ToolDef]) -> Vec<String> {
        let sink = Sink::default();
        let server = Server::new(Arc::new(Output::new(Box::new(sink.clone()))), tools);
        for line in [
            concat!(
                r#"{"jsonrpc":"2.0","id":1,"method":"initialize","#,
                r#""params":{"protocolVersion":"2025-11-25"}}"#
            ),
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        ] {
            server.handle_bytes(line.as_bytes());
        }
        let out = sink.0.lock().map(|b| b.clone()).unwrap_or_default();
        let last = String::from_utf8_lossy(&out)
            .lines()
            .last()
            .unwrap_or("")
            .to_string();
        let reply: Value = serde_json::from_str(&last).unwrap_or_default();
        reply["result"]["tools"]
            .as_array()
            .map(|t| {
                t.iter()
                    .filter_map(|t| t["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn each_server_lists_its_own_tools() {
        assert_eq!(listed(&FIRST), ["first"]);
        assert_eq!(listed(&SECOND), ["second"]);
    }
}
