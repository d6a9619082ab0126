//! Where the guest agent (`mcqemu-agent`, built static for each guest architecture) lives on
//! this host: the program mcqemu puts into roots and images it prepares. Looked for in order:
//! `$MCQEMU_AGENT_DIR/mcqemu-agent-ARCH` (the operator's), beside the running `mcqemu` as
//! `mcqemu-agent-ARCH`, in the cargo target folder the running binary was built in
//! (`target/ARCH-unknown-linux-musl/release/mcqemu-agent`, a developer's fresh build), and
//! last the one inside this binary (`src/build.rs`), written out once to
//! `<state>/agents/mcqemu-agent-ARCH-DIGEST` and checked by digest. A missing one is an error
//! that names the command that builds it.

use crate::kind::Failed;
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/agents.rs"));
}

/// The architectures whose agent this binary carries.
pub fn embedded_arches() -> Vec<&'static str> {
    embedded::EMBEDDED.iter().map(|(a, _)| *a).collect()
}

/// The agent inside this binary for `arch`, unpacked, and its SHA-256 (hex); None when this
/// build carries none for it.
fn embedded(arch: &str) -> Option<Result<(Vec<u8>, String), Failed>> {
    let (_, xz) = embedded::EMBEDDED.iter().find(|(a, _)| *a == arch)?;
    let mut out = Vec::new();
    let unpacked = lzma_rust2::XzReader::new(*xz, true)
        .take(64 << 20)
        .read_to_end(&mut out);
    Some(match unpacked {
        Ok(_) => {
            let digest =
                crate::net::digest::hex(ring::digest::digest(&ring::digest::SHA256, &out).as_ref());
            Ok((out, digest))
        }
        Err(e) => Err(Failed::host(format!(
            "the {arch} agent inside this binary is damaged: {e}"
        ))),
    })
}

/// The embedded agent for `arch` as a file (written out once per digest, and checked by
/// digest once per process); None when this build carries none.
pub fn written_out(arch: &str) -> Option<Result<PathBuf, Failed>> {
    static DONE: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let done = DONE.get_or_init(Mutex::default);
    if let Some(p) = done.lock().ok().and_then(|d| d.get(arch).cloned()) {
        return Some(Ok(p));
    }
    let (bytes, digest) = match embedded(arch)? {
        Ok(x) => x,
        Err(e) => return Some(Err(e)),
    };
    let dir = crate::state::paths::state_dir().join("agents");
    let path = dir.join(format!("mcqemu-agent-{arch}-{}", &digest[..16]));
    let same = std::fs::read(&path).is_ok_and(|have| {
        crate::net::digest::hex(ring::digest::digest(&ring::digest::SHA256, &have).as_ref())
            == digest
    });
    if !same {
        if let Err(e) = write_exec(&dir, &path, &bytes) {
            return Some(Err(Failed::host(format!(
                "cannot write the {arch} agent inside this binary to {}: {e}",
                path.display()
            ))));
        }
    }
    if let Ok(mut d) = done.lock() {
        d.insert(arch.to_string(), path.clone());
    }
    Some(Ok(path))
}

/// Writes `bytes` to `path` (mode 0755) through a temporary file renamed into place.
fn write_exec(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".agent.{}.tmp", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o755)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

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
pub fn find(arch: &str) -> Result<PathBuf, Failed> {
    let dir = std::env::var_os("MCQEMU_AGENT_DIR").map(PathBuf::from);
    let exe = std::env::current_exe().ok();
    let looked = candidates(arch, dir.as_deref(), exe.as_deref());
    if let Some(p) = looked.iter().find(|p| p.is_file()) {
        return Ok(p.clone());
    }
    if let Some(r) = written_out(arch) {
        return r;
    }
    Err({
        let places: Vec<String> = looked.iter().map(|p| p.display().to_string()).collect();
        Failed::not_found(format!(
            "no mcqemu-agent for {arch} guests: this mcqemu was built without the agents inside \
             it, and none is at {}; build it with: {}, or put one at \
             $MCQEMU_AGENT_DIR/mcqemu-agent-{arch}",
            places.join(", "),
            build_command(arch)
        ))
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
