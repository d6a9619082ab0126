//! Parameters several tools share, typed (no tool is defined here): the machine launch_vm,
//! sandbox_vm, template_create and image_prepare all take, the sandbox parameters sandbox_vm
//! and template_create share, the network, mounts and lifetime parameters, and the pointer
//! tools' `scale` and `hold`. Each is declared with [`crate::params!`], so a tool that
//! flattens one takes exactly what it declares.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::mcp::tool::ToolError;
use crate::ops::sandbox::request::{AgentWait, BOOT_AGENT_WAIT};
use crate::ops::vm::egress::{Rule, MAX_RULES};
use crate::ops::vm::launch::{ARCHES, DEFAULT_CPUS, DEFAULT_FIRMWARE};
use crate::ops::vm::launch_args::{egress_rules, LaunchArgs};
use crate::ops::vm::lifetime::{Asked, MAX_S};
use crate::ops::vm::mounts::{MountSpec, MAX_MOUNTS};
use crate::schema::{merged, Param};

/// A snapshot tag, as [`crate::tools::check_tag`] accepts it.
pub const TAG_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$";

/// A VM or template name, as the registry accepts it.
pub const NAME_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$";

/// What counts as a VM's activity, for the lifetime parameters' descriptions.
pub const ACTIVITY: &str = "Activity: tool calls on it, a live view, forwarded traffic, a \
    running guest_exec.";

/// Host folders mounted live into a guest: the `mounts` parameter of launch_vm, sandbox_vm and
/// template_create, and vm_mount's `add`.
#[derive(Deserialize, Default)]
#[serde(transparent)]
pub struct Mounts(pub Vec<MountSpec>);

impl Param for Mounts {
    fn param() -> Value {
        merged(
            Vec::<MountSpec>::param(),
            Some(json!({
                "maxItems": MAX_MOUNTS,
                "description": "Host folders mounted live (FUSE; the guest needs fuse.ko). Host \
                    changes show within a second; guest writes are on the host when they return. \
                    Forks, suspends and templates refuse a VM with mounts."
            })),
        )
    }
}

/// `allow_network`: true, false, or a list of egress rules.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum AllowNetwork {
    /// All guest-initiated traffic, or none.
    Open(bool),
    /// Only these names, through the VM's egress proxy.
    Rules(Vec<String>),
}

impl Param for AllowNetwork {
    fn param() -> Value {
        json!({
            "anyOf": [bool::param(), merged(Vec::<String>::param(), Some(json!({"maxItems": MAX_RULES})))],
            "description": "Guest-initiated network: true, false (forwards still work), or rules \
                \"host\", \"host:port\", \"*.domain\" (ports 80, 443 unless given) enforced \
                by an HTTP proxy, http://10.0.2.2:3128 (guest_exec gets http_proxy)."
        })
    }
}

impl AllowNetwork {
    /// Parsed so that a malformed rule is refused before anything starts: whether the network
    /// is open, and the rules. A list (even empty) keeps the network restricted; a non-empty
    /// one adds the VM's egress proxy.
    pub fn parse(given: Option<AllowNetwork>) -> Result<(Option<bool>, Vec<Rule>), ToolError> {
        match given {
            None => Ok((None, Vec::new())),
            Some(AllowNetwork::Open(b)) => Ok((Some(b), Vec::new())),
            Some(AllowNetwork::Rules(list)) => Ok((Some(false), egress_rules(&list)?)),
        }
    }
}

/// `cloud_init`'s meaning, shared by every tool that takes one.
pub fn cloud_init_extra() -> Value {
    json!({
        "description": "A NoCloud seed: hostname, users [{name, ssh_authorized_keys, sudo, \
            shell, groups, lock_passwd}], ssh_authorized_keys, packages, runcmd, write_files \
            [{path, content, encoding, permissions, owner}], network_config; or user_data \
            (raw)."
    })
}

/// `memory_mb`'s bounds, with the operation's default (template_create's is its own).
pub fn memory_extra(default: i64) -> Value {
    json!({"minimum": 16, "maximum": 1048576, "default": default})
}

crate::params! {
    /// The machine: what launch_vm, sandbox_vm, template_create and image_prepare all take
    /// (each left out: the operation's default).
    #[derive(Deserialize, Default)]
    pub struct Machine {
        arch: Option<String> = {
            "enum": ARCHES.iter().map(|a| a.0).collect::<Vec<_>>(),
            "description": format!(
                "Guest architecture; default the host's ({}).",
                crate::ops::vm::launch::default_arch()
            )
        },
        cpus: Option<i64> = {
            "minimum": 1, "maximum": 256,
            "description": format!("vCPUs; default {DEFAULT_CPUS}, or 1 on a one-CPU host.")
        },
        firmware: Option<String> = {
            "enum": ["bios", "uefi"],
            "description": format!(
                "Default {DEFAULT_FIRMWARE} on x86, uefi on aarch64/riscv64 (bios there only with \
                 kernel)."
            )
        },
        /// Boot this kernel directly.
        kernel: Option<String>,
        initrd: Option<String>,
        /// Kernel command line.
        append: Option<String>,
    }
}

impl Machine {
    /// The launch these parameters ask for, with `memory_mb` (None: the operation's default).
    pub fn launch(self, memory_mb: Option<i64>) -> LaunchArgs {
        LaunchArgs {
            arch: self.arch,
            cpus: self.cpus,
            firmware: self.firmware,
            kernel: self.kernel,
            initrd: self.initrd,
            append: self.append,
            memory_mb,
            ..LaunchArgs::default()
        }
    }
}

