//! Disk images: files downloaded, cloud images pulled and verified, and the catalog of them.

pub mod catalog;
pub mod download;
pub mod pull;
