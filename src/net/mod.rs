//! The network: HTTP(S) downloads for `image_download`.

pub mod download;
