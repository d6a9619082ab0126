//! Guest copies over mcqemu's data channel: a virtio-serial port of its own beside the guest
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
//!   exactly that many bytes of tar (measured by packing once into nothing first: busybox's
//!   tar reads on to the end of its input, so the guest's `head -c` must end it), and keeps
//!   the connection open until the guest program has ended.
//!
//! Anything before the nonce's line is stale or hostile and skipped (within a bound). One
//! transfer holds the channel at a time (a lock file beside the socket, across servers);
//! a failed transfer kills what still holds the port in the guest, so the next one starts
//! clean. Every wait on the socket is a short read or write timeout between which the guest
//! program's status, the caller's cancel and an idle bound are checked.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::guest_stream::{self as gs, Watch};
use crate::b64;
use crate::qemu::cmdline::{data_socket, DATA_PORT};
use crate::qemu::qga::{Qga, QgaError};
use crate::state::registry::Record;

/// One socket read or write wait, between checks of the guest program and the caller.
const TICK: Duration = Duration::from_millis(500);
/// Longest time with no byte moving while the guest program still runs.
const IDLE: Duration = Duration::from_secs(60);
/// After the guest program ended, how long its last bytes may take to arrive.
const AFTER_EXIT: Duration = Duration::from_secs(3);
/// Most stale or foreign bytes skipped before the nonce's line.
const MAX_SKIP: u64 = 64 << 20;
/// How long a second transfer waits for the channel.
const LOCK_WAIT: Duration = Duration::from_secs(30);
/// Zero bytes allowed between the guest's archive and its end marker (tar pads to records).
const MAX_TAIL: u64 = 64 * 1024;

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
/// destination's parking name. Unpacks straight from the port, then renames into place.
const IN: &str = r#"d=$1 n=$2 dst=$3 ow=$4 old=$5
bye() { rm -rf "$d"; echo "$2" >&2; exit "$1"; }
( : < "$dev" ) 2>/dev/null || { free "$dev"; sleep 1; }
( : < "$dev" ) 2>/dev/null || exit 22
mkdir "$d" || bye 10 "cannot create $d"
exec 3<>"$dev"
printf 'MCQ-READY %s\n' "$n" >&3
l=
while IFS= read -r l <&3; do case "$l" in "MCQ-BEGIN $n "*) break;; esac; done
case "$l" in "MCQ-BEGIN $n "*) ;; *) bye 23 "the data channel closed before the copy began";; esac
z=${l##* }
case "$z" in ''|*[!0-9]*) bye 24 "a bad length on the data channel";; esac
head -c "$z" <&3 | tar -x -f - -C "$d" || bye 11 "tar could not unpack the copy (is the guest's disk full?)"
exec 3<&-
src="$d/c"
if [ -e "$dst" ] || [ -L "$dst" ]; then
  [ "$ow" = 1 ] || bye 13 "$dst appeared in the guest meanwhile; pass overwrite=true to replace it"
  mv "$dst" "$old" || bye 14 "cannot move the old $dst aside"
  if mv "$src" "$dst"; then rm -rf "$old"; else mv "$old" "$dst"; bye 15 "cannot rename into $dst"; fi
else
  mv "$src" "$dst" || bye 15 "cannot rename into $dst"
fi
rm -rf "$d""#;

/// Kills whatever holds the port (after a failed transfer).
const FREE: &str = r#"free "$dev""#;

