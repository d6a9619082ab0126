//! The operations below the tools: what mcqemu does, in typed requests and results, knowing
//! nothing of MCP. Each takes the running call as a [`work::Work`] (progress, cancellation,
//! log) and fails with an [`error::OpError`]; the MCP adapters in `tools/` build the requests
//! from a call's arguments, keep the schemas, and shape the results.
//!
//! In folders by domain: `vm` (a VM's life and record), `guest` (inside a guest, through its
//! agent and the data channel), `screen` (the screen and input), `sandbox` (sandboxes,
//! templates, clones, pools, forks, suspends), `image` (cloud images pulled and their catalog), `container` (container images as
//! roots, below sandbox and image). Beside them: the one error type (`error`), where
//! the layers' errors become it (`session`), what a call gives an operation (`work`) and a
//! download's progress (`watch`).

pub mod container;
pub mod error;
pub mod guest;
pub mod image;
pub mod sandbox;
pub mod screen;
pub mod session;
pub mod vm;
pub mod watch;
pub mod watcher;
pub mod work;
