//! PNG encoding of screen frames, fast enough for a 1920x1080 desktop within a tool call:
//! the frame is scaled and filtered band by band and compressed in segments on parallel
//! threads, whose zlib streams are joined into one valid PNG (their Adler-32 checksums
//! combined).

use super::frame::{Frame, Png, ScreenError};
use super::scale::Scaler;

/// The PNG encoder's settings: the Sub filter (each row filtered on its own, which the
/// segments of [`scale_encode`] rely on) and zlib level 2. Measured on one core on 1568x882
/// reductions of 1920x1080 desktops (release build, optimized for size as this crate ships):
/// 570 KB in 20 ms and 460 KB in 17 ms, where fdeflate's fastest mode gives 930 KB (over the
/// default budget) in 6 ms, level 1 700 KB in 19 ms, level 3 517 KB in 29 ms, and the adaptive
/// or Paeth filters cost 10-40 ms more for 2-10 % less.
fn encoder<W: std::io::Write>(out: W, width: u32, height: u32) -> png::Encoder<'static, W> {
    let mut enc = png::Encoder::new(out, width, height);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_deflate_compression(png::DeflateCompression::Level(2));
    enc.set_filter(png::Filter::Sub);
    enc
}

/// Encodes `width` x `height` RGB pixels as PNG, as one stream on this thread.
pub fn encode(pixels: &[u8], width: u32, height: u32) -> Result<Vec<u8>, ScreenError> {
    let mut out = Vec::with_capacity(pixels.len() / 6);
    {
        let mut w = encoder(&mut out, width, height)
            .write_header()
            .map_err(ScreenError::Encode)?;
        w.write_image_data(pixels).map_err(ScreenError::Encode)?;
        w.finish().map_err(ScreenError::Encode)?;
    }
    Ok(out)
}

/// Output rows per band fed to an encoder.
const BAND_ROWS: usize = 16;

/// Fewest rows a segment of a parallel encoding gets: below that, threads cost more than they
/// save.
const MIN_SEGMENT_ROWS: u32 = 64;

/// Most segments (threads) one encoding uses.
const MAX_SEGMENTS: usize = 4;

/// A `Write` into a shared buffer, so that its length can be read while an encoder owns the
/// writer.
struct Shared<'a>(&'a std::cell::RefCell<Vec<u8>>);

impl std::io::Write for Shared<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The IDAT payloads of a PNG file, concatenated, with the payload length of the chunks that
/// end by file offset `mark`.
fn idat_payload(png: &[u8], mark: usize) -> (Vec<u8>, usize) {
    let mut out = Vec::with_capacity(png.len());
    let mut upto = 0;
    let mut pos = 8;
    while pos + 12 <= png.len() {
        let len = u32::from_be_bytes([png[pos], png[pos + 1], png[pos + 2], png[pos + 3]]) as usize;
        let end = pos + 12 + len;
        if end > png.len() {
            break;
        }
        if &png[pos + 4..pos + 8] == b"IDAT" {
            out.extend_from_slice(&png[pos + 8..pos + 8 + len]);
            if end <= mark {
                upto = out.len();
            }
        }
        pos = end;
    }
    (out, upto)
}

/// Adler-32 of two pieces of data from theirs and the second's length (zlib's
/// `adler32_combine`).
fn adler32_combine(a1: u32, a2: u32, len2: u64) -> u32 {
    const BASE: u64 = 65521;
    let rem = len2 % BASE;
    let mut sum1 = u64::from(a1 & 0xffff);
    let mut sum2 = (rem * sum1) % BASE;
    sum1 += u64::from(a2 & 0xffff) + BASE - 1;
    sum2 += u64::from(a1 >> 16) + u64::from(a2 >> 16) + BASE - rem;
    if sum1 >= BASE {
        sum1 -= BASE;
    }
    if sum1 >= BASE {
        sum1 -= BASE;
    }
    if sum2 >= BASE << 1 {
        sum2 -= BASE << 1;
    }
    if sum2 >= BASE {
        sum2 -= BASE;
    }
    (sum1 | (sum2 << 16)) as u32
}

/// One segment of a zlib stream: its deflate data (the zlib header only in the first, no
/// Adler-32), the Adler-32 of its uncompressed data, and that data's length.
struct Segment {
    deflate: Vec<u8>,
    adler: u32,
    len: u64,
}

