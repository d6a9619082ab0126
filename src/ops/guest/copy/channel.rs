//! The guest side of copies over mcqemu's data channel: a virtio-serial port of its own beside the guest
//! agent's (`qemu::cmdline::DATA_PORT`, on the socket `data.sock` in the VM's runtime folder),
//! which moves bytes at the device's speed instead of as the agent's base64 JSON.
//!
//! The guest side is `sh` and `tar` started through the agent's guest-exec: no temporary
//! archive in the guest, no guest software installed. The framing never trusts an end of
//! stream (the host sees no EOF from a guest, and a host close can drop queued bytes):
//! - out: the guest writes `MCQ-BEGIN <nonce>`, the tar, then `MCQ-END <nonce> <tar's exit>`;
//!   the host reads the tar up to its end-of-archive block, then the trailer.
//! - in: the guest opens the port and writes `MCQ-READY <nonce>` (data that reaches a port
//!   nobody holds open is discarded); the host then writes `MCQ-BEGIN <nonce> <length>` and
//!   exactly that many bytes: the tar (measured by packing once into nothing first: busybox's
//!   tar reads on to the end of its input, so the guest must end it) and zeros up to a whole
//!   number of 64 KiB blocks, which the guest's `dd iflag=fullblock` reads at 4x the speed of
//!   busybox's `head -c` (`head -c` remains for a dd without `fullblock`); it keeps the
//!   connection open until the guest program has ended.
//!
//! Anything before the nonce's line is stale or hostile and skipped (within a bound, `frame`).
//! A failed transfer kills what still holds the port in the guest, so the next one starts
//! clean.

use std::cell::Cell;
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::frame;
use super::port::{Channel, Port, Program, Side};
use crate::ops::error::{ErrorKind, OpError};
use crate::ops::guest::stream::{self as gs, Watch};
use crate::qemu::cmdline::{data_socket, DATA_PORT};
use crate::qemu::qga::{Qga, QgaError};
use crate::state::record::text;
use crate::state::registry::Record;

/// Exit codes of the guest scripts that mean "use the agent instead", with why.
pub fn unusable(code: Option<i64>) -> Option<&'static str> {
    match code {
        Some(20) => {
            Some("the guest shows no port named org.mcqemu.data.0 under /sys/class/virtio-ports")
        }
        Some(21) => {
            Some("the guest has no device node for the data channel's port (no devtmpfs on /dev)")
        }
        Some(22) => Some("the guest could not open the data channel's port"),
        _ => None,
    }
}

