//! Downscaling screen captures: area averaging, the box filter whose taps are the exact overlap
//! of each output pixel with the source pixels (every source pixel counts, in proportion to how
//! much of it the output pixel covers; no pixel is skipped as nearest-neighbour would, so text
//! and one-pixel lines fade rather than vanish or alias).
//!
//! Separable (a horizontal pass per source row, then a vertical pass per output row) and in
//! fixed point, with the three channels of a pixel in one `u64` (21-bit lanes: a weight of at
//! most 2^13 times 255, summed to at most 2^13 times 255, fits), so each tap is one multiply-add
//! for all three. The horizontal results of the few source rows an output row needs live in a
//! small ring, so the intermediate image is never stored whole. Averages are taken on the
//! sRGB values as they are, as most resizers do.

/// Fixed-point bits of a weight: an axis's weights for one output pixel sum to `1 << FRAC`.
const FRAC: u32 = 13;
/// The sum of one output pixel's weights.
const ONE: u64 = 1 << FRAC;
/// Bits per channel lane in a packed pixel.
const LANE: u32 = 21;
/// Half a unit in every lane: rounding before the shift.
const ROUND: u64 = (ONE / 2) | (ONE / 2) << LANE | (ONE / 2) << (2 * LANE);
/// The integer part of every lane after the shift.
const MASK: u64 = 0xFF | 0xFF << LANE | 0xFF << (2 * LANE);

/// The taps of one axis: for each output pixel, the first source pixel and `stride` weights
/// (zero past the pixel's own taps).
struct Taps {
    start: Vec<usize>,
    weights: Vec<u64>,
    stride: usize,
}

impl Taps {
    /// Taps for `src` source pixels onto `dst` output pixels (`dst <= src`). Output pixel `i`
    /// covers source positions `[i * src / dst, (i + 1) * src / dst)`; its weights are the
    /// overlaps, rounded so that each output pixel's weights sum to exactly [`ONE`].
    fn new(src: usize, dst: usize) -> Taps {
        // Positions in units of 1/dst of a source pixel: output pixel i covers
        // [i*src, (i+1)*src), source pixel j covers [j*dst, (j+1)*dst).
        let stride = src.div_ceil(dst) + 1;
        let mut start = Vec::with_capacity(dst);
        let mut weights = vec![0u64; dst * stride];
        let (s, d) = (src as u64, dst as u64);
        for i in 0..dst {
            let lo = i as u64 * s;
            let hi = lo + s;
            let j0 = lo / d;
            start.push(j0 as usize);
            let (mut covered, mut given) = (0u64, 0u64);
            let mut j = j0;
            while j * d < hi {
                let overlap = hi.min((j + 1) * d) - lo.max(j * d);
                covered += overlap;
                // Cumulative rounding: the weights so far always sum to round(covered/s * ONE).
                let upto = (covered * ONE + s / 2) / s;
                weights[i * stride + (j - j0) as usize] = upto - given;
                given = upto;
                j += 1;
            }
        }
        Taps {
            start,
            weights,
            stride,
        }
    }

    fn of(&self, i: usize) -> (usize, &[u64]) {
        (
            self.start[i],
            &self.weights[i * self.stride..(i + 1) * self.stride],
        )
    }
}

/// Packs a row of RGB pixels into lanes: `packed[j]` for source pixel `j`.
fn pack_row(src: &[u8], packed: &mut [u64]) {
    let n = (src.len() / 3).min(packed.len());
    let src = &src[..n * 3];
    for j in 0..n {
        packed[j] = u64::from(src[3 * j])
            | u64::from(src[3 * j + 1]) << LANE
            | u64::from(src[3 * j + 2]) << (2 * LANE);
    }
}

/// Writes one output row's packed sums (rounding included) as RGB bytes.
#[inline(always)]
fn unpack(v: u64, out: &mut [u8], x: usize) {
    let v = v >> FRAC;
    out[3 * x] = v as u8;
    out[3 * x + 1] = (v >> LANE) as u8;
    out[3 * x + 2] = (v >> (2 * LANE)) as u8;
}

