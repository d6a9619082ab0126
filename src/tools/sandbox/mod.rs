//! Sandbox tools: sandbox_vm and sandbox_destroy, forks and suspends, templates, their pools,
//! and their travel between hosts.

pub mod fork;
pub mod template;
pub mod template_manage;
pub mod travel;
pub mod vm;