/// The shell functions both guest scripts start with: `port` prints the channel's device,
/// `free` kills whatever still holds it (a transfer that failed half-way).
const FIND_PORT: &str = r#"port() { for n in /sys/class/virtio-ports/*/name; do [ -r "$n" ] || continue; IFS= read -r v < "$n" || continue; if [ "$v" = "PORT" ]; then d=${n%/name}; echo "/dev/${d##*/}"; return 0; fi; done; return 1; }
free() { for f in /proc/[0-9]*/fd/*; do [ "$(readlink "$f" 2>/dev/null)" = "$1" ] || continue; x=${f#/proc/}; [ "${x%%/*}" = "$$" ] || kill -9 "${x%%/*}" 2>/dev/null; done; }
dev=$(port) || { echo "no data channel port in the guest" >&2; exit 20; }
[ -c "$dev" ] || { echo "no device node $dev" >&2; exit 21; }
"#;

/// Copy out: $1 folder, $2 name, $3 nonce, $4 the cap in KiB.
const OUT: &str = r#"p=$1 b=$2 n=$3
command -v tar >/dev/null 2>&1 || { echo "the guest has no tar program (guest_copy_out needs sh and tar; busybox has them)" >&2; exit 3; }
[ -e "$p/$b" ] || [ -L "$p/$b" ] || { echo "nothing is at $p/$b in the guest" >&2; exit 4; }
if command -v du >/dev/null 2>&1; then k=$(du -sk "$p/$b" 2>/dev/null); k=${k%%[!0-9]*}
  [ "${k:-0}" -le "$4" ] || { echo "$p/$b holds $((k / 1024)) MiB, more than the cap of $(($4 / 1024)) MiB per copy (MCQEMU_MAX_COPY_MB); copy a smaller part" >&2; exit 6; }; fi
( : > "$dev" ) 2>/dev/null || { free "$dev"; sleep 1; }
( : > "$dev" ) 2>/dev/null || exit 22
exec 3>"$dev"
printf 'MCQ-BEGIN %s %s\n' "$n" "$((${k:-0} * 1024))" >&3
tar -c -f - -C "$p" "$b" >&3; s=$?
printf 'MCQ-END %s %s\n' "$n" "$s" >&3
exit $s"#;

/// Copy in: $1 the unpack folder, $2 nonce, $3 destination, $4 overwrite, $5 the old
/// destination's parking name. Unpacks straight from the port into `$d/c` (`$src`); the
/// caller's `place` script follows.
const IN: &str = r#"d=$1 n=$2 dst=$3 ow=$4 old=$5
bye() { rm -rf "$d"; echo "$2" >&2; exit "$1"; }
( : < "$dev" ) 2>/dev/null || { free "$dev"; sleep 1; }
( : < "$dev" ) 2>/dev/null || exit 22
mkdir "$d" || bye 10 "cannot create $d"
exec 3<>"$dev"
printf 'MCQ-READY %s\n' "$n" >&3
l=
while IFS= read -r l <&3; do case "$l" in *"MCQ-BEGIN $n "*) break;; esac; done
case "$l" in *"MCQ-BEGIN $n "*) ;; *) bye 23 "the data channel closed before the copy began";; esac
z=${l##* }
case "$z" in ''|*[!0-9]*) bye 24 "a bad length on the data channel";; esac
b=$((z / 65536))
if [ $((b * 65536)) -eq "$z" ] && dd if=/dev/null of=/dev/null iflag=fullblock count=0 2>/dev/null; then
  dd bs=65536 count="$b" iflag=fullblock <&3 2>/dev/null | tar -x -f - -C "$d" || bye 11 "the copy could not be unpacked in the guest (tar's message is above: a full disk, or the transfer cut short)"
else head -c "$z" <&3 | tar -x -f - -C "$d" || bye 11 "the copy could not be unpacked in the guest (tar's message is above: a full disk, or the transfer cut short)"; fi
exec 3<&-
src="$d/c"
"#;

/// The guest's read size for copies in: the announced length is a whole number of these.
const BLOCK: u64 = 64 << 10;

/// Kills whatever holds the port (after a failed transfer), then removes what a copy in had
/// unpacked so far ($1; its script was killed before it could).
const FREE: &str = r#"free "$dev"; [ -z "$1" ] || rm -rf "$1""#;

/// The VM's data channel socket, when its QEMU was started with one; else why not.
pub fn socket_of(rec: &Record) -> Result<PathBuf, &'static str> {
    let wired = rec.spec.as_ref().is_some_and(|s| s.channels.data_channel);
    if !wired {
        return Err("this VM was started without mcqemu's data channel (attached, or started by an older mcqemu); a VM launched now has it");
    }
    text(&rec.qga_socket)
        .map(|s| data_socket(Path::new(s)))
        .ok_or("this VM has no runtime folder for a data channel")
}

/// A transfer's outcome: the agent failed (explained by the session); the channel cannot be
/// used (fall back, with why); or the copy's own result.
pub enum Moved<T> {
    /// Use the agent instead, for this reason.
    Unusable(String),
    /// The copy ran (or failed) over the channel.
    Done(Result<T, OpError>),
}

/// The script with the port helpers before it.
fn script(body: &str) -> String {
    format!("{}{body}", FIND_PORT.replace("PORT", DATA_PORT))
}

/// After a failed transfer: kill what still holds the port in the guest, and remove a copy
/// in's unpack folder `leftover` (best effort).
fn clean_up(q: &mut Qga, side: Side, leftover: &str) {
    let free = script(FREE);
    let argv: &[&str] = match side {
        Side::Shell => &["sh", "-c", &free, "sh", leftover],
        Side::Agent => &["/proc/self/exe", "copy-free", leftover],
    };
    let _ = gs::run(q, argv, Duration::from_secs(20), None);
}

/// A transfer whose opening line never came: the agent's failure, the guest's own
/// "cannot use the channel" (fall back), or the guest script's refusal or `e`.
fn never_began<T>(
    mut port: Port,
    e: io::Error,
    what: &str,
    leftover: &str,
) -> Result<Moved<T>, QgaError> {
    if let Some(f) = port.failure.take() {
        return Err(f);
    }
    if let Some(why) = port.prog.ended.as_ref().and_then(|(c, _)| unusable(*c)) {
        return Ok(Moved::Unusable(why.to_string()));
    }
    let failed = port.prog.failure(what).map_or_else(
        || super::io_failure(&format!("{what} failed"), e, ErrorKind::GuestFailed),
        strip_exit,
    );
    clean_up(port.q, port.prog.side, leftover);
    Ok(Moved::Done(Err(failed)))
}

/// Streams the guest's `parent/name` as a tar into `sink` (which extracts it).
pub fn out<T>(
    q: &mut Qga,
    (ch, side): (&mut Channel, Side),
    (parent, name, nonce, cap): (&str, &str, &str, u64),
    files: &Cell<u64>,
    watch: &dyn Watch,
    sink: impl FnOnce(&mut dyn Read) -> Result<T, OpError>,
) -> Result<Moved<T>, QgaError> {
    let cap_k = (cap >> 10).to_string();
    let prog = Program::start(
        q,
        side,
        (&script(OUT), "copy-out"),
        &[parent, name, nonce, &cap_k],
    )?;
    let archive_cap = cap + cap / 8 + (1 << 20);
    let mut port = Port::new(ch, q, prog, watch, files, (0, archive_cap));
    // Buffered: the framing and the tar are read in large pieces, not a syscall a byte.
    let mut br = BufReader::with_capacity(64 << 10, &mut port);
    match frame::sync(&mut br, &format!("MCQ-BEGIN {nonce}")) {
        Err(e) => {
            drop(br);
            return never_began(port, e, "copying out of the guest", "");
        }
        // The guest's du of what it sends: the progress total (0 without du).
        Ok(size) => br.get_mut().total = size.trim().parse().unwrap_or(0),
    }
    let got = sink(&mut br).and_then(|v| {
        frame::trailer(&mut br, nonce).map(|()| v).map_err(|e| {
            super::io_failure("copying out of the guest failed", e, ErrorKind::GuestFailed)
        })
    });
    drop(br);
    if let Some(f) = port.failure.take() {
        return Err(f);
    }
    let Port { q, mut prog, .. } = port;
    if got.is_err() {
        // A writer that is still going (garbage, an endless stream) is stopped, not awaited.
        clean_up(q, side, "");
        return Ok(Moved::Done(got));
    }
    prog.wait(q, Duration::from_secs(30), watch)?;
    let got = got.and_then(|v| match (&prog.ended, prog.failure("tar")) {
        (_, Some(f)) => Err(f),
        (None, None) => Err(OpError::guest(format!(
            "the guest's side of the copy did not end after sending everything (pid {})",
            prog.pid
        ))),
        (Some(_), None) => Ok(v),
    });
    if got.is_err() {
        clean_up(q, side, "");
    }
    Ok(Moved::Done(got))
}

/// A guest script's own refusal, without the exit code wrapping (its text says it all); its
/// kind stays.
fn strip_exit(e: OpError) -> OpError {
    match e.msg.split_once("): ") {
        Some((head, tail)) if head.contains("(exit ") && !tail.is_empty() => {
            OpError::of(e.kind, tail)
        }
        _ => e,
    }
}

/// Streams the `exact` bytes of tar that `pack` makes into the guest, unpacked at `unpack`;
/// then `place` (a script fragment, within `place_time`) puts `$src` at `dst`.
#[allow(clippy::too_many_arguments)]
pub fn into<T>(
    q: &mut Qga,
    (ch, side): (&mut Channel, Side),
    (unpack, nonce, dst, overwrite, old): (&str, &str, &str, &str, &str),
    exact: u64,
    (place, place_time): (&str, Duration),
    files: &Cell<u64>,
    watch: &dyn Watch,
    pack: impl FnOnce(&mut dyn Write) -> io::Result<T>,
) -> Result<Moved<T>, QgaError> {
    let body = format!("{IN}{place}");
    // Whole blocks for the guest's dd; the zeros after the archive's end are nothing to tar.
    let exact = exact.div_ceil(BLOCK) * BLOCK;
    let prog = Program::start(
        q,
        side,
        (&script(&body), "copy-in"),
        &[unpack, nonce, dst, overwrite, old],
    )?;
    let mut port = Port::new(ch, q, prog, watch, files, (exact, u64::MAX));
    // Nothing the host needs follows the line: what the buffer read past it is dropped.
    let ready = frame::sync(
        &mut BufReader::new(&mut port),
        &format!("MCQ-READY {nonce}"),
    );
    if let Err(e) = ready {
        return never_began(port, e, "copying into the guest", unpack);
    }
    let sent = port
        .write_all(format!("MCQ-BEGIN {nonce} {exact}\n").as_bytes())
        .and_then(|()| {
            port.moved = 0;
            port.cap = exact;
            pack(&mut port)
        })
        .and_then(|v| {
            // The padding to whole blocks, and for a file that shrank since it was measured
            // the rest: the length announced always arrives.
            let short = exact.saturating_sub(port.moved);
            std::io::copy(&mut std::io::repeat(0).take(short), &mut port).map(|_| v)
        });
    if let Some(f) = port.failure.take() {
        return Err(f);
    }
    let Port { q, mut prog, .. } = port;
    let sent = match sent {
        Ok(v) => v,
        Err(e) => {
            prog.poll(q)?;
            let failed = prog.failure("unpacking").map_or_else(
                || super::io_failure("sending to the guest failed", e, ErrorKind::GuestFailed),
                strip_exit,
            );
            clean_up(q, side, unpack);
            return Ok(Moved::Done(Err(failed)));
        }
    };
    // The connection stays open until the guest has read everything and renamed the copy.
    prog.wait(q, place_time, watch)?;
    let done = match (&prog.ended, prog.failure("putting the copy in place")) {
        (None, _) => {
            clean_up(q, side, unpack);
            Err(OpError::timed_out(format!(
                "the guest did not finish unpacking within {} s (pid {})",
                place_time.as_secs(),
                prog.pid
            )))
        }
        (Some(_), Some(f)) => Err(strip_exit(f)),
        (Some(_), None) => Ok(sent),
    };
    Ok(Moved::Done(done))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_scripts_own_codes_mean_use_the_agent() {
        assert!(unusable(Some(20)).is_some());
        assert!(unusable(Some(22)).is_some());
        assert!(unusable(Some(0)).is_none());
        assert!(unusable(Some(4)).is_none());
        assert!(unusable(None).is_none());
    }

    #[test]
    fn a_scripts_refusal_keeps_its_kind_and_loses_its_exit_wrapping() {
        let e = super::super::program_failure("copying out", Some(4), "nothing is at /x");
        assert_eq!(
            strip_exit(e),
            OpError::not_found("nothing is at /x"),
            "exit 4 is nothing at the path"
        );
        let e = super::super::program_failure("the check", Some(13), "/x exists");
        assert_eq!(strip_exit(e).kind, ErrorKind::InvalidArgument);
        let e = super::super::program_failure("copying out", Some(6), "over the cap");
        assert_eq!(strip_exit(e).kind, ErrorKind::Refused);
        let e = super::super::program_failure("tar", Some(137), "killed");
        assert_eq!(e.kind, ErrorKind::GuestFailed);
        assert!(e.msg.contains("signal 9"), "{}", e.msg);
        assert_eq!(strip_exit(OpError::guest("plain")), OpError::guest("plain"));
    }

    #[test]
    fn an_io_failure_keeps_the_kind_made_where_it_stopped() {
        let cancel = io::Error::other(OpError::cancelled("cancelled by the client"));
        let e = super::super::io_failure("sending", cancel, ErrorKind::GuestFailed);
        assert_eq!(e.kind, ErrorKind::Cancelled);
        assert_eq!(e.msg, "sending: cancelled by the client");
        let refusal = io::Error::new(io::ErrorKind::PermissionDenied, "archive entry refused");
        let e = super::super::io_failure("copying", refusal, ErrorKind::GuestFailed);
        assert_eq!(e.kind, ErrorKind::Refused);
        let other = io::Error::other("reset");
        let e = super::super::io_failure("copying", other, ErrorKind::GuestFailed);
        assert_eq!(e.kind, ErrorKind::GuestFailed);
    }

    #[test]
    fn the_scripts_name_the_port_qemu_is_given() {
        let s = script(OUT);
        assert!(s.contains(&format!("\"{DATA_PORT}\"")), "{s}");
        assert!(!s.contains("\"PORT\""));
    }
}
