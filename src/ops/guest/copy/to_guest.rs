//! guest_copy_in: a host file or tree into the guest, over the data channel or the agent.

use std::cell::Cell;
use std::ffi::OsStr;
use std::path::Path;
use std::time::Instant;

use super::channel::{self, Moved};
use super::{
    channel_for, guest_split, guest_time, host_parts, join, max_bytes, nonce, sh, temp_tag, Copied,
    CopyIn, Route, Side, Step, Via, RENAME, TOP,
};
use crate::ops::error::{ErrorKind, OpError};
use crate::ops::guest::stream::{self as gs, GuestWriter, Watch};
use crate::ops::guest::with_guest;
use crate::qemu::agent_calls;
use crate::qemu::qga::Qga;
use crate::state::roots::{self, Access};
use crate::state::tar::Writer;
use crate::state::tree::{self, Counts, Folder, Meta, Type};

/// What the guest needs, checked before any data is sent: its tools, the destination's
/// folder, and (unless overwrite) that nothing is at the destination.
const PREFLIGHT_IN: &str = r#"for c in tar mv rm mkdir chmod; do command -v "$c" >/dev/null 2>&1 || { echo "the guest has no $c program (guest_copy_in needs sh, tar, mv, rm, mkdir, chmod; busybox has them)" >&2; exit 3; }; done
[ -d "$1" ] || { echo "the guest folder $1 does not exist; create it first (guest_exec mkdir -p)" >&2; exit 4; }
if [ "$3" != 1 ] && { [ -e "$2" ] || [ -L "$2" ]; }; then echo "$2 already exists in the guest; pass overwrite=true to replace it" >&2; exit 13; fi"#;

/// Puts the sent data in place: unpacks the archive (or sets the single file's mode), then
/// [`RENAME`]s it. $1 mode or "tar", $2 the sent file, $3 the unpack folder, $4 the
/// destination, $5 overwrite, $6 the old destination's parking name.
const PLACE: &str = r#"m=$1 t=$2 d=$3 dst=$4 ow=$5 old=$6
bye() { rm -rf "$d" "$t"; echo "$2" >&2; exit "$1"; }
if [ "$m" = tar ]; then
  mkdir "$d" || bye 10 "cannot create $d"
  tar -x -f "$t" -C "$d" || bye 11 "tar could not unpack the copy (is the guest's disk full?)"
  rm -f "$t"; src="$d/c"
else
  chmod "$m" "$t" || bye 12 "chmod failed"; src=$t
fi
"#;

/// Copies a host file or tree into the guest.
pub fn copy_in(req: &CopyIn, watch: &dyn Watch) -> Result<Copied, OpError> {
    let started = Instant::now();
    let host = roots::check_str(&req.host_path, Access::Read)
        .map_err(|e| OpError::from(e).context("parameter 'host_path'"))?;
    let (gparent, gbase) = guest_split(&req.guest_path)?;
    let dst = join(&gparent, &gbase);
    let (dir, leaf) = host_parts(&host)?;
    let folder = Folder::open(dir)
        .map_err(|e| OpError::host(format!("cannot open {}: {e}", dir.display())))?;
    let top = folder
        .meta(leaf)
        .map_err(|e| OpError::not_found(format!("cannot read {}: {e}", host.display())))?;
    let scan = scan(&folder, leaf, &top)?;
    let cap = max_bytes();
    if scan.0.bytes > cap {
        return Err(OpError::refused(format!(
            "{} holds {} MiB, more than the cap of {} MiB per copy (MCQEMU_MAX_COPY_MB); copy \
             a smaller part, or ask the operator to raise it",
            host.display(),
            scan.0.bytes >> 20,
            cap >> 20
        )));
    }
    let tag = temp_tag();
    let mut chan = channel_for(&req.name, watch)?;
    let (counts, via) = with_guest(&req.name, "guest-exec", |q| -> Step<(Counts, Via)> {
        let ow = if req.overwrite { "1" } else { "0" };
        let preflight = |q: &mut Qga| {
            sh(
                q,
                PREFLIGHT_IN,
                &[&gparent, &dst, ow],
                guest_time(0),
                "the check",
                Some(watch),
            )
        };
        // mcqemu-agent's own side of the channel checks the same itself.
        let mut checked = false;
        let why = match &mut chan {
            Route::Channel(ch, side) => {
                if *side == Side::Shell {
                    if let Err(e) = preflight(q)? {
                        return Ok(Err(e));
                    }
                    checked = true;
                }
                let files = Cell::new(0);
                let mut measure = Counter(0);
                if let Err(e) = pack(&folder, leaf, &top, &mut measure, &files) {
                    return Ok(Err(OpError::host(format!("cannot read the tree: {e}"))));
                }
                let moved = channel::into(
                    q,
                    (ch, *side),
                    (
                        &join(&gparent, &format!("{tag}.d")),
                        &nonce(),
                        &dst,
                        ow,
                        &join(&gparent, &format!("{tag}.old")),
                    ),
                    measure.0,
                    (RENAME, guest_time(scan.0.bytes)),
                    &files,
                    watch,
                    |w| pack(&folder, leaf, &top, w, &files),
                )?;
                match moved {
                    Moved::Done(r) => return Ok(r.map(|c| (c, Via::Channel))),
                    Moved::Unusable(why) => why,
                }
            }
            Route::Agent(why) => why.clone(),
        };
        if !checked {
            if let Err(e) = preflight(q)? {
                return Ok(Err(e));
            }
        }
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
                &format!("{PLACE}{RENAME}"),
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
    })??;
    let (via, via_reason) = via.parts();
    Ok(Copied {
        name: req.name.clone(),
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

/// Counts what a copy in will send (before anything is sent) and estimates the archive size.
fn scan(folder: &Folder, leaf: &OsStr, top: &Meta) -> Result<(Counts, u64), OpError> {
    if top.kind == Type::File {
        let c = Counts {
            bytes: top.size,
            files: 1,
            ..Counts::default()
        };
        return Ok((c, top.size));
    }
    if top.kind != Type::Dir {
        return Err(OpError::invalid(format!(
            "{} is not a regular file or folder (a symlink given as host_path is resolved \
             first; devices, fifos and sockets are never copied)",
            leaf.to_string_lossy()
        )));
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
    .map_err(|e| OpError::host(format!("cannot read the tree: {e}")))?;
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
    let handle = agent_calls::file_open(q, to, "w")?;
    let files = Cell::new(0);
    // The cap counts content; the archive adds headers, and files may grow meanwhile.
    let mut w = GuestWriter::new(
        q,
        handle,
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
    let closed = gs::close(q, handle);
    if let Some(e) = failure {
        return Err(e);
    }
    if let Err(e) = flushed {
        return Ok(Err(super::io_failure(
            "sending to the guest failed",
            e,
            ErrorKind::GuestFailed,
        )));
    }
    closed?;
    Ok(Ok(counts))
}
