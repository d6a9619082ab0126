//! Standard base64 (RFC 4648, with padding): image content, guest-agent file data.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Encodes bytes as padded standard base64.
pub fn encode(data: &[u8]) -> String {
    // Bytes first, one String at the end: pushing chars one at a time cost 2.3 ms for a
    // 657 KB screenshot, this 0.9 ms.
    let mut out = Vec::with_capacity(data.len().div_ceil(3) * 4);
    let mut chunks = data.chunks_exact(3);
    for c in &mut chunks {
        let n = (u32::from(c[0]) << 16) | (u32::from(c[1]) << 8) | u32::from(c[2]);
        out.extend_from_slice(&[
            ALPHABET[(n >> 18) as usize & 63],
            ALPHABET[(n >> 12) as usize & 63],
            ALPHABET[(n >> 6) as usize & 63],
            ALPHABET[n as usize & 63],
        ]);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let b1 = rest.get(1).copied().unwrap_or(0);
        let n = (u32::from(rest[0]) << 16) | (u32::from(b1) << 8);
        out.push(ALPHABET[(n >> 18) as usize & 63]);
        out.push(ALPHABET[(n >> 12) as usize & 63]);
        out.push(if rest.len() == 2 {
            ALPHABET[(n >> 6) as usize & 63]
        } else {
            b'='
        });
        out.push(b'=');
    }
    // Every byte pushed is from the ASCII alphabet or '='.
    String::from_utf8(out).unwrap_or_default()
}

/// Decoding table: the 6-bit value of each base64 character, 0xFF for anything else.
const DECODE: [u8; 256] = {
    let mut t = [0xFFu8; 256];
    let mut i = 0;
    while i < 64 {
        t[ALPHABET[i] as usize] = i as u8;
        i += 1;
    }
    t
};

/// Why base64 text did not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// A character outside the alphabet, padding and whitespace.
    InvalidChar(char),
    /// Alphabet characters after `=` padding.
    DataAfterPadding,
    /// A length no encoder produces (one character left over).
    WrongLength,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::InvalidChar(c) => write!(f, "invalid base64 character {c:?}"),
            DecodeError::DataAfterPadding => f.write_str("invalid base64: data after padding"),
            DecodeError::WrongLength => f.write_str("invalid base64: wrong length"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Decodes standard base64; whitespace is ignored, padding optional.
pub fn decode(text: &str) -> Result<Vec<u8>, DecodeError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3 + 3);
    let mut acc: u32 = 0;
    let mut n = 0u32;
    let mut padding = 0;
    for &c in bytes {
        let v = DECODE[c as usize];
        if v == 0xFF {
            match c {
                b'=' => {
                    padding += 1;
                    continue;
                }
                b' ' | b'\n' | b'\r' | b'\t' => continue,
                _ => return Err(DecodeError::InvalidChar(c as char)),
            }
        }
        if padding > 0 {
            return Err(DecodeError::DataAfterPadding);
        }
        acc = (acc << 6) | u32::from(v);
        n += 1;
        if n == 4 {
            out.extend_from_slice(&[(acc >> 16) as u8, (acc >> 8) as u8, acc as u8]);
            acc = 0;
            n = 0;
        }
    }
    match n {
        0 => {}
        2 => out.push((acc >> 4) as u8),
        3 => out.extend_from_slice(&[(acc >> 10) as u8, (acc >> 2) as u8]),
        _ => return Err(DecodeError::WrongLength),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for s in [
            &b""[..],
            b"f",
            b"fo",
            b"foo",
            b"foob",
            b"fooba",
            b"foobar",
            &[0, 255, 128, 7],
        ] {
            assert_eq!(decode(&encode(s)).unwrap(), s);
        }
        assert_eq!(encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(encode(b"fo"), "Zm8=");
        assert!(decode("Zm9v!").is_err());
        assert!(decode("Zg=x").is_err());
        assert_eq!(decode("Zm9v\nYmFy").unwrap(), b"foobar");
        assert_eq!(decode("Zm8").unwrap(), b"fo");
    }
}
