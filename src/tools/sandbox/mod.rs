//! Sandbox tools: sandbox_vm and sandbox_destroy, forks and suspends, templates and their pools.

pub mod fork;
pub mod template;
pub mod template_manage;
pub mod vm;
