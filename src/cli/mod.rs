//! The front ends, one a subcommand: serve (default: the stdio MCP server), tools, `call`
//! (one tool from the shell), `doctor`, `view` (the live view over local HTTP), the egress
//! helper's entry, --version, --help. Every tool call goes through `mcp::call`.

#![allow(clippy::print_stdout)] // this subcommand's results are its stdout; `serve` prints nothing

mod call;
pub mod doctor;
mod egress;
mod fs_serve;
mod ps;
mod supervise;
mod view;

use serde_json::Value;

use crate::tools;

const HELP: &str = "mcqemu - an MCP server that lets LLM agents run QEMU virtual machines

USAGE:
    mcqemu [serve] [--root DIR]... [--tools GROUPS]
                                        serve MCP on stdin/stdout (what MCP clients run);
                                        --root: a folder the tools may reach (repeatable);
                                        --tools: only these groups (sandbox,guest,...; all)
    mcqemu tools [--json | --groups]    list the tools (one line each, or full definitions),
                                        or the groups --tools takes
    mcqemu call TOOL ['{json}' | -]     run one tool and print its structured result
                   [--out FILE]         save image content (screenshots) to FILE
    mcqemu doctor                       check the host: QEMU, qemu-img, KVM, firmware, folders
    mcqemu ps                           the VMs as a table: state, CPU, memory, disk,
                                        deadline, idle clock, why each ended
    mcqemu view NAME [--open] [--port N]
                                        the live view of VM NAME for a browser: prints a
                                        local URL with a secret (--open starts the browser)
    mcqemu egress-proxy ...             (internal) one VM's egress proxy, started with it
    mcqemu fs-serve ...                 (internal) one VM's mounted host folder, started with it
    mcqemu supervise ...                (internal) one VM's QEMU's parent: records why it ended
    mcqemu watch --state DIR            (internal) the state folder's lifetime watcher
    mcqemu --version | --help

EXIT STATUS (call): 0 success, 2 usage error; a tool error's kind (printed in brackets):
    1 host_failed, 3 not_found, 4 busy, 5 refused, 6 invalid_argument, 7 guest_failed,
    8 timed_out, 9 cancelled.

ENVIRONMENT:
    MCQEMU_STATE_DIR, MCQEMU_RUNTIME_DIR   where the registry/logs and sockets live
    MCQEMU_ACCEL                           default accelerator (auto, kvm, tcg)
    MCQEMU_QEMU_DIR                        folder of another QEMU build (qemu-system-*, qemu-img)
    MCQEMU_QEMU_IMG                        qemu-img binary to use
    MCQEMU_ROOTS                           folders the tools may reach (DIR:DIR:...), like --root
    MCQEMU_TOOLS                           the tool groups to serve (like --tools; default all)
    MCQEMU_MAX_VMS, MCQEMU_MAX_MEMORY_MB   quotas: running VMs, their memory together
    MCQEMU_MAX_DISK_GB                     quota: largest disk_size (default 2048)
    MCQEMU_CATALOG_MIRROR                  fetch catalog images from http(s)://MIRROR/HOST/PATH
    MCQEMU_IMAGE_KERNEL_DEB[_AARCH64]      the Debian kernel package container images boot,
                                           as URL-or-path#sha256=HEX (default: mcqemu's pin)
    MCQEMU_AGENT_DIR                       a folder of mcqemu-agent-ARCH files to use instead
                                           of the agents inside this binary
";

/// `serve [--root DIR]... [--tools GROUPS]`: sets the roots (flags and `MCQEMU_ROOTS`
/// together) and the tools (the flag, else `MCQEMU_TOOLS`, else all), then serves.
fn serve(args: &[String]) -> i32 {
    let mut roots = crate::state::roots::env_roots();
    let mut groups = std::env::var("MCQEMU_TOOLS").unwrap_or_default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match (a.as_str(), it.next()) {
            ("--root", Some(dir)) => roots.push(dir.into()),
            ("--root", None) => return usage("--root needs a folder"),
            ("--tools", Some(g)) => groups = g.clone(),
            ("--tools", None) => return usage("--tools needs groups, e.g. --tools sandbox,guest"),
            (other, _) => return usage(&format!("unknown serve option {other:?}")),
        }
    }
    let served =
        match tools::groups::select(tools::ALL, crate::mcp::protocol::INSTRUCTIONS, &groups) {
            Ok(s) => s,
            Err(e) => return usage(&format!("--tools / MCQEMU_TOOLS: {e}")),
        };
    if let Err(e) = crate::state::roots::set_operator_roots(&roots) {
        return usage(&e.msg);
    }
    let hook: crate::mcp::client_roots::RootsHook = crate::state::roots::set_client_roots;
    crate::state::registry::shared().keep_reads();
    crate::ops::sandbox::pool::start_keeper();
    // VMs with lifetimes whose watcher died (a reboot, a kill) are watched again.
    if crate::state::registry::shared()
        .load()
        .values()
        .any(|r| r.lifetime.is_some())
    {
        crate::ops::vm::lifetime::ensure_watcher();
    }
    crate::mcp::server::serve_stdio(served, Some(tools::resources::provider()), Some(hook))
}

