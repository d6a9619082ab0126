//! `qopt` escapes a value so QEMU's option parser reads it back as one value: for any string
//! `s`, `file=<qopt(s)>` is one option whose value is exactly `s`, alone or between others.
//! Checked against `split_opts` and against a splitter written here after QEMU's own
//! `get_opt_value` (util/qemu-option.c), so a bug shared by `qopt` and `split_opts` shows too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcqemu::qemu::cmdline::{qopt, split_opts};

/// A port of QEMU's `get_opt_value` loop, applied part after part: take up to the next ','; a
/// ',' followed by another ',' is one literal comma and the part goes on after the pair; any
/// other ',' ends it. (QEMU does not unescape ",," in option names, only in values; the names
/// used here have no commas.)
fn qemu_split(s: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut rest = s;
    loop {
        let mut value = String::new();
        let ended_at_comma = loop {
            match rest.find(',') {
                None => {
                    value.push_str(rest);
                    rest = "";
                    break false;
                }
                Some(at) if rest[at + 1..].starts_with(',') => {
                    value.push_str(&rest[..=at]);
                    rest = &rest[at + 2..];
                }
                Some(at) => {
                    value.push_str(&rest[..at]);
                    rest = &rest[at + 1..];
                    break true;
                }
            }
        };
        parts.push(value);
        if !ended_at_comma {
            return parts;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    // The two splitters agree on any input, escaped or not.
    assert_eq!(split_opts(s), qemu_split(s), "splitters differ on {s:?}");

    let want = format!("file={s}");
    let alone = format!("file={}", qopt(s));
    assert_eq!(split_opts(&alone), [want.as_str()], "{s:?} alone");
    assert_eq!(qemu_split(&alone), [want.as_str()], "{s:?} alone (QEMU)");

    let embedded = format!("a=b,file={},c=d", qopt(s));
    let expect = ["a=b", want.as_str(), "c=d"];
    assert_eq!(split_opts(&embedded), expect, "{s:?} embedded");
    assert_eq!(qemu_split(&embedded), expect, "{s:?} embedded (QEMU)");
});
