//! Disk images: cloud images pulled and verified, and the catalog of them.

pub mod catalog;
pub mod pull;
