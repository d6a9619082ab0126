//! Thin entry point: everything lives in the library so tests and fuzz targets can reach it.

fn main() {
    std::process::exit(mcqemu::cli::main(std::env::args().skip(1).collect()));
}
