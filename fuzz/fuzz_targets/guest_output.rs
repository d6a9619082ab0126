//! What mcqemu reads out of a guest's program output, which a hostile guest controls: the
//! guest_list_dir lister's lines, a background process's output slices as
//! guest_exec_status shapes them, a final guest-exec status (captured streams, the wrapper's
//! refusal). The first byte picks the mode (`% 3`); nothing may panic, and:
//!
//! - listing: entries sorted by name, unique, at most `max`, names that are plain file names
//!   (no `/`, not `.` or `..`), a mode of four octal digits;
//! - background slices: offsets never behind the data returned, `more` exactly when data is
//!   left, dropped bytes counted only past what was asked for;
//! - exec status: streams capped at guest_exec's limit (flagged when cut), a refusal only for
//!   the wrapper's own exit status.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::{fuzz_target, Corpus};
use mcqemu::ops::guest::background::{shape, Known, StatusRequest};
use mcqemu::ops::guest::listing::parse;
use mcqemu::ops::guest::spool::{wrapper_refusal, Slice};
use mcqemu::ops::guest::{decode_stream, MAX_OUTPUT};
use mcqemu::qemu::agent_calls::ExecStatus;
use serde_json::json;

fn listing(data: &[u8]) {
    let Some((&max, rest)) = data.split_first() else {
        return;
    };
    let max = usize::from(max);
    let text = String::from_utf8_lossy(rest);
    let (entries, truncated) = parse(&text, max);
    assert!(entries.len() <= max);
    let lines = text.lines().count();
    assert!(entries.len() <= lines);
    if truncated {
        assert_eq!(entries.len(), max);
    }
    for w in entries.windows(2) {
        assert!(w[0].name < w[1].name, "not sorted and unique: {:?}", w);
    }
    for e in &entries {
        assert!(!e.name.is_empty() && !e.name.contains('/'), "{:?}", e.name);
        assert!(e.name != "." && e.name != "..");
        assert!(
            e.mode.len() == 4 && e.mode.chars().all(|c| ('0'..='7').contains(&c)),
            "mode {:?}",
            e.mode
        );
    }
}

fn u64_at(d: &[u8], i: usize) -> u64 {
    let mut b = [0u8; 8];
    for (k, slot) in b.iter_mut().enumerate() {
        *slot = d.get(i * 8 + k).copied().unwrap_or(0);
    }
    // Small numbers are the interesting ones: keep them near the data's length.
    u64::from_le_bytes(b) % (1 << 20)
}

fn slices(data: &[u8]) {
    let nums: Vec<u64> = (0..6).map(|i| u64_at(data, i)).collect();
    let body = data.get(48..).unwrap_or_default();
    let split = (nums[5] as usize).min(body.len());
    let (od, ed) = body.split_at(split);
    let slice = |size: u64, start: u64, data: &[u8]| {
        // As read_from makes them: start <= size, data within the file.
        let start = start.min(size);
        let len = (data.len() as u64).min(size - start) as usize;
        Slice {
            size,
            start,
            data: data[..len].to_vec(),
        }
    };
    let o = slice(nums[0], nums[1], od);
    let e = slice(nums[2], nums[3], ed);
    let req = StatusRequest {
        name: "vm".into(),
        handle: "bg-1".into(),
        stdout_offset: nums[4],
        stderr_offset: nums[4] / 2,
        wait: Duration::ZERO,
    };
    let k = Known {
        pid: 7,
        command: "c".into(),
        ended: None,
        native: nums[4] % 2 == 1,
    };
    let (o_end, e_end) = (o.start + o.data.len() as u64, e.start + e.data.len() as u64);
    let (o_size, e_size, o_start) = (o.size, e.size, o.start);
    let s = shape(&req, &k, true, o, e);
    assert!(s.stdout_next_offset >= o_end, "{s:?}");
    assert!(s.stderr_next_offset >= e_end, "{s:?}");
    assert!(s.stdout_next_offset <= o_size.max(o_end), "{s:?}");
    assert!(s.stderr_next_offset <= e_size.max(e_end), "{s:?}");
    assert_eq!(s.more, o_end < o_size || e_end < e_size);
    assert_eq!(s.stdout_dropped, o_start.saturating_sub(req.stdout_offset));
}

fn exec_status(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    // Either JSON the agent might send, or the bytes as a capture.
    let reply = serde_json::from_str(&text).unwrap_or_else(|_| {
        let b64 = mcqemu::b64::encode(data);
        let code = data.first().map_or(0, |b| i64::from(*b % 130));
        json!({"exited": true, "exitcode": code, "out-data": b64, "err-data": b64,
               "out-truncated": data.len() % 2 == 1})
    });
    // A reply that is not a guest-exec-status is refused whole (QgaError::Garbage).
    let Ok(status) = serde_json::from_value::<ExecStatus>(reply) else {
        return;
    };
    for (bytes, flag) in [
        (status.stdout(), status.out_truncated),
        (status.stderr(), status.err_truncated),
    ] {
        let (out, cut) = decode_stream(bytes, flag);
        assert!(out.len() <= MAX_OUTPUT * 3, "{} bytes", out.len());
        if flag {
            assert!(cut);
        }
    }
    if wrapper_refusal(&status).is_some() {
        assert_eq!(
            status.exitcode,
            Some(125),
            "a refusal without the wrapper's code"
        );
    }
}

fuzz_target!(|data: &[u8]| -> Corpus {
    let Some((&mode, rest)) = data.split_first() else {
        return Corpus::Reject;
    };
    if rest.len() > 256 * 1024 {
        return Corpus::Reject;
    }
    match mode % 3 {
        0 => listing(rest),
        1 => slices(rest),
        _ => exec_status(rest),
    }
    Corpus::Keep
});
