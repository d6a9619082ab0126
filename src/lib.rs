//! mcqemu: an MCP server that lets LLM agents run QEMU virtual machines.
//!
//! Layers, each knowing only the ones below it (no circles between modules, nor between the
//! files of one):
//! - [`mcp`]: the protocol (framing, eras, dispatch, workers, progress, cancellation,
//!   resources' protocol side). Knows nothing of QEMU: the CLI hands it the tools and the
//!   resource provider.
//! - [`tools`]: the MCP adapters, one module per tool group (and `tools/resources.rs` for the
//!   VM resources): schemas, typed requests built from a call's arguments, result shapes;
//!   `tools/boundary.rs` is where operation errors become tool errors.
//! - [`ops`]: the operations, in typed requests and results, run under a [`ops::work::Work`]
//!   (cancellation, progress, log) and failing with [`ops::error::OpError`]; no MCP.
//! - [`qemu`], [`host`], [`cloudinit`], [`net`], [`oci`]: QEMU and its tooling; what this host
//!   can run; cloud-init seeds; HTTP downloads; container images.
//! - [`state`]: where things live on disk (paths, the registry, the roots, tails and trees).
//!
//! [`agent`] is apart: the guest side, `mcqemu-agent`, a program of its own (std and libc only)
//! that runs inside guests.
//!
//! [`cli`] wires them: `serve` hands [`tools::ALL`] and the resource provider to the server.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![deny(clippy::print_stdout)]

pub mod agent;
pub mod b64;
pub mod cli;
pub mod clock;
pub mod cloudinit;
pub mod fuse;
pub mod host;
pub mod kind;
pub mod log;
pub mod mcp;
pub mod net;
pub mod oci;
pub mod ops;
pub mod qemu;
pub mod schema;
pub mod state;
pub mod tools;
