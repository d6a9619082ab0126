//! The resources mcqemu offers: for each VM in the registry, its serial console log (the last
//! 256 KiB, as text) at `mcqemu://vm/{name}/serial`, its current screen (PNG, base64) at
//! `mcqemu://vm/{name}/screen`, and what it uses (JSON: status, metrics, lifetime, end) at
//! `mcqemu://vm/{name}/metrics`. VMs adopted with `attach_vm` have no serial log, so only their
//! screen and metrics are listed. The serial log and the metrics can be subscribed to.
//!
//! The MCP adapter of the resources, beside the tools: the server (`mcp::resources`) knows
//! only the [`Provider`] that [`provider`] hands to it. The reads are
//! [`crate::ops::screen::consoles`]': the serial log's last window as `vm_serial_read` reads it, the
//! screen as `vm_screenshot` captures it, with its inline bounds, but within [`SCREEN_BUDGET`]
//! so that a wedged QEMU cannot hold up `resources/read`.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::mcp::resources::{Provider, ReadError};
use crate::ops::screen::consoles::{self, Unread};
use crate::ops::vm::records::valid_name;
use crate::ops::vm::serial;

/// Where every URI of a VM resource starts.
pub const PREFIX: &str = "mcqemu://vm/";
/// The URI template of a VM's serial console log.
pub const SERIAL_TEMPLATE: &str = "mcqemu://vm/{name}/serial";
/// The URI template of a VM's screen.
pub const SCREEN_TEMPLATE: &str = "mcqemu://vm/{name}/screen";
/// The URI template of a VM's metrics.
pub const METRICS_TEMPLATE: &str = "mcqemu://vm/{name}/metrics";
/// How much of the end of a serial log a read returns (the same window as `vm_serial_read`).
pub const SERIAL_WINDOW: u64 = serial::WINDOW;
/// The longest a screen read takes, the wait for the monitor included.
pub use crate::ops::screen::consoles::SCREEN_BUDGET;

const SERIAL_DESCRIPTION: &str = "The last 256 KiB of the VM's serial console log (kernel \
    messages, login prompts, a shell on ttyS0), read now. vm_serial_wait waits for text in it, \
    vm_serial_write types into it.";
const SCREEN_DESCRIPTION: &str = "The VM's screen as PNG, captured when read (the VM must be \
    running or paused), bounded as vm_screenshot's inline image is (longer edge at most 1568 \
    px, PNG at most 750 kB; vm_screenshot also gives the scale for clicks). vm_click, \
    vm_type_text and vm_send_keys act on it.";
const METRICS_DESCRIPTION: &str = "What the VM uses now, as JSON: its status; metrics (QEMU's \
    CPU % since the last read, RSS and Pss, the disk's allocated bytes, bytes read and written, \
    egress bytes, uptime); its lifetime (deadline, idle clock); why it ended. Subscribe to hear \
    of changes (every 2 s while it runs).";

/// Which resource of a VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Serial,
    Screen,
    Metrics,
}

/// The VM name and resource of a URI of ours, or None.
fn parse(uri: &str) -> Option<(&str, Kind)> {
    let rest = uri.strip_prefix(PREFIX)?;
    let (name, what) = rest.split_once('/')?;
    let kind = match what {
        "serial" => Kind::Serial,
        "screen" => Kind::Screen,
        "metrics" => Kind::Metrics,
        _ => return None,
    };
    valid_name(name).then_some((name, kind))
}

fn uri_of(name: &str, kind: Kind) -> String {
    match kind {
        Kind::Serial => format!("{PREFIX}{name}/serial"),
        Kind::Screen => format!("{PREFIX}{name}/screen"),
        Kind::Metrics => format!("{PREFIX}{name}/metrics"),
    }
}

/// The live view (an MCP App): hosts that render apps show it beside vm_view, vm_screenshot,
/// vm_screen_wait, launch_vm, sandbox_vm and sandbox_fork.
fn view_resource() -> Value {
    json!({
        "uri": super::presets::VIEW_URI,
        "name": "view",
        "title": "Live view of a VM",
        "description": "A VM's screen as it changes, its run state and serial console, with \
            Take over / Hand back for the person watching (an MCP App).",
        "mimeType": super::presets::VIEW_MIME,
    })
}

fn serial_resource(name: &str) -> Value {
    json!({
        "uri": uri_of(name, Kind::Serial),
        "name": format!("{name}/serial"),
        "title": format!("Serial console of VM {name}"),
        "description": SERIAL_DESCRIPTION,
        "mimeType": "text/plain",
    })
}

fn screen_resource(name: &str) -> Value {
    json!({
        "uri": uri_of(name, Kind::Screen),
        "name": format!("{name}/screen"),
        "title": format!("Screen of VM {name}"),
        "description": SCREEN_DESCRIPTION,
        "mimeType": "image/png",
    })
}

fn metrics_resource(name: &str) -> Value {
    json!({
        "uri": uri_of(name, Kind::Metrics),
        "name": format!("{name}/metrics"),
        "title": format!("Metrics of VM {name}"),
        "description": METRICS_DESCRIPTION,
        "mimeType": "application/json",
    })
}

fn unread(e: Unread) -> ReadError {
    match e {
        Unread::NotFound(m) => ReadError::NotFound(m),
        Unread::Failed(m) => ReadError::Failed(m),
    }
}