// The passes for 2, 3 and 4 taps, written out: the release profile optimizes for size, which
// neither unrolls the loop over the taps nor vectorizes, and these loops are the scaler's time.
macro_rules! passes {
    ($h:ident, $v:ident, $t:literal, $($k:literal),+) => {
        /// The horizontal pass of one row: `packed` holds the source row's packed pixels
        /// followed by at least as many zeros as there are taps.
        fn $h(start: &[usize], weights: &[[u64; $t]], packed: &[u64], dst: &mut [u64]) {
            let n = dst.len().min(start.len()).min(weights.len());
            for i in 0..n {
                let x0 = start[i];
                let p = &packed[x0..x0 + $t];
                let w = &weights[i];
                dst[i] = ((ROUND $(+ w[$k] * p[$k])+) >> FRAC) & MASK;
            }
        }

        /// The vertical pass of one output row from its rows of horizontal results.
        fn $v(rows: [&[u64]; $t], w: [u64; $t], out: &mut [u8]) {
            let n = (out.len() / 3) $(.min(rows[$k].len()))+;
            let rows = [$(&rows[$k][..n]),+];
            let out = &mut out[..n * 3];
            for x in 0..n {
                unpack(ROUND $(+ w[$k] * rows[$k][x])+, out, x);
            }
        }
    };
}
passes!(h_row2, v_row2, 2, 0, 1);
passes!(h_row3, v_row3, 3, 0, 1, 2);
passes!(h_row4, v_row4, 4, 0, 1, 2, 3);

/// The horizontal pass for any number of taps.
fn h_row_any(taps: &Taps, packed: &[u64], dst: &mut [u64]) {
    for (i, d) in dst.iter_mut().enumerate() {
        let (x0, w) = taps.of(i);
        let mut a = ROUND;
        for (w, p) in w.iter().zip(&packed[x0..]) {
            a += w * p;
        }
        *d = (a >> FRAC) & MASK;
    }
}

/// The vertical pass for any number of rows, accumulated row by row in `acc`.
fn v_row_any(rows: &[&[u64]], w: &[u64], acc: &mut [u64], out: &mut [u8]) {
    acc.iter_mut().for_each(|a| *a = ROUND);
    for (row, w) in rows.iter().zip(w) {
        for (a, p) in acc.iter_mut().zip(row.iter()) {
            *a += w * p;
        }
    }
    for (x, a) in acc.iter().enumerate().take(out.len() / 3) {
        unpack(*a, out, x);
    }
}

/// Area-averaging reduction of `src_w` x `src_h` RGB pixels to `dst_w` x `dst_h`, computed a
/// band of output rows at a time from the top ([`Scaler::cursor`]), so that an encoder can
/// compress the first rows while later ones are scaled.
pub struct Scaler {
    sw: usize,
    sh: usize,
    dw: usize,
    dh: usize,
    h: Taps,
    v: Taps,
}

impl Scaler {
    /// A scaler from `src_w` x `src_h` down to `dst_w` x `dst_h` (each clamped to 1..=the
    /// source's size on its axis).
    pub fn new(src_w: u32, src_h: u32, dst_w: u32, dst_h: u32) -> Scaler {
        let (sw, sh) = (src_w.max(1) as usize, src_h.max(1) as usize);
        let dw = dst_w.clamp(1, src_w.max(1)) as usize;
        let dh = dst_h.clamp(1, src_h.max(1)) as usize;
        Scaler {
            sw,
            sh,
            dw,
            dh,
            h: Taps::new(sw, dw),
            v: Taps::new(sh, dh),
        }
    }

    /// The output size.
    pub fn size(&self) -> (u32, u32) {
        (self.dw as u32, self.dh as u32)
    }

    /// A cursor over the output rows of `pixels` (the whole source image, rows packed, at
    /// least `src_w * src_h * 3` bytes: [`Rows::fill`] panics on fewer), from the top:
    /// [`Rows::fill`] computes the next rows.
    pub fn cursor<'a>(&'a self, pixels: &'a [u8]) -> Rows<'a> {
        self.cursor_at(pixels, 0)
    }

