//! The guest agent's entry point: everything is in the library's `agent` module (std and libc
//! only), so that its request reader can be fuzzed.

fn main() {
    std::process::exit(mcqemu::agent::main(std::env::args().skip(1).collect()));
}
