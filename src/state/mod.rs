//! Where things live on disk: user paths, the state and runtime folders, the VM registry.

pub mod beneath;
pub mod config;
pub mod copy;
pub mod extract;
pub mod flat;
pub mod lockfile;
pub mod paths;
pub mod record;
pub mod registry;
pub mod roots;
pub mod sparse;
pub mod tail;
pub mod tar;
pub mod tree;
