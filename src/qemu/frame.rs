//! One captured screen and the PNG made of it: the strictly parsed binary PPM QEMU's
//! `screendump` writes (header parser with a dimension cap), the frame's pixels, and the errors
//! of reading and encoding them. Below both the capture ([`super::screen`]) and the encoder
//! ([`super::encode`]).

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

/// One captured screen: RGB pixels, 8 bits per channel, rows packed (the PPM's own buffer,
/// not copied).
pub struct Frame {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    data: Vec<u8>,
    offset: usize,
}

impl Frame {
    /// The frame a binary PPM (P6, maxval 255) holds.
    pub fn from_ppm(data: Vec<u8>) -> Result<Frame, ScreenError> {
        let (width, height, offset) = ppm_header(&data)?;
        if data.len() - offset < width as usize * height as usize * 3 {
            return Err(ScreenError::TruncatedPixels);
        }
        Ok(Frame {
            width,
            height,
            data,
            offset,
        })
    }

    /// A frame of `width` x `height` RGB pixels.
    pub fn from_rgb(width: u32, height: u32, pixels: Vec<u8>) -> Result<Frame, ScreenError> {
        if width == 0 || height == 0 || width > MAX_DIM || height > MAX_DIM {
            return Err(ScreenError::Dimensions(width, height));
        }
        if pixels.len() < width as usize * height as usize * 3 {
            return Err(ScreenError::TruncatedPixels);
        }
        Ok(Frame {
            width,
            height,
            data: pixels,
            offset: 0,
        })
    }

    /// The pixels, `width * height * 3` bytes.
    pub fn pixels(&self) -> &[u8] {
        &self.data[self.offset..self.offset + self.width as usize * self.height as usize * 3]
    }
}

/// A rectangle of a screen, in its pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rect {
    /// Left edge.
    pub x: u32,
    /// Top edge.
    pub y: u32,
    /// Width.
    pub width: u32,
    /// Height.
    pub height: u32,
}

/// One step of the frame digest: a multiply-rotate over 8 bytes (one multiplication per
/// word: a 1920x1080 frame digests in about a millisecond).
fn mix(h: u64, word: u64) -> u64 {
    (h ^ word)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .rotate_left(31)
}

impl Frame {
    /// A 64-bit digest of the pixels within `rect` (clipped to the frame; the whole frame when
    /// `None`), seeded with the frame's size and the clipped rectangle: two frames of different
    /// sizes never share a digest. For telling frames apart cheaply, without encoding them; not
    /// a cryptographic hash.
    pub fn digest(&self, rect: Option<Rect>) -> u64 {
        let r = rect.unwrap_or(Rect {
            x: 0,
            y: 0,
            width: self.width,
            height: self.height,
        });
        let x0 = r.x.min(self.width) as usize;
        let y0 = r.y.min(self.height) as usize;
        let x1 = (r.x.saturating_add(r.width)).min(self.width) as usize;
        let y1 = (r.y.saturating_add(r.height)).min(self.height) as usize;
        let mut h = 0x243f_6a88_85a3_08d3u64;
        for v in [self.width as usize, self.height as usize, x0, y0, x1, y1] {
            h = mix(h, v as u64);
        }
        let px = self.pixels();
        let stride = self.width as usize * 3;
        for y in y0..y1 {
            let row = &px[y * stride + x0 * 3..y * stride + x1 * 3];
            let mut words = row.chunks_exact(8);
            for w in &mut words {
                let mut b = [0u8; 8];
                b.copy_from_slice(w);
                h = mix(h, u64::from_le_bytes(b));
            }
            let mut last = [0u8; 8];
            last[..words.remainder().len()].copy_from_slice(words.remainder());
            h = mix(h, u64::from_le_bytes(last) ^ ((y as u64) << 40));
        }
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^ (h >> 33)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn decode(data: &[u8]) -> (u32, u32, Vec<u8>) {
        let mut r = png::Decoder::new(std::io::Cursor::new(data))
            .read_info()
            .unwrap();
        let mut buf = vec![0; r.output_buffer_size().unwrap()];
        let info = r.next_frame(&mut buf).unwrap();
        buf.truncate(info.buffer_size());
        (info.width, info.height, buf)
    }

    /// A frame with detail everywhere (noise), whose PNG cannot be small.
    pub(crate) fn noisy(w: u32, h: u32) -> Frame {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let px = (0..w as usize * h as usize * 3)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 32) as u8
            })
            .collect();
        Frame::from_rgb(w, h, px).unwrap()
    }

    #[test]
    fn the_digest_sees_every_pixel_of_its_rectangle_and_nothing_outside() {
        let base = noisy(37, 11);
        let changed = |x: usize, y: usize| {
            let mut px = base.pixels().to_vec();
            px[(y * 37 + x) * 3 + 1] ^= 1;
            Frame::from_rgb(37, 11, px).unwrap()
        };
        assert_eq!(base.digest(None), noisy(37, 11).digest(None));
        // One bit of any pixel changes the whole frame's digest.
        for (x, y) in [(0, 0), (36, 10), (18, 5), (35, 0), (2, 10)] {
            assert_ne!(base.digest(None), changed(x, y).digest(None), "({x},{y})");
        }
        let r = Some(Rect {
            x: 10,
            y: 2,
            width: 5,
            height: 3,
        });
        // Inside the rectangle it counts, outside it does not.
        assert_ne!(base.digest(r), changed(12, 3).digest(r));
        assert_ne!(base.digest(r), changed(14, 4).digest(r));
        assert_eq!(base.digest(r), changed(9, 3).digest(r));
        assert_eq!(base.digest(r), changed(15, 3).digest(r));
        assert_eq!(base.digest(r), changed(12, 5).digest(r));
        assert_ne!(base.digest(r), base.digest(None));
        // Another size is another digest, even with the same bytes.
        let same_bytes = Frame::from_rgb(11, 37, base.pixels().to_vec()).unwrap();
        assert_ne!(base.digest(None), same_bytes.digest(None));
    }
}
