//! The test guests: a tiny Linux built by `tests/guest/build_guest.py`, booted directly from its
//! kernel and initramfs, for x86_64 ([`test_guest`]) and for aarch64 on QEMU's `virt` board
//! ([`test_guest_arm64`]).

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

/// Longest wait for the test-guest build, its lock included (about 25 s when nothing is cached;
/// another test binary or the bench may be building it).
pub const GUEST_BUILD_TIMEOUT: Duration = Duration::from_secs(600);

/// The tiny Linux test guest built by `tests/guest/build_guest.py` (direct kernel boot).
#[derive(Clone, Debug)]
pub struct Guest {
    /// Uncompressed kernel: a PVH-bootable vmlinux on x86_64, the raw arm64 `Image` (with its
    /// EFI stub, so QEMU's `-kernel` and UEFI firmware both boot it) on aarch64.
    pub kernel: String,
    /// The initramfs.
    pub initrd: String,
    /// The kernel command line to boot it with.
    pub append: String,
}

/// The test guest, built once per process (see [`try_test_guest`]); fails the test when it
/// cannot be built.
pub fn test_guest() -> Guest {
    try_test_guest().unwrap_or_else(|e| panic!("{e}"))
}

/// Builds the test guest once per process into `<workspace>/target/test-guest` (cached there by
/// package versions across runs); later calls return the first call's outcome. A file lock
/// keeps two test binaries (or a test binary and the bench) from building it at the same time;
/// the builder also renames its finished folder into place atomically. Everything, the wait for
/// the lock included, is bounded by [`GUEST_BUILD_TIMEOUT`].
pub fn try_test_guest() -> Result<Guest, String> {
    static GUEST: OnceLock<Result<Guest, String>> = OnceLock::new();
    GUEST.get_or_init(build).clone()
}

/// The aarch64 test guest (for `arch: aarch64` on the `virt` board; its serial console is
/// `ttyAMA0`), built once per process (see [`try_test_guest_arm64`]); fails the test when it
/// cannot be built.
pub fn test_guest_arm64() -> Guest {
    try_test_guest_arm64().unwrap_or_else(|e| panic!("{e}"))
}

/// Builds the aarch64 test guest from Debian's arm64 packages once per process, into the same
/// `<workspace>/target/test-guest` cache as the x86_64 one (its own keys there, and its own apt
/// lists in `apt-arm64/`), under the same build lock and bound ([`GUEST_BUILD_TIMEOUT`]).
pub fn try_test_guest_arm64() -> Result<Guest, String> {
    static GUEST: OnceLock<Result<Guest, String>> = OnceLock::new();
    GUEST.get_or_init(build_arm64).clone()
}

/// Which agent the test guest carries, from `MCQEMU_TEST_AGENT`: qemu-ga (unset or
/// `qemu-ga`), mcqemu-agent started by the guest's init (`mcqemu`), or mcqemu-agent as the
/// guest's PID 1 (`mcqemu-init`). CI runs the agent suites once more with each of ours.
pub fn agent_variant() -> Result<Option<&'static str>, String> {
    match std::env::var("MCQEMU_TEST_AGENT").as_deref() {
        Err(_) | Ok("") | Ok("qemu-ga") => Ok(None),
        Ok("mcqemu") => Ok(Some("service")),
        Ok("mcqemu-init") => Ok(Some("init")),
        Ok(other) => Err(format!(
            "MCQEMU_TEST_AGENT={other:?}: use qemu-ga, mcqemu or mcqemu-init"
        )),
    }
}

fn build() -> Result<Guest, String> {
    try_test_guest_with(agent_variant()?)
}

/// The x86_64 test guest with qemu-ga (`None`) or with mcqemu-agent started by its init
/// (`Some("service")`) or as its PID 1 (`Some("init")`), whatever `MCQEMU_TEST_AGENT` says
/// (for the bench, which compares them in one run). Built on each call (the builder's own
/// cache makes a repeat cost its package check, about a second).
pub fn try_test_guest_with(mode: Option<&str>) -> Result<Guest, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = root.join("target").join("test-guest");
    let script = root.join("tests").join("guest").join("build_guest.py");
    let Some(mode) = mode else {
        let v = super::cli::run_locked_builder("test guest", &script, &out, GUEST_BUILD_TIMEOUT)?;
        return from_json(&v);
    };
    guest_with_agent("x86_64", mode)
}