/// Compresses `rows` rows of a `width`-wide RGB image, filled a band at a time by `fill`, as
/// one segment of a zlib stream: the encoder's own PNG of just these rows, flushed (a sync
/// flush, which ends on a byte boundary without ending the stream) after the last row and only
/// then finished, of which the data up to the flush is kept. With the Sub filter every row is
/// filtered on its own, so the segments of an image concatenate into its zlib stream, as pigz
/// does it.
fn segment(
    width: u32,
    rows: u32,
    first: bool,
    last: bool,
    mut fill: impl FnMut(&mut [u8]),
) -> Result<Segment, ScreenError> {
    let line = width as usize * 3;
    let file = std::cell::RefCell::new(Vec::with_capacity(line * rows as usize / 6));
    let mark;
    {
        let mut w = encoder(Shared(&file), width, rows)
            .write_header()
            .map_err(ScreenError::Encode)?;
        let mut stream = w
            .stream_writer_with_size(1 << 20)
            .map_err(ScreenError::Encode)?;
        let mut band = vec![0u8; BAND_ROWS * line];
        let mut left = rows as usize;
        while left > 0 {
            let n = left.min(BAND_ROWS);
            fill(&mut band[..n * line]);
            std::io::Write::write_all(&mut stream, &band[..n * line])
                .map_err(|e| ScreenError::Encode(e.into()))?;
            left -= n;
        }
        std::io::Write::flush(&mut stream).map_err(|e| ScreenError::Encode(e.into()))?;
        mark = file.borrow().len();
        stream.finish().map_err(ScreenError::Encode)?;
        w.finish().map_err(ScreenError::Encode)?;
    }
    let file = file.into_inner();
    let (zlib, flushed) = idat_payload(&file, mark);
    if zlib.len() < 6 || flushed < 2 {
        return Err(ScreenError::Encode(
            std::io::Error::other("the encoder wrote no zlib stream").into(),
        ));
    }
    let n = zlib.len();
    let adler = u32::from_be_bytes([zlib[n - 4], zlib[n - 3], zlib[n - 2], zlib[n - 1]]);
    let start = if first { 0 } else { 2 };
    let end = if last { n - 4 } else { flushed };
    Ok(Segment {
        deflate: zlib[start..end].to_vec(),
        adler,
        len: u64::from(rows) * (line as u64 + 1),
    })
}

/// How many segments (threads) to encode `height` rows with.
fn segments(height: u32) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores
        .min(MAX_SEGMENTS)
        .min((height / MIN_SEGMENT_ROWS).max(1) as usize)
}

/// Scales `frame` to `width` x `height` (when smaller) and encodes it as PNG, in segments
/// compressed in parallel, one thread each (see [`segment`]), each scaling its own rows: on 2
/// cores a 1920x1080 frame's scaling and compression take about half the time they take on
/// one.
pub fn scale_encode(frame: &Frame, width: u32, height: u32) -> Result<Png, ScreenError> {
    scale_encode_in(
        frame,
        width,
        height,
        segments(height.clamp(1, frame.height)),
    )
}

