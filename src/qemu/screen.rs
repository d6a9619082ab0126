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

fn ppm_token(data: &[u8], pos: &mut usize) -> Result<u32, String> {
    loop {
        match data.get(*pos) {
            Some(b'#') => {
                while data.get(*pos).is_some_and(|b| *b != b'\n') {
                    *pos += 1;
                }
            }
            Some(b) if b.is_ascii_whitespace() => *pos += 1,
            Some(_) => break,
            None => return Err("truncated PPM header".into()),
        }
    }
    let start = *pos;
    while data.get(*pos).is_some_and(u8::is_ascii_digit) {
        *pos += 1;
    }
    if start == *pos || *pos - start > 6 {
        return Err("bad number in PPM header".into());
    }
    std::str::from_utf8(&data[start..*pos])
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| "bad number in PPM header".into())
}

/// Parses a binary PPM header (P6, maxval 255): width, height and where the pixels start.
pub fn ppm_header(data: &[u8]) -> Result<(u32, u32, usize), String> {
    if data.len() < 2 || &data[..2] != b"P6" {
        return Err("not a binary PPM (P6)".into());
    }
    let mut pos = 2;
    let width = ppm_token(data, &mut pos)?;
    let height = ppm_token(data, &mut pos)?;
    let maxval = ppm_token(data, &mut pos)?;
    if maxval != 255 {
        return Err(format!("unsupported PPM maxval {maxval}"));
    }
    if width == 0 || height == 0 || width > MAX_DIM || height > MAX_DIM {
        return Err(format!("PPM dimensions {width}x{height} out of range"));
    }
    if !data.get(pos).is_some_and(u8::is_ascii_whitespace) {
        return Err("bad PPM header".into());
    }
    Ok((width, height, pos + 1))
}

/// Converts a binary PPM (P6, maxval 255) into PNG.
pub fn ppm_to_png(data: &[u8]) -> Result<Png, String> {
    let (width, height, pos) = ppm_header(data)?;
    let need = width as usize * height as usize * 3;
    let pixels = data
        .get(pos..pos + need)
        .ok_or("truncated PPM pixel data")?;
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, width, height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        enc.set_compression(png::Compression::Fast);
        let mut w = enc.write_header().map_err(|e| e.to_string())?;
        w.write_image_data(pixels).map_err(|e| e.to_string())?;
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