/// `ttl_s`, with the kind's `defaults` in its description.
pub fn ttl_extra(defaults: &str) -> Value {
    json!({"minimum": 0, "maximum": MAX_S, "description": format!("Seconds until on_ttl; 0: never. {defaults}")})
}

/// `idle_s`.
pub fn idle_extra() -> Value {
    json!({"minimum": 0, "maximum": MAX_S, "description": format!("Idle seconds until on_idle; 0: never. {ACTIVITY}")})
}

/// `on_idle` (`idle`) or `on_ttl`, among `actions`.
pub fn action_extra(actions: &[&str], idle: bool) -> Value {
    let mut s = json!({"enum": actions});
    if idle {
        s["description"] = json!("suspend: saved, resumed by the next call naming it.");
    }
    s
}

/// The lifetime parameters as given (each None: the kind's default).
pub fn asked(
    ttl_s: Option<u64>,
    idle_s: Option<u64>,
    on_idle: Option<String>,
    on_ttl: Option<String>,
) -> Asked {
    Asked {
        ttl_s,
        idle_s,
        on_idle,
        on_ttl,
    }
}

/// `wait_agent_s`: how long a guest agent may take, with the operation's own bounds.
pub fn agent_wait_extra(w: AgentWait) -> Value {
    json!({"minimum": w.min, "maximum": w.max, "default": w.default})
}

crate::params! {
    /// What sandbox_vm and template_create share beyond the machine: the root, the network,
    /// the seed, the mounts and the waits. (Fields without a doc comment are described by
    /// their types.)
    #[derive(Deserialize, Default)]
    #[allow(missing_docs)]
    pub struct SandboxCommon {
        /// A container image as root: python:3.12-slim, REG/NAME:tag, NAME@sha256:...,
        /// oci:DIR[:tag], docker-archive:FILE. guest_exec gets its Env, WorkingDir and User.
        pub oci: Option<String> = {"minLength": 1},
        pub allow_network: Option<AllowNetwork> = {"default": false},
        /// Names of the operator's secrets: the guest gets placeholders, the egress proxy
        /// swaps in the values for their hosts (needs allow_network rules).
        #[serde(default)]
        pub secrets: Vec<String> = {"maxItems": 16, "items": {"minLength": 1, "maxLength": 64}},
        pub wait_agent_s: Option<f64> = (agent_wait_extra(BOOT_AGENT_WAIT)),
        /// e.g. "20G"; at least the base's (the default); cloud-init grows the root to fill it.
        pub disk_size: Option<String> = {"minLength": 1},
        pub cloud_init: Option<Map<String, Value>> = (cloud_init_extra()),
        #[serde(default)]
        pub mounts: Mounts,
        /// Also wait for cloud-init to finish; report its status.
        pub wait_cloud_init: bool = {"default": false},
        /// Bound on that wait.
        pub wait_cloud_init_s: f64 = {"minimum": 0, "maximum": 3600, "default": 600},
    }
}

impl SandboxCommon {
    /// `launch` with the network, seed and mounts asked for; whether the network is open.
    pub fn onto(&mut self, launch: &mut LaunchArgs) -> Result<bool, ToolError> {
        let (allow, egress) = AllowNetwork::parse(self.allow_network.take())?;
        launch.restrict_net = allow == Some(false);
        launch.egress = egress;
        launch.secrets = std::mem::take(&mut self.secrets);
        launch.cloud_init = self.cloud_init.take().map(Value::Object);
        launch.mounts = std::mem::take(&mut self.mounts.0);
        Ok(allow.unwrap_or(false))
    }
}

/// The `hold` parameter of the pointer tools (`Option<Vec<String>>`): its bound and meaning.
pub fn hold_extra() -> Value {
    json!({
        "maxItems": crate::ops::screen::pointer::MAX_HOLD,
        "description": "Modifiers held throughout: shift, ctrl, alt, altgr, win (or _r)."
    })
}

/// The `hold` argument, checked: modifiers only.
pub fn hold_of(names: Option<Vec<String>>) -> Result<Vec<&'static str>, ToolError> {
    Ok(crate::ops::screen::pointer::modifiers(
        &names.unwrap_or_default(),
    )?)
}

/// The `scale` parameter of the pointer tools (`Option<f64>`): its bounds and meaning.
pub fn scale_extra() -> Value {
    json!({
        "minimum": MIN_SCALE, "maximum": 1,
        "description": "The vm_screenshot scale the coordinates were read at (default 1: screen \
            pixels)."
    })
}

/// The mouse buttons a click or drag may use.
pub const BUTTONS: [&str; 3] = ["left", "right", "middle"];

/// Smallest `scale` accepted (below any vm_screenshot gives: a 32 px image of a 16384 px screen
/// is 0.0019).
const MIN_SCALE: f64 = 0.0001;

/// The `scale` argument: 1 when absent.
pub fn scale_of(scale: Option<f64>) -> Result<f64, ToolError> {
    match scale {
        None => Ok(1.0),
        Some(s) if (MIN_SCALE..=1.0).contains(&s) => Ok(s),
        Some(s) => Err(ToolError::new(format!(
            "scale must be between {MIN_SCALE} and 1 (a screenshot's size divided by the \
             screen's, as vm_screenshot returns it), not {s}; nothing was sent"
        ))),
    }
}
