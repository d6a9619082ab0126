//! `mcqemu egress-proxy ...` (internal): the entry of one VM's egress proxy, a process of its
//! own started with the VM (`net::egress::process` does the work).

use crate::net::egress::process;

/// The subcommand's entry: 0 when its VM ended, 2 on a start-up failure (written to stderr).
pub fn main(args: &[String]) -> i32 {
    if args == ["--probe"] {
        return match process::probe() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("{e}");
                2
            }
        };
    }
    match process::parse_args(args).and_then(|c| process::run(&c)) {
        Ok(()) => 0,
        Err(e) => {
            crate::log::stderr("error", &format!("egress proxy: {e}"));
            2
        }
    }
}
