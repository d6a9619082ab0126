//! `tools/call` over a [`Server`]: plain calls, calls with their own bound for slow tools,
//! overlapping calls, and the checks of a `CallToolResult`.

use std::time::Duration;

use serde_json::{json, Value};

use super::server::{Server, RESPONSE_TIMEOUT};

impl Server {
    /// The serial log's current size, for waiting on output written from now on.
    pub fn serial_offset(&mut self, name: &str) -> u64 {
        let r = self.call_keeping(
            "vm_serial_read",
            json!({"name": name, "tail_lines": 1}),
            Duration::from_secs(60),
        );
        tool_ok(&r, "vm_serial_read")["offset"]
            .as_u64()
            .expect("serial offset")
    }

    /// Calls a tool and returns its `CallToolResult`; fails the test on a JSON-RPC error.
    pub fn call_tool(&mut self, name: &str, args: Value) -> Value {
        self.call_tool_within(name, args, RESPONSE_TIMEOUT)
    }

    /// [`Server::call_tool`], with an error instead of a panic (a tool error, `isError: true`,
    /// is still an `Ok`: it is a `CallToolResult`).
    pub fn try_call_tool(&mut self, name: &str, args: Value) -> Result<Value, String> {
        self.try_call_tool_within(name, args, RESPONSE_TIMEOUT)
    }

    /// Calls a tool with a custom bound on the wait for its response (for slow tools such as
    /// sandbox_vm or snapshots under TCG); returns the `CallToolResult`.
    pub fn call_tool_within(&mut self, name: &str, args: Value, timeout: Duration) -> Value {
        self.try_call_tool_within(name, args, timeout)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Server::call_tool_within`], with an error instead of a panic.
    pub fn try_call_tool_within(
        &mut self,
        name: &str,
        args: Value,
        timeout: Duration,
    ) -> Result<Value, String> {
        let params = json!({"name": name, "arguments": args});
        let (resp, _) = self.try_request_within("tools/call", params, timeout)?;
        match resp.get("result") {
            Some(r) => Ok(r.clone()),
            None => Err(format!("tools/call {name} gave a protocol error: {resp}")),
        }
    }

    /// Calls a tool with a progress token (as Claude Code sends on every call), timing it:
    /// the `CallToolResult`, the round trip, and the progress notifications that came with it.
    pub fn try_call_with_token(
        &mut self,
        name: &str,
        args: Value,
        timeout: Duration,
    ) -> Result<(Value, Duration, Vec<Value>), String> {
        let params = json!({"name": name, "arguments": args, "_meta": {"progressToken": "tok"}});
        let t0 = std::time::Instant::now();
        let (resp, others) = self.try_request_within("tools/call", params, timeout)?;
        let took = t0.elapsed();
        let progress = others
            .into_iter()
            .filter(|m| m["method"] == "notifications/progress")
            .collect();
        match resp.get("result") {
            Some(r) => Ok((r.clone(), took, progress)),
            None => Err(format!("tools/call {name} gave a protocol error: {resp}")),
        }
    }

    /// Calls a tool and returns the whole response message (result or error).
    pub fn call_tool_response(&mut self, name: &str, args: Value) -> Value {
        self.request("tools/call", json!({"name": name, "arguments": args}))
    }

    /// Calls a tool that must succeed; returns its `structuredContent`.
    pub fn call_ok(&mut self, name: &str, args: Value) -> Value {
        self.call_ok_within(name, args, RESPONSE_TIMEOUT)
    }

    /// Calls a tool that must fail with `isError`; returns its error text.
    pub fn call_err(&mut self, name: &str, args: Value) -> String {
        self.call_err_within(name, args, RESPONSE_TIMEOUT)
    }

    /// A call that must fail with an error of `kind` (`ops::error::ErrorKind`'s code); its text.
    pub fn call_err_kind(&mut self, name: &str, args: Value, kind: &str) -> String {
        let r = self.call_tool_within(name, args, RESPONSE_TIMEOUT);
        let text = tool_err(&r, name);
        assert_eq!(error_kind(&r), kind, "{name}: {text}");
        text
    }

    /// [`Server::call_ok`] with a custom bound.
    pub fn call_ok_within(&mut self, name: &str, args: Value, timeout: Duration) -> Value {
        self.try_call_ok_within(name, args, timeout)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Server::call_ok_within`], with an error instead of a panic.
    pub fn try_call_ok_within(
        &mut self,
        name: &str,
        args: Value,
        timeout: Duration,
    ) -> Result<Value, String> {
        let r = self.try_call_tool_within(name, args.clone(), timeout)?;
        try_tool_ok(&r, &format!("{name} {args}"))
    }

    /// [`Server::call_err`] with a custom bound.
    pub fn call_err_within(&mut self, name: &str, args: Value, timeout: Duration) -> String {
        let r = self.call_tool_within(name, args.clone(), timeout);
        tool_err(&r, &format!("{name} {args}"))
    }

