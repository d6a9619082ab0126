//! The data channel as guest_copy_out reads it: the fuzz bytes are everything a hostile guest
//! writes into its port. The host skips to the nonce's opening line, reads a tar stream to its
//! end-of-archive block and then the end marker, through a buffer whose size the first byte
//! picks (so lines and markers fall across refills). Nothing may panic; the opening line and a
//! clean end are accepted only when the bytes really carry them; every loop ends.
#![no_main]

use std::io::BufReader;

use libfuzzer_sys::{fuzz_target, Corpus};
use mcqemu::ops::guest::copy::frame;
use mcqemu::state::tar::Reader;

/// Inputs above this are refused: the framing and a few tar blocks fit well inside.
const MAX_INPUT: usize = 64 * 1024;
const NONCE: &str = "n0nce";

fn has(data: &[u8], needle: &[u8]) -> bool {
    data.windows(needle.len()).any(|w| w == needle)
}

fuzz_target!(|data: &[u8]| -> Corpus {
    let Some((&size, data)) = data.split_first() else {
        return Corpus::Reject;
    };
    if data.len() > MAX_INPUT {
        return Corpus::Reject;
    }
    let mut r = BufReader::with_capacity(usize::from(size % 64) + 1, data);
    let begun = frame::sync(&mut r, &format!("MCQ-BEGIN {NONCE}"));
    let Ok(rest) = begun else {
        return Corpus::Keep;
    };
    assert!(has(data, format!("MCQ-BEGIN {NONCE}").as_bytes()));
    assert!(
        !rest.contains('\n'),
        "the opening line's rest spans lines: {rest:?}"
    );
    {
        let mut tr = Reader::new(&mut r);
        loop {
            match tr.next_entry() {
                Ok(Some(e)) => {
                    // Every other entry's data is read out; the reader skips the rest.
                    if e.size % 2 == 0 && tr.data(&mut std::io::sink()).is_err() {
                        break;
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
    }
    if frame::trailer(&mut r, NONCE).is_ok() {
        assert!(has(data, format!("MCQ-END {NONCE} 0\n").as_bytes()));
    }
    Corpus::Keep
});
