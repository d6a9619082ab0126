//! Path handling: `~` expansion, absolute resolution, and the state/runtime folders of the spec.

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

/// The runtime folder for sockets and pidfiles: `$MCQEMU_RUNTIME_DIR`, else
/// `$XDG_RUNTIME_DIR/mcqemu`, else `/tmp/mcqemu-UID`.
pub fn runtime_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MCQEMU_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("mcqemu");
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/tmp/mcqemu-{uid}"))
}

/// The registry file inside the state folder.
pub fn registry_file() -> PathBuf {
    state_dir().join("vms.json")
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
    fn expands_tilde() {
        if let Some(h) = home() {
            assert_eq!(
                resolve("~/vm.qcow2").unwrap(),
                normalize(&h.join("vm.qcow2"))
            );
        }
    }
}
