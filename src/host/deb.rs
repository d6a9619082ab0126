//! A Debian package's files, read in-process, so that the image kernel comes to any Linux host
//! without apt, dpkg, ar or xz: a `.deb` is an `ar` archive (`!<arch>\n`, 60-byte member
//! headers, members padded to even sizes) whose `data.tar.xz` (`.gz` or plain `.tar` in
//! other packages) holds the files. Only regular files the caller selects are written, below
//! the caller's folder, never through `..`; the package is untrusted until its digest is
//! checked, and even then every size is bounded.

use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::path::Path;

use crate::state::tar::{Kind, Reader};

/// Longest data archive unpacked (the cloud kernel's is 108 MB): a bound on what a hostile
/// package writes.
const MAX_UNPACKED: u64 = 1 << 30;
/// The `ar` archive's magic.
const MAGIC: &[u8; 8] = b"!<arch>\n";

/// What went wrong reading a package.
fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Writes the regular files of `deb`'s data archive whose path (without its leading `./`)
/// `keep` selects below `dir`, keeping their paths; returns those paths. `cancelled` is asked
/// between files.
pub fn extract(
    deb: &Path,
    dir: &Path,
    keep: &dyn Fn(&str) -> bool,
    cancelled: &dyn Fn() -> bool,
) -> io::Result<Vec<String>> {
    let mut f = BufReader::new(File::open(deb)?);
    let (name, size) = data_member(&mut f)?;
    let body = f.take(size);
    let tar: Box<dyn Read> = if name.ends_with(".xz") {
        Box::new(lzma_rust2::XzReader::new(body, true))
    } else if name.ends_with(".gz") {
        Box::new(flate2::read::GzDecoder::new(body))
    } else if name == "data.tar" {
        Box::new(body)
    } else {
        return Err(bad(format!(
            "the package's {name} is compressed in a way mcqemu does not read (it reads .xz, \
             .gz and plain tar)"
        )));
    };
    let mut r = Reader::new(tar.take(MAX_UNPACKED));
    let mut out = Vec::new();
    while let Some(e) = r.next_entry()? {
        if cancelled() {
            return Err(io::Error::new(io::ErrorKind::Interrupted, "cancelled"));
        }
        let path = String::from_utf8_lossy(&e.path).into_owned();
        let Some(rel) = relative(&path) else {
            continue;
        };
        if e.kind != Kind::File || !keep(&rel) {
            continue;
        }
        let to = dir.join(&rel);
        if let Some(p) = to.parent() {
            std::fs::create_dir_all(p)?;
        }
        let mut w = io::BufWriter::new(File::create(&to)?);
        r.data(&mut w)?;
        w.flush()?;
        out.push(rel);
    }
    Ok(out)
}

/// A member path made relative (no `./`, no `/`), or None when it is empty or climbs (`..`).
fn relative(path: &str) -> Option<String> {
    let rel: Vec<&str> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    (!rel.is_empty() && !rel.contains(&"..")).then(|| rel.join("/"))
}

