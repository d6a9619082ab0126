//! The MCP protocol over stdio: framing, lifecycle, dispatch, progress and cancellation.
//! Nothing here knows about QEMU; tools plug in through [`tool::ToolDef`].

pub mod client_roots;
pub mod era;
pub mod listing;
pub mod protocol;
pub mod schema;
pub mod server;
pub mod tool;
pub mod transport;
pub mod workers;
