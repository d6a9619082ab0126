//! Copies between the host and a guest, files or whole folder trees, as one tar stream over
//! one agent session (a round trip per file would cost a guest-exec each under TCG). The
//! guest's own `tar` packs and unpacks; the host side is `state::tar` and `state::tree`, which
//! never follow a symlink. Nothing partial is left on failure: both sides build under a
//! temporary name beside the destination and rename it into place at the end.
//!
//! The bytes go over the VM's data channel (`copy_channel`) when it has one, streamed with no
//! archive in the guest; through the agent's file commands otherwise, the result says which
//! (`via`) and why.

use std::cell::Cell;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::copy_channel::{self as channel, Channel, Moved, Open};
use super::guest::with_guest;
use super::guest_stream::{self as gs, GuestReader, GuestWriter, Watch};
use super::records::lookup;
use crate::qemu::qga::{Qga, QgaError};
use crate::state::extract::Extract;
use crate::state::roots::{self, Access};
use crate::state::tar::{Reader, Writer};
use crate::state::tree::{self, Counts, Folder, Meta, Type};

/// Default cap per call on the bytes copied (MCQEMU_MAX_COPY_MB).
const DEFAULT_MAX_MB: u64 = 2048;
/// The one name the copied tree has inside an archive sent to the guest.
const TOP: &str = "c";

/// guest_copy_in: a host file or tree into the guest.
pub struct CopyIn {
    /// The VM.
    pub name: String,
    /// The host path as given (checked against the roots here, for reading).
    pub host_path: String,
    /// The absolute guest path to create.
    pub guest_path: String,
    /// Replace what is at `guest_path`.
    pub overwrite: bool,
}

/// guest_copy_out: a guest file or tree to the host.
pub struct CopyOut {
    /// The VM.
    pub name: String,
    /// The absolute guest path to copy.
    pub guest_path: String,
    /// The host path as given (checked against the roots here, for writing).
    pub host_path: String,
    /// Replace what is at `host_path`.
    pub overwrite: bool,
}

/// What a copy did.
#[derive(Debug)]
pub struct Copied {
    /// What was copied (and left out).
    pub counts: Counts,
    /// Wall time of the whole call.
    pub duration_ms: u64,
    /// The host path as resolved.
    pub host_path: PathBuf,
    /// The guest path.
    pub guest_path: String,
    /// How the bytes went: `channel` (mcqemu's data channel) or `agent`.
    pub via: &'static str,
    /// Why the channel was not used, when it was not.
    pub via_reason: Option<String>,
}

/// How a copy's bytes went.
enum Via {
    Channel,
    Agent(String),
}

impl Via {
    fn parts(self) -> (&'static str, Option<String>) {
        match self {
            Via::Channel => ("channel", None),
            Via::Agent(why) => ("agent", Some(why)),
        }
    }
}

/// The VM's data channel, opened for one transfer, or why the agent carries the copy.
/// `Err(Err(..))`: the channel is held by another transfer past the wait.
fn channel_for(name: &str, watch: &dyn Watch) -> Result<Result<Channel, String>, String> {
    let rec = lookup(name).map_err(|e| e.0)?;
    let sock = match channel::socket_of(&rec) {
        Ok(s) => s,
        Err(why) => return Ok(Err(why.to_string())),
    };
    match Channel::open(&sock, watch) {
        Ok(ch) => Ok(Ok(ch)),
        Err(Open::Unusable(why)) => Ok(Err(why)),
        Err(Open::Busy(msg)) => Err(msg),
    }
}

/// A per-transfer nonce for the channel's framing.
fn nonce() -> String {
    super::hold::new_secret()
        .map(|s| s.chars().take(24).collect())
        .unwrap_or_else(|_| temp_tag())
}

/// The cap per call, in bytes.
pub fn max_bytes() -> u64 {
    std::env::var("MCQEMU_MAX_COPY_MB")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(DEFAULT_MAX_MB)
        .saturating_mul(1 << 20)
}

