//! Roots: the host folders an agent may reach through the tools. Every host path a tool reads
//! or writes is checked here after resolving `..` and every symlink (in the leaf and in every
//! parent); it must lie inside a root, name no hidden (`.`) component below that root, and be
//! written only inside a writable root.
//!
//! Where roots come from, strongest first:
//! - the operator (`mcqemu serve --root DIR`, repeatable, or `MCQEMU_ROOTS=DIR:DIR`), final;
//! - otherwise the user's home folder and the system temporary folder, narrowed to the MCP
//!   client's own roots that lie inside them when the client declares some (never widened);
//! - always: mcqemu's state and runtime folders (writable), and the read-only system folders
//!   `/usr/share` and `/boot` (readable: firmware, distribution kernels).

use crate::kind::Failed;
use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};
use std::sync::RwLock;

use super::paths;

/// What a tool wants to do with a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read it (or hand it to QEMU read-only).
    Read,
    /// Create, change or delete it.
    Write,
}

/// Where a root came from (shown in errors and by `mcqemu doctor`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `--root` or `MCQEMU_ROOTS`.
    Operator,
    /// The default: home or the temporary folder.
    Default,
    /// The MCP client's `roots/list`, inside the default.
    Client,
    /// mcqemu's state or runtime folder.
    Own,
    /// A read-only system folder.
    System,
}

impl Origin {
    fn as_str(self) -> &'static str {
        match self {
            Origin::Operator => "operator",
            Origin::Default => "default",
            Origin::Client => "client",
            Origin::Own => "mcqemu",
            Origin::System => "system, read-only",
        }
    }
}

/// One root: a canonical folder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Root {
    /// The folder, with symlinks resolved.
    pub path: PathBuf,
    /// Whether tools may write inside it.
    pub writable: bool,
    /// Where it came from.
    pub origin: Origin,
}

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootsError {
    /// The text is not a usable path (empty, NUL, a protocol or `json:` pseudo-filename).
    Invalid(String),
    /// The path (or its folder) could not be resolved.
    Unresolvable(String),
    /// It resolves outside every root.
    Outside {
        /// The path as resolved.
        path: PathBuf,
    },
    /// A component below its root is hidden (`.ssh`, `.config`, ...).
    Hidden {
        /// The path as resolved.
        path: PathBuf,
        /// The hidden component.
        component: String,
    },
    /// It lies in a read-only root and would be written.
    ReadOnly {
        /// The path as resolved.
        path: PathBuf,
        /// The read-only root.
        root: PathBuf,
    },
}

impl std::fmt::Display for RootsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RootsError::Invalid(m) | RootsError::Unresolvable(m) => f.write_str(m),
            RootsError::Outside { path } => write!(
                f,
                "{} is outside the folders this server may reach ({}). An operator can widen them \
                 with `mcqemu serve --root DIR` or MCQEMU_ROOTS",
                path.display(),
                summary()
            ),
            RootsError::Hidden { path, component } => write!(
                f,
                "{} is refused: {component:?} is a hidden folder or file, and hidden paths below \
                 a root are never reached (roots: {}). An operator can make such a folder a root \
                 itself with `mcqemu serve --root DIR`",
                path.display(),
                summary()
            ),
            RootsError::ReadOnly { path, root } => write!(
                f,
                "{} is inside {}, which may be read but never written; choose a path in a \
                 writable root ({})",
                path.display(),
                root.display(),
                summary()
            ),
        }
    }
}

impl std::error::Error for RootsError {}

/// The roots in force in this process.
#[derive(Debug, Default)]
struct Policy {
    /// Set by the operator: when Some, the default and client roots play no part.
    operator: Option<Vec<PathBuf>>,
    /// The client's roots, when it declared any (already canonical).
    client: Option<Vec<PathBuf>>,
}

static POLICY: RwLock<Policy> = RwLock::new(Policy {
    operator: None,
    client: None,
});

