//! sandbox_vm's typed request, and the sandbox name it asks for (checked) or the first free one.

use std::time::Duration;

use crate::ops::error::OpError;
use crate::ops::vm::launch_args::LaunchArgs;
use crate::state::record::Network;
use crate::state::registry::{invalid_name, valid_name};

/// sandbox_vm's request: a sandbox on `base_image` (an overlay) or a clone of `template`.
#[derive(Debug, Clone, Default)]
pub struct SandboxRequest {
    /// None: the first free `sandbox`, `sandbox-2`, ...
    pub name: Option<String>,
    /// A template to clone instead of an overlay on base_image.
    pub template: Option<String>,
    /// The disk image the overlay is on (never written).
    pub base_image: Option<String>,
    /// A container image reference whose root the overlay is on, instead of base_image.
    pub oci: Option<String>,
    /// The digest of the image `oci` named, once pulled.
    pub oci_digest: Option<String>,
    /// Start the image's Entrypoint and Cmd in the background once the agent answers.
    pub run: bool,
    /// Forward an automatic host port to each TCP port the image exposes.
    pub expose: bool,
    /// The image's program (Entrypoint then Cmd), once pulled.
    pub oci_command: Vec<String>,
    /// The overlay's size (never smaller than the base).
    pub disk_size: Option<String>,
    /// The launch's own parameters (port_forwards None: `auto:22`).
    pub launch: LaunchArgs,
    /// Guest-initiated traffic allowed.
    pub allow_network: bool,
    /// None: 90 s.
    pub wait_agent_s: Option<f64>,
    /// Also wait for cloud-init to finish.
    pub wait_cloud_init: bool,
    /// None: 600 s.
    pub wait_cloud_init_s: Option<f64>,
}

impl SandboxRequest {
    /// How long to wait for the guest agent.
    pub fn agent_wait(&self) -> Duration {
        Duration::from_secs_f64(self.wait_agent_s.unwrap_or(90.0).clamp(0.0, 3600.0))
    }

    /// `allow_network` as the sandbox's record keeps it: a boolean, or the rules.
    pub fn network(&self) -> Network {
        if self.launch.egress.is_empty() {
            return Network::All(self.allow_network);
        }
        Network::Rules(self.launch.egress.iter().map(|r| r.text()).collect())
    }

    /// How long to wait for cloud-init, once the agent answers.
    pub fn cloud_init_wait(&self) -> Duration {
        Duration::from_secs_f64(self.wait_cloud_init_s.unwrap_or(600.0).clamp(0.0, 3600.0))
    }
}

/// A requested VM name, checked, or the first free sandbox name.
pub fn checked_name(name: Option<&str>) -> Result<String, OpError> {
    match name {
        Some(n) if valid_name(n) => Ok(n.to_string()),
        Some(n) => Err(OpError::invalid(invalid_name("VM", n))),
        None => Ok(first_free_name()),
    }
}

/// The first free sandbox name: sandbox, sandbox-2, ...
pub fn first_free_name() -> String {
    let vms = crate::state::registry::shared().load();
    (1..1000)
        .map(|i| {
            if i == 1 {
                "sandbox".to_string()
            } else {
                format!("sandbox-{i}")
            }
        })
        .find(|n| !vms.contains_key(n))
        .unwrap_or_else(|| format!("sandbox-{}", std::process::id()))
}
