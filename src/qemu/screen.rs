//! Screen captures: QEMU writes PPM, converted here to PNG with a strict header parser and a
//! dimension cap (faster than QEMU's own PNG encoder, see `tools::drive`).

use std::path::{Path, PathBuf};

/// Largest screen accepted from a PPM (QEMU's own limit is far below).
pub const MAX_DIM: u32 = 16384;

/// A PNG in memory with its size.
pub struct Png {
    /// The encoded bytes.
    pub data: Vec<u8>,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
}

/// Why a capture could not be read or converted.
#[derive(Debug)]
pub enum ScreenError {
    /// The data does not start with `P6`.
    NotP6,
    /// The header ends before its three numbers.
    TruncatedHeader,
    /// A header field is not a number of at most six digits.
    BadNumber,
    /// A maximum sample value other than 255.
    Maxval(u32),
    /// Zero or over [`MAX_DIM`] pixels wide or high.
    Dimensions(u32, u32),
    /// No whitespace between the header and the pixels.
    BadHeader,
    /// Fewer pixel bytes than the header promises.
    TruncatedPixels,
    /// The PNG encoder failed.
    Encode(png::EncodingError),
}

impl std::fmt::Display for ScreenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScreenError::NotP6 => f.write_str("not a binary PPM (P6)"),
            ScreenError::TruncatedHeader => f.write_str("truncated PPM header"),
            ScreenError::BadNumber => f.write_str("bad number in PPM header"),
            ScreenError::Maxval(maxval) => write!(f, "unsupported PPM maxval {maxval}"),
            ScreenError::Dimensions(width, height) => {
                write!(f, "PPM dimensions {width}x{height} out of range")
            }
            ScreenError::BadHeader => f.write_str("bad PPM header"),
            ScreenError::TruncatedPixels => f.write_str("truncated PPM pixel data"),
            ScreenError::Encode(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ScreenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ScreenError::Encode(e) => Some(e),
            _ => None,
        }
    }
}

fn ppm_token(data: &[u8], pos: &mut usize) -> Result<u32, ScreenError> {
    loop {
        match data.get(*pos) {
            Some(b'#') => {
                while data.get(*pos).is_some_and(|b| *b != b'\n') {
                    *pos += 1;
                }
            }
            Some(b) if b.is_ascii_whitespace() => *pos += 1,
            Some(_) => break,
            None => return Err(ScreenError::TruncatedHeader),
        }
    }
    let start = *pos;
    while data.get(*pos).is_some_and(u8::is_ascii_digit) {
        *pos += 1;
    }
    if start == *pos || *pos - start > 6 {
        return Err(ScreenError::BadNumber);
    }
    std::str::from_utf8(&data[start..*pos])
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(ScreenError::BadNumber)
}

/// Parses a binary PPM header (P6, maxval 255): width, height and where the pixels start.
pub fn ppm_header(data: &[u8]) -> Result<(u32, u32, usize), ScreenError> {
    if data.len() < 2 || &data[..2] != b"P6" {
        return Err(ScreenError::NotP6);
    }
    let mut pos = 2;
    let width = ppm_token(data, &mut pos)?;
    let height = ppm_token(data, &mut pos)?;
    let maxval = ppm_token(data, &mut pos)?;
    if maxval != 255 {
        return Err(ScreenError::Maxval(maxval));
    }
    if width == 0 || height == 0 || width > MAX_DIM || height > MAX_DIM {
        return Err(ScreenError::Dimensions(width, height));
    }
    if !data.get(pos).is_some_and(u8::is_ascii_whitespace) {
        return Err(ScreenError::BadHeader);
    }
    Ok((width, height, pos + 1))
}

/// Converts a binary PPM (P6, maxval 255) into PNG.
pub fn ppm_to_png(data: &[u8]) -> Result<Png, ScreenError> {
    let (width, height, pos) = ppm_header(data)?;
    let need = width as usize * height as usize * 3;
    let pixels = data
        .get(pos..pos + need)
        .ok_or(ScreenError::TruncatedPixels)?;
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, width, height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        enc.set_compression(png::Compression::Fast);
        let mut w = enc.write_header().map_err(ScreenError::Encode)?;
        w.write_image_data(pixels).map_err(ScreenError::Encode)?;
    }
    Ok(Png {
        data: out,
        width,
        height,
    })
}

/// A temporary capture file, removed when dropped (success, error or timeout alike).
pub struct TempCapture(pub PathBuf);

impl TempCapture {
    /// A unique file name in `dir` for one capture.
    pub fn new(dir: &Path, ext: &str) -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        TempCapture(dir.join(format!(".screenshot-{}-{n}.{ext}", std::process::id())))
    }
}

impl Drop for TempCapture {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_ppm_to_a_png_of_the_same_size() {
        let mut ppm = b"P6\n# c\n2 3\n255\n".to_vec();
        ppm.extend(std::iter::repeat_n(7u8, 2 * 3 * 3));
        let png = ppm_to_png(&ppm).unwrap();
        assert_eq!((png.width, png.height), (2, 3));
        let info = png::Decoder::new(std::io::Cursor::new(&png.data[..]))
            .read_info()
            .unwrap()
            .info()
            .clone();
        assert_eq!((info.width, info.height), (2, 3));
    }

    #[test]
    fn rejects_bad_ppm() {
        assert!(ppm_to_png(b"P3\n1 1\n255\n").is_err());
        assert!(ppm_to_png(b"P6\n99999999 1\n255\n").is_err());
        assert!(ppm_to_png(b"P6\n2 2\n255\nabc").is_err());
        assert!(ppm_to_png(b"P6\n0 2\n255\n").is_err());
    }
}
