//! Container images as the roots of VMs: what an image reference means ([`reference`]), an
//! image fetched from a registry into a local layout ([`registry`], with the user's
//! credentials and the registry's refusals in [`auth`]), an image read from an OCI image layout ([`layout`]: index, the guest's platform, config,
//! layers, every blob checked against its digest), its layers applied into a folder
//! ([`unpack`]), the agent's config for the image's Env, WorkingDir and User written into it ([`guest`]),
//! and that folder made an ext4 image with the image's owners ([`rootfs`]); and the other
//! way: mcqemu's own artifacts (a saved guest's record and files, [`artifact`], its memory
//! packed without its zeros, [`sparse`]) pushed to a registry or a layout ([`push`]). Blobs
//! move a few at a time ([`parallel`]); a blob another repository of the registry holds is
//! mounted from there ([`origins`]).
//! Below ops; knows no VM.

pub mod archive;
pub mod artifact;
pub mod auth;
mod client;
pub mod error;
pub mod guest;
pub mod layout;
pub mod origins;
mod parallel;
pub mod push;
pub mod reference;
pub mod registry;
pub mod rootfs;
pub mod sparse;
pub mod unpack;
