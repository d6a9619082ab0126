//! Strict standard base64 decoding for the tests, written apart from the code under test
//! (`mcqemu::b64`), so that what the server encodes is checked by an independent reader.

/// Strict standard base64 (padding required); panics on anything else.
pub fn b64_decode(s: &str) -> Vec<u8> {
    fn val(c: u8) -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("invalid base64 character {:?}", c as char),
        }
    }
    let b = s.as_bytes();
    assert_eq!(
        b.len() % 4,
        0,
        "base64 length {} is not a multiple of 4",
        b.len()
    );
    let mut out = Vec::with_capacity(b.len() / 4 * 3);
    for q in b.chunks(4) {
        let pad = q.iter().rev().take_while(|c| **c == b'=').count();
        assert!(pad <= 2, "bad base64 padding");
        let mut n = 0u32;
        for (i, c) in q.iter().enumerate() {
            n |= if i >= 4 - pad { 0 } else { val(*c) } << (18 - 6 * i);
        }
        out.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8][..3 - pad]);
    }
    out
}

/// Standard base64 with padding, for what a test hands the server (a Docker config's `auth`).
pub fn b64_encode(text: &str) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in text.as_bytes().chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
