//! Egress by name: a VM with `allow_network` rules runs in an empty network of its own, where
//! the only thing its guest can reach is an HTTP proxy of mcqemu's (`mcqemu egress-proxy`, one
//! process per VM, living as long as the VM) that lets through what the rules name.

pub mod forwards;
pub mod netns;
pub mod process;
pub mod proxy;
pub mod relay;
pub mod request;
pub mod rules;
pub mod stats;