/// An absolute guest path split into its folder and name.
fn guest_split(path: &str) -> Result<(String, String), String> {
    let trimmed = path.trim_end_matches('/');
    if !path.starts_with('/') || trimmed.is_empty() || path.contains('\0') {
        return Err(format!(
            "guest_path {path:?} must be an absolute path below / (e.g. /root/data)"
        ));
    }
    let (parent, base) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
    if base == "." || base == ".." {
        return Err(format!(
            "guest_path {path:?} must end in a name, not {base:?}"
        ));
    }
    let parent = if parent.is_empty() { "/" } else { parent };
    Ok((parent.to_string(), base.to_string()))
}

/// A name for temporaries, unique enough per call.
fn temp_tag() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(".mcq-copy-{}-{nanos:08x}", std::process::id())
}

fn join(parent: &str, name: &str) -> String {
    if parent.ends_with('/') {
        format!("{parent}{name}")
    } else {
        format!("{parent}/{name}")
    }
}

/// A session step's result: the agent failed (explained by the session), or this copy did.
type Step<T> = Result<Result<T, String>, QgaError>;

/// Runs `sh -c script sh args...` in the guest; a non-zero exit becomes `what`'s error.
fn sh(
    q: &mut Qga,
    script: &str,
    args: &[&str],
    timeout: Duration,
    what: &str,
    watch: Option<&dyn Watch>,
) -> Step<String> {
    let mut argv = vec!["sh", "-c", script, "sh"];
    argv.extend_from_slice(args);
    Ok(
        gs::run(q, &argv, timeout, watch)?.and_then(|r| match r.code {
            Some(0) => Ok(r.stdout),
            code => Err(format!(
                "{what} failed in the guest (exit {code:?}): {}",
                if r.stderr.is_empty() {
                    &r.stdout
                } else {
                    &r.stderr
                }
            )),
        }),
    )
}

/// What the guest needs, checked before any data is sent: its tools, the destination's
/// folder, and (unless overwrite) that nothing is at the destination.
const PREFLIGHT_IN: &str = r#"for c in tar mv rm mkdir chmod; do command -v "$c" >/dev/null 2>&1 || { echo "the guest has no $c program (guest_copy_in needs sh, tar, mv, rm, mkdir, chmod; busybox has them)" >&2; exit 3; }; done
[ -d "$1" ] || { echo "the guest folder $1 does not exist; create it first (guest_exec mkdir -p)" >&2; exit 4; }
if [ "$3" != 1 ] && { [ -e "$2" ] || [ -L "$2" ]; }; then echo "$2 already exists in the guest; pass overwrite=true to replace it" >&2; exit 5; fi"#;

/// Puts the sent data in place: unpacks the archive (or sets the single file's mode), then
/// renames it over the destination, keeping the old one until the new one is in place.
/// $1 mode or "tar", $2 the sent file, $3 the unpack folder, $4 the destination, $5
/// overwrite, $6 the old destination's parking name.
const PLACE: &str = r#"m=$1 t=$2 d=$3 dst=$4 ow=$5 old=$6
bye() { rm -rf "$d" "$t"; echo "$2" >&2; exit "$1"; }
if [ "$m" = tar ]; then
  mkdir "$d" || bye 10 "cannot create $d"
  tar -x -f "$t" -C "$d" || bye 11 "tar could not unpack the copy (is the guest's disk full?)"
  rm -f "$t"; src="$d/c"
else
  chmod "$m" "$t" || bye 12 "chmod failed"; src=$t
fi
if [ -e "$dst" ] || [ -L "$dst" ]; then
  [ "$ow" = 1 ] || bye 13 "$dst appeared in the guest meanwhile; pass overwrite=true to replace it"
  mv "$dst" "$old" || bye 14 "cannot move the old $dst aside"
  if mv "$src" "$dst"; then rm -rf "$old"; else mv "$old" "$dst"; bye 15 "cannot rename into $dst"; fi
else
  mv "$src" "$dst" || bye 15 "cannot rename into $dst"
fi
rm -rf "$d""#;

/// How long the guest may take to unpack or pack `bytes` (TCG guests write slowly).
fn guest_time(bytes: u64) -> Duration {
    Duration::from_secs(60 + bytes / (1 << 20))
}