/// The aarch64 test guest carrying mcqemu-agent (built for aarch64) in `mode` (`init`: as its
/// PID 1; `bare`: with no shell at all).
pub fn try_test_guest_arm64_with(mode: &str) -> Result<Guest, String> {
    guest_with_agent("aarch64", mode)
}

fn guest_with_agent(arch: &str, mode: &str) -> Result<Guest, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = root.join("target").join("test-guest");
    let script = root.join("tests").join("guest").join("build_guest.py");
    let agent = static_agent(&format!("{arch}-unknown-linux-musl"))?;
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(&script)
        .args(["--arch", arch])
        .arg("--agent")
        .arg(&agent)
        .args(["--agent-mode", mode])
        .arg(&out);
    let what = "test guest with mcqemu-agent";
    let stdout = super::cli::run_locked(what, &mut cmd, &out, GUEST_BUILD_TIMEOUT)?;
    let v: serde_json::Value = serde_json::from_slice(&stdout).map_err(|e| {
        format!(
            "build_guest.py --agent printed no JSON ({e}): {}",
            String::from_utf8_lossy(&stdout)
        )
    })?;
    from_json(&v)
}

/// The static mcqemu-agent for a musl `target`, built (or found up to date) by cargo: the
/// program the guests carry.
pub fn static_agent(target: &str) -> Result<std::path::PathBuf, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.current_dir(root).args([
        "build",
        "--release",
        "--quiet",
        "--bin",
        "mcqemu-agent",
        "--target",
        target,
    ]);
    if target.starts_with("aarch64") {
        // A cross build with no aarch64 C toolchain: clang for ring's C, and the LLD that
        // ships with every rustup toolchain to link (as .ci/cross-aarch64 does).
        cmd.env("CC_aarch64_unknown_linux_musl", "clang")
            .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER", "rust-lld");
    }
    let done = super::cli::try_run_command(&mut cmd, None, GUEST_BUILD_TIMEOUT)?;
    if !done.status.success() {
        return Err(format!(
            "building mcqemu-agent for {target} failed ({}): {} (the target comes from \
             `rustup target add {target}`)",
            done.status,
            String::from_utf8_lossy(&done.stderr)
        ));
    }
    let target_dir = std::env::var("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| root.join("target"));
    Ok(target_dir.join(target).join("release").join("mcqemu-agent"))
}

fn build_arm64() -> Result<Guest, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = root.join("target").join("test-guest");
    let script = root.join("tests").join("guest").join("build_guest.py");
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(&script).args(["--arch", "aarch64"]).arg(&out);
    let what = "aarch64 test guest";
    let stdout = super::cli::run_locked(what, &mut cmd, &out, GUEST_BUILD_TIMEOUT)?;
    let v: serde_json::Value = serde_json::from_slice(&stdout).map_err(|e| {
        format!(
            "build_guest.py --arch aarch64 printed no JSON ({e}): {}",
            String::from_utf8_lossy(&stdout)
        )
    })?;
    from_json(&v)
}

fn from_json(v: &serde_json::Value) -> Result<Guest, String> {
    let field = |k: &str| {
        v[k].as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("build_guest.py output lacks {k}: {v}"))
    };
    Ok(Guest {
        kernel: field("kernel")?,
        initrd: field("initrd")?,
        append: field("append")?,
    })
}

/// Whether mcqemu-agent (not qemu-ga) answers VM `vm`, by guest_info's version.
pub fn our_agent_answers(s: &mut super::Server, vm: &str) -> bool {
    let info = s.call_ok("guest_info", serde_json::json!({ "name": vm }));
    info["version"]
        .as_str()
        .is_some_and(|v| v.starts_with("mcqemu-agent"))
}