/// Runs the CLI with the arguments after the program name; returns the exit code.
pub fn main(args: Vec<String>) -> i32 {
    let first = args.first().map(String::as_str);
    if !matches!(first, Some("supervise" | "egress-proxy" | "fs-serve")) {
        supervise_qemu();
        crate::mcp::call::set_hooks(tools::activity::HOOKS);
    }
    match first {
        None => serve(&[]),
        Some("serve") => serve(&args[1..]),
        Some("--root" | "--tools") => serve(&args),
        Some("--version") | Some("-V") | Some("version") => {
            println!("mcqemu {}", env!("CARGO_PKG_VERSION"));
            0
        }
        Some("--help") | Some("-h") | Some("help") => {
            print!("{HELP}");
            0
        }
        Some("tools") => list_tools(&args[1..]),
        Some("call") => call::main(&args[1..]),
        Some("doctor") => doctor::run_doctor(),
        Some("view") => view::main(&args[1..]),
        Some("egress-proxy") => egress::main(&args[1..]),
        Some("fs-serve") => fs_serve::main(&args[1..]),
        Some("supervise") => supervise::main(&args[1..]),
        Some("watch") => watch(&args[1..]),
        Some("ps") => ps::main(&args[1..]),
        Some(other) => usage(&format!("unknown command {other:?}")),
    }
}

/// `watch --state DIR`: the lifetime watcher of that state folder, until nothing is left.
fn watch(args: &[String]) -> i32 {
    match args {
        [flag, dir] if flag == "--state" => {
            std::env::set_var("MCQEMU_STATE_DIR", dir);
            crate::ops::watcher::run()
        }
        _ => usage("watch needs --state DIR"),
    }
}

/// Every QEMU this process starts runs under `mcqemu supervise`, which records why it ended.
fn supervise_qemu() {
    if let Ok(exe) = std::env::current_exe() {
        let state = crate::state::paths::state_dir();
        crate::qemu::process::supervise_with(vec![
            exe.into(),
            "supervise".into(),
            "--state".into(),
            state.into(),
        ]);
    }
}

pub(crate) fn usage(msg: &str) -> i32 {
    eprintln!("mcqemu: {msg}\n\n{HELP}");
    2
}

fn list_tools(rest: &[String]) -> i32 {
    match rest.first().map(String::as_str) {
        Some("--json") => {
            let all: Vec<Value> = tools::ALL.iter().map(|t| t.to_json()).collect();
            println!("{}", serde_json::to_string_pretty(&all).unwrap_or_default());
            0
        }
        None => {
            use std::io::Write;
            let width = tools::ALL.iter().map(|t| t.name.len()).max().unwrap_or(0);
            let mut out = std::io::stdout().lock();
            for t in tools::ALL {
                // A closed pipe (`mcqemu tools | head`) ends the listing, not the process.
                if writeln!(out, "{:<width$}  {}", t.name, t.title).is_err() {
                    break;
                }
            }
            0
        }
        Some("--groups") => {
            for g in tools::groups::GROUPS {
                println!("{:<8} {} tools: {}", g.name, g.tools.len(), g.about);
            }
            0
        }
        Some(other) => usage(&format!("unknown option {other:?} for 'tools'")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_help_gives_each_kind_its_exit_status() {
        let said: String = super::HELP.split_whitespace().collect::<Vec<_>>().join(" ");
        for k in crate::kind::ErrorKind::ALL {
            let entry = format!("{} {}", k.exit_code(), k.code());
            assert!(said.contains(&entry), "--help does not say {entry:?}");
        }
    }
}