    /// A cursor like [`Scaler::cursor`] starting at output row `first`.
    pub fn cursor_at<'a>(&'a self, pixels: &'a [u8], first: usize) -> Rows<'a> {
        let first = first.min(self.dh);
        Rows {
            s: self,
            pixels,
            hrows: vec![0u64; self.v.stride * self.dw],
            packed: vec![0u64; self.sw + self.h.stride],
            acc: vec![0u64; self.dw],
            next_row: if first < self.dh {
                self.v.start[first]
            } else {
                0
            },
            next_out: first,
        }
    }
}

/// Output rows of a [`Scaler`] computed in order, a band at a time, with the horizontal
/// results of the source rows still needed kept between bands.
pub struct Rows<'a> {
    s: &'a Scaler,
    pixels: &'a [u8],
    /// A ring of horizontal results: an output row's taps span at most `v.stride`
    /// consecutive source rows, which then sit in distinct slots.
    hrows: Vec<u64>,
    packed: Vec<u64>,
    acc: Vec<u64>,
    next_row: usize,
    next_out: usize,
}

impl Rows<'_> {
    /// Fills `out` with the next `out.len() / (3 * width)` output rows.
    pub fn fill(&mut self, out: &mut [u8]) {
        let s = self.s;
        let (sw, sh, dw) = (s.sw, s.sh, s.dw);
        let line = sw * 3;
        let ring = s.v.stride;
        for out_row in out.chunks_exact_mut(dw * 3) {
            if self.next_out >= s.dh {
                return;
            }
            let (y0, wy) = s.v.of(self.next_out);
            self.next_out += 1;
            // The horizontal pass for every source row this output row needs and the ring
            // lacks.
            let last = (y0 + ring).min(sh);
            while self.next_row < last {
                let y = self.next_row;
                pack_row(&self.pixels[y * line..(y + 1) * line], &mut self.packed);
                let slot = y % ring;
                let dst = &mut self.hrows[slot * dw..(slot + 1) * dw];
                let (start, w) = (&s.h.start, &s.h.weights);
                match s.h.stride {
                    2 => h_row2(start, w.as_chunks().0, &self.packed, dst),
                    3 => h_row3(start, w.as_chunks().0, &self.packed, dst),
                    4 => h_row4(start, w.as_chunks().0, &self.packed, dst),
                    _ => h_row_any(&s.h, &self.packed, dst),
                }
                self.next_row += 1;
            }
            // Rows past the bottom edge have weight 0; any computed row stands in for them.
            let hrows = &self.hrows;
            let row = |k: usize| {
                let slot = (y0 + k).min(sh - 1) % ring;
                &hrows[slot * dw..(slot + 1) * dw]
            };
            match ring {
                2 => v_row2([row(0), row(1)], [wy[0], wy[1]], out_row),
                3 => v_row3([row(0), row(1), row(2)], [wy[0], wy[1], wy[2]], out_row),
                4 => v_row4(
                    [row(0), row(1), row(2), row(3)],
                    [wy[0], wy[1], wy[2], wy[3]],
                    out_row,
                ),
                _ => {
                    let rows: Vec<&[u64]> = (0..ring).map(row).collect();
                    v_row_any(&rows, wy, &mut self.acc, out_row);
                }
            }
        }
    }
}

