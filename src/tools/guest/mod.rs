//! Guest-agent tools: ping, info, exec (and background processes), files, listings, tree copies.

pub mod agent;
pub mod background;
pub mod copy;