/// Copies a host file or tree into the guest.
pub fn copy_in(req: &CopyIn, watch: &dyn Watch) -> Result<Copied, String> {
    let started = Instant::now();
    let host = roots::check_str(&req.host_path, Access::Read)
        .map_err(|e| format!("parameter 'host_path': {e}"))?;
    let (gparent, gbase) = guest_split(&req.guest_path)?;
    let dst = join(&gparent, &gbase);
    let (dir, leaf) = host_parts(&host)?;
    let folder = Folder::open(dir).map_err(|e| format!("cannot open {}: {e}", dir.display()))?;
    let top = folder
        .meta(leaf)
        .map_err(|e| format!("cannot read {}: {e}", host.display()))?;
    let scan = scan(&folder, leaf, &top)?;
    let cap = max_bytes();
    if scan.0.bytes > cap {
        return Err(format!(
            "{} holds {} MiB, more than the cap of {} MiB per copy (MCQEMU_MAX_COPY_MB); copy \
             a smaller part, or ask the operator to raise it",
            host.display(),
            scan.0.bytes >> 20,
            cap >> 20
        ));
    }
    let tag = temp_tag();
    let mut chan = channel_for(&req.name, watch)?;
    let (counts, via) = with_guest(&req.name, "guest-exec", |q| -> Step<(Counts, Via)> {
        let ow = if req.overwrite { "1" } else { "0" };
        if let Err(e) = sh(
            q,
            PREFLIGHT_IN,
            &[&gparent, &dst, ow],
            guest_time(0),
            "the check",
            Some(watch),
        )? {
            return Ok(Err(e));
        }
        let why = match &mut chan {
            Ok(ch) => {
                let files = Cell::new(0);
                let mut measure = Counter(0);
                if let Err(e) = pack(&folder, leaf, &top, &mut measure, &files) {
                    return Ok(Err(format!("cannot read the tree: {e}")));
                }
                let moved = channel::into(
                    q,
                    ch,
                    (
                        &join(&gparent, &format!("{tag}.d")),
                        &nonce(),
                        &dst,
                        ow,
                        &join(&gparent, &format!("{tag}.old")),
                    ),
                    measure.0,
                    guest_time(scan.0.bytes),
                    &files,
                    watch,
                    |w| pack(&folder, leaf, &top, w, &files),
                )?;
                match moved {
                    Moved::Done(r) => return Ok(r.map(|c| (c, Via::Channel))),
                    Moved::Unusable(why) => why,
                }
            }
            Err(why) => why.clone(),
        };
        let sent = join(&gparent, &format!("{tag}.tar"));
        let mut step = send(q, &folder, leaf, &top, &sent, scan.1, cap, watch);
        let mode = if top.kind == Type::File {
            format!("{:o}", top.mode)
        } else {
            "tar".to_string()
        };
        if let Ok(Ok(_)) = step {
            let args = [
                mode.as_str(),
                &sent,
                &join(&gparent, &format!("{tag}.d")),
                &dst,
                ow,
                &join(&gparent, &format!("{tag}.old")),
            ];
            let placed = sh(
                q,
                PLACE,
                &args,
                guest_time(scan.0.bytes),
                "putting the copy in place",
                Some(watch),
            )?;
            if let Err(e) = placed {
                step = Ok(Err(e));
            }
        } else {
            let _ = sh(q, "rm -f \"$1\"", &[&sent], guest_time(0), "cleanup", None);
        }
        Ok(step?.map(|c| (c, Via::Agent(why))))
    })
    .map_err(|e| e.0)??;
    let (via, via_reason) = via.parts();
    Ok(Copied {
        counts: in_host_terms(counts, &host),
        duration_ms: started.elapsed().as_millis() as u64,
        host_path: host,
        guest_path: dst,
        via,
        via_reason,
    })
}

/// The entries left out, named in the caller's terms instead of the archive's internal name.
fn in_host_terms(mut counts: Counts, host: &Path) -> Counts {
    let prefix = format!("{TOP}/");
    for s in &mut counts.skipped {
        if let Some(rest) = s.strip_prefix(&prefix) {
            *s = format!("{}/{rest}", host.display());
        }
    }
    counts
}

