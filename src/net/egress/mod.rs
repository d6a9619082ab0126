//! Egress by name: a VM with `allow_network` rules runs in an empty network of its own, where
//! the only thing its guest can reach is an HTTP proxy of mcqemu's (`mcqemu egress-proxy`, one
//! process per VM, living as long as the VM) that lets through what the rules name, and adds
//! the operator's secrets to requests to their hosts ([`secrets`], [`rewrite`], [`tls`]).

pub mod forwards;
pub mod netns;
pub mod process;
pub mod proxy;
pub mod relay;
pub mod request;
pub mod rewrite;
pub mod rules;
pub mod secrets;
pub mod stats;
pub mod tls;
