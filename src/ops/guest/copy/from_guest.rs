//! guest_copy_out: a guest file or tree to the host, over the data channel or the agent.

use std::cell::Cell;
use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::time::Instant;

use super::channel::{self, Moved};
use super::{
    channel_for, guest_split, guest_time, host_parts, join, max_bytes, nonce, sh, temp_tag, Copied,
    CopyOut, Route, Step, Via,
};
use crate::ops::error::{ErrorKind, OpError};
use crate::ops::guest::stream::{self as gs, GuestReader, Watch};
use crate::ops::guest::with_guest;
use crate::qemu::agent_calls::{self, Whence};
use crate::qemu::qga::Qga;
use crate::state::extract::Extract;
use crate::state::roots::{self, Access};
use crate::state::tar::Reader;
use crate::state::tree::{Counts, Folder};

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
pub fn copy_out(req: &CopyOut, watch: &dyn Watch) -> Result<Copied, OpError> {
    let started = Instant::now();
    let host = roots::check_str(&req.host_path, Access::Write)
        .map_err(|e| OpError::from(e).context("parameter 'host_path'"))?;
    if std::fs::symlink_metadata(&host).is_ok() && !req.overwrite {
        return Err(OpError::invalid(format!(
            "{} already exists; pass overwrite=true to replace it, or choose another host_path",
            host.display()
        )));
    }
    let (gparent, gbase) = guest_split(&req.guest_path)?;
    let (dir, leaf) = host_parts(&host)?;
    let folder = Folder::open(dir)
        .map_err(|e| OpError::host(format!("cannot open {}: {e}", dir.display())))?;
    let tag = temp_tag();
    let tmp = OsString::from(format!(".{}{tag}", leaf.to_string_lossy()));
    let cap = max_bytes();
    let cap_k = (cap >> 10).to_string();
    let mut chan = channel_for(&req.name, watch)?;
    let received = with_guest(&req.name, "guest-exec", |q| -> Step<(Counts, Via)> {
        let why = match &mut chan {
            Route::Channel(ch, side) => {
                let files = Cell::new(0);
                let moved = channel::out(
                    q,
                    (ch, *side),
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
            Route::Agent(why) => why.clone(),
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
    .and_then(|r| r);
    let placed = received.and_then(|(counts, via)| {
        place(&folder, dir, &tmp, leaf, req.overwrite, &tag).map(|()| (counts, via))
    });
    if placed.is_err() {
        crate::state::tree::remove_quietly(&dir.join(&tmp));
    }
    let (counts, via) = placed?;
    let (via, via_reason) = via.parts();
    Ok(Copied {
        name: req.name.clone(),
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
    let handle = agent_calls::file_open(q, t, "r")?;
    // The archive's size, for the cap and the progress total (0 when the agent cannot seek).
    let size = agent_calls::file_seek(q, handle, 0, Whence::End).unwrap_or(0);
    let rewound = agent_calls::file_seek(q, handle, 0, Whence::Set);
    let files = Cell::new(0);
    let archive_cap = cap + cap / 8 + (1 << 20);
    let result = if size > archive_cap {
        Err(OpError::refused(format!(
            "the guest's copy is {} MiB, more than the cap of {} MiB (MCQEMU_MAX_COPY_MB); copy \
             a smaller part",
            size >> 20,
            cap >> 20
        )))
    } else if let Err(e) = rewound {
        Err(OpError::guest(format!(
            "cannot rewind the guest's archive: {e}"
        )))
    } else {
        let mut r = GuestReader::new(q, handle, size, archive_cap, &files, watch);
        let out = extract(&mut r, folder, tmp, top, cap, &files);
        if let Some(e) = r.failure.take() {
            let _ = gs::close(r.into_parts().0, handle);
            return Err(e);
        }
        out
    };
    let _ = gs::close(q, handle);
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
) -> Result<Counts, OpError> {
    let mut x = Extract::new(folder, tmp.to_os_string(), top);
    let mut tr = Reader::new(r);
    let failed = |e: std::io::Error| {
        super::io_failure("copying out of the guest failed", e, ErrorKind::GuestFailed)
    };
    while let Some(e) = tr.next_entry().map_err(failed)? {
        if x.counts.bytes + e.size > cap {
            return Err(OpError::refused(format!(
                "the guest's files pass the cap of {} MiB per copy (MCQEMU_MAX_COPY_MB)",
                cap >> 20
            )));
        }
        x.entry(&e, &mut tr).map_err(failed)?;
        files.set(x.counts.files);
    }
    if !x.started {
        return Err(OpError::guest("the guest's archive held nothing to copy"));
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
) -> Result<(), OpError> {
    let exists = folder.meta(leaf).is_ok();
    if exists && !overwrite {
        return Err(OpError::invalid(format!(
            "{} appeared meanwhile; pass overwrite=true to replace it",
            leaf.to_string_lossy()
        )));
    }
    let old = OsString::from(format!(".{}{tag}.old", leaf.to_string_lossy()));
    if exists {
        folder.rename(leaf, &old, false).map_err(|e| {
            OpError::host(format!(
                "cannot move the old {} aside: {e}",
                leaf.to_string_lossy()
            ))
        })?;
    }
    if let Err(e) = folder.rename(tmp, leaf, false) {
        if exists {
            let _ = folder.rename(&old, leaf, false);
        }
        return Err(OpError::host(format!(
            "cannot rename the copy into place: {e}"
        )));
    }
    if exists {
        crate::state::tree::remove_quietly(&dir.join(&old));
    }
    Ok(())
}
