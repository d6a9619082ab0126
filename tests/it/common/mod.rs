//! The end-to-end harness: runs the built `mcqemu` binary and speaks MCP to it over pipes, one
//! JSON message per line. Every wait is bounded, so a hung server fails a test instead of
//! hanging it. Shared by every suite in `tests/it/` and by the bench (`benches/mcp_latency/main.rs`,
//! which includes it with `#[path]`).
//!
//! Helpers panic with a readable message, which is what a test wants. Those the bench needs
//! also come as `try_` variants returning that message as an `Err`, so that one failing bench
//! row prints an error row instead of aborting the bench; the panicking variant is a thin
//! wrapper over its `try_` one.
//!
//! - `server.rs`: the [`Server`] process, requests and responses, the protocol constants.
//! - `tools.rs`: `tools/call` helpers on [`Server`] and the `CallToolResult` checks.
//! - `lab.rs`: [`Lab`], the fixture of tests that run real QEMUs.
//! - `qemu.rs`: guest slots, short runtime folders, [`VmKiller`], /proc and pidfile helpers,
//!   `qemu-img info`.
//! - `guest.rs`: the test guest ([`test_guest`]), with qemu-ga or mcqemu-agent
//!   (`MCQEMU_TEST_AGENT`, [`try_test_guest_with`]), and the static agent it carries.
//! - `cloud.rs`: the test cloud image, Debian with cloud-init ([`test_cloud_image`]).
//! - `desktop.rs`: the desktop image (Xorg, openbox, a Tk program logging its input).
//! - `installer.rs`: the Debian 12 installer ISO ([`test_installer`]).
//! - `stock.rs`: the stock-shaped cloud image (GPT, GRUB, the cloud kernel, no agent).
//! - `qemu10.rs`: QEMU 10.0 unpacked beside the system's 7.2.
//! - `kernel.rs`: today's Debian kernel packages, named to every server.
//! - `cli.rs`: bounded runs of the `mcqemu` CLI and of external programs.
//! - `http.rs`: a local HTTP server with fixed routes.
//! - `files.rs`: [`TempDir`], folder listings, pseudo-random data, SHA-256.
//! - `browser.rs`: Chromium and the npm packages of the live-view tests (`tests/browser/`).
//! - `tokens.rs`: the tool list's size in a real tokenizer's tokens.
//! - `schema.rs`: every tool result read is checked against the tool's `outputSchema`.
//! - `security.rs`: the fixtures of the `security_*` tests: [`Fence`], [`Tripwire`], refusals.

// The bench compiles this whole harness but uses only part of it, and an item it never uses
// is dead code to it; the allow sits here once instead of on every module.
#![allow(dead_code)]

pub mod arm64;
pub mod b64;
pub mod browser;
mod cli;
mod cloud;
pub mod cloud_guest;
pub mod desktop;
pub mod dirlock;
pub mod evdev;
mod files;
mod guest;
mod http;
mod installer;
pub mod kernel;
mod lab;
mod qemu;
pub mod qemu10;
pub mod registry;
pub mod schema;
mod security;
mod server;
pub mod stock;
pub mod tls;
pub mod tokens;
mod tools;
pub mod view;

// One item, so that one allow covers it: a binary that uses nothing from a module leaves that
// part of the re-export unused.
#[allow(unused_imports)]
pub use self::{
    cli::*, cloud::*, files::*, guest::*, http::*, installer::*, lab::*, qemu::*, security::*,
    server::*, tools::*,
};
