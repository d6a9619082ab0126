//! Puts the guest agents inside the binary: `.ci/build-agents` leaves the static
//! `mcqemu-agent` for each guest architecture, xz-compressed, in `target/mcqemu-agents/`
//! (`MCQEMU_EMBED_AGENTS` names another folder), and this script makes them constants of the
//! library (`host::agent` writes one out where a guest needs it, checked by digest). A build
//! without them works: `doctor` then says the agents are not embedded.

use std::path::PathBuf;

const ARCHES: [&str; 2] = ["x86_64", "aarch64"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=MCQEMU_EMBED_AGENTS");
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");
    let dir = match std::env::var_os("MCQEMU_EMBED_AGENTS") {
        Some(d) => PathBuf::from(d),
        None => std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default())
                    .join("target")
            })
            .join("mcqemu-agents"),
    };
    // The folder exists, so cargo watches it (a missing path would rerun this script, and
    // rebuild the crate, on every build).
    let _ = std::fs::create_dir_all(&dir);
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut code =
        String::from("/// The agents inside this binary: (architecture, xz-compressed program).\n");
    code.push_str("pub const EMBEDDED: &[(&str, &[u8])] = &[\n");
    for arch in ARCHES {
        let f = dir.join(format!("mcqemu-agent-{arch}.xz"));
        if f.is_file() {
            code.push_str(&format!(
                "    ({arch:?}, include_bytes!({:?})),\n",
                f.display().to_string()
            ));
        }
    }
    code.push_str("];\n");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default()).join("agents.rs");
    if std::fs::read_to_string(&out).ok().as_deref() != Some(code.as_str()) {
        if let Err(e) = std::fs::write(&out, code) {
            println!("cargo:warning=cannot write {}: {e}", out.display());
        }
    }
}
