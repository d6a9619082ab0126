//! The MCP tools, one module per group, each saying what its tools mean in terms of `qemu/`
//! and `state/`. [`ALL`] is the fixed order `tools/list` shows.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::mcp::tool::{Args, ToolDef, ToolError};
use crate::qemu::untrusted::{self, Checked};
use crate::state::roots::{self, Access};

pub mod clone;
pub mod disk_size;
pub mod download;
pub mod drive;
pub mod guest;
pub mod guest_run;
pub mod image;
pub mod image_snapshot;
pub mod inspect;
pub mod keyboard;
pub mod launch;
pub mod launch_schema;
pub mod lifecycle;
pub mod prepare;
pub mod pull;
pub mod quota;
pub mod sandbox;
pub mod serial;
pub mod session;
pub mod snapshot;
pub mod stop;
pub mod template;
pub mod template_manage;

/// Every tool, in the order `tools/list` shows them.
pub static ALL: &[ToolDef] = &[
    launch::LAUNCH,
    stop::STOP,
    lifecycle::PAUSE,
    lifecycle::RESUME,
    lifecycle::ATTACH,
    lifecycle::FORGET,
    inspect::LIST,
    inspect::INFO,
    snapshot::CREATE,
    snapshot::RESTORE,
    snapshot::DELETE,
    snapshot::LIST,
    drive::SCREENSHOT,
    keyboard::SEND_KEYS,
    keyboard::TYPE_TEXT,
    drive::CLICK,
    drive::MOUSE_MOVE,
    serial::READ,
    serial::WRITE,
    serial::WAIT,
    image::CREATE,
    image::INFO,
    image::CONVERT,
    image::RESIZE,
    image_snapshot::SNAPSHOT_LIST,
    image_snapshot::SNAPSHOT_CREATE,
    image_snapshot::SNAPSHOT_APPLY,
    image_snapshot::SNAPSHOT_DELETE,
    download::DOWNLOAD,
    pull::PULL,
    pull::CATALOG,
    prepare::PREPARE,
    sandbox::SANDBOX,
    sandbox::DESTROY,
    template::CREATE,
    template_manage::LIST,
    template_manage::DELETE,
    guest::PING,
    guest::INFO,
    guest::EXEC,
    guest::FILE_READ,
    guest::FILE_WRITE,
];

/// Finds a tool by name.
pub fn find(name: &str) -> Option<&'static ToolDef> {
    ALL.iter().find(|t| t.name == name)
}

/// A path parameter, `~`-expanded and made absolute.
/// A path parameter, checked against the roots for `access` and resolved (every symlink and
/// `..`): the tool must use the returned path from then on, never the text it was given.
pub fn path_arg(args: &Args, name: &str, access: Access) -> Result<PathBuf, ToolError> {
    let raw = args.str(name)?;
    roots::check_str(raw, access).map_err(|e| ToolError::new(format!("parameter '{name}': {e}")))
}

/// An existing disk image, checked as untrusted data: its backing chain and external data
/// file must stay inside the roots. `format` pins how it is read (None probes it once).
pub fn checked_image(path: &Path, what: &str, format: Option<&str>) -> Result<Checked, ToolError> {
    if !path.is_file() {
        return Err(ToolError::new(format!(
            "{what} {} does not exist or is not a file",
            path.display()
        )));
    }
    // A disk a VM has used keeps the format recorded at its first launch: a guest that wrote
    // another format's header into it cannot change how the image tools read it either.
    let recorded = match format {
        Some(_) => None,
        None => recorded_format(path),
    };
    Ok(untrusted::check(path, format.or(recorded.as_deref()))?)
}

/// The format a VM's record pinned for the disk at `path`, if any VM used it.
fn recorded_format(path: &Path) -> Option<String> {
    let key = path.display().to_string();
    crate::qemu::vm::registry().load().values().find_map(|rec| {
        rec.get("disk_formats")
            .and_then(|m| m.get(&key))
            .and_then(Value::as_str)
            .map(str::to_string)
    })
}

/// Checks a snapshot tag against `^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`.
pub fn check_tag(tag: &str) -> Result<(), ToolError> {
    let mut chars = tag.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if first_ok && rest_ok && tag.len() <= 64 {
        Ok(())
    } else {
        Err(ToolError::new(format!(
            "invalid snapshot tag {tag:?}: use 1-64 characters from A-Z a-z 0-9 _ . -, starting \
             with a letter or digit"
        )))
    }
}

/// An input schema: an object with these properties, these required, nothing else.
pub fn object(props: Value, required: &[&str]) -> Value {
    json!({
        "type": "object", "properties": props, "required": required, "additionalProperties": false
    })
}

/// The `name` parameter, checked against `^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$`.
pub fn vm_name_arg(args: &Args) -> Result<String, ToolError> {
    let name = args.str("name")?;
    if crate::state::registry::valid_name(name) {
        Ok(name.to_string())
    } else {
        Err(ToolError::new(format!(
            "invalid VM name {name:?}: use 1-48 characters from A-Z a-z 0-9 _ . -, starting with \
             a letter or digit"
        )))
    }
}
