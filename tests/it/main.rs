//! The end-to-end suites, one module each, in one test binary: the harness (`common/`) is
//! compiled and linked once, and `cargo test` runs every suite's tests on one pool of threads,
//! whose QEMU guests share one limit ([`common::QEMU_SLOTS`]). Run one suite with
//! `cargo test --test it -- lifecycle::`, one test by its name.

mod common;

mod agent_bare;
mod arm64;
mod arm64_screen;
mod cli;
mod cloud_init_boot;
mod cloud_init_seed;
mod copy_faults;
mod desktop;
mod download;
mod egress;
mod forks;
mod guest_agent;
mod guest_copy;
mod guest_work;
mod image_tools;
mod inspector;
mod install_journey;
mod lifecycle;
mod lifetimes;
mod live_view;
mod load;
mod mcp_protocol;
mod mounts;
mod oci;
mod oci_arm64;
mod oci_auth;
mod oci_boot;
mod oci_roots;
mod one_file;
mod pools;
mod progress;
mod pull;
mod qemu_versions;
mod qmp_faults;
mod resources;
mod screen_wait;
mod screenshots;
mod sdk_clients;
mod secrets;
mod security_images;
mod security_paths;
mod security_qemu;
mod see_and_drive;
mod stock_image;
mod templates;
mod tool_groups;
mod travel;
mod view_browser;
mod wedged;