/// [`scale_encode`] in `k` segments.
fn scale_encode_in(frame: &Frame, width: u32, height: u32, k: usize) -> Result<Png, ScreenError> {
    let (width, height) = (width.clamp(1, frame.width), height.clamp(1, frame.height));
    let scaled = (width, height) != (frame.width, frame.height);
    let scaler = Scaler::new(frame.width, frame.height, width, height);
    let line = width as usize * 3;
    let k = k.clamp(1, height as usize);
    let bounds: Vec<(u32, u32)> = (0..k as u32)
        .map(|i| (height * i / k as u32, height * (i + 1) / k as u32))
        .collect();
    let src = frame.pixels();
    let run = |i: usize| -> Result<Segment, ScreenError> {
        let (a, b) = bounds[i];
        let (first, last) = (i == 0, i + 1 == k);
        if scaled {
            let mut rows = scaler.cursor_at(src, a as usize);
            segment(width, b - a, first, last, |band| rows.fill(band))
        } else {
            let mut at = a as usize * line;
            segment(width, b - a, first, last, |band| {
                band.copy_from_slice(&src[at..at + band.len()]);
                at += band.len();
            })
        }
    };
    let parts: Vec<Result<Segment, ScreenError>> = std::thread::scope(|s| {
        let others: Vec<_> = (1..k).map(|i| s.spawn(move || run(i))).collect();
        let mut parts = vec![run(0)];
        for h in others {
            parts.push(h.join().unwrap_or_else(|_| {
                Err(ScreenError::Encode(
                    std::io::Error::other("an encoding thread panicked").into(),
                ))
            }));
        }
        parts
    });
    let mut zlib = Vec::with_capacity(line * height as usize / 6);
    let mut adler = 1u32;
    for (i, part) in parts.into_iter().enumerate() {
        let part = part?;
        zlib.extend_from_slice(&part.deflate);
        adler = if i == 0 {
            part.adler
        } else {
            adler32_combine(adler, part.adler, part.len)
        };
    }
    zlib.extend_from_slice(&adler.to_be_bytes());
    let mut data = Vec::with_capacity(zlib.len() + 1024);
    {
        let mut w = encoder(&mut data, width, height)
            .write_header()
            .map_err(ScreenError::Encode)?;
        for chunk in zlib.chunks(1 << 20) {
            w.write_chunk(png::chunk::IDAT, chunk)
                .map_err(ScreenError::Encode)?;
        }
        w.finish().map_err(ScreenError::Encode)?;
    }
    Ok(Png {
        data,
        width,
        height,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qemu::frame::tests::{decode, noisy};

    #[test]
    fn scales_and_encodes_to_the_size_asked() {
        let frame = noisy(300, 200);
        let png = scale_encode(&frame, 149, 99).unwrap();
        let (w, h, px) = decode(&png.data);
        assert_eq!((w, h, png.width, png.height), (149, 99, 149, 99));
        assert_eq!(
            px,
            super::super::scale::downscale(frame.pixels(), 300, 200, 149, 99)
        );
        // The same size: the frame itself, losslessly.
        let png = scale_encode(&frame, 300, 200).unwrap();
        assert_eq!(decode(&png.data).2, frame.pixels());
    }

    /// Adler-32, byte by byte.
    fn adler32(data: &[u8]) -> u32 {
        let (mut a, mut b) = (1u32, 0u32);
        for d in data {
            a = (a + u32::from(*d)) % 65521;
            b = (b + a) % 65521;
        }
        (b << 16) | a
    }

    #[test]
    fn segments_compressed_apart_make_one_valid_stream() {
        // Each stream's checksum must be that of the whole filtered image (filter byte 1, Sub,
        // on every row), and its pixels the image's.
        let frame = noisy(640, 480);
        for (w, h, k) in [(640, 480, 3), (601, 399, 2), (601, 399, 1), (640, 7, 4)] {
            let png = scale_encode_in(&frame, w, h, k).unwrap();
            let (dw, dh, px) = decode(&png.data);
            assert_eq!((dw, dh), (w, h));
            let want = if (w, h) == (640, 480) {
                frame.pixels().to_vec()
            } else {
                super::super::scale::downscale(frame.pixels(), 640, 480, w, h)
            };
            assert!(px == want, "{w}x{h} in {k}: pixels differ");
            let (zlib, _) = idat_payload(&png.data, 0);
            let mut filtered = Vec::new();
            for row in want.chunks(w as usize * 3) {
                filtered.push(1u8);
                for (i, v) in row.iter().enumerate() {
                    filtered.push(v.wrapping_sub(if i >= 3 { row[i - 3] } else { 0 }));
                }
            }
            let n = zlib.len();
            let stored = u32::from_be_bytes([zlib[n - 4], zlib[n - 3], zlib[n - 2], zlib[n - 1]]);
            assert_eq!(stored, adler32(&filtered), "{w}x{h} in {k}: Adler-32");
        }
        for (a, b) in [
            (&b"hello "[..], &b"world"[..]),
            (&[7u8; 70000][..], &[9u8; 100][..]),
        ] {
            let whole = [a, b].concat();
            assert_eq!(
                adler32_combine(adler32(a), adler32(b), b.len() as u64),
                adler32(&whole)
            );
        }
    }
}
