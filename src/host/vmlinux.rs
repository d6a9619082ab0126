//! The uncompressed kernel (an ELF `vmlinux`) inside a bzImage, so QEMU boots it through PVH:
//! straight into the kernel's 32-bit entry, without the firmware's real-mode loader and
//! without decompressing it under emulation on every boot (measured with Debian's cloud
//! kernel under TCG below). Debian's cloud kernels are compressed with LZ4 (legacy frames);
//! others are left as they are (None), and boot the usual way.

/// The LZ4 legacy frame's magic.
const LZ4_LEGACY: [u8; 4] = [0x02, 0x21, 0x4c, 0x18];
/// The largest block a legacy frame holds, uncompressed.
const LZ4_LEGACY_BLOCK: usize = 8 << 20;
/// The largest kernel accepted, uncompressed.
const MAX_KERNEL: usize = 512 << 20;

/// The ELF kernel of `bzimage`, when it is an LZ4-compressed bzImage whose payload is an ELF.
pub fn extract(bzimage: &[u8]) -> Option<Vec<u8>> {
    if bzimage.get(0x202..0x206)? != b"HdrS" {
        return None;
    }
    let setup_sects = match *bzimage.get(0x1f1)? {
        0 => 4,
        n => usize::from(n),
    };
    let u32_at = |at: usize| -> Option<usize> {
        let b = bzimage.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let start = (setup_sects + 1) * 512 + u32_at(0x248)?;
    let payload = bzimage.get(start..start.checked_add(u32_at(0x24c)?)?)?;
    let elf = lz4_legacy(payload)?;
    elf.starts_with(b"\x7fELF").then_some(elf)
}

/// Decompresses an LZ4 legacy frame (what the kernel's `lz4 -l` makes): blocks, each after
/// its compressed size; anything after the last block (the kernel's size word) is ignored.
fn lz4_legacy(data: &[u8]) -> Option<Vec<u8>> {
    let mut rest = data.strip_prefix(&LZ4_LEGACY)?;
    let mut out = Vec::new();
    while rest.len() >= 4 {
        let size = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if size == 0 || size > rest.len() - 4 || rest[..4] == LZ4_LEGACY {
            break;
        }
        let before = out.len();
        lz4_block(&rest[4..4 + size], &mut out)?;
        if out.len() - before > LZ4_LEGACY_BLOCK || out.len() > MAX_KERNEL {
            return None;
        }
        rest = &rest[4 + size..];
    }
    (!out.is_empty()).then_some(out)
}

/// Appends one LZ4 block's content to `out`; None on a malformed block.
fn lz4_block(src: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let start = out.len();
    let mut i = 0;
    let length = |i: &mut usize, mut n: usize| -> Option<usize> {
        if n == 15 {
            loop {
                let b = *src.get(*i)?;
                *i += 1;
                n += usize::from(b);
                if b != 255 {
                    break;
                }
            }
        }
        Some(n)
    };
    loop {
        let token = *src.get(i)?;
        i += 1;
        let lit = length(&mut i, usize::from(token >> 4))?;
        out.extend_from_slice(src.get(i..i.checked_add(lit)?)?);
        i += lit;
        if i == src.len() {
            return Some(());
        }
        let offset = usize::from(u16::from_le_bytes([*src.get(i)?, *src.get(i + 1)?]));
        i += 2;
        let len = length(&mut i, usize::from(token & 15))? + 4;
        // Blocks are independent: a match reaches back into this block only.
        if offset == 0 || offset > out.len() - start || len > LZ4_LEGACY_BLOCK {
            return None;
        }
        let from = out.len() - offset;
        for k in 0..len {
            let b = out[from + k];
            out.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_with_literals_and_overlapping_matches_decodes() {
        // "abc" then a match of 9 at offset 3 ("abcabcabc"), then the literals "xy".
        let block = [0x35, b'a', b'b', b'c', 3, 0, 0x20, b'x', b'y'];
        let mut out = Vec::new();
        lz4_block(&block, &mut out).unwrap();
        assert_eq!(out, b"abcabcabcabcxy");
        let mut frame = LZ4_LEGACY.to_vec();
        frame.extend_from_slice(&(block.len() as u32).to_le_bytes());
        frame.extend_from_slice(&block);
        frame.extend_from_slice(&14u32.to_le_bytes());
        assert_eq!(lz4_legacy(&frame).unwrap(), b"abcabcabcabcxy");
    }

    #[test]
    fn malformed_input_gives_nothing_and_never_panics() {
        let mut out = Vec::new();
        assert!(
            lz4_block(&[0xf0], &mut out).is_none(),
            "a length past the end"
        );
        assert!(
            lz4_block(&[0x10, b'a', 9, 0, 0], &mut out).is_none(),
            "an offset before the start"
        );
        assert!(lz4_block(&[0x00, 0, 0], &mut out).is_none(), "offset 0");
        assert!(extract(b"not a kernel").is_none());
        assert!(lz4_legacy(&LZ4_LEGACY).is_none());
        for n in 0..64u8 {
            let junk: Vec<u8> = (0..200u32)
                .map(|i| (i as u8).wrapping_mul(n).wrapping_add(n))
                .collect();
            let _ = lz4_block(&junk, &mut Vec::new());
        }
    }
}
