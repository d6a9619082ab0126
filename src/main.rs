//! Thin entry point: everything lives in the library so tests and fuzz targets can reach it.

/// The static musl build allocates through dlmalloc: musl's own allocator, built for hardening,
/// made every call half again slower than in the glibc build.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOC: mcqemu::host::alloc::Dl = mcqemu::host::alloc::Dl;

fn main() {
    std::process::exit(mcqemu::cli::main(std::env::args().skip(1).collect()));
}