/// Sets the operator's roots (from `--root` and `MCQEMU_ROOTS`); an empty list keeps the
/// default. Folders that do not exist are an error: a typo must not silently narrow nothing.
pub fn set_operator_roots(dirs: &[PathBuf]) -> Result<(), Failed> {
    if dirs.is_empty() {
        return Ok(());
    }
    let mut canon = Vec::new();
    for d in dirs {
        let c = std::fs::canonicalize(d)
            .map_err(|e| Failed::invalid(format!("root {}: {e}", d.display())))?;
        if !c.is_dir() {
            return Err(Failed::invalid(format!(
                "root {} is not a folder",
                d.display()
            )));
        }
        canon.push(c);
    }
    let mut p = POLICY.write().unwrap_or_else(|e| e.into_inner());
    p.operator = Some(canon);
    Ok(())
}

/// The operator's roots from `MCQEMU_ROOTS` (colon-separated).
pub fn env_roots() -> Vec<PathBuf> {
    std::env::var_os("MCQEMU_ROOTS")
        .map(|v| {
            std::env::split_paths(&v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// Records the MCP client's roots (`file://` URIs already turned into paths). They narrow the
/// default roots and are ignored when the operator set roots. None: the client has none.
pub fn set_client_roots(dirs: Option<Vec<PathBuf>>) {
    let canon = dirs.map(|d| {
        d.iter()
            .filter_map(|p| std::fs::canonicalize(p).ok())
            .collect::<Vec<_>>()
    });
    let mut p = POLICY.write().unwrap_or_else(|e| e.into_inner());
    p.client = canon;
}

fn canon_or_self(p: PathBuf) -> PathBuf {
    std::fs::canonicalize(&p).unwrap_or(p)
}

/// Every root in force, most specific first.
pub fn current() -> Vec<Root> {
    let p = POLICY.read().unwrap_or_else(|e| e.into_inner());
    let mut out: Vec<Root> = Vec::new();
    let mut add = |path: PathBuf, writable: bool, origin: Origin| {
        if !out.iter().any(|r| r.path == path) {
            out.push(Root {
                path,
                writable,
                origin,
            });
        }
    };
    add(canon_or_self(paths::state_dir()), true, Origin::Own);
    add(canon_or_self(paths::runtime_dir()), true, Origin::Own);
    match &p.operator {
        Some(dirs) => {
            for d in dirs {
                add(d.clone(), true, Origin::Operator);
            }
        }
        None => {
            let defaults = default_roots();
            match &p.client {
                Some(client) => {
                    for r in narrow(&defaults, client) {
                        add(r, true, Origin::Client);
                    }
                }
                None => {
                    for d in defaults {
                        add(d, true, Origin::Default);
                    }
                }
            }
        }
    }
    for sys in ["/usr/share", "/boot"] {
        add(canon_or_self(PathBuf::from(sys)), false, Origin::System);
    }
    // Most specific first, so a path is judged against the deepest root that holds it.
    out.sort_by_key(|r| std::cmp::Reverse(r.path.components().count()));
    out
}

/// The default roots: the home folder and the system temporary folder.
fn default_roots() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        v.push(canon_or_self(PathBuf::from(h)));
    }
    v.push(canon_or_self(std::env::temp_dir()));
    v
}

/// The intersection of two sets of folder trees: each client root inside a default root, and
/// each default root inside a client root.
fn narrow(defaults: &[PathBuf], client: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for c in client {
        for d in defaults {
            let r = if c.starts_with(d) {
                c
            } else if d.starts_with(c) {
                d
            } else {
                continue;
            };
            if !out.contains(r) {
                out.push(r.clone());
            }
        }
    }
    out
}

/// The roots as one line for messages.
pub fn summary() -> String {
    current()
        .iter()
        .map(|r| format!("{} ({})", r.path.display(), r.origin.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Turns a tool's path text into an absolute path (`~` expanded), refusing protocol and
/// `json:` pseudo-filenames, which QEMU and qemu-img would not read as files.
pub fn parse(input: &str) -> Result<PathBuf, RootsError> {
    if let Some((scheme, _)) = input.split_once(':') {
        let looks_like_protocol = !scheme.is_empty()
            && !scheme.contains('/')
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.' | '_'));
        if looks_like_protocol {
            return Err(RootsError::Invalid(format!(
                "{input:?} looks like a {scheme}: URL or pseudo-filename; give a plain file path \
                 (protocols and json: filenames are refused)"
            )));
        }
    }
    expand(input).map_err(|e| RootsError::Invalid(e.msg))
}

/// Expands a leading `~` and makes the path absolute against the current folder, keeping
/// `..` as written: it is resolved with the symlinks, by the kernel, not lexically.
fn expand(input: &str) -> Result<PathBuf, Failed> {
    if input.is_empty() {
        return Err(Failed::invalid("the path is empty"));
    }
    if input.contains('\0') {
        return Err(Failed::invalid("the path contains a NUL byte"));
    }
    let expanded = if input == "~" || input.starts_with("~/") {
        let home = std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .ok_or(Failed::invalid(
                "cannot expand '~': HOME is not set; give an absolute path",
            ))?;
        PathBuf::from(home).join(input.trim_start_matches('~').trim_start_matches('/'))
    } else {
        PathBuf::from(input)
    };
    if expanded.is_absolute() {
        return Ok(expanded);
    }
    std::env::current_dir()
        .map(|d| d.join(expanded))
        .map_err(|e| {
            Failed::invalid(format!(
                "cannot resolve relative path {input:?}: {e}; give an absolute path"
            ))
        })
}

/// Resolves `path` (absolute) the way the kernel will: every symlink and `..`, in the leaf and
/// in every parent. A leaf that does not exist yet is allowed; its folder must exist.
pub fn resolve(path: &Path) -> Result<PathBuf, RootsError> {
    match std::fs::canonicalize(path) {
        Ok(p) => Ok(p),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Not there: a dangling symlink is refused (it would be followed on creation);
            // otherwise the folder must resolve and the leaf be a plain name.
            if std::fs::symlink_metadata(path).is_ok() {
                return Err(RootsError::Unresolvable(format!(
                    "{} is a symlink to something that does not exist; give the real path",
                    path.display()
                )));
            }
            let leaf = match path.components().next_back() {
                Some(Component::Normal(n)) => n,
                _ => {
                    return Err(RootsError::Invalid(format!(
                        "{} does not name a file",
                        path.display()
                    )))
                }
            };
            let parent = path.parent().unwrap_or(Path::new("/"));
            let dir = std::fs::canonicalize(parent).map_err(|e| {
                RootsError::Unresolvable(if e.kind() == std::io::ErrorKind::NotFound {
                    format!(
                        "the folder of {} does not exist; create it first",
                        path.display()
                    )
                } else {
                    format!("the folder of {} cannot be resolved: {e}", path.display())
                })
            })?;
            Ok(dir.join(leaf))
        }
        Err(e) => Err(RootsError::Unresolvable(format!(
            "{} cannot be resolved: {e}",
            path.display()
        ))),
    }
}

fn hidden(name: &OsStr) -> bool {
    name.to_str().is_none_or(|s| s.starts_with('.'))
}

/// Judges an already resolved path against `roots` (most specific first).
pub fn judge(resolved: &Path, access: Access, roots: &[Root]) -> Result<(), RootsError> {
    let root = roots
        .iter()
        .find(|r| resolved.starts_with(&r.path))
        .ok_or_else(|| RootsError::Outside {
            path: resolved.to_path_buf(),
        })?;
    if let Ok(rest) = resolved.strip_prefix(&root.path) {
        for c in rest.components() {
            if let Component::Normal(n) = c {
                if hidden(n) {
                    return Err(RootsError::Hidden {
                        path: resolved.to_path_buf(),
                        component: n.to_string_lossy().into_owned(),
                    });
                }
            }
        }
    }
    if access == Access::Write && !root.writable {
        return Err(RootsError::ReadOnly {
            path: resolved.to_path_buf(),
            root: root.path.clone(),
        });
    }
    Ok(())
}

/// Checks a path a tool will use: resolved, inside a root, not hidden, writable when written.
/// Returns the resolved path, which is what the tool must use from then on.
pub fn check(path: &Path, access: Access) -> Result<PathBuf, RootsError> {
    let resolved = resolve(path)?;
    judge(&resolved, access, &current())?;
    Ok(resolved)
}

/// [`parse`] then [`check`]: the whole check for a path parameter.
pub fn check_str(input: &str, access: Access) -> Result<PathBuf, RootsError> {
    check(&parse(input)?, access)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roots(list: &[(&str, bool)]) -> Vec<Root> {
        let mut v: Vec<Root> = list
            .iter()
            .map(|(p, w)| Root {
                path: PathBuf::from(p),
                writable: *w,
                origin: Origin::Operator,
            })
            .collect();
        v.sort_by_key(|r| std::cmp::Reverse(r.path.components().count()));
        v
    }

    #[test]
    fn inside_outside_hidden_and_read_only() {
        let r = roots(&[
            ("/home/u", true),
            ("/home/u/.local/share/mcqemu", true),
            ("/usr/share", false),
        ]);
        let ok = |p: &str, a| judge(Path::new(p), a, &r);
        assert_eq!(ok("/home/u/vms/a.qcow2", Access::Write), Ok(()));
        assert!(matches!(
            ok("/etc/shadow", Access::Read),
            Err(RootsError::Outside { .. })
        ));
        assert!(matches!(
            ok("/home/u/.ssh/authorized_keys", Access::Write),
            Err(RootsError::Hidden { .. })
        ));
        assert!(matches!(
            ok("/home/u/vms/.hidden", Access::Read),
            Err(RootsError::Hidden { .. })
        ));
        // A root may itself lie below a hidden folder: only what is below the root counts.
        assert_eq!(
            ok("/home/u/.local/share/mcqemu/images/x.qcow2", Access::Write),
            Ok(())
        );
        assert_eq!(ok("/usr/share/OVMF/OVMF_CODE.fd", Access::Read), Ok(()));
        assert!(matches!(
            ok("/usr/share/x", Access::Write),
            Err(RootsError::ReadOnly { .. })
        ));
        assert!(matches!(
            ok("/home/user2/x", Access::Read),
            Err(RootsError::Outside { .. })
        ));
    }

    #[test]
    fn protocols_and_json_pseudo_filenames_are_refused() {
        for bad in [
            "json:{\"file.filename\":\"/etc/shadow\"}",
            "nbd://host/x",
            "file:/etc/passwd",
            "http://x/y",
        ] {
            assert!(matches!(parse(bad), Err(RootsError::Invalid(_))), "{bad}");
        }
        assert!(parse("/tmp/a:b.qcow2").is_ok());
    }

    #[test]
    fn client_roots_narrow_the_default_never_widen_it() {
        let d = vec![PathBuf::from("/home/u"), PathBuf::from("/tmp")];
        let c = vec![
            PathBuf::from("/home/u/proj"),
            PathBuf::from("/etc"),
            PathBuf::from("/"),
        ];
        assert_eq!(
            narrow(&d, &c),
            vec![
                PathBuf::from("/home/u/proj"),
                PathBuf::from("/home/u"),
                PathBuf::from("/tmp")
            ]
        );
        assert!(narrow(&d, &[PathBuf::from("/srv")]).is_empty());
    }

    #[test]
    fn symlinks_in_leaf_and_parent_resolve_to_their_targets() {
        let base = std::env::temp_dir().join(format!("mcq-roots-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let inside = base.join("inside");
        let outside = base.join("outside");
        for d in [&inside, &outside] {
            assert!(std::fs::create_dir_all(d).is_ok());
        }
        assert!(std::fs::write(outside.join("secret"), b"x").is_ok());
        let _ = std::os::unix::fs::symlink(outside.join("secret"), inside.join("leaf"));
        let _ = std::os::unix::fs::symlink(&outside, inside.join("dir"));
        let canon_inside = std::fs::canonicalize(&inside).unwrap_or(inside.clone());
        let r = vec![Root {
            path: canon_inside,
            writable: true,
            origin: Origin::Operator,
        }];
        for p in [
            inside.join("leaf"),
            inside.join("dir/secret"),
            inside.join("dir/new"),
            inside.join("../outside/secret"),
        ] {
            let resolved = resolve(&p);
            assert!(resolved.is_ok(), "{p:?}: {resolved:?}");
            let verdict = resolved.map(|x| judge(&x, Access::Read, &r));
            assert!(
                matches!(verdict, Ok(Err(RootsError::Outside { .. }))),
                "{p:?}: {verdict:?}"
            );
        }
        assert!(matches!(
            resolve(&inside.join("missing/x")),
            Err(RootsError::Unresolvable(_))
        ));
        let _ = std::os::unix::fs::symlink(base.join("nowhere"), inside.join("dangling"));
        assert!(matches!(
            resolve(&inside.join("dangling")),
            Err(RootsError::Unresolvable(_))
        ));
        let _ = std::fs::remove_dir_all(&base);
    }
}
