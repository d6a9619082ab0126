//! Where the guest agent (`mcqemu-agent`, built static for each guest architecture) lives on
//! this host: the program mcqemu puts into roots and images it prepares. Looked for in order:
//! `$MCQEMU_AGENT_DIR/mcqemu-agent-ARCH`, beside the running `mcqemu` as
//! `mcqemu-agent-ARCH`, and in the cargo target folder the running binary was built in
//! (`target/ARCH-unknown-linux-musl/release/mcqemu-agent`). A missing one is an error that
//! names the command that builds it.

use std::path::{Path, PathBuf};

/// The musl target triple of a guest architecture.
pub fn triple(arch: &str) -> String {
    format!("{arch}-unknown-linux-musl")
}

/// The command that builds the agent for `arch` (on a host of another architecture, with
/// clang for ring's C and rust-lld to link, as `.ci/cross-aarch64` does).
pub fn build_command(arch: &str) -> String {
    let t = triple(arch);
    let cross = if arch == std::env::consts::ARCH {
        String::new()
    } else {
        let env = t.replace('-', "_");
        format!(
            "CC_{env}=clang CARGO_TARGET_{}_LINKER=rust-lld ",
            env.to_ascii_uppercase()
        )
    };
    format!(
        "rustup target add {t} && {cross}cargo build --release --target {t} --bin mcqemu-agent \
         (in mcqemu's source folder; .ci/build-agents there builds it for x86_64 and aarch64)"
    )
}

/// The places looked at for `arch`'s agent, in order, given the agent folder set by the
/// operator and the running binary's path.
pub fn candidates(arch: &str, dir: Option<&Path>, exe: Option<&Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let named = format!("mcqemu-agent-{arch}");
    if let Some(d) = dir {
        out.push(d.join(&named));
    }
    if let Some(bin_dir) = exe.and_then(Path::parent) {
        out.push(bin_dir.join(&named));
        // target/release/mcqemu or target/TRIPLE/release/mcqemu: the target folder is the
        // nearest ancestor named "target".
        if let Some(target) = bin_dir
            .ancestors()
            .find(|a| a.file_name().is_some_and(|n| n == "target"))
        {
            out.push(
                target
                    .join(triple(arch))
                    .join("release")
                    .join("mcqemu-agent"),
            );
        }
    }
    out
}

/// `arch`'s agent: its path, or an error saying where it was looked for and how to build it.
pub fn find(arch: &str) -> Result<PathBuf, String> {
    let dir = std::env::var_os("MCQEMU_AGENT_DIR").map(PathBuf::from);
    let exe = std::env::current_exe().ok();
    let looked = candidates(arch, dir.as_deref(), exe.as_deref());
    looked.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        let places: Vec<String> = looked.iter().map(|p| p.display().to_string()).collect();
        format!(
            "no mcqemu-agent for {arch} guests (looked at {}); build it with: {}, or put \
                 one at $MCQEMU_AGENT_DIR/mcqemu-agent-{arch}",
            places.join(", "),
            build_command(arch)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looks_in_the_operator_folder_beside_the_binary_and_in_its_target_folder() {
        let c = candidates(
            "aarch64",
            Some(Path::new("/opt/agents")),
            Some(Path::new(
                "/src/mcqemu/target/x86_64-unknown-linux-musl/release/mcqemu",
            )),
        );
        assert_eq!(
            c,
            vec![
                PathBuf::from("/opt/agents/mcqemu-agent-aarch64"),
                PathBuf::from(
                    "/src/mcqemu/target/x86_64-unknown-linux-musl/release/mcqemu-agent-aarch64"
                ),
                PathBuf::from("/src/mcqemu/target/aarch64-unknown-linux-musl/release/mcqemu-agent"),
            ]
        );
        let c = candidates("x86_64", None, Some(Path::new("/usr/local/bin/mcqemu")));
        assert_eq!(c, vec![PathBuf::from("/usr/local/bin/mcqemu-agent-x86_64")]);
        assert!(build_command("aarch64").contains("aarch64-unknown-linux-musl"));
        if std::env::consts::ARCH == "x86_64" {
            assert!(build_command("aarch64")
                .contains("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=rust-lld"));
            assert!(!build_command("x86_64").contains("CC_"));
        }
    }
}
