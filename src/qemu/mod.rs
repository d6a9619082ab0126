//! Talking to QEMU and its tooling.

pub mod accel;
pub mod cmdline;
pub mod firmware;
pub mod img;
pub mod run;
