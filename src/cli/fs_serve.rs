//! `mcqemu fs-serve ...` (internal): the file server of one host folder mounted into one VM, a
//! process of its own started with the mount (`fuse::helper` does the work).

use crate::fuse::helper;

/// The subcommand's entry: 0 when its VM ended, 2 on a failure (written to stderr, which the
/// starter points at the mount's log).
pub fn main(args: &[String]) -> i32 {
    match helper::parse_args(args).and_then(|c| helper::run(&c)) {
        Ok(()) => 0,
        Err(e) => {
            crate::log::stderr("error", &format!("fs-serve: {e}"));
            2
        }
    }
}