/// Reads `ar` headers up to the data archive's; leaves `f` at its first byte. Its name and size.
fn data_member(f: &mut impl Read) -> io::Result<(String, u64)> {
    let mut magic = [0u8; 8];
    f.read_exact(&mut magic)
        .map_err(|_| bad("not a Debian package: shorter than an ar header"))?;
    if &magic != MAGIC {
        return Err(bad("not a Debian package: no ar archive magic"));
    }
    loop {
        let mut h = [0u8; 60];
        f.read_exact(&mut h)
            .map_err(|_| bad("the package has no data.tar member"))?;
        if &h[58..60] != b"`\n" {
            return Err(bad("the package's ar header is damaged"));
        }
        let name = String::from_utf8_lossy(&h[..16])
            .trim_end()
            .trim_end_matches('/')
            .to_string();
        let size: u64 = String::from_utf8_lossy(&h[48..58])
            .trim()
            .parse()
            .map_err(|_| bad(format!("the package's member {name} has no size")))?;
        if name.starts_with("data.tar") {
            return Ok((name, size));
        }
        let skip = size + size % 2;
        if io::copy(&mut f.take(skip), &mut io::sink())? != skip {
            return Err(bad(format!("the package ends inside its member {name}")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::tar::Writer;

    fn ar_member(out: &mut Vec<u8>, name: &str, data: &[u8]) {
        out.extend_from_slice(
            format!(
                "{:<16}{:<12}{:<6}{:<6}{:<8}{:<10}`\n",
                name,
                0,
                0,
                0,
                "100644",
                data.len()
            )
            .as_bytes(),
        );
        out.extend_from_slice(data);
        if data.len() % 2 == 1 {
            out.push(b'\n');
        }
    }

    fn deb(data_name: &str, data: &[u8]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        ar_member(&mut out, "debian-binary", b"2.0\n");
        ar_member(&mut out, "control.tar.xz", b"odd");
        ar_member(&mut out, data_name, data);
        out
    }

    fn data_tar() -> Vec<u8> {
        let mut w = Writer::new(Vec::new());
        w.dir(b"./boot", 0o755, 0).unwrap();
        w.file(
            b"./boot/vmlinuz-6.1.0-1-cloud-amd64",
            0o644,
            0,
            6,
            &mut &b"kernel"[..],
        )
        .unwrap();
        w.file(
            b"./lib/modules/6.1.0-1/kernel/fs/overlay.ko",
            0o644,
            0,
            2,
            &mut &b"ko"[..],
        )
        .unwrap();
        w.file(b"./../escape.ko", 0o644, 0, 2, &mut &b"no"[..])
            .unwrap();
        w.file(b"./usr/share/doc/x", 0o644, 0, 3, &mut &b"doc"[..])
            .unwrap();
        w.finish().unwrap()
    }

    #[test]
    fn a_package_s_chosen_files_are_written_and_nothing_climbs_out() {
        let dir = std::env::temp_dir().join(format!("mcq-deb-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&data_tar()).unwrap();
        let pkg = dir.join("k.deb");
        std::fs::write(&pkg, deb("data.tar.gz", &gz.finish().unwrap())).unwrap();
        let out = dir.join("x");
        let keep = |p: &str| p.starts_with("boot/") || p.ends_with(".ko");
        let got = extract(&pkg, &out, &keep, &|| false).unwrap();
        assert_eq!(
            got,
            vec![
                "boot/vmlinuz-6.1.0-1-cloud-amd64".to_string(),
                "lib/modules/6.1.0-1/kernel/fs/overlay.ko".to_string()
            ]
        );
        assert_eq!(
            std::fs::read(out.join(&got[0])).unwrap(),
            b"kernel".to_vec()
        );
        assert!(!dir.join("escape.ko").exists());
        assert!(!out.join("usr").exists());

        std::fs::write(&pkg, deb("data.tar", &data_tar())).unwrap();
        assert_eq!(
            extract(&pkg, &dir.join("y"), &keep, &|| false)
                .unwrap()
                .len(),
            2
        );

        std::fs::write(&pkg, deb("data.tar.zst", b"zz")).unwrap();
        let e = extract(&pkg, &dir.join("z"), &keep, &|| false).unwrap_err();
        assert!(e.to_string().contains("data.tar.zst"), "{e}");
        std::fs::write(&pkg, b"<html>not found</html>").unwrap();
        let e = extract(&pkg, &dir.join("z"), &keep, &|| false).unwrap_err();
        assert!(e.to_string().contains("not a Debian package"), "{e}");
        let mut cut = deb("data.tar", &data_tar());
        cut.truncate(200);
        std::fs::write(&pkg, cut).unwrap();
        assert!(extract(&pkg, &dir.join("z"), &keep, &|| false).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