    // Overlapping tool calls: start a call, make others while it runs, then collect its
    // response. The server runs each tools/call on its own worker.

    /// Sends a `tools/call` without waiting; returns its id for [`Server::finish_call`].
    pub fn start_call(&mut self, name: &str, args: Value) -> Value {
        let id = json!(self.fresh_id());
        self.send_request(&id, "tools/call", json!({"name": name, "arguments": args}));
        id
    }

    /// Waits (bounded) for the response to a call made with [`Server::start_call`] and returns
    /// its `CallToolResult`. Responses to other ids seen meanwhile are kept for later reads
    /// (notifications are dropped), so overlapping calls never lose each other's answers.
    pub fn finish_call(&mut self, id: &Value, timeout: Duration) -> Value {
        let (resp, others) = self.read_until_id(id, timeout);
        let responses: Vec<Value> = others
            .into_iter()
            .filter(|m| m.get("method").is_none())
            .collect();
        self.unread(responses);
        match resp.get("result") {
            Some(r) => r.clone(),
            None => panic!("tools/call {id} gave a protocol error: {resp}"),
        }
    }

    /// A tool call that keeps other calls' responses (see [`Server::finish_call`]).
    pub fn call_keeping(&mut self, name: &str, args: Value, timeout: Duration) -> Value {
        let id = self.start_call(name, args);
        self.finish_call(&id, timeout)
    }
}

/// Checks a `CallToolResult` is a success whose text block mirrors `structuredContent`;
/// returns the structured content.
pub fn tool_ok(result: &Value, what: &str) -> Value {
    try_tool_ok(result, what).unwrap_or_else(|e| panic!("{e}"))
}

/// [`tool_ok`], with an error instead of a panic.
pub fn try_tool_ok(result: &Value, what: &str) -> Result<Value, String> {
    if result["isError"] != json!(false) {
        return Err(format!(
            "{what} failed: {}; isError is {}",
            result["content"], result["isError"]
        ));
    }
    let structured = result
        .get("structuredContent")
        .ok_or_else(|| format!("{what}: no structuredContent in {result}"))?
        .clone();
    let text = result["content"][0]["text"]
        .as_str()
        .ok_or_else(|| format!("{what}: no text block in {result}"))?;
    let parsed: Value = serde_json::from_str(text)
        .map_err(|e| format!("{what}: the text block is not JSON ({e}): {text}"))?;
    if parsed != structured {
        return Err(format!(
            "{what}: text block differs from structuredContent\n text: {parsed}\n structured: {structured}"
        ));
    }
    Ok(structured)
}

/// Checks a `CallToolResult` is a tool error; returns its text.
pub fn tool_err(result: &Value, what: &str) -> String {
    assert_eq!(
        result["isError"],
        json!(true),
        "{what} should have failed: {result}"
    );
    let kind = error_kind(result);
    assert!(
        mcqemu::ops::error::ErrorKind::from_code(&kind).is_some(),
        "{what}: an error without a known kind in _meta: {result}"
    );
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: error without text: {result}"))
        .to_string()
}

/// The JSON-RPC error code of a response that must be an error.
pub fn error_code(resp: &Value) -> i64 {
    resp["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("not an error response: {resp}"))
}

/// The names of the tools in a `tools/list` result, in its order.
pub fn tool_names(list: &Value) -> Vec<String> {
    list["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("not a tools/list result: {list}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The kind code of an error result (`_meta["mcqemu/error"].kind`; empty when it has none).
pub fn error_kind(result: &Value) -> String {
    result["_meta"]["mcqemu/error"]["kind"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// `sh -c SCRIPT` in guest `vm` through guest_exec (120 s in the guest, 300 s for the call);
/// must exit 0; returns its stdout.
pub fn sh(s: &mut Server, vm: &str, script: &str) -> String {
    let r = s.call_ok_within(
        "guest_exec",
        json!({"name": vm, "command": "sh", "args": ["-c", script], "timeout": 120}),
        Duration::from_secs(300),
    );
    assert_eq!(
        r["exitcode"],
        json!(0),
        "sh -c {script:?} in {vm} failed: {r}"
    );
    r["stdout"].as_str().unwrap_or_default().to_string()
}

/// Decodes a PNG fully: (width, height, bytes per pixel, pixels). Independent of the code
/// under test (the png crate's decoder, not mcqemu's encoder).
pub fn decode_png(data: &[u8]) -> (u32, u32, usize, Vec<u8>) {
    let mut reader = png::Decoder::new(std::io::Cursor::new(data))
        .read_info()
        .expect("PNG header decodes");
    let mut buf = vec![
        0;
        reader
            .output_buffer_size()
            .expect("PNG buffer size fits memory")
    ];
    let info = reader.next_frame(&mut buf).expect("PNG image data decodes");
    buf.truncate(info.buffer_size());
    let bpp = info.color_type.samples() * usize::from(info.bit_depth as u8).div_ceil(8);
    (info.width, info.height, bpp, buf)
}
