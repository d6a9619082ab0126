//! A cpio archive in the kernel's `newc` format, the form of an initramfs: written here so an
//! initrd needs no cpio program, no root and no loop device. Entries are owned by root.

/// An archive being written.
#[derive(Debug, Default)]
pub struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    /// An empty archive.
    pub fn new() -> Cpio {
        Cpio::default()
    }

    /// A folder (its parents first: the kernel makes nothing on its own).
    pub fn dir(&mut self, path: &str) {
        self.entry(path, 0o040755, &[], 0, 0);
    }

    /// A regular file with `mode`'s permission bits.
    pub fn file(&mut self, path: &str, data: &[u8], mode: u32) {
        self.entry(path, 0o100000 | (mode & 0o7777), data, 0, 0);
    }

    /// A character device.
    pub fn chardev(&mut self, path: &str, major: u32, minor: u32) {
        self.entry(path, 0o020600, &[], major, minor);
    }

    /// The archive, with its trailer.
    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[], 0, 0);
        self.out
    }

    fn entry(&mut self, path: &str, mode: u32, data: &[u8], rmajor: u32, rminor: u32) {
        self.ino += 1;
        let name = path.trim_start_matches('/');
        let fields = [
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len() as u32,
            0,
            0,
            rmajor,
            rminor,
            name.len() as u32 + 1,
            0,
        ];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08X}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The archive as `cpio -t` (GNU cpio, when the host has it) lists it; else its own
    /// reading of the headers.
    #[test]
    fn entries_are_aligned_and_end_with_the_trailer() {
        let mut c = Cpio::new();
        c.dir("etc");
        c.file("/etc/x", b"hello", 0o644);
        c.chardev("dev/console", 5, 1);
        let a = c.finish();
        assert_eq!(a.len() % 4, 0);
        assert!(a.starts_with(b"070701"));
        let mut names = Vec::new();
        let mut at = 0;
        while at < a.len() {
            let field = |i: usize| {
                let s = std::str::from_utf8(&a[at + 6 + i * 8..at + 14 + i * 8]).unwrap();
                usize::from_str_radix(s, 16).unwrap()
            };
            let (size, namesize) = (field(6), field(11));
            let name = &a[at + 110..at + 110 + namesize - 1];
            names.push(String::from_utf8(name.to_vec()).unwrap());
            let data = (at + 110 + namesize).next_multiple_of(4);
            if names.last().unwrap() == "etc/x" {
                assert_eq!(&a[data..data + size], b"hello");
            }
            at = (data + size).next_multiple_of(4);
        }
        assert_eq!(names, ["etc", "etc/x", "dev/console", "TRAILER!!!"]);
        if let Ok(mut child) = std::process::Command::new("cpio")
            .args(["-t", "--quiet"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
        {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(&a).unwrap();
            let out = child.wait_with_output().unwrap();
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "etc\netc/x\ndev/console\n"
            );
        }
    }
}
