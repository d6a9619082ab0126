//! The guest's side of copies over mcqemu's data channel (the virtio port [`DATA_PORT`]),
//! done by the agent itself: the host starts `mcqemu-agent copy-out|copy-in|copy-free ARGS`
//! through guest-exec as the agent's own program (`/proc/self/exe`), so a copy needs no sh,
//! tar or dd in the guest. Arguments, framing and exit codes are those of the shell scripts
//! it replaces (`ops::guest::copy::channel`), so the host reads both the same way:
//! - out: `MCQ-BEGIN <nonce> <bytes>`, the tar, `MCQ-END <nonce> <status>`;
//! - in: `MCQ-READY <nonce>`, then the host's `MCQ-BEGIN <nonce> <length>` and exactly that
//!   many bytes (the tar, then zeros), unpacked beside the destination and renamed into place.
//!
//! The tar is the host's own writer and extractor (`state::tar`, `state::extract`): entries
//! are written through folder descriptors with `O_NOFOLLOW`, never under a symlink the archive
//! made, never outside the unpack folder.

use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::state::extract::Extract;
use crate::state::tar::{Reader, Writer};
use crate::state::tree::{archive_one, remove_quietly, walk_all, Counts, Folder, Type};

/// The data channel's port name (the host's `qemu::cmdline::DATA_PORT`).
pub const DATA_PORT: &str = "org.mcqemu.data.0";

/// Longest stretch of stale bytes skipped before the host's opening line.
const MAX_SKIP: u64 = 1 << 20;

/// A copy step's failure: the exit code the host reads, and the line for its stderr.
struct Fail(i32, String);

fn fail(code: i32, msg: impl Into<String>) -> Fail {
    Fail(code, msg.into())
}

/// Runs a copy subcommand (`cmd` with `args`); None when `cmd` is not one.
pub fn main(cmd: &str, args: &[String]) -> Option<i32> {
    let arg = |i: usize| args.get(i).map(String::as_str).unwrap_or("");
    let r = match cmd {
        "copy-out" => copy_out(arg(0), arg(1), arg(2), arg(3)),
        "copy-in" => copy_in(arg(0), arg(1), arg(2), arg(3) == "1", arg(4)),
        "copy-free" => {
            free_port();
            if !arg(0).is_empty() {
                remove_quietly(Path::new(arg(0)));
            }
            Ok(())
        }
        _ => return None,
    };
    Some(match r {
        Ok(()) => 0,
        Err(Fail(code, msg)) => {
            eprintln!("{msg}");
            code
        }
    })
}

/// The port's device node, or the scripts' codes for "use the agent's file commands".
fn port_device() -> Result<PathBuf, Fail> {
    let dev = super::port::find(DATA_PORT)
        .ok_or_else(|| fail(20, "no data channel port in the guest"))?;
    if !dev.exists() {
        return Err(fail(21, format!("no device node {}", dev.display())));
    }
    Ok(dev)
}

/// Opens the port; a port still held by a transfer that failed half-way is freed first.
fn open_port(write_only: bool) -> Result<File, Fail> {
    let dev = port_device()?;
    let open = || {
        let mut o = OpenOptions::new();
        if write_only {
            o.write(true);
        } else {
            o.read(true).write(true);
        }
        o.custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC).open(&dev)
    };
    open()
        .or_else(|_| {
            free_port();
            std::thread::sleep(Duration::from_secs(1));
            open()
        })
        .map_err(|e| fail(22, format!("cannot open {}: {e}", dev.display())))
}

/// Kills every other process holding the port open (a transfer that failed half-way).
fn free_port() {
    let Ok(dev) = port_device() else { return };
    let me = std::process::id().to_string();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for p in procs.flatten() {
        let pid = p.file_name();
        let Some(pid) = pid
            .to_str()
            .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let holds = std::fs::read_dir(p.path().join("fd"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == dev));
        if let (true, Ok(n)) = (holds, pid.parse::<i32>()) {
            // SAFETY: kill(2) with a PID read from /proc; a stale one fails harmlessly.
            unsafe { libc::kill(n, libc::SIGKILL) };
        }
    }
}

/// The folder holding `path` (followed as the guest's tar would) and `path`'s last name.
fn split(path: &str) -> Result<(PathBuf, OsString), Fail> {
    let p = Path::new(path);
    match (p.parent(), p.file_name()) {
        (Some(d), Some(n)) if p.is_absolute() => Ok((d.to_path_buf(), n.to_os_string())),
        _ => Err(fail(
            2,
            format!("{path:?} is not an absolute path with a name"),
        )),
    }
}

fn open_folder(dir: &Path, code: i32) -> Result<Folder, Fail> {
    Folder::open_following(dir).map_err(|e| {
        fail(
            code,
            format!(
                "the guest folder {} does not exist or cannot be opened ({e}); create it first \
                 (guest_exec mkdir -p)",
                dir.display()
            ),
        )
    })
}