/// The VM's data channel socket, when its QEMU was started with one; else why not.
pub fn socket_of(rec: &Record) -> Result<PathBuf, &'static str> {
    let wired = rec
        .get("spec")
        .and_then(|s| s.get("data_channel"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if !wired {
        return Err("this VM was started without mcqemu's data channel (attached, or started by an older mcqemu); a VM launched now has it");
    }
    rec.get("qga_socket")
        .and_then(Value::as_str)
        .map(|s| data_socket(Path::new(s)))
        .ok_or("this VM has no runtime folder for a data channel")
}

/// The channel, held for one transfer: the lock file (released when dropped) and the socket.
pub struct Channel {
    _lock: File,
    stream: UnixStream,
}

impl Channel {
    /// Takes the channel at `sock` (waiting up to [`LOCK_WAIT`] for another transfer) and
    /// connects to it; [`Open`] says whether to fall back to the agent or to refuse.
    pub fn open(sock: &Path, watch: &dyn Watch) -> Result<Channel, Open> {
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(sock.with_file_name("data.lock"))
            .map_err(|e| Open::Unusable(format!("cannot create the channel's lock: {e}")))?;
        let start = Instant::now();
        // SAFETY: flock(2) on a descriptor this function owns; released when it closes.
        while unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            if start.elapsed() > LOCK_WAIT || watch.cancelled() {
                return Err(Open::Busy(format!(
                    "another copy has held this VM's data channel for over {} s; wait for it \
                     to finish, then retry",
                    LOCK_WAIT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let stream = UnixStream::connect(sock)
            .map_err(|e| Open::Unusable(format!("cannot connect to {}: {e}", sock.display())))?;
        stream
            .set_read_timeout(Some(TICK))
            .and_then(|()| stream.set_write_timeout(Some(TICK)))
            .map_err(|e| Open::Unusable(format!("socket timeouts: {e}")))?;
        Ok(Channel {
            _lock: lock,
            stream,
        })
    }
}

/// Why a channel could not be opened.
pub enum Open {
    /// Not usable here: copy through the agent (the reason goes in the result).
    Unusable(String),
    /// Held by another transfer past the wait.
    Busy(String),
}

/// A guest program started for a transfer, and what is known of its end.
struct Program {
    pid: i64,
    ended: Option<(Option<i64>, String)>,
    ended_at: Option<Instant>,
}

impl Program {
    /// Starts `sh -c script sh args...` with its output captured.
    fn start(q: &mut Qga, script: &str, args: &[&str]) -> Result<Program, QgaError> {
        let mut argv = vec!["-c".to_string(), script.to_string(), "sh".to_string()];
        argv.extend(args.iter().map(|a| a.to_string()));
        let pid = gs::spawn(
            q,
            json!({"path": "sh", "arg": argv, "capture-output": true}),
        )?;
        Ok(Program {
            pid,
            ended: None,
            ended_at: None,
        })
    }

    /// Asks the agent whether the program has ended; remembers its exit code and stderr.
    fn poll(&mut self, q: &mut Qga) -> Result<(), QgaError> {
        if self.ended.is_some() {
            return Ok(());
        }
        let s = q.execute("guest-exec-status", Some(json!({"pid": self.pid})))?;
        if s.get("exited").and_then(Value::as_bool) == Some(true) {
            let err = s
                .get("err-data")
                .and_then(Value::as_str)
                .and_then(|d| b64::decode(d).ok())
                .unwrap_or_default();
            let code = s
                .get("exitcode")
                .and_then(Value::as_i64)
                .or_else(|| s.get("signal").map(|_| -1));
            self.ended = Some((code, String::from_utf8_lossy(&err).trim().to_string()));
            self.ended_at = Some(Instant::now());
        }
        Ok(())
    }

    /// Waits (bounded) for the program to end.
    fn wait(&mut self, q: &mut Qga, limit: Duration, watch: &dyn Watch) -> Result<(), QgaError> {
        let deadline = Instant::now() + limit;
        let mut slice = Duration::from_millis(2);
        while self.ended.is_none() && Instant::now() < deadline && !watch.cancelled() {
            self.poll(q)?;
            if self.ended.is_none() {
                std::thread::sleep(slice);
                slice = (slice * 2).min(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// The failure to report for an ended program (None: it ended well or has not ended).
    fn failure(&self, what: &str) -> Option<String> {
        match &self.ended {
            Some((Some(0), _)) | None => None,
            Some((code, err)) => Some(format!(
                "{what} failed in the guest (exit {}): {err}",
                code.map_or("by a signal".to_string(), |c| c.to_string())
            )),
        }
    }
}

/// The byte stream between host and guest for one transfer: counts, caps, progress, and
/// between socket waits the guest program's status, the caller's cancel and the idle bound.
struct Port<'a> {
    ch: &'a mut Channel,
    q: &'a mut Qga,
    prog: Program,
    watch: &'a dyn Watch,
    /// Bytes moved (after the nonce's line).
    moved: u64,
    total: u64,
    cap: u64,
    files: &'a Cell<u64>,
    last: Instant,
    /// The agent failure that ended the stream, if one did.
    failure: Option<QgaError>,
}

impl<'a> Port<'a> {
    fn new(
        ch: &'a mut Channel,
        q: &'a mut Qga,
        prog: Program,
        watch: &'a dyn Watch,
        files: &'a Cell<u64>,
        (total, cap): (u64, u64),
    ) -> Self {
        Port {
            ch,
            q,
            prog,
            watch,
            moved: 0,
            total,
            cap,
            files,
            last: Instant::now(),
            failure: None,
        }
    }

    /// Called when a socket wait timed out: is it still worth waiting?
    fn still(&mut self) -> io::Result<()> {
        if self.watch.cancelled() {
            return Err(io::Error::other("cancelled by the client"));
        }
        if let Err(e) = self.prog.poll(self.q) {
            let msg = e.to_string();
            self.failure = Some(e);
            return Err(io::Error::other(msg));
        }
        if let Some(f) = self.prog.failure("the guest's side of the copy") {
            return Err(io::Error::other(f));
        }
        if self.prog.ended_at.is_some_and(|t| t.elapsed() > AFTER_EXIT) {
            return Err(io::Error::other(
                "the guest's side of the copy ended but its data did not arrive whole",
            ));
        }
        if self.last.elapsed() > IDLE {
            return Err(io::Error::other(format!(
                "no data moved on the channel for {} s",
                IDLE.as_secs()
            )));
        }
        Ok(())
    }

    fn timed_out(e: &io::Error) -> bool {
        matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
        )
    }

    /// Reads until the line that is `want` (the nonce's) or starts with `want` and a space,
    /// skipping what comes before it; returns the rest of that line.
    fn sync(&mut self, want: &str) -> io::Result<String> {
        let mut line: Vec<u8> = Vec::new();
        let mut skipped = 0u64;
        let mut b = [0u8; 1];
        loop {
            self.read_raw(&mut b)?;
            if b[0] == b'\n' {
                if line == want.as_bytes() {
                    return Ok(String::new());
                }
                if let Some(rest) = line
                    .strip_prefix(want.as_bytes())
                    .and_then(|r| r.strip_prefix(b" "))
                {
                    return Ok(String::from_utf8_lossy(rest).into_owned());
                }
                skipped += line.len() as u64 + 1;
                line.clear();
            } else if line.len() < 256 {
                line.push(b[0]);
            } else {
                skipped += 1;
            }
            if skipped > MAX_SKIP {
                return Err(io::Error::other(
                    "the guest sent too much before the copy began",
                ));
            }
        }
    }

    /// The trailer `MCQ-END <nonce> <code>` after the archive (zero padding before it).
    fn trailer(&mut self, nonce: &str) -> io::Result<()> {
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        let mut zeros = 0u64;
        loop {
            self.read_raw(&mut b)?;
            match b[0] {
                0 if line.is_empty() => {
                    zeros += 1;
                    if zeros > MAX_TAIL {
                        return Err(io::Error::other("the guest's archive has a long tail"));
                    }
                }
                b'\n' => break,
                c if line.len() < 128 => line.push(c),
                _ => return Err(io::Error::other("the guest's archive ended in garbage")),
            }
        }
        let text = String::from_utf8_lossy(&line);
        match text.strip_prefix(&format!("MCQ-END {nonce} ")) {
            Some("0") => Ok(()),
            Some(code) => Err(io::Error::other(format!(
                "tar in the guest exited with {code} (a file it could not read?)"
            ))),
            None => Err(io::Error::other(format!(
                "the guest's archive was followed by {text:?}, not its end marker"
            ))),
        }
    }

    /// One read from the socket, waiting in ticks.
    fn read_raw(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.ch.stream.read(out) {
                Ok(0) => return Err(io::Error::other("QEMU closed the data channel")),
                Ok(n) => {
                    self.last = Instant::now();
                    return Ok(n);
                }
                Err(e) if Self::timed_out(&e) => self.still()?,
                Err(e) => return Err(e),
            }
        }
    }
}

impl Read for Port<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let n = self.read_raw(out)?;
        self.moved += n as u64;
        if self.moved > self.cap {
            return Err(io::Error::other(format!(
                "the guest's data passed the cap of {} MiB (MCQEMU_MAX_COPY_MB)",
                self.cap >> 20
            )));
        }
        self.watch
            .progress(self.moved, self.total, self.files.get());
        Ok(n)
    }
}

impl Write for Port<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.moved + data.len() as u64 > self.cap {
            return Err(io::Error::other(format!(
                "the copy grew past the {} bytes measured before it was sent (did the tree \
                 change meanwhile? copy again)",
                self.cap
            )));
        }
        loop {
            match self.ch.stream.write(data) {
                Ok(n) => {
                    self.moved += n as u64;
                    self.last = Instant::now();
                    self.watch
                        .progress(self.moved, self.total, self.files.get());
                    return Ok(n);
                }
                Err(e) if Self::timed_out(&e) => self.still()?,
                Err(e) => return Err(e),
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.ch.stream.flush()
    }
}

/// A transfer's outcome: the agent failed (explained by the session); the channel cannot be
/// used (fall back, with why); or the copy's own result.
pub enum Moved<T> {
    /// Use the agent instead, for this reason.
    Unusable(String),
    /// The copy ran (or failed) over the channel.
    Done(Result<T, String>),
}

/// The script with the port helpers before it.
fn script(body: &str) -> String {
    format!("{}{body}", FIND_PORT.replace("PORT", DATA_PORT))
}

/// After a failed transfer: kill what still holds the port in the guest (best effort).
fn clean_up(q: &mut Qga) {
    let _ = gs::run(
        q,
        &["sh", "-c", &script(FREE)],
        Duration::from_secs(20),
        None,
    );
}

/// Streams the guest's `parent/name` as a tar into `sink` (which extracts it).
pub fn out<T>(
    q: &mut Qga,
    ch: &mut Channel,
    (parent, name, nonce, cap): (&str, &str, &str, u64),
    files: &Cell<u64>,
    watch: &dyn Watch,
    sink: impl FnOnce(&mut dyn Read) -> Result<T, String>,
) -> Result<Moved<T>, QgaError> {
    let cap_k = (cap >> 10).to_string();
    let prog = Program::start(q, &script(OUT), &[parent, name, nonce, &cap_k])?;
    let archive_cap = cap + cap / 8 + (1 << 20);
    let mut port = Port::new(ch, q, prog, watch, files, (0, archive_cap));
    let begun = port.sync(&format!("MCQ-BEGIN {nonce}"));
    // The guest's du of what it sends: the progress total (0 without du).
    if let Ok(size) = &begun {
        port.total = size.trim().parse().unwrap_or(0);
    }
    if let Err(e) = begun {
        if let Some(f) = port.failure.take() {
            return Err(f);
        }
        if let Some(why) = port.prog.ended.as_ref().and_then(|(c, _)| unusable(*c)) {
            return Ok(Moved::Unusable(why.to_string()));
        }
        let msg = port
            .prog
            .failure("copying out")
            .unwrap_or_else(|| format!("copying out of the guest failed: {e}"));
        clean_up(port.q);
        return Ok(Moved::Done(Err(strip_exit(msg))));
    }
    let got = sink(&mut port).and_then(|v| {
        port.trailer(nonce)
            .map(|()| v)
            .map_err(|e| format!("copying out of the guest failed: {e}"))
    });
    if let Some(f) = port.failure.take() {
        return Err(f);
    }
    let Port { q, mut prog, .. } = port;
    if got.is_err() {
        // A writer that is still going (garbage, an endless stream) is stopped, not awaited.
        clean_up(q);
        return Ok(Moved::Done(got));
    }
    prog.wait(q, Duration::from_secs(30), watch)?;
    let got = got.and_then(|v| match (&prog.ended, prog.failure("tar")) {
        (_, Some(f)) => Err(f),
        (None, None) => Err(format!(
            "the guest's side of the copy did not end after sending everything (pid {})",
            prog.pid
        )),
        (Some(_), None) => Ok(v),
    });
    if got.is_err() {
        clean_up(q);
    }
    Ok(Moved::Done(got))
}

/// A guest script's own refusal, without the exit code wrapping (its text says it all).
fn strip_exit(msg: String) -> String {
    match msg.split_once("): ") {
        Some((head, tail)) if head.contains("(exit ") && !tail.is_empty() => tail.to_string(),
        _ => msg,
    }
}

/// Streams the `exact` bytes of tar that `pack` makes into the guest, unpacked at `unpack`
/// and renamed to `dst`.
#[allow(clippy::too_many_arguments)]
pub fn into<T>(
    q: &mut Qga,
    ch: &mut Channel,
    (unpack, nonce, dst, overwrite, old): (&str, &str, &str, &str, &str),
    exact: u64,
    place_time: Duration,
    files: &Cell<u64>,
    watch: &dyn Watch,
    pack: impl FnOnce(&mut dyn Write) -> io::Result<T>,
) -> Result<Moved<T>, QgaError> {
    let prog = Program::start(q, &script(IN), &[unpack, nonce, dst, overwrite, old])?;
    let mut port = Port::new(ch, q, prog, watch, files, (exact, u64::MAX));
    let ready = port.sync(&format!("MCQ-READY {nonce}"));
    if let Err(e) = ready {
        if let Some(f) = port.failure.take() {
            return Err(f);
        }
        if let Some(why) = port.prog.ended.as_ref().and_then(|(c, _)| unusable(*c)) {
            return Ok(Moved::Unusable(why.to_string()));
        }
        let msg = port
            .prog
            .failure("copying in")
            .unwrap_or_else(|| format!("copying into the guest failed: {e}"));
        clean_up(port.q);
        return Ok(Moved::Done(Err(strip_exit(msg))));
    }
    let sent = port
        .write_all(format!("MCQ-BEGIN {nonce} {exact}\n").as_bytes())
        .and_then(|()| {
            port.moved = 0;
            port.cap = exact;
            pack(&mut port)
        })
        .and_then(|v| {
            // A file that shrank since it was measured: the length announced still arrives
            // (zeros after an archive's end are nothing to tar).
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
            let msg = prog
                .failure("unpacking")
                .map_or_else(|| format!("sending to the guest failed: {e}"), strip_exit);
            clean_up(q);
            return Ok(Moved::Done(Err(msg)));
        }
    };
    // The connection stays open until the guest has read everything and renamed the copy.
    prog.wait(q, place_time, watch)?;
    let done = match (&prog.ended, prog.failure("putting the copy in place")) {
        (None, _) => {
            clean_up(q);
            Err(format!(
                "the guest did not finish unpacking within {} s (pid {})",
                place_time.as_secs(),
                prog.pid
            ))
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
    fn a_scripts_refusal_is_shown_without_its_exit_wrapping() {
        assert_eq!(
            strip_exit("copying out failed in the guest (exit 4): nothing is at /x".into()),
            "nothing is at /x"
        );
        assert_eq!(strip_exit("plain".into()), "plain");
    }

    #[test]
    fn the_scripts_name_the_port_qemu_is_given() {
        let s = script(OUT);
        assert!(s.contains(&format!("\"{DATA_PORT}\"")), "{s}");
        assert!(!s.contains("\"PORT\""));
    }
}
