//! Disk images: qemu-img's create, info, convert and resize, internal snapshots of images at
//! rest, files downloaded, cloud images pulled and verified, and the catalog of them.

pub mod catalog;
pub mod disk;
pub mod download;
pub mod pull;
pub mod snapshots;