/// copy-out FOLDER NAME NONCE CAP_KIB: streams FOLDER/NAME as a tar over the port.
fn copy_out(parent: &str, name: &str, nonce: &str, cap_k: &str) -> Result<(), Fail> {
    let cap = cap_k
        .parse::<u64>()
        .unwrap_or(u64::MAX / 1024)
        .saturating_mul(1024);
    let dir = open_folder(Path::new(parent), 4)?;
    let leaf = OsStr::new(name);
    dir.meta(leaf)
        .map_err(|_| fail(4, format!("nothing is at {parent}/{name} in the guest")))?;
    let size =
        measure(&dir, leaf).map_err(|e| fail(5, format!("cannot read {parent}/{name}: {e}")))?;
    if size > cap {
        return Err(fail(
            6,
            format!(
                "{parent}/{name} holds {} MiB, more than the cap of {} MiB per copy \
                 (MCQEMU_MAX_COPY_MB); copy a smaller part",
                size >> 20,
                cap >> 20
            ),
        ));
    }
    let port = open_port(true)?;
    let mut w = BufWriter::with_capacity(64 << 10, port);
    let sent = writeln!(w, "MCQ-BEGIN {nonce} {size}").and_then(|()| {
        let mut tw = Writer::new(&mut w);
        walk_all(
            &dir,
            leaf,
            name.as_bytes(),
            &mut Counts::default(),
            &mut |d, n, p, m, c| {
                if m.kind != Type::File {
                    return archive_one(&mut tw, d, n, p, m, c);
                }
                let f = d.open_file(n)?;
                tw.file_with(p, (m.mode, m.mtime, m.size), |out| {
                    out.flush()?;
                    send_file(&f, out.get_ref(), m.size)
                })
            },
        )?;
        tw.finish().map(|_| ())
    });
    let status = i32::from(sent.is_err());
    let ended = writeln!(w, "MCQ-END {nonce} {status}").and_then(|()| w.flush());
    match sent.and(ended) {
        Ok(()) => Ok(()),
        Err(e) => Err(fail(
            2,
            format!("packing {parent}/{name} in the guest failed: {e}"),
        )),
    }
}

