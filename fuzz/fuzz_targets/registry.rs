//! `vms.json` parsing: arbitrary bytes never panic, oversized files are refused, and whatever
//! parses survives a write and a re-read unchanged (records, unknown top-level keys) without
//! new warnings.
#![no_main]

use std::sync::Once;

use libfuzzer_sys::fuzz_target;
use mcqemu::state::registry::{parse, serialize, MAX_FILE_BYTES, SCHEMA_VERSION};

static SIZE_LIMIT: Once = Once::new();

/// The size cap, checked once per process: libFuzzer's -max_len keeps inputs far below it.
/// Whitespace is what an empty registry looks like, so only the size can make these fail.
fn check_size_limit() {
    let mut big = vec![b' '; MAX_FILE_BYTES];
    assert!(parse(&big).is_ok(), "{MAX_FILE_BYTES} bytes are allowed");
    big.push(b' ');
    assert!(
        parse(&big).is_err(),
        "over {MAX_FILE_BYTES} bytes must be refused"
    );
}

fuzz_target!(|data: &[u8]| {
    SIZE_LIMIT.call_once(check_size_limit);
    let Ok(first) = parse(data) else {
        return;
    };
    let written = serialize(&first.vms, &first.extra);
    let again = match parse(&written) {
        Ok(p) => p,
        Err(e) => panic!(
            "our own output does not parse ({e}):\n{}",
            String::from_utf8_lossy(&written)
        ),
    };
    assert_eq!(again.vms, first.vms, "records changed on a round trip");
    assert_eq!(
        again.extra, first.extra,
        "top-level keys changed on a round trip"
    );
    assert!(
        again.warnings.is_empty(),
        "new warnings: {:?}",
        again.warnings
    );
    assert_eq!(again.version, SCHEMA_VERSION);
});
