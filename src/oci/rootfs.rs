//! An unpacked image folder made into an ext4 file system image, with the image's owners,
//! modes and file capabilities, whoever runs the server: `mke2fs -d` copies the folder (it
//! needs no root and no loop device), then one `debugfs -w` script sets on each inode what the
//! image says of it (owners the host could not give, setuid bits, `security.capability`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::error::OciError;
use super::unpack::{FileType, Meta};
use crate::host::run::{run, RunError};

/// Free room beyond the content: new files in the guest go to its overlay, but the guest's
/// own writes (logs, package installs) land in this file system.
const HEADROOM: u64 = 256 << 20;
/// Longest a build's mke2fs or debugfs may take.
const TOOL_TIMEOUT: Duration = Duration::from_secs(1800);

/// What a build made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    /// The image's size in bytes (sparse on disk).
    pub size: u64,
    /// Inodes whose owner, mode or capability was set after the copy.
    pub fixed: usize,
}

/// What kind of file system a build makes.
#[derive(Debug, Clone, Copy)]
pub struct Fs<'a> {
    /// Its label (how a guest finds it).
    pub label: &'a str,
    /// Only ever mounted read-only (the modules disk): no journal, which a read-only mount
    /// need not check, and no headroom.
    pub read_only: bool,
}

/// An image's root: journalled, with room for the guest's writes.
pub const ROOT: Fs<'static> = Fs {
    label: "mcqemu-root",
    read_only: false,
};

/// Builds `out` (an ext4 image of kind `fs`, replaced if there) from `tree` and its entries'
/// `meta`, at `content` bytes of files; `cancelled` stops it.
pub fn build(
    fs: Fs,
    tree: &Path,
    meta: &BTreeMap<Vec<u8>, Meta>,
    content: u64,
    out: &Path,
    cancelled: &dyn Fn() -> bool,
) -> Result<Built, OciError> {
    let entries = meta.len() as u64 + 16;
    // Content, a block's slack per entry, the inode tables, then the headroom; whole MiB.
    let headroom = if fs.read_only { 16 << 20 } else { HEADROOM };
    let size = (content + content / 8 + entries * 8192 + headroom).div_ceil(1 << 20) << 20;
    let _ = std::fs::remove_file(out);
    std::fs::File::create(out)
        .and_then(|f| f.set_len(size))
        .map_err(|e| OciError::Host(format!("cannot create {}: {e}", out.display())))?;
    let inodes = (entries * 2).max(16384).to_string();
    let mut mk = Command::new(e2fs_tool("mke2fs"));
    mk.args([
        "-q",
        "-F",
        "-t",
        "ext4",
        "-L",
        fs.label,
        "-E",
        "root_owner=0:0",
        "-N",
    ])
    .arg(&inodes)
    .args(if fs.read_only {
        &["-O", "^has_journal"][..]
    } else {
        &[]
    })
    .arg("-d")
    .arg(tree)
    .arg(out);
    let r = run(&mut mk, TOOL_TIMEOUT, cancelled).map_err(|e| ran("mke2fs", e))?;
    if !r.status.success() {
        return Err(OciError::Host(format!(
            "mke2fs could not build the root ({}): {}",
            r.status,
            String::from_utf8_lossy(&r.stderr).trim()
        )));
    }
    let dir = out.with_extension("debugfs");
    std::fs::create_dir_all(&dir)
        .map_err(|e| OciError::Host(format!("cannot create {}: {e}", dir.display())))?;
    let result = fix_inodes(meta, out, &dir, cancelled);
    let _ = std::fs::remove_dir_all(&dir);
    let fixed = result?;
    Ok(Built { size, fixed })
}

