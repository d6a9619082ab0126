//! Host folders served into guests: a FUSE file server on the host side of a virtio-serial
//! port, whose guest side (`mcqemu-agent`'s relay, [`crate::agent::mounts`]) mounts FUSE and
//! passes the kernel's requests through. The server runs in a process of its own per mount
//! (`mcqemu fs-serve`, [`helper`]), so a mount lives as long as its VM, not its MCP server.
//!
//! - `abi`: the wire format; `nodes`: the files the guest holds, as descriptors;
//!   [`server`]: the requests answered; [`helper`]: the process, its port and its status file.

mod abi;
pub mod helper;
mod nodes;
pub mod server;

#[cfg(test)]
mod tests;
