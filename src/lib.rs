//! mcqemu: an MCP server that lets LLM agents run QEMU virtual machines.
//!
//! Layers, each knowing only the ones below it:
//! - [`mcp`]: the protocol (framing, lifecycle, dispatch, progress, cancellation). Knows
//!   nothing of QEMU.
//! - [`tools`]: one module per tool group, saying what each MCP tool means in terms of the
//!   layers below.
//! - [`qemu`]: talking to QEMU and its tooling (qemu-img today).
//! - [`net`]: HTTP downloads for `image_download`.
//! - [`state`]: where things live on disk.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![deny(clippy::print_stdout)]

pub mod b64;
pub mod cli;
pub mod clock;
pub mod cloudinit;
pub mod doctor;
pub mod host;
pub mod log;
pub mod mcp;
pub mod net;
pub mod ops;
pub mod qemu;
pub mod state;
pub mod tools;