/// Sets each inode's owner, mode and capability where the copy did not already give them.
fn fix_inodes(
    meta: &BTreeMap<Vec<u8>, Meta>,
    image: &Path,
    dir: &Path,
    cancelled: &dyn Fn() -> bool,
) -> Result<usize, OciError> {
    // SAFETY: geteuid has no preconditions.
    let host_uid = u64::from(unsafe { libc::geteuid() });
    // SAFETY: getegid has no preconditions.
    let host_gid = u64::from(unsafe { libc::getegid() });
    let mut script = Vec::new();
    let mut fixed = 0;
    for (i, (path, m)) in meta.iter().enumerate() {
        let quoted = quote(path)?;
        let (type_bits, copied_mode) = match m.kind {
            FileType::File => (0o100000, 0o644),
            FileType::Dir => (0o040000, 0o755),
            FileType::Symlink => (0o120000, 0o777),
        };
        let before = script.len();
        if m.uid != host_uid {
            writeln!(script, "sif {quoted} uid {}", m.uid).ok();
        }
        if m.gid != host_gid {
            writeln!(script, "sif {quoted} gid {}", m.gid).ok();
        }
        if m.kind != FileType::Symlink && m.mode != copied_mode {
            writeln!(script, "sif {quoted} mode 0{:o}", type_bits | m.mode).ok();
        }
        for (j, (name, value)) in m.xattrs.iter().enumerate() {
            let file = dir.join(format!("x{i}-{j}"));
            std::fs::write(&file, value)
                .map_err(|e| OciError::Host(format!("cannot write {}: {e}", file.display())))?;
            let name = quote_name(name)?;
            writeln!(script, "ea_set -f {} {quoted} {name}", file.display()).ok();
        }
        if script.len() > before {
            fixed += 1;
        }
    }
    if script.is_empty() {
        return Ok(0);
    }
    let file = dir.join("script");
    std::fs::write(&file, &script)
        .map_err(|e| OciError::Host(format!("cannot write {}: {e}", file.display())))?;
    let mut dbg = Command::new(e2fs_tool("debugfs"));
    dbg.arg("-w").arg("-f").arg(&file).arg(image);
    let r = run(&mut dbg, TOOL_TIMEOUT, cancelled).map_err(|e| ran("debugfs", e))?;
    // debugfs exits 0 whatever its commands did: its complaints are the lines on stderr
    // other than its banner.
    let err = String::from_utf8_lossy(&r.stderr);
    let complaints: Vec<&str> = err
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("debugfs "))
        .take(5)
        .collect();
    if !r.status.success() || !complaints.is_empty() {
        return Err(OciError::Host(format!(
            "debugfs could not set the image's owners and modes: {}",
            complaints.join("; ")
        )));
    }
    Ok(fixed)
}

/// Where e2fsprogs' `tool` is: /usr/sbin or /sbin, which an ordinary user's PATH lacks on
/// Debian, else whatever PATH finds.
fn e2fs_tool(tool: &str) -> std::path::PathBuf {
    ["/usr/sbin", "/sbin"]
        .iter()
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
        .unwrap_or_else(|| tool.into())
}

/// Why running `tool` failed: the caller's cancel, a missing e2fsprogs, or the host.
fn ran(tool: &str, e: RunError) -> OciError {
    match e {
        RunError::Cancelled(_) => OciError::Cancelled(format!("{tool}: cancelled by the client")),
        RunError::NotFound(_) => OciError::Host(format!(
            "{tool} is not installed; container images become roots with e2fsprogs (Debian: \
             apt-get install e2fsprogs; .ci/setup-host --run installs it)"
        )),
        e => OciError::Host(format!("{tool}: {e}")),
    }
}

/// A path as a debugfs argument: `/` first, in double quotes. debugfs has no escapes, so a
/// name with a quote, a backslash or a line break cannot be named and is refused.
fn quote(path: &[u8]) -> Result<String, OciError> {
    Ok(format!("\"/{}\"", unquoted(path)?))
}

/// An extended attribute's name as a debugfs argument: in double quotes, as it is (a leading
/// `/` would make another attribute, one no program asks for).
fn quote_name(name: &[u8]) -> Result<String, OciError> {
    Ok(format!("\"{}\"", unquoted(name)?))
}

