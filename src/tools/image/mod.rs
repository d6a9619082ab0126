//! Image tools: qemu-img (create, info, convert, resize), snapshots at rest, downloads, pulls and
//! the catalog, image_prepare.

pub mod catalog;
pub mod disk;
pub mod download;
pub mod prepare;
pub mod pull;
pub mod snapshots;
