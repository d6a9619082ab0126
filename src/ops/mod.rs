//! Shared operations below the tools: what several tools do, so that no tool module imports
//! another. Each takes the call's context (progress, cancellation, log) and answers in tool
//! errors; the MCP adapters in `tools/` keep the schemas, argument parsing and result shapes.

pub mod agent;
pub mod background;
pub mod checks;
pub mod clone;
pub mod disk_size;
pub mod guest;
pub mod guest_clock;
pub mod guest_run;
pub mod guest_stream;
pub mod launch;
pub mod listing;
pub mod pool;
pub mod port_forward;
pub mod quota;
pub mod records;
pub mod sandbox;
pub mod screen;
pub mod session;
pub mod spool;
pub mod stop;
pub mod templates;
pub mod tree_copy;
pub mod watch;
