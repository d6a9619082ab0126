//! The MCP protocol over stdio: framing, lifecycle, dispatch, progress and cancellation, and
//! resources. Nothing here knows about QEMU: tools plug in through [`tool::ToolDef`], and what
//! the resources are through a [`resources::Provider`] the caller hands to the server.

pub mod args;
pub mod call;
pub mod client_roots;
pub mod era;
pub mod instructions;
pub mod listing;
pub mod progress;
pub mod protocol;
pub mod resources;
pub mod schema;
pub mod server;
pub mod subscriptions;
pub mod tool;
pub mod tool_error;
pub mod transport;
pub mod workers;
