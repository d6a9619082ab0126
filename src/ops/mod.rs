//! The operations below the tools: what mcqemu does, in typed requests and results, knowing
//! nothing of MCP. Each takes the running call as a [`work::Work`] (progress, cancellation,
//! log) and fails with an [`error::OpError`]; the MCP adapters in `tools/` build the requests
//! from a call's arguments, keep the schemas, and shape the results.

pub mod agent;
pub mod background;
pub mod capture;
pub mod checks;
pub mod clone;
pub mod copy;
pub mod destroy;
pub mod disk_size;
pub mod egress;
pub mod error;
pub mod fork;
pub mod frozen;
pub mod guest;
pub mod guest_clock;
pub mod guest_run;
pub mod guest_stream;
pub mod hold;
pub mod input;
pub mod keyboard;
pub mod launch;
pub mod launch_args;
pub mod listing;
pub mod pointer;
pub mod pool;
pub mod port_forward;
pub mod quota;
pub mod records;
pub mod reseed;
pub mod sandbox;
pub mod sandbox_request;
pub mod scratch;
pub mod screen;
pub mod screen_memory;
pub mod screen_wait;
pub mod screen_watch;
pub mod serial_write;
pub mod session;
pub mod spool;
pub mod stop;
pub mod suspend;
pub mod templates;
pub mod view;
pub mod watch;
pub mod work;