/// A name debugfs can take between double quotes, refused when it cannot.
fn unquoted(path: &[u8]) -> Result<String, OciError> {
    let s = String::from_utf8_lossy(path);
    if path
        .iter()
        .any(|&b| b == b'"' || b == b'\\' || b == b'\n' || b == b'\r' || b == 0)
        || s.contains('\u{fffd}')
    {
        return Err(OciError::Invalid(format!(
            "the image has a name mcqemu cannot write into its root ({s:?}: a quote, backslash, \
             line break or invalid UTF-8)"
        )));
    }
    Ok(s.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn debugfs(image: &Path, cmd: &str) -> String {
        let o = Command::new(e2fs_tool("debugfs"))
            .arg("-R")
            .arg(cmd)
            .arg(image)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// A real mke2fs and debugfs: the inodes carry the image's owners, setuid bit and file
    /// capability, not the host's, and the content is the folder's.
    #[test]
    fn the_image_has_the_images_owners_modes_and_capabilities() {
        let d = std::env::temp_dir().join(format!("mcq-rootfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("tree/usr/bin")).unwrap();
        std::fs::write(d.join("tree/usr/bin/ping"), b"#!ping").unwrap();
        std::os::unix::fs::symlink("ping", d.join("tree/usr/bin/p")).unwrap();
        let m = |kind, uid, gid, mode, xattrs| Meta {
            kind,
            uid,
            gid,
            mode,
            xattrs,
        };
        let cap_bytes = vec![
            1u8, 0, 0, 2, 0, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        let meta: BTreeMap<Vec<u8>, Meta> = [
            (b"usr".to_vec(), m(FileType::Dir, 0, 0, 0o755, vec![])),
            (b"usr/bin".to_vec(), m(FileType::Dir, 0, 0, 0o755, vec![])),
            (
                b"usr/bin/ping".to_vec(),
                m(
                    FileType::File,
                    1000,
                    50,
                    0o4750,
                    vec![(b"security.capability".to_vec(), cap_bytes.clone())],
                ),
            ),
            (
                b"usr/bin/p".to_vec(),
                m(FileType::Symlink, 7, 7, 0o777, vec![]),
            ),
        ]
        .into_iter()
        .collect();
        let img = d.join("root.ext4");
        let built = build(ROOT, &d.join("tree"), &meta, 6, &img, &|| false).unwrap();
        assert!(built.size >= HEADROOM, "{built:?}");
        let st = debugfs(&img, "stat /usr/bin/ping");
        assert!(st.contains("Mode:  04750"), "{st}");
        assert!(
            st.contains("User:  1000") && st.contains("Group:    50"),
            "{st}"
        );
        // The attribute under its own name, with the layer's bytes (it was `/security.capability`,
        // which no kernel reads).
        let ea = debugfs(&img, "ea_list /usr/bin/ping");
        assert!(ea.contains("security.capability"), "{ea}");
        assert!(!ea.contains("/security"), "{ea}");
        let got = d.join("cap.bin");
        debugfs(
            &img,
            &format!(
                "ea_get -f {} /usr/bin/ping security.capability",
                got.display()
            ),
        );
        assert_eq!(std::fs::read(&got).unwrap(), cap_bytes);
        let link = debugfs(&img, "stat /usr/bin/p");
        assert!(
            link.contains("User:     7") && link.contains("Fast link dest: \"ping\""),
            "{link}"
        );
        assert_eq!(debugfs(&img, "cat /usr/bin/ping"), "#!ping");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn names_are_quoted_and_unnameable_ones_refused() {
        assert_eq!(quote(b"usr/bin/a b").unwrap(), "\"/usr/bin/a b\"");
        for bad in [&b"a\"b"[..], b"a\\b", b"a\nb", b"\xff"] {
            assert!(quote(bad).is_err(), "{bad:?}");
        }
    }
}