/// Scales an RGB image (8 bits per channel, rows packed, `src_w * src_h * 3` bytes) down to
/// `dst_w` x `dst_h` by area averaging, on this thread. Sizes are clamped to 1..=the source's
/// on each axis; equal sizes return a copy. Panics if `pixels` holds fewer bytes.
pub fn downscale(pixels: &[u8], src_w: u32, src_h: u32, dst_w: u32, dst_h: u32) -> Vec<u8> {
    let s = Scaler::new(src_w, src_h, dst_w, dst_h);
    if (s.dw, s.dh) == (s.sw, s.sh) {
        return pixels[..s.sw * s.sh * 3].to_vec();
    }
    let mut out = vec![0u8; s.dw * s.dh * 3];
    s.cursor(pixels).fill(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exact area average of the source under output pixel (ox, oy), channel c, by brute
    /// force in floating point.
    fn reference(px: &[u8], sw: usize, sh: usize, dw: usize, dh: usize) -> Vec<f64> {
        let mut out = vec![0.0; dw * dh * 3];
        let (fx, fy) = (sw as f64 / dw as f64, sh as f64 / dh as f64);
        for oy in 0..dh {
            let (ylo, yhi) = (oy as f64 * fy, (oy + 1) as f64 * fy);
            for ox in 0..dw {
                let (xlo, xhi) = (ox as f64 * fx, (ox + 1) as f64 * fx);
                for c in 0..3 {
                    let mut sum = 0.0;
                    for sy in ylo.floor() as usize..(yhi.ceil() as usize).min(sh) {
                        let oyv = (yhi.min(sy as f64 + 1.0) - ylo.max(sy as f64)).max(0.0);
                        for sx in xlo.floor() as usize..(xhi.ceil() as usize).min(sw) {
                            let oxv = (xhi.min(sx as f64 + 1.0) - xlo.max(sx as f64)).max(0.0);
                            sum += oxv * oyv * f64::from(px[(sy * sw + sx) * 3 + c]);
                        }
                    }
                    out[(oy * dw + ox) * 3 + c] = sum / (fx * fy);
                }
            }
        }
        out
    }

    fn noise(n: usize, mut seed: u64) -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn weights_cover_each_output_pixel_exactly_once() {
        for (src, dst) in [
            (1920, 1568),
            (1080, 882),
            (7, 3),
            (5, 5),
            (16384, 32),
            (3, 1),
        ] {
            let t = Taps::new(src, dst);
            for i in 0..dst {
                let (s, w) = t.of(i);
                assert_eq!(w.iter().sum::<u64>(), ONE, "{src}->{dst} pixel {i}");
                let used = w.iter().rposition(|w| *w != 0).unwrap() + 1;
                assert!(
                    s + used <= src,
                    "{src}->{dst} pixel {i} reads past the edge"
                );
            }
        }
    }

    #[test]
    fn matches_the_exact_area_average() {
        for (sw, sh, dw, dh) in [
            (40, 30, 17, 13),
            (64, 48, 32, 24),
            (33, 7, 33, 3),
            (9, 9, 1, 1),
        ] {
            let px = noise(sw * sh * 3, (sw * 31 + dw) as u64);
            let got = downscale(&px, sw as u32, sh as u32, dw as u32, dh as u32);
            let want = reference(&px, sw, sh, dw, dh);
            assert_eq!(got.len(), want.len());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                // Two roundings (after each pass) and the weights' fixed point: within 1.
                assert!(
                    (f64::from(*g) - w).abs() <= 1.0,
                    "{sw}x{sh}->{dw}x{dh} byte {i}: {g} vs {w:.2}"
                );
            }
        }
    }

    #[test]
    fn keeps_flat_colours_and_halves_exactly() {
        let flat: Vec<u8> = [12u8, 200, 255].repeat(50 * 20);
        let out = downscale(&flat, 50, 20, 31, 7);
        assert!(out.chunks(3).all(|p| p == [12, 200, 255]));
        // A 2:1 reduction of a checkerboard of 0 and 255 is mid-grey everywhere.
        let mut board = Vec::new();
        for y in 0..8 {
            for x in 0..8 {
                board.extend([if (x + y) % 2 == 0 { 0u8 } else { 255 }; 3]);
            }
        }
        let out = downscale(&board, 8, 8, 4, 4);
        assert!(out.iter().all(|v| *v == 128 || *v == 127), "{out:?}");
    }

    #[test]
    fn a_thin_line_survives_as_a_fainter_line() {
        // A one-pixel white vertical line at x = 7 on black, scaled by 0.8: nearest-neighbour
        // could drop it; area averaging keeps it at about 0.8 of its brightness.
        let (sw, sh, dw, dh) = (20usize, 10usize, 16usize, 8usize);
        let mut px = vec![0u8; sw * sh * 3];
        for y in 0..sh {
            px[(y * sw + 7) * 3..(y * sw + 8) * 3].copy_from_slice(&[255, 255, 255]);
        }
        let out = downscale(&px, sw as u32, sh as u32, dw as u32, dh as u32);
        for y in 0..dh {
            let row = &out[y * dw * 3..(y + 1) * dw * 3];
            let total: u32 = row.iter().step_by(3).map(|v| u32::from(*v)).sum();
            assert!((200..=208).contains(&total), "row {y}: {row:?}");
        }
    }
}
