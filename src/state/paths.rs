//! Path handling: `~` expansion, absolute resolution, and the state/runtime folders of the spec.

use crate::kind::Failed;
use std::path::{Component, Path, PathBuf};

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

/// Why a user-supplied path could not be resolved.
#[derive(Debug)]
pub enum PathError {
    /// The path is the empty string.
    Empty,
    /// The path contains a NUL byte, which no file name can.
    Nul,
    /// It starts with `~` but `HOME` is not set.
    NoHome,
    /// It is relative and the current directory cannot be read.
    NoCurrentDir {
        /// The path as given.
        input: String,
        /// Why the current directory is unknown.
        error: std::io::Error,
    },
}

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PathError::Empty => f.write_str("path is empty"),
            PathError::Nul => f.write_str("path contains a NUL byte"),
            PathError::NoHome => {
                f.write_str("cannot expand '~': HOME is not set; give an absolute path")
            }
            PathError::NoCurrentDir { input, error } => write!(
                f,
                "cannot resolve relative path {input:?}: {error}; give an absolute path"
            ),
        }
    }
}

impl std::error::Error for PathError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PathError::NoCurrentDir { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// Resolves a user-supplied path: expands a leading `~`, makes it absolute against the current
/// directory, and removes `.` and `..` lexically (the file need not exist yet).
pub fn resolve(input: &str) -> Result<PathBuf, PathError> {
    if input.is_empty() {
        return Err(PathError::Empty);
    }
    if input.contains('\0') {
        return Err(PathError::Nul);
    }
    let expanded = if input == "~" || input.starts_with("~/") {
        let h = home().ok_or(PathError::NoHome)?;
        h.join(input.trim_start_matches('~').trim_start_matches('/'))
    } else {
        PathBuf::from(input)
    };
    let absolute = if expanded.is_absolute() {
        expanded
    } else {
        std::env::current_dir()
            .map_err(|error| PathError::NoCurrentDir {
                input: input.to_string(),
                error,
            })?
            .join(expanded)
    };
    Ok(normalize(&absolute))
}

fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// The state folder: `$MCQEMU_STATE_DIR`, else `$XDG_DATA_HOME/mcqemu`, else
/// `~/.local/share/mcqemu`.
pub fn state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MCQEMU_STATE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("mcqemu");
    }
    home()
        .unwrap_or_else(|| PathBuf::from("/tmp"))
        .join(".local/share/mcqemu")
}

/// The runtime folder for sockets and pidfiles, and why it is that one. It must outlive the
/// user's login sessions, since the VMs do (`ssh HOST mcqemu` ends a session with every call):
/// `$MCQEMU_RUNTIME_DIR`; for root `/run/mcqemu`; `$XDG_RUNTIME_DIR/mcqemu` only when logind
/// keeps that folder after the last session (lingering is on for the user); else
/// `/tmp/mcqemu-UID`, checked to be the user's own (see [`ensure_runtime_dir`]).
pub fn runtime_choice() -> (PathBuf, &'static str) {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_default();
    let lingering = !user.is_empty()
        && !user.contains('/')
        && Path::new("/var/lib/systemd/linger").join(&user).exists();
    choose_runtime(
        std::env::var_os("MCQEMU_RUNTIME_DIR").map(PathBuf::from),
        std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
        uid,
        lingering,
    )
}

/// [`runtime_choice`] as a function of what it reads.
pub fn choose_runtime(
    env: Option<PathBuf>,
    xdg: Option<PathBuf>,
    uid: u32,
    lingering: bool,
) -> (PathBuf, &'static str) {
    if let Some(d) = env.filter(|d| !d.as_os_str().is_empty()) {
        return (d, "MCQEMU_RUNTIME_DIR");
    }
    if uid == 0 {
        return (
            PathBuf::from("/run/mcqemu"),
            "root: /run outlives every session",
        );
    }
    if let Some(d) = xdg.filter(|d| !d.as_os_str().is_empty()) {
        if lingering {
            return (
                d.join("mcqemu"),
                "XDG_RUNTIME_DIR, kept by logind because lingering is on",
            );
        }
    }
    (
        PathBuf::from(format!("/tmp/mcqemu-{uid}")),
        "/tmp: XDG_RUNTIME_DIR is removed when the user's last session ends (enable lingering \
         with loginctl enable-linger to use it)",
    )
}

/// The runtime folder (see [`runtime_choice`]).
pub fn runtime_dir() -> PathBuf {
    runtime_choice().0
}

/// Creates the runtime folder 0700 if it is missing, and checks that it is this user's own
/// folder that nobody else can enter: under /tmp another user could have made it first, to
/// read or replace the sockets.
pub fn ensure_runtime_dir() -> Result<PathBuf, Failed> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let dir = runtime_dir();
    if let Some(parent) = dir.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(Failed::host(format!(
                "cannot create the runtime folder {}: {e}",
                dir.display()
            )))
        }
    }
    let meta = std::fs::symlink_metadata(&dir).map_err(|e| {
        Failed::host(format!(
            "cannot read the runtime folder {}: {e}",
            dir.display()
        ))
    })?;
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    if !meta.is_dir() {
        return Err(Failed::host(format!(
            "the runtime folder {} is not a folder (a symlink or a file); remove it, or set \
             MCQEMU_RUNTIME_DIR",
            dir.display()
        )));
    }
    if meta.uid() != uid {
        return Err(Failed::host(format!(
            "the runtime folder {} belongs to user {}, not to this user ({uid}); refusing to put \
             VM sockets there. Remove it, or set MCQEMU_RUNTIME_DIR to a folder of your own",
            dir.display(),
            meta.uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| {
            Failed::host(format!(
                "the runtime folder {} is open to other users and cannot be made 0700: {e}",
                dir.display()
            ))
        })?;
    }
    Ok(dir)
}

/// The registry file inside the state folder.
pub fn registry_file() -> PathBuf {
    state_dir().join("vms.json")
}

/// Sets `path`'s modification time to now, making the file if it is missing: a stamp whose
/// time is the fact (a VM's last activity, an agent's last answer). Best effort.
pub fn touch(path: &Path) {
    if let Ok(f) = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
    {
        let _ = f.set_modified(std::time::SystemTime::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_relative_and_dots() {
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(resolve("a/./b/../c").unwrap(), cwd.join("a/c"));
        assert_eq!(resolve("/x/y,z w").unwrap(), PathBuf::from("/x/y,z w"));
        assert!(resolve("").is_err());
    }

    #[test]
    fn the_runtime_folder_outlives_sessions() {
        let xdg = Some(PathBuf::from("/run/user/1000"));
        let env = Some(PathBuf::from("/srv/run"));
        assert_eq!(
            choose_runtime(env, xdg.clone(), 1000, false).0,
            PathBuf::from("/srv/run")
        );
        assert_eq!(
            choose_runtime(None, None, 0, false).0,
            PathBuf::from("/run/mcqemu")
        );
        assert_eq!(
            choose_runtime(None, xdg.clone(), 1000, false).0,
            PathBuf::from("/tmp/mcqemu-1000")
        );
        assert_eq!(
            choose_runtime(None, xdg, 1000, true).0,
            PathBuf::from("/run/user/1000/mcqemu")
        );
    }

    #[test]
    fn expands_tilde() {
        if let Some(h) = home() {
            assert_eq!(
                resolve("~/vm.qcow2").unwrap(),
                normalize(&h.join("vm.qcow2"))
            );
        }
    }
}
