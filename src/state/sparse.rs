//! Copying a guest's RAM file without its zero pages: the copy is sparse, so a saved guest
//! takes disk for the memory it touched, not its whole RAM.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The unit zero runs are found in (the guest's page size).
const PAGE: usize = 4096;
/// Read at a time.
const CHUNK: usize = 2 << 20;

/// Copies `from` into a new file `to` (mode 0600) of the same length, writing only pages that
/// are not all zero, flushed to the disk when `durable`. Returns the bytes written.
pub fn copy_without_zeros(from: &Path, to: &Path, durable: bool) -> std::io::Result<u64> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut src = File::open(from)?;
    let len = src.metadata()?.len();
    let dst = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    dst.set_len(len)?;
    let zero = vec![0u8; PAGE];
    let mut buf = vec![0u8; CHUNK];
    let mut at: u64 = 0;
    let mut written = 0;
    while at < len {
        let want = CHUNK.min((len - at) as usize);
        src.read_exact(&mut buf[..want])?;
        written += write_runs(&dst, &buf[..want], at, &zero)?;
        at += want as u64;
    }
    if durable {
        dst.sync_all()?;
    }
    Ok(written)
}

/// Writes the runs of non-zero pages of `chunk` (which starts at `at` in the file).
fn write_runs(dst: &File, chunk: &[u8], at: u64, zero: &[u8]) -> std::io::Result<u64> {
    let mut written = 0;
    let mut run: Option<usize> = None;
    let pages = chunk.len().div_ceil(PAGE);
    for i in 0..=pages {
        let page = chunk.get(i * PAGE..((i + 1) * PAGE).min(chunk.len()));
        // Slice equality is memcmp: fast even in a debug build.
        let data = page.is_some_and(|p| p != &zero[..p.len()]);
        match (data, run) {
            (true, None) => run = Some(i * PAGE),
            (false, Some(start)) => {
                let end = (i * PAGE).min(chunk.len());
                dst.write_all_at(&chunk[start..end], at + start as u64)?;
                written += (end - start) as u64;
                run = None;
            }
            _ => {}
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn the_copy_is_equal_and_holds_only_the_pages_with_data() {
        let dir = std::env::temp_dir().join(format!("mcqemu-sparse-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (from, to) = (dir.join("from"), dir.join("to"));
        let mut data = vec![0u8; 5 * CHUNK + 3 * PAGE + 100];
        data[7] = 1;
        data[CHUNK - 1] = 2;
        data[CHUNK] = 3;
        data[3 * CHUNK + 5 * PAGE..3 * CHUNK + 9 * PAGE].fill(9);
        let last = data.len() - 1;
        data[last] = 4;
        std::fs::write(&from, &data).unwrap();
        let written = copy_without_zeros(&from, &to, true).unwrap();
        assert_eq!(std::fs::read(&to).unwrap(), data);
        // Pages 0, the last of chunk 0, the first of chunk 1, 4 pages, and the short tail.
        assert_eq!(written, (3 + 4) * PAGE as u64 + 100);
        let allocated = std::fs::metadata(&to).unwrap().blocks() * 512;
        assert!(
            allocated < data.len() as u64 / 4,
            "{allocated} bytes allocated"
        );
        assert!(
            copy_without_zeros(&from, &to, false).is_err(),
            "an existing file is kept"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
