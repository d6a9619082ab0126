//! Disk images: stock cloud images prepared for sandboxes, qemu-img's create, info, convert and resize, internal snapshots of images at
//! rest, files downloaded, cloud images pulled and verified, and the catalog of them; container
//! images made VM roots (`oci`).

pub mod catalog;
pub mod disk;
pub mod download;
pub mod prepare;
pub mod pull;
pub mod snapshots;