fn read_serial(uri: &str, name: &str) -> Result<Vec<Value>, ReadError> {
    let text = consoles::serial_text(name, &uri_of(name, Kind::Screen)).map_err(unread)?;
    Ok(vec![
        json!({"uri": uri, "mimeType": "text/plain", "text": text}),
    ])
}

fn read_screen(uri: &str, name: &str) -> Result<Vec<Value>, ReadError> {
    let png = consoles::screen_png(name).map_err(unread)?;
    Ok(vec![json!({
        "uri": uri, "mimeType": "image/png", "blob": crate::b64::encode(&png)
    })])
}

fn read_metrics(uri: &str, name: &str) -> Result<Vec<Value>, ReadError> {
    let v = crate::ops::vm::inspect::one(name).map_err(|e| {
        ReadError::NotFound(format!(
            "resource not found: {}; resources/list and list_vms show the VMs there are",
            e.msg
        ))
    })?;
    let text = serde_json::to_string(&json!({
        "name": v.name, "status": v.status, "metrics": v.metrics,
        "lifetime": v.lifetime, "end": v.end,
    }))
    .map_err(|e| ReadError::Failed(e.to_string()))?;
    Ok(vec![
        json!({"uri": uri, "mimeType": "application/json", "text": text}),
    ])
}

/// Each VM's serial console log, screen and metrics, from the registry of this process's state
/// folder.
pub struct VmResources;

/// The resources the server offers (`mcp::server::serve_stdio` takes them).
pub fn provider() -> Arc<dyn Provider> {
    Arc::new(VmResources)
}

impl Provider for VmResources {
    fn list(&self) -> Vec<Value> {
        let mut out = Vec::new();
        // Pooled clones are the server's, not the caller's VMs (list_vms hides them too); a
        // VM still being launched has no console or screen yet: it appears once, when its
        // launch is recorded.
        for vm in consoles::shown() {
            if vm.serial {
                out.push(serial_resource(&vm.name));
            }
            out.push(screen_resource(&vm.name));
            out.push(metrics_resource(&vm.name));
        }
        // The live view last: the VMs' own resources keep their places.
        out.push(view_resource());
        out
    }

    fn templates(&self) -> Vec<Value> {
        vec![
            json!({
                "uriTemplate": SERIAL_TEMPLATE,
                "name": "vm-serial",
                "title": "Serial console of a VM",
                "description": SERIAL_DESCRIPTION,
                "mimeType": "text/plain",
            }),
            json!({
                "uriTemplate": SCREEN_TEMPLATE,
                "name": "vm-screen",
                "title": "Screen of a VM",
                "description": SCREEN_DESCRIPTION,
                "mimeType": "image/png",
            }),
            json!({
                "uriTemplate": METRICS_TEMPLATE,
                "name": "vm-metrics",
                "title": "Metrics of a VM",
                "description": METRICS_DESCRIPTION,
                "mimeType": "application/json",
            }),
        ]
    }

    fn read(&self, uri: &str) -> Result<Vec<Value>, ReadError> {
        if uri == super::presets::VIEW_URI {
            return Ok(vec![json!({
                "uri": uri, "mimeType": super::presets::VIEW_MIME,
                "text": super::presets::VIEW_PAGE,
            })]);
        }
        match parse(uri) {
            Some((name, Kind::Serial)) => read_serial(uri, name),
            Some((name, Kind::Screen)) => read_screen(uri, name),
            Some((name, Kind::Metrics)) => read_metrics(uri, name),
            None => Err(ReadError::NotFound(format!(
                "resource not found: {uri:?} is not a resource of this server; its resources \
                 are {SERIAL_TEMPLATE}, {SCREEN_TEMPLATE} and {METRICS_TEMPLATE} for each VM \
                 (resources/list shows them)"
            ))),
        }
    }

    fn version(&self, uri: &str) -> Option<String> {
        match parse(uri)? {
            (name, Kind::Serial) => crate::ops::vm::serial::log_version(name),
            (name, Kind::Metrics) => crate::ops::vm::inspect::metrics_version(name),
            (_, Kind::Screen) => None,
        }
    }

    fn stamp(&self) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(consoles::registry_file()) {
            // The registry is replaced by a rename at every change: a new inode each time.
            Ok(m) => Some(format!(
                "{}:{}:{}:{}",
                m.ino(),
                m.len(),
                m.mtime(),
                m.mtime_nsec()
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("absent".into()),
            Err(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse_only_in_our_own_shape() {
        assert_eq!(parse("mcqemu://vm/vm1/serial"), Some(("vm1", Kind::Serial)));
        assert_eq!(
            parse("mcqemu://vm/a.b-c_d/screen"),
            Some(("a.b-c_d", Kind::Screen))
        );
        for bad in [
            "mcqemu://vm/vm1/disk",
            "mcqemu://vm/vm1",
            "mcqemu://vm//serial",
            "mcqemu://vm/../serial",
            "mcqemu://vm/a/b/serial",
            "file:///etc/passwd",
            "mcqemu://vm/.hidden/serial",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
        assert_eq!(uri_of("x", Kind::Screen), "mcqemu://vm/x/screen");
        assert_eq!(
            SERIAL_TEMPLATE.replace("{name}", "x"),
            uri_of("x", Kind::Serial)
        );
    }
}
