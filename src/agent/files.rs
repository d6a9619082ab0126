//! Files the host opened in the guest (`guest-file-*`), by handle, as qemu-ga keeps them: a
//! mode in fopen's words, reads and writes of a bounded size, seeks, and a close.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};

use super::exec::os_text;

/// Most bytes one read returns (qemu-ga's limit).
pub const MAX_READ: usize = 48 << 20;
/// Most files open at once.
const MAX_OPEN: usize = 256;

/// The open files.
#[derive(Debug, Default)]
pub struct Files {
    open: HashMap<i64, File>,
    next: i64,
}

/// Where a seek counts from.
#[derive(Debug, Clone, Copy)]
pub enum Whence {
    /// The start.
    Set,
    /// The position now.
    Cur,
    /// The end.
    End,
}

impl Files {
    /// No file open.
    pub fn new() -> Files {
        Files {
            open: HashMap::new(),
            next: 1000,
        }
    }

    /// Opens `path` with fopen's `mode` (r, r+, w, w+, a, a+, each with an optional b).
    pub fn open(&mut self, path: &str, mode: &str) -> Result<i64, String> {
        if self.open.len() >= MAX_OPEN {
            return Err(format!(
                "too many open files ({MAX_OPEN}); close some first"
            ));
        }
        let m = mode.replace('b', "");
        let mut o = OpenOptions::new();
        match m.as_str() {
            "r" => o.read(true),
            "r+" => o.read(true).write(true),
            "w" => o.write(true).create(true).truncate(true),
            "w+" => o.read(true).write(true).create(true).truncate(true),
            "a" => o.append(true).create(true),
            "a+" => o.read(true).append(true).create(true),
            _ => return Err(format!("invalid file open mode '{mode}'")),
        };
        let f = o.open(path).map_err(|e| {
            format!(
                "failed to open file '{path}' (mode: '{mode}'): {}",
                os_text(&e)
            )
        })?;
        let h = self.next;
        self.next += 1;
        self.open.insert(h, f);
        Ok(h)
    }

    fn file(&mut self, h: i64) -> Result<&mut File, String> {
        self.open
            .get_mut(&h)
            .ok_or_else(|| format!("handle '{h}' has not been found"))
    }

    /// Reads up to `count` bytes: the bytes and whether the end was reached.
    pub fn read(&mut self, h: i64, count: usize) -> Result<(Vec<u8>, bool), String> {
        if count > MAX_READ {
            return Err(format!("count is too large: at most {MAX_READ}"));
        }
        let f = self.file(h)?;
        let mut buf = vec![0u8; count];
        let mut got = 0;
        while got < count {
            match f.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("failed to read file: {}", os_text(&e))),
            }
        }
        buf.truncate(got);
        Ok((buf, got < count))
    }

    /// Writes `data`; how many bytes went.
    pub fn write(&mut self, h: i64, data: &[u8]) -> Result<usize, String> {
        let f = self.file(h)?;
        f.write_all(data)
            .map_err(|e| format!("failed to write to file: {}", os_text(&e)))?;
        Ok(data.len())
    }

    /// Moves the position; the new one.
    pub fn seek(&mut self, h: i64, offset: i64, whence: Whence) -> Result<u64, String> {
        let f = self.file(h)?;
        let to = match whence {
            Whence::Set => SeekFrom::Start(
                u64::try_from(offset)
                    .map_err(|_| "a negative offset from the start".to_string())?,
            ),
            Whence::Cur => SeekFrom::Current(offset),
            Whence::End => SeekFrom::End(offset),
        };
        f.seek(to)
            .map_err(|e| format!("failed to seek file: {}", os_text(&e)))
    }

    /// Closes a handle (its data flushed to the file system first).
    pub fn close(&mut self, h: i64) -> Result<(), String> {
        let f = self
            .open
            .remove(&h)
            .ok_or_else(|| format!("handle '{h}' has not been found"))?;
        f.sync_data()
            .or_else(|e| {
                // Devices, pipes and /proc files cannot be synced: nothing to flush there.
                if e.raw_os_error() == Some(libc::EINVAL) {
                    Ok(())
                } else {
                    Err(e)
                }
            })
            .map_err(|e| format!("failed to close file: {}", os_text(&e)))
    }
}

/// Most entries a listing reads from one folder (the host returns at most 10,000 of them,
/// sorted by name; past this many it says the listing is cut).
pub const MAX_LISTED: usize = 100_000;

/// One entry of a folder, as lstat sees it (a link is not followed).
#[derive(Debug, Clone, PartialEq)]
pub struct Listed {
    /// Its name (not UTF-8: lossily).
    pub name: String,
    /// st_mode: type and permission bits.
    pub mode: u32,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
}

/// The entries of folder `path`, sorted by name, at most `max`; and whether there were more.
pub fn list_dir(path: &str, max: usize) -> Result<(Vec<Listed>, bool), String> {
    use std::os::unix::fs::MetadataExt;
    let rd = std::fs::read_dir(path)
        .map_err(|e| format!("{path} is not a folder that can be read: {}", os_text(&e)))?;
    let mut out = Vec::new();
    let mut cut = false;
    for entry in rd {
        let Ok(entry) = entry else { continue };
        if out.len() >= MAX_LISTED {
            cut = true;
            break;
        }
        let Ok(m) = entry.path().symlink_metadata() else {
            continue; // gone meanwhile
        };
        out.push(Listed {
            name: entry.file_name().to_string_lossy().into_owned(),
            mode: m.mode(),
            size: m.size(),
            mtime: m.mtime(),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    if out.len() > max {
        out.truncate(max);
        cut = true;
    }
    Ok((out, cut))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_write_seek_read_close() {
        let dir = std::env::temp_dir().join(format!("mcqemu-agent-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f");
        let path = p.to_str().unwrap();
        let mut fs = Files::new();
        let h = fs.open(path, "w").unwrap();
        assert_eq!(fs.write(h, b"hello world").unwrap(), 11);
        fs.close(h).unwrap();
        let h = fs.open(path, "rb").unwrap();
        assert_eq!(fs.seek(h, 0, Whence::End).unwrap(), 11);
        fs.seek(h, 6, Whence::Set).unwrap();
        assert_eq!(fs.read(h, 100).unwrap(), (b"world".to_vec(), true));
        fs.close(h).unwrap();
        assert!(fs.close(h).is_err());
        let e = fs
            .open(dir.join("none").to_str().unwrap(), "r")
            .unwrap_err();
        assert!(e.contains("No such file"), "{e}");
        let h = fs.open(dir.to_str().unwrap(), "r").unwrap();
        assert!(fs.read(h, 10).unwrap_err().contains("directory"));
        std::os::unix::fs::symlink("f", dir.join("link")).unwrap();
        let (entries, cut) = list_dir(dir.to_str().unwrap(), 10).unwrap();
        assert!(!cut);
        let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["f", "link"]);
        assert_eq!(
            (entries[0].size, entries[0].mode & 0o170000),
            (11, 0o100000)
        );
        assert_eq!(
            entries[1].mode & 0o170000,
            0o120000,
            "a link is not followed"
        );
        assert!(list_dir(dir.to_str().unwrap(), 1).unwrap().1);
        assert!(list_dir(p.to_str().unwrap(), 10).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