/// The folder and name of a resolved host path.
fn host_parts(host: &Path) -> Result<(&Path, &OsStr), String> {
    match (host.parent(), host.file_name()) {
        (Some(d), Some(n)) => Ok((d, n)),
        _ => Err(format!(
            "{} names no file or folder to copy",
            host.display()
        )),
    }
}

/// Counts what a copy in will send (before anything is sent) and estimates the archive size.
fn scan(folder: &Folder, leaf: &OsStr, top: &Meta) -> Result<(Counts, u64), String> {
    if top.kind == Type::File {
        let c = Counts {
            bytes: top.size,
            files: 1,
            ..Counts::default()
        };
        return Ok((c, top.size));
    }
    if top.kind != Type::Dir {
        return Err(format!(
            "{} is not a regular file or folder (a symlink given as host_path is resolved \
             first; devices, fifos and sockets are never copied)",
            leaf.to_string_lossy()
        ));
    }
    let mut counts = Counts::default();
    let mut archive = 1024u64;
    tree::walk(
        folder,
        leaf,
        TOP.as_bytes(),
        0,
        &mut counts,
        &mut |_, _, path, m, c| {
            archive += 512
                + if path.len() > 99 {
                    1024 + path.len() as u64
                } else {
                    0
                };
            if m.kind == Type::File {
                c.bytes += m.size;
                c.files += 1;
                archive += m.size.div_ceil(512) * 512;
            }
            Ok(())
        },
    )
    .map_err(|e| format!("cannot read the tree: {e}"))?;
    Ok((counts, archive))
}

/// Counts what is written to it (the channel announces a transfer's exact length).
struct Counter(u64);

