//! The two fields of a qcow2 header mcqemu reads itself: the backing file's name, so that a
//! template's blank overlay is known to point at that template's disk before clones copy it,
//! and the virtual size, for an overlay made without opening a backing file a QEMU holds.

use std::io::Read;
use std::path::Path;

/// qcow2's magic, "QFI\xfb".
const MAGIC: [u8; 4] = *b"QFI\xfb";
/// The backing file name lies in the image's first cluster; no valid image needs more.
const MAX_HEADER: u64 = 2 * 1024 * 1024;

/// The backing file name in a qcow2 header (`bytes` from the file's start); None when `bytes`
/// are not qcow2, name no backing file, or cut it short.
pub fn backing_name(bytes: &[u8]) -> Option<String> {
    if bytes.get(..4)? != MAGIC {
        return None;
    }
    let offset = u64::from_be_bytes(bytes.get(8..16)?.try_into().ok()?);
    let size = u32::from_be_bytes(bytes.get(16..20)?.try_into().ok()?) as u64;
    if offset == 0 || size == 0 || size > 1023 {
        return None;
    }
    let end = offset.checked_add(size)?;
    let name = bytes.get(usize::try_from(offset).ok()?..usize::try_from(end).ok()?)?;
    String::from_utf8(name.to_vec()).ok()
}

/// [`backing_name`] of the file at `path`, reading at most its first 2 MiB.
pub fn backing_of(path: &Path) -> Option<String> {
    let mut head = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_HEADER)
        .read_to_end(&mut head)
        .ok()?;
    backing_name(&head)
}

/// The virtual size in a qcow2 header; None when the file is not qcow2.
pub fn virtual_size(path: &Path) -> Option<u64> {
    let mut head = [0u8; 32];
    std::fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    if head[..4] != MAGIC {
        return None;
    }
    Some(u64::from_be_bytes(head[24..32].try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(offset: u64, name: &[u8]) -> Vec<u8> {
        let mut h = vec![0u8; offset as usize + name.len()];
        h[..4].copy_from_slice(&MAGIC);
        h[4..8].copy_from_slice(&3u32.to_be_bytes());
        h[8..16].copy_from_slice(&offset.to_be_bytes());
        h[16..20].copy_from_slice(&(name.len() as u32).to_be_bytes());
        h[offset as usize..].copy_from_slice(name);
        h
    }

    #[test]
    fn reads_the_backing_name_and_refuses_what_is_not_one() {
        let h = header(0x200, b"/s/templates/t/disk.qcow2");
        assert_eq!(
            backing_name(&h).as_deref(),
            Some("/s/templates/t/disk.qcow2")
        );
        assert_eq!(backing_name(&h[..0x205]), None, "cut short");
        assert_eq!(backing_name(&header(0x200, b"")), None, "no backing file");
        let mut raw = h.clone();
        raw[0] = b'X';
        assert_eq!(backing_name(&raw), None, "not qcow2");
        let mut huge = h;
        huge[8..16].copy_from_slice(&u64::MAX.to_be_bytes());
        assert_eq!(backing_name(&huge), None, "offset past the end");
        assert_eq!(backing_name(b"QFI"), None);
    }
}
