//! Container images as VM roots, below the sandboxes and image tools that use them: an image
//! pulled (a registry, a layout or a docker-archive) and built into a cached ext4 root
//! ([`pull`]), and the kernel and initrd that boot such a root ([`boot`]).

pub mod boot;
pub mod kernel;
pub mod pull;
