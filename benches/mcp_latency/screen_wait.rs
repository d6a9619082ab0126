//! The vm_screen_wait row, on the booted test guest of [`crate::guest::guest_rows`].

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::Server;
use crate::report::Table;
use crate::vm::{VmBench, VM_CALL_TIMEOUT};
use crate::{structured, Res, ToolCalls};

/// vm_screen_wait's overhead: a background guest_exec writes a line into the VGA text buffer
/// 1 s later (through /dev/mem; the test guest has no console on VGA), and the row is how long
/// after that change vm_screen_wait (stable_ms 300) returned, above its stable time. The
/// screen's cursor blinks, so a settled screen takes two of its phases (~270 ms each) to tell.
pub fn screen_wait_row(
    vb: &VmBench,
    table: &mut Table,
    server: &mut Server,
    name: &str,
) -> Res<()> {
    const STABLE_MS: u64 = 300;
    let mut round = 0u32;
    vb.slow
        .measure(table, "vm_screen_wait over stable_ms 300", None, || {
            round += 1;
            // Each round another text at row 12: the screen differs from the last one.
            let cells: String = format!("WAIT-{round:04}")
                .chars()
                .map(|c| format!("{c}\\017"))
                .collect();
            let at = 0xb8000 + 12 * 160;
            let script = format!(
                "(sleep 1; printf '{cells}' | dd of=/dev/mem bs=1 seek={at} conv=notrunc) \
                 >/dev/null 2>&1 &"
            );
            server.tool("vm_screenshot", json!({"name": name}))?;
            let r = server.tool_within(
                "guest_exec",
                json!({"name": name, "command": "sh", "args": ["-c", script]}),
                VM_CALL_TIMEOUT,
            )?;
            let started = Instant::now();
            structured(&r)?;
            let w = server.tool_within(
                "vm_screen_wait",
                json!({"name": name, "stable_ms": STABLE_MS, "timeout_s": 20}),
                VM_CALL_TIMEOUT,
            )?;
            let took = started.elapsed();
            let s = structured(&w)?;
            if s["changed"] != json!(true) || s["stable"] != json!(true) {
                return Err(format!("vm_screen_wait saw no settled change: {s}"));
            }
            Ok(took.saturating_sub(Duration::from_millis(1000 + STABLE_MS)))
        })?;
    Ok(())
}
