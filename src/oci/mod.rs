//! Container images as the roots of VMs: what an image reference means ([`reference`]), an
//! image fetched from a registry into a local layout ([`registry`]), an image read from an OCI image layout ([`layout`]: index, the guest's platform, config,
//! layers, every blob checked against its digest), its layers applied into a folder
//! ([`unpack`]), the agent's config for the image's Env, WorkingDir and User written into it ([`guest`]),
//! and that folder made an ext4 image with the image's owners ([`rootfs`]).
//! Below ops; knows no VM.

pub mod archive;
pub mod error;
pub mod guest;
pub mod layout;
pub mod reference;
pub mod registry;
pub mod rootfs;
pub mod unpack;
