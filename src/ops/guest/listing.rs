//! guest_list_dir: a folder's entries (names, types, sizes, modes, modification times) read in
//! the guest by one `stat` over the folder's names, bounded in count, or by mcqemu-agent
//! itself (`mcqemu-list-dir`). Typed request and result; no MCP here. With qemu-ga it needs
//! `sh` and `stat` in the guest (busybox has both); with mcqemu-agent, nothing.

use crate::ops::error::OpError;
use std::time::Duration;

use serde::Serialize;

use crate::ops::guest::spool::{self, Launch};
use crate::ops::guest::with_guest;
use crate::qemu::agent_calls;

/// Most entries one listing returns.
pub const MAX_ENTRIES: usize = 10_000;

/// The lister: `cd` into the folder, then one `stat` of every name (hidden ones too).
/// (A pattern that matches nothing stays as it is, and stat skips it.)
const LISTER: &str = r#"cd "$1" 2>/dev/null || { echo "mcqemu-list: not a folder" >&2; exit 3; }
exec stat -c '%f %s %Y %n' -- * .[!.]* ..?* 2>/dev/null"#;

/// guest_list_dir.
#[derive(Debug, Clone)]
pub struct Request {
    /// The VM.
    pub name: String,
    /// The folder (absolute).
    pub path: String,
    /// Most entries to return.
    pub max_entries: usize,
}

crate::described! {
    /// One entry.
    #[derive(Debug, Clone, Serialize, PartialEq)]
    pub struct Entry {
        /// Its name in the folder.
        pub name: String,
        /// file, dir, symlink, fifo, socket, char, block.
        #[serde(rename = "type")]
        pub kind: &'static str,
        /// Size in bytes (a link's: its target's length).
        pub size: u64,
        /// Permission bits, e.g. "0755".
        pub mode: String,
        /// Modification time, seconds since the epoch.
        pub mtime: i64,
    }
}

crate::described! {
    /// A listing.
    #[derive(Debug, Clone, Serialize)]
    pub struct Listing {
        /// The VM.
        pub name: String,
        /// The folder.
        pub path: String,
        /// Its entries, sorted by name.
        pub entries: Vec<Entry>,
        /// True when the folder holds more than `max_entries`.
        pub truncated: bool,
    }
}

fn kind(raw: u32) -> &'static str {
    match raw & 0o170000 {
        0o040000 => "dir",
        0o100000 => "file",
        0o120000 => "symlink",
        0o010000 => "fifo",
        0o140000 => "socket",
        0o020000 => "char",
        0o060000 => "block",
        _ => "other",
    }
}

/// One `stat -c '%f %s %Y %n'` line.
fn parse_line(line: &str) -> Option<Entry> {
    let mut parts = line.splitn(4, ' ');
    let raw = u32::from_str_radix(parts.next()?, 16).ok()?;
    let size = parts.next()?.parse().ok()?;
    let mtime = parts.next()?.parse().ok()?;
    let name = parts.next()?.to_string();
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return None;
    }
    Some(Entry {
        name,
        kind: kind(raw),
        size,
        mode: format!("{:04o}", raw & 0o7777),
        mtime,
    })
}

/// Parses the lister's output: entries sorted by name, duplicates (a glob that matched twice)
/// and unreadable lines dropped.
pub fn parse(out: &str, max: usize) -> (Vec<Entry>, bool) {
    let mut v: Vec<Entry> = out.lines().filter_map(parse_line).collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v.dedup_by(|a, b| a.name == b.name);
    let truncated = v.len() > max;
    v.truncate(max);
    (v, truncated)
}

/// guest_list_dir.
pub fn list(req: &Request) -> Result<Listing, OpError> {
    if !req.path.starts_with('/') {
        return Err(OpError::invalid(format!(
            "path {:?} must be absolute in the guest",
            req.path
        )));
    }
    let max = req.max_entries.min(MAX_ENTRIES);
    if crate::ops::guest::agent_is_ours(&req.name)? {
        // mcqemu-agent reads the folder itself: no shell or stat needed in the guest.
        let got = with_guest(&req.name, "mcqemu-list-dir", |q| {
            agent_calls::list_dir(q, &req.path, max)
        })?;
        let entries = got
            .entries
            .into_iter()
            .filter(|e| !e.name.is_empty() && !e.name.contains('/'))
            .map(|e| Entry {
                name: e.name,
                kind: kind(e.mode),
                size: e.size,
                mode: format!("{:04o}", e.mode & 0o7777),
                mtime: e.mtime,
            })
            .collect();
        return Ok(Listing {
            name: req.name.clone(),
            path: req.path.clone(),
            entries,
            truncated: got.truncated,
        });
    }
    let args = vec![
        "-c".to_string(),
        LISTER.to_string(),
        "mcqemu-list".to_string(),
        req.path.clone(),
    ];
    let launch = Launch {
        command: "/bin/sh",
        args: &args,
        ..Launch::default()
    };
    let status = with_guest(&req.name, "guest-exec", |q| {
        spool::run_in(q, &launch, Duration::from_secs(60))
    })?;
    if status.exitcode == Some(3) {
        return Err(OpError::invalid(format!(
            "{} is not a folder in VM {:?} (or cannot be entered)",
            req.path, req.name
        )));
    }
    let out = String::from_utf8_lossy(&status.stdout()).into_owned();
    let (entries, truncated) = parse(&out, max);
    Ok(Listing {
        name: req.name.clone(),
        path: req.path.clone(),
        entries,
        truncated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_become_typed_entries() {
        let out = "41ed 4096 1700000000 sub\n81a4 12 1700000001 a file\n\
                   a1ff 7 1700000002 link\nbad line\n81a4 1 1 a file\n";
        let (v, cut) = parse(out, 10);
        assert!(!cut);
        assert_eq!(v.len(), 3);
        assert_eq!(v[0].name, "a file");
        assert_eq!(
            (v[0].kind, v[0].mode.as_str(), v[0].size),
            ("file", "0644", 12)
        );
        assert_eq!((v[1].kind, v[1].mode.as_str()), ("symlink", "0777"));
        assert_eq!((v[2].kind, v[2].mtime), ("dir", 1700000000));
        let (v, cut) = parse(out, 2);
        assert!(cut && v.len() == 2);
    }
}
