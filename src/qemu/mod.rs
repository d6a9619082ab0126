//! Talking to QEMU and its tooling.

pub mod agent_calls;
pub mod agent_seen;
pub mod blockdev;
pub mod cmdline;
pub mod encode;
pub mod extra_args;
pub mod firmware;
pub mod forwards;
pub mod frame;
pub mod img;
pub mod keys;
pub mod live_migrate;
pub mod migrate;
pub mod process;
pub mod qcow2;
pub mod qga;
pub mod qmp;
pub mod qmp_calls;
pub mod reseed_elf;
/// Bounded runs of external programs live below, in `host`; kept here under their old path.
pub use crate::host::run;
pub mod scale;
pub mod screen;
pub mod sock;
pub mod untrusted;
pub mod vm;
pub mod wire;