/// Moves up to `size` bytes of `from` to `to` in the kernel (sendfile: no copy through this
/// process, as busybox's tar does); how many it moved.
fn send_file(from: &File, to: &File, size: u64) -> io::Result<u64> {
    use std::os::unix::io::AsRawFd;
    let mut sent = 0u64;
    while sent < size {
        let want = (size - sent).min(1 << 30) as usize;
        // SAFETY: two open descriptors; a null offset uses (and advances) the file's own.
        let n =
            unsafe { libc::sendfile(to.as_raw_fd(), from.as_raw_fd(), std::ptr::null_mut(), want) };
        match n {
            0 => break,
            n if n > 0 => sent += n as u64,
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(sent)
}

/// The bytes of file content at and below `name`.
fn measure(dir: &Folder, name: &OsStr) -> io::Result<u64> {
    let mut total = 0u64;
    walk_all(
        dir,
        name,
        b"",
        &mut Counts::default(),
        &mut |_, _, _, m, _| {
            if m.kind == Type::File {
                total = total.saturating_add(m.size);
            }
            Ok(())
        },
    )?;
    Ok(total)
}

/// copy-in UNPACK NONCE DEST OVERWRITE OLD: unpacks the host's tar from the port at UNPACK,
/// then renames it to DEST (parking an existing DEST at OLD until the new one is in place).
fn copy_in(unpack: &str, nonce: &str, dst: &str, overwrite: bool, old: &str) -> Result<(), Fail> {
    let (dir_path, dst_name) = split(dst)?;
    let (_, tmp) = split(unpack)?;
    let (_, old_name) = split(old)?;
    let dir = open_folder(&dir_path, 4)?;
    if !overwrite && dir.meta(&dst_name).is_ok() {
        return Err(fail(
            13,
            format!("{dst} already exists in the guest; pass overwrite=true to replace it"),
        ));
    }
    let mut port = open_port(false)?;
    port.write_all(format!("MCQ-READY {nonce}\n").as_bytes())
        .map_err(|e| fail(22, format!("cannot write to the data channel: {e}")))?;
    let len = opening(&mut port, nonce)?;
    let bye = |code: i32, msg: String| {
        remove_quietly(Path::new(unpack));
        fail(code, msg)
    };
    let mut body = BufReader::with_capacity(64 << 10, (&mut port).take(len));
    if let Err(e) = unpack_into(&dir, &tmp, &mut body) {
        return Err(bye(
            11,
            format!("the copy could not be unpacked in the guest: {e} (a full disk, or the transfer cut short)"),
        ));
    }
    // The zeros after the archive: the host sends every byte it announced.
    let _ = io::copy(&mut body, &mut io::sink());
    if dir.meta(&dst_name).is_ok() {
        if !overwrite {
            return Err(bye(
                13,
                format!("{dst} appeared in the guest meanwhile; pass overwrite=true to replace it"),
            ));
        }
        dir.rename(&dst_name, &old_name, false)
            .map_err(|e| bye(14, format!("cannot move the old {dst} aside: {e}")))?;
        if let Err(e) = dir.rename(&tmp, &dst_name, false) {
            let _ = dir.rename(&old_name, &dst_name, false);
            return Err(bye(15, format!("cannot rename into {dst}: {e}")));
        }
        remove_quietly(Path::new(old));
    } else {
        dir.rename(&tmp, &dst_name, false)
            .map_err(|e| bye(15, format!("cannot rename into {dst}: {e}")))?;
    }
    Ok(())
}

/// Reads up to the host's `MCQ-BEGIN <nonce> <length>` line (anything before it is stale)
/// and returns the length.
fn opening(port: &mut File, nonce: &str) -> Result<u64, Fail> {
    let want = format!("MCQ-BEGIN {nonce} ");
    let mut line = Vec::new();
    let mut skipped = 0u64;
    let mut b = [0u8; 1];
    loop {
        match port.read(&mut b) {
            Ok(0) => return Err(fail(23, "the data channel closed before the copy began")),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(fail(23, format!("reading the data channel: {e}"))),
        }
        skipped += 1;
        if skipped > MAX_SKIP {
            return Err(fail(23, "no opening line on the data channel"));
        }
        if b[0] != b'\n' {
            if line.len() < 4096 {
                line.push(b[0]);
            }
            continue;
        }
        let text = String::from_utf8_lossy(&line).into_owned();
        line.clear();
        if let Some(at) = text.find(&want) {
            return text[at + want.len()..]
                .trim()
                .parse()
                .map_err(|_| fail(24, "a bad length on the data channel"));
        }
    }
}

/// Extracts the archive (entries under `c`) into `dir`/`tmp`.
fn unpack_into(dir: &Folder, tmp: &OsStr, r: &mut dyn Read) -> io::Result<()> {
    let mut x = Extract::new(dir, tmp.to_os_string(), b"c").keeping_hidden();
    let mut tr = Reader::new(r);
    while let Some(e) = tr.next_entry()? {
        x.entry(&e, &mut tr)?;
    }
    if !x.started {
        return Err(io::Error::other("the archive held nothing"));
    }
    x.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_name_is_the_hosts() {
        assert_eq!(DATA_PORT, crate::qemu::cmdline::DATA_PORT);
    }

    #[test]
    fn a_tree_goes_out_whole_with_hidden_names_and_comes_back_in() {
        let base = std::env::temp_dir().join(format!("mcq-agent-copy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("src/t/.git")).unwrap();
        std::fs::write(base.join("src/t/.git/HEAD"), b"ref").unwrap();
        std::fs::write(base.join("src/t/f"), b"data").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", base.join("src/t/l")).unwrap();
        std::fs::create_dir_all(base.join("dst")).unwrap();
        let from = Folder::open_following(&base.join("src")).unwrap();
        assert_eq!(measure(&from, OsStr::new("t")).unwrap(), 7);
        let mut archive = Vec::new();
        {
            let mut tw = Writer::new(&mut archive);
            walk_all(
                &from,
                OsStr::new("t"),
                b"c",
                &mut Counts::default(),
                &mut |d, n, p, m, c| archive_one(&mut tw, d, n, p, m, c),
            )
            .unwrap();
            tw.finish().unwrap();
        }
        let to = Folder::open_following(&base.join("dst")).unwrap();
        unpack_into(&to, OsStr::new("u"), &mut &archive[..]).unwrap();
        assert_eq!(std::fs::read(base.join("dst/u/.git/HEAD")).unwrap(), b"ref");
        assert_eq!(std::fs::read(base.join("dst/u/f")).unwrap(), b"data");
        assert_eq!(
            std::fs::read_link(base.join("dst/u/l")).unwrap(),
            Path::new("/etc/passwd")
        );
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn stale_bytes_before_the_opening_line_are_skipped() {
        let base = std::env::temp_dir().join(format!("mcq-agent-open-{}", std::process::id()));
        std::fs::write(&base, b"junk\nMCQ-BEGIN old 5\nxx MCQ-BEGIN n1 131072\n").unwrap();
        let mut f = File::open(&base).unwrap();
        assert_eq!(opening(&mut f, "n1").ok(), Some(131072));
        let mut f = File::open(&base).unwrap();
        assert!(opening(&mut f, "n2").is_err());
        let _ = std::fs::remove_file(&base);
    }
}
