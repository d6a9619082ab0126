//! Where things live on disk: user paths, the state and runtime folders.

pub mod paths;
