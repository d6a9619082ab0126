//! The network: HTTP(S) downloads for `image_download` and `image_pull`, the publishers'
//! checksum files, and the catalog of distribution cloud images.

pub mod catalog;
pub mod checksums;
pub mod digest;
pub mod download;
pub mod egress;
pub mod error;
pub mod http;
pub mod resume;
