//! [`Lab`]: one test's world for real QEMUs.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use super::files::TempDir;
use super::qemu::{qemu_slots, short_runtime_dir, QemuSlot, VmKiller};
use super::server::{Server, NEWEST};
use super::tools::tool_ok;

/// One test's world for real QEMUs: guest slots of this binary (taken all at once), a short
/// folder under /tmp holding `s/` (MCQEMU_STATE_DIR) and `r/` (MCQEMU_RUNTIME_DIR, short
/// enough for unix socket paths), usually an initialized server of its own on those folders,
/// and a killer for every QEMU started there.
///
/// Fields drop in order: the QEMUs are killed first, then the lab's server goes, then the
/// folder, and only then are the slots given back. Build the test guest ([`test_guest`]) before
/// making a lab, not while holding its slots.
///
/// [`test_guest`]: super::guest::test_guest
pub struct Lab {
    /// Kills every QEMU of the lab on drop; tell it about each QEMU as soon as it starts.
    pub killer: VmKiller,
    server: Option<Server>,
    /// The lab's folder: `s/`, `r/`, and whatever the test puts beside them.
    pub dir: TempDir,
    _slots: Vec<QemuSlot>,
}

impl Lab {
    /// One guest slot, the folders, and an initialized server of the lab's own ([`Lab::srv`]).
    pub fn new(label: &str) -> Lab {
        let mut lab = Lab::without_server(label, 1);
        lab.server = Some(lab.spawn_server());
        lab
    }

    /// [`Lab::new`] holding `slots` guest slots (an emulated guest of another architecture
    /// takes them all, so that it runs alone).
    pub fn with_slots(label: &str, slots: usize) -> Lab {
        let mut lab = Lab::without_server(label, slots);
        lab.server = Some(lab.spawn_server());
        lab
    }

    /// [`Lab::new`] whose server may reach only the lab's own folder and the test-guest cache,
    /// so that a folder made anywhere else is outside every root, wherever the checkout is
    /// (a checkout under /tmp lies inside the usual test roots).
    pub fn confined(label: &str) -> Lab {
        let mut lab = Lab::without_server(label, 1);
        let guest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target")
            .join("test-guest");
        let roots = format!("{}:{}", lab.dir.path().display(), guest.display());
        lab.server = Some(lab.spawn_server_with(&[("MCQEMU_ROOTS", &roots)]));
        lab
    }

    /// `slots` guest slots and the folders, but no server: for tests that start (and stop)
    /// their own, possibly several at once on the same registry ([`Lab::spawn_server`]).
    pub fn without_server(label: &str, slots: usize) -> Lab {
        let slots = qemu_slots(slots);
        let dir = short_runtime_dir(label);
        dir.subdir("s");
        let runtime = dir.subdir("r");
        Lab {
            killer: VmKiller::new(&runtime),
            server: None,
            dir,
            _slots: slots,
        }
    }

    /// The lab's own server.
    pub fn srv(&mut self) -> &mut Server {
        self.server
            .as_mut()
            .expect("this lab has no server of its own (Lab::without_server)")
    }

    /// A new initialized server on the lab's folders.
    pub fn spawn_server(&self) -> Server {
        Server::ready_in(&self.state(), &self.runtime())
    }

    /// A server of this lab's folders with extra environment (another QEMU, say), initialized.
    pub fn spawn_server_with(&self, env: &[(&str, &str)]) -> Server {
        let tmp = TempDir::new("srv");
        let mut s = Server::try_start_with(tmp, &self.state(), &self.runtime(), env)
            .unwrap_or_else(|e| panic!("{e}"));
        s.initialize(NEWEST);
        s
    }

    /// MCQEMU_STATE_DIR.
    pub fn state(&self) -> PathBuf {
        self.dir.join("s")
    }

    /// MCQEMU_RUNTIME_DIR.
    pub fn runtime(&self) -> PathBuf {
        self.dir.join("r")
    }

    /// The VM registry, MCQEMU_STATE_DIR/vms.json.
    pub fn registry(&self) -> PathBuf {
        self.state().join("vms.json")
    }

    /// A VM's state folder, MCQEMU_STATE_DIR/vms/NAME.
    pub fn vm_dir(&self, name: &str) -> PathBuf {
        self.state().join("vms").join(name)
    }

    /// sandbox_vm `name` of a test guest built by `build_guest.py` (a 1 MiB blank base, 128
    /// MiB, 1 vCPU, no forwards), `extra_append` added to its kernel command line; fails the
    /// test unless its agent answers.
    pub fn boot_guest_sandbox(&mut self, name: &str, guest: &super::Guest, extra_append: &str) {
        let base = self.srv().tmp.join(&format!("{name}-base.img"));
        std::fs::File::create(&base)
            .and_then(|f| f.set_len(1 << 20))
            .expect("create the base image");
        let r = self.srv().call_tool_within(
            "sandbox_vm",
            serde_json::json!({
                "base_image": base.to_str().unwrap(), "name": name, "memory_mb": 128, "cpus": 1,
                "port_forwards": [], "wait_agent_s": 90,
                "kernel": guest.kernel, "initrd": guest.initrd,
                "append": format!("{} {extra_append}", guest.append).trim_end(),
            }),
            Duration::from_secs(150),
        );
        self.track(&r);
        let sc = tool_ok(&r, "sandbox_vm");
        assert_eq!(sc["agent_ready"], true, "agent never answered: {sc}");
    }

    /// Remembers the QEMU of a launch_vm or sandbox_vm `CallToolResult` (whatever it says)
    /// for killing.
    pub fn track(&self, call_result: &Value) {
        if let Some(sc) = call_result.get("structuredContent") {
            self.killer.track(sc);
        }
    }

    /// launch_vm on `s` that must succeed (bounded by `timeout`); the QEMU is tracked for
    /// killing before anything is checked. Returns the structured result.
    pub fn launch_on(&self, s: &mut Server, args: Value, timeout: Duration) -> Value {
        let r = s.call_tool_within("launch_vm", args.clone(), timeout);
        self.launched(&r, &args)
    }

    /// [`Lab::launch_on`] the lab's own server.
    pub fn launch(&mut self, args: Value, timeout: Duration) -> Value {
        let r = self
            .srv()
            .call_tool_within("launch_vm", args.clone(), timeout);
        self.launched(&r, &args)
    }

    fn launched(&self, r: &Value, args: &Value) -> Value {
        self.track(r);
        let out = tool_ok(r, &format!("launch_vm {args}"));
        assert!(
            out["pid"].as_i64().is_some(),
            "launch_vm gave no pid: {out}"
        );
        out
    }

    /// Boots the test guest as `name` (1 vCPU, `memory_mb`) and waits (bounded) for its agent.
    /// Returns launch_vm's structured result.
    pub fn boot_test_guest(&mut self, name: &str, memory_mb: u64) -> Value {
        let guest = super::guest::test_guest();
        let args = serde_json::json!({
            "name": name, "kernel": guest.kernel, "initrd": guest.initrd,
            "append": guest.append, "memory_mb": memory_mb, "cpus": 1
        });
        let launched = self.launch(args, Duration::from_secs(300));
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let r = self
                .srv()
                .call_tool("guest_ping", serde_json::json!({"name": name}));
            if r["isError"] == Value::Bool(false) {
                return launched;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no agent in {name}: {}",
                r["content"]
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `sh -c script` in the guest `name` through guest_exec; must exit 0; returns stdout.
    pub fn guest_sh(&mut self, name: &str, script: &str) -> String {
        super::tools::sh(self.srv(), name, script)
    }
}
