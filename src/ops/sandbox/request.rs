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
    /// What it boots from (None: refused, naming the three).
    pub root: Option<Root>,
    /// Start the image's Entrypoint and Cmd in the background once the agent answers.
    pub run: bool,
    /// Forward an automatic host port to each TCP port the image exposes.
    pub expose: bool,
    /// The overlay's size (never smaller than the base).
    pub disk_size: Option<String>,
    /// The launch's own parameters (port_forwards None: `auto:22`).
    pub launch: LaunchArgs,
    /// Guest-initiated traffic allowed.
    pub allow_network: bool,
    /// None: [`BOOT_AGENT_WAIT`]'s default.
    pub wait_agent_s: Option<f64>,
    /// Also wait for cloud-init to finish.
    pub wait_cloud_init: bool,
    /// None: 600 s.
    pub wait_cloud_init_s: Option<f64>,
}

/// What a sandbox boots from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Root {
    /// An overlay on this disk image (never written).
    Image(String),
    /// An overlay on the root made of this container image reference.
    Oci(String),
    /// A clone of this template.
    Template(String),
    /// A sandbox pushed with sandbox_push, started here as it was.
    Pushed(String),
}

impl Root {
    /// The one root a call names among `base_image`, `oci` and `template`; two are refused,
    /// and none is None.
    pub fn given(
        base_image: Option<String>,
        oci: Option<String>,
        template: Option<String>,
        from: Option<String>,
    ) -> Result<Option<Root>, OpError> {
        if let Some(r) = from {
            if base_image.is_some() || oci.is_some() || template.is_some() {
                return Err(OpError::invalid(
                    "from starts a pushed sandbox as it was: give it alone (not with base_image, \
                     oci or template)",
                ));
            }
            return Ok(Some(Root::Pushed(r)));
        }
        match (base_image, oci, template) {
            (_, Some(_), Some(_)) => Err(OpError::invalid(
                "give oci or template, not both: a template already holds its root (make one \
                 with template_create {\"oci\": ...})",
            )),
            (Some(_), Some(_), None) => Err(OpError::invalid(
                "give oci or base_image, not both: the image's root is the base",
            )),
            (Some(_), None, Some(_)) => Err(OpError::invalid(
                "base_image comes from the template and cannot be changed for a clone; drop \
                 it, or make another template",
            )),
            (Some(b), None, None) => Ok(Some(Root::Image(b))),
            (None, Some(o), None) => Ok(Some(Root::Oci(o))),
            (None, None, Some(t)) => Ok(Some(Root::Template(t))),
            (None, None, None) => Ok(None),
        }
    }

    /// The template to clone, if that is the root.
    pub fn template(&self) -> Option<&str> {
        match self {
            Root::Template(t) => Some(t),
            _ => None,
        }
    }
}

/// How long a guest agent may take, in seconds: its bounds and default, for the tools' schemas
/// and the operations alike.
#[derive(Debug, Clone, Copy)]
pub struct AgentWait {
    /// The least.
    pub min: f64,
    /// The most.
    pub max: f64,
    /// When not given.
    pub default: f64,
}

impl AgentWait {
    /// `asked` (None: the default), held within the bounds.
    pub fn of(self, asked: Option<f64>) -> Duration {
        Duration::from_secs_f64(asked.unwrap_or(self.default).clamp(self.min, self.max))
    }
}

/// A booted guest's agent (sandbox_vm, template_create): a cold boot under TCG takes a while.
pub const BOOT_AGENT_WAIT: AgentWait = AgentWait {
    min: 0.0,
    max: 3600.0,
    default: 90.0,
};

/// A copy's or a resumed sandbox's agent (sandbox_fork, sandbox_resume): its guest was running.
pub const COPY_AGENT_WAIT: AgentWait = AgentWait {
    min: 1.0,
    max: 600.0,
    default: 60.0,
};

impl SandboxRequest {
    /// How long to wait for the guest agent.
    pub fn agent_wait(&self) -> Duration {
        BOOT_AGENT_WAIT.of(self.wait_agent_s)
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