impl std::io::Write for Counter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0 += b.len() as u64;
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes the file or tree as one archive whose top entry is [`TOP`] (the channel's form).
fn pack(
    folder: &Folder,
    leaf: &OsStr,
    top: &Meta,
    w: &mut dyn std::io::Write,
    files: &Cell<u64>,
) -> std::io::Result<Counts> {
    let mut counts = Counts::default();
    let mut tw = Writer::new(w);
    if top.kind == Type::File {
        tree::archive_one(&mut tw, folder, leaf, TOP.as_bytes(), top, &mut counts)?;
        files.set(counts.files);
    } else {
        tree::walk(
            folder,
            leaf,
            TOP.as_bytes(),
            0,
            &mut counts,
            &mut |d, n, p, m, c| {
                tree::archive_one(&mut tw, d, n, p, m, c)?;
                files.set(c.files);
                Ok(())
            },
        )?;
    }
    tw.finish()?;
    Ok(counts)
}

/// Sends the file itself, or the tree as one archive, to `to` in the guest.
#[allow(clippy::too_many_arguments)]
fn send(
    q: &mut Qga,
    folder: &Folder,
    leaf: &OsStr,
    top: &Meta,
    to: &str,
    total: u64,
    cap: u64,
    watch: &dyn Watch,
) -> Step<Counts> {
    let handle = gs::open(q, to, "w")?;
    let files = Cell::new(0);
    // The cap counts content; the archive adds headers, and files may grow meanwhile.
    let mut w = GuestWriter::new(
        q,
        handle.clone(),
        total,
        cap + (total / 8) + (1 << 20),
        &files,
        watch,
    );
    let mut counts = Counts::default();
    let packed = if top.kind == Type::File {
        folder.open_file(leaf).and_then(|mut f| {
            counts.bytes = std::io::copy(&mut f, &mut w)?;
            counts.files = 1;
            Ok(())
        })
    } else {
        pack(folder, leaf, top, &mut w, &files).map(|c| counts = c)
    };
    let failure = w.failure.take();
    let flushed = packed.and_then(|()| w.finish().map(|_| ()));
    let closed = gs::close(q, &handle);
    if let Some(e) = failure {
        return Err(e);
    }
    if let Err(e) = flushed {
        return Ok(Err(format!("sending to the guest failed: {e}")));
    }
    closed?;
    Ok(Ok(counts))
}

/// Archives the guest path into a temporary tar and prints that tar's path; a tree larger
/// than the cap ($4, KiB; measured with du when the guest has it) is refused before packing.
const PACK_OUT: &str = r#"p=$1 b=$2 n=$3
for c in tar rm; do command -v "$c" >/dev/null 2>&1 || { echo "the guest has no $c program (guest_copy_out needs sh, tar and rm; busybox has them)" >&2; exit 3; }; done
[ -e "$p/$b" ] || [ -L "$p/$b" ] || { echo "nothing is at $p/$b in the guest" >&2; exit 4; }
if command -v du >/dev/null 2>&1; then k=$(du -sk "$p/$b" 2>/dev/null); k=${k%%[!0-9]*}
  [ "${k:-0}" -le "$4" ] || { echo "$p/$b holds $((k / 1024)) MiB, more than the cap of $(($4 / 1024)) MiB per copy (MCQEMU_MAX_COPY_MB); copy a smaller part" >&2; exit 6; }; fi
for d in /var/tmp /tmp "$p"; do [ -d "$d" ] && [ -w "$d" ] && break; done
t="$d/$n.tar"
tar -c -f "$t" -C "$p" "$b" || { rm -f "$t"; echo "tar could not pack $p/$b (is the guest's disk or memory full?)" >&2; exit 5; }
echo "$t""#;

/// Copies a guest file or tree to the host.
pub fn copy_out(req: &CopyOut, watch: &dyn Watch) -> Result<Copied, String> {
    let started = Instant::now();
    let host = roots::check_str(&req.host_path, Access::Write)
        .map_err(|e| format!("parameter 'host_path': {e}"))?;
    if std::fs::symlink_metadata(&host).is_ok() && !req.overwrite {
        return Err(format!(
            "{} already exists; pass overwrite=true to replace it, or choose another host_path",
            host.display()
        ));
    }
    let (gparent, gbase) = guest_split(&req.guest_path)?;
    let (dir, leaf) = host_parts(&host)?;
    let folder = Folder::open(dir).map_err(|e| format!("cannot open {}: {e}", dir.display()))?;
    let tag = temp_tag();
    let tmp = OsString::from(format!(".{}{tag}", leaf.to_string_lossy()));
    let cap = max_bytes();
    let cap_k = (cap >> 10).to_string();
    let mut chan = channel_for(&req.name, watch)?;
    let received = with_guest(&req.name, "guest-exec", |q| -> Step<(Counts, Via)> {
        let why = match &mut chan {
            Ok(ch) => {
                let files = Cell::new(0);
                let moved = channel::out(
                    q,
                    ch,
                    (&gparent, &gbase, &nonce(), cap),
                    &files,
                    watch,
                    |r| extract(r, &folder, &tmp, gbase.as_bytes(), cap, &files),
                )?;
                match moved {
                    Moved::Done(r) => return Ok(r.map(|c| (c, Via::Channel))),
                    Moved::Unusable(why) => why,
                }
            }
            Err(why) => why.clone(),
        };
        let t = match sh(
            q,
            PACK_OUT,
            &[&gparent, &gbase, &tag, &cap_k],
            guest_time(cap),
            "tar",
            Some(watch),
        )? {
            Ok(t) => t,
            Err(e) => return Ok(Err(e)),
        };
        let got = receive(q, &t, &folder, &tmp, gbase.as_bytes(), cap, watch);
        let _ = sh(q, "rm -f \"$1\"", &[&t], guest_time(0), "cleanup", None);
        Ok(got?.map(|c| (c, Via::Agent(why))))
    })
    .map_err(|e| e.0)
    .and_then(|r| r);
    let placed = received.and_then(|(counts, via)| {
        place(&folder, dir, &tmp, leaf, req.overwrite, &tag).map(|()| (counts, via))
    });
    if placed.is_err() {
        remove_tree(&dir.join(&tmp));
    }
    let (counts, via) = placed?;
    let (via, via_reason) = via.parts();
    Ok(Copied {
        counts,
        duration_ms: started.elapsed().as_millis() as u64,
        host_path: host,
        guest_path: join(&gparent, &gbase),
        via,
        via_reason,
    })
}

/// Reads the guest's archive at `t` and extracts it into `folder`/`tmp`.
fn receive(
    q: &mut Qga,
    t: &str,
    folder: &Folder,
    tmp: &OsStr,
    top: &[u8],
    cap: u64,
    watch: &dyn Watch,
) -> Step<Counts> {
    let handle = gs::open(q, t, "r")?;
    // The archive's size, for the cap and the progress total (0 when the agent cannot seek).
    let size = q
        .execute(
            "guest-file-seek",
            Some(serde_json::json!({"handle": handle, "offset": 0, "whence": "end"})),
        )
        .ok()
        .and_then(|r| r.get("position").and_then(serde_json::Value::as_u64))
        .unwrap_or(0);
    let rewound = q.execute(
        "guest-file-seek",
        Some(serde_json::json!({"handle": handle, "offset": 0, "whence": "set"})),
    );
    let files = Cell::new(0);
    let archive_cap = cap + cap / 8 + (1 << 20);
    let result = if size > archive_cap {
        Err(format!(
            "the guest's copy is {} MiB, more than the cap of {} MiB (MCQEMU_MAX_COPY_MB); copy \
             a smaller part",
            size >> 20,
            cap >> 20
        ))
    } else if let Err(e) = rewound {
        Err(format!("cannot rewind the guest's archive: {e}"))
    } else {
        let mut r = GuestReader::new(q, handle.clone(), size, archive_cap, &files, watch);
        let out = extract(&mut r, folder, tmp, top, cap, &files);
        if let Some(e) = r.failure.take() {
            let _ = gs::close(r.into_parts().0, &handle);
            return Err(e);
        }
        out
    };
    let _ = gs::close(q, &handle);
    Ok(result)
}

/// Extracts every entry; the content may not pass `cap`.
fn extract(
    r: &mut dyn std::io::Read,
    folder: &Folder,
    tmp: &OsStr,
    top: &[u8],
    cap: u64,
    files: &Cell<u64>,
) -> Result<Counts, String> {
    let mut x = Extract::new(folder, tmp.to_os_string(), top);
    let mut tr = Reader::new(r);
    let failed = |e: std::io::Error| format!("copying out of the guest failed: {e}");
    while let Some(e) = tr.next_entry().map_err(failed)? {
        if x.counts.bytes + e.size > cap {
            return Err(format!(
                "the guest's files pass the cap of {} MiB per copy (MCQEMU_MAX_COPY_MB)",
                cap >> 20
            ));
        }
        x.entry(&e, &mut tr).map_err(failed)?;
        files.set(x.counts.files);
    }
    if !x.started {
        return Err("the guest's archive held nothing to copy".into());
    }
    x.finish().map_err(failed)?;
    Ok(x.counts)
}

/// Renames the extracted `tmp` to `leaf`; with overwrite, the old one is parked and removed
/// only once the new one is in place.
fn place(
    folder: &Folder,
    dir: &Path,
    tmp: &OsStr,
    leaf: &OsStr,
    overwrite: bool,
    tag: &str,
) -> Result<(), String> {
    let exists = folder.meta(leaf).is_ok();
    if exists && !overwrite {
        return Err(format!(
            "{} appeared meanwhile; pass overwrite=true to replace it",
            leaf.to_string_lossy()
        ));
    }
    let old = OsString::from(format!(".{}{tag}.old", leaf.to_string_lossy()));
    if exists {
        folder
            .rename(leaf, &old, false)
            .map_err(|e| format!("cannot move the old {} aside: {e}", leaf.to_string_lossy()))?;
    }
    if let Err(e) = folder.rename(tmp, leaf, false) {
        if exists {
            let _ = folder.rename(&old, leaf, false);
        }
        return Err(format!("cannot rename the copy into place: {e}"));
    }
    if exists {
        remove_tree(&dir.join(&old));
    }
    Ok(())
}

/// Removes a failed copy's temporary, file or tree (never following a link out of it).
fn remove_tree(path: &Path) {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            let _ = std::fs::remove_dir_all(path);
        }
        Ok(_) => {
            let _ = std::fs::remove_file(path);
        }
        Err(_) => {}
    }
}
