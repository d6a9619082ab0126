//! The static musl build's allocator. musl's own, built for hardening rather than speed, made
//! the shipped server half again slower than the glibc build (list_vms over 100 VMs: 20.2
//! against 13.8 ms), so a server (and `call`, `view`, `ps`) allocates through dlmalloc, a
//! pure-Rust port, under one process-wide lock. The long-lived helpers (`watch`, `supervise`,
//! `fs-serve`, `egress-proxy`: one of some per VM, running for hours) keep musl's, which hands
//! freed memory back and so stays small. Which one a process uses is decided once, at its
//! first allocation, from its own command line, before any pointer exists.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU8, Ordering};

/// The allocator `src/main.rs` declares global in musl builds.
pub struct Dl;

/// The one dlmalloc heap and the mutex that guards it.
struct Heap {
    dl: UnsafeCell<dlmalloc::Dlmalloc>,
    lock: UnsafeCell<libc::pthread_mutex_t>,
}

// SAFETY: every use of `dl` holds `lock` (see `with`).
unsafe impl Sync for Heap {}

static HEAP: Heap = Heap {
    dl: UnsafeCell::new(dlmalloc::Dlmalloc::new()),
    lock: UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER),
};

/// Not decided yet, dlmalloc, or the system's allocator.
const UNDECIDED: u8 = 0;
const DLMALLOC: u8 = 1;
const SYSTEM: u8 = 2;
static CHOICE: AtomicU8 = AtomicU8::new(UNDECIDED);

/// The subcommands that keep the system's allocator.
const HELPERS: [&[u8]; 4] = [b"watch", b"supervise", b"fs-serve", b"egress-proxy"];

/// Whether this process allocates through dlmalloc, decided at the first call. Reads
/// /proc/self/cmdline into a buffer on the stack: nothing is allocated to decide.
fn uses_dlmalloc() -> bool {
    match CHOICE.load(Ordering::Acquire) {
        DLMALLOC => return true,
        SYSTEM => return false,
        _ => {}
    }
    let mut buf = [0u8; 512];
    // SAFETY: open/read/close with a NUL-terminated path and a buffer of the given length.
    let n = unsafe {
        let fd = libc::open(
            c"/proc/self/cmdline".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            0
        } else {
            let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
            libc::close(fd);
            n.max(0) as usize
        }
    };
    let choice = choice_for(&buf[..n]);
    // The first thread to decide wins; a racing one decides the same from the same file.
    let _ = CHOICE.compare_exchange(UNDECIDED, choice, Ordering::AcqRel, Ordering::Acquire);
    CHOICE.load(Ordering::Acquire) == DLMALLOC
}

/// The allocator for a process whose /proc/self/cmdline is `cmdline`.
fn choice_for(cmdline: &[u8]) -> u8 {
    let first_arg = cmdline.split(|&b| b == 0).nth(1).unwrap_or(b"");
    if HELPERS.contains(&first_arg) {
        SYSTEM
    } else {
        DLMALLOC
    }
}

/// Runs `f` on the heap with its lock held.
fn with<T>(f: impl FnOnce(&mut dlmalloc::Dlmalloc) -> T) -> T {
    // SAFETY: the mutex is a static initialised by PTHREAD_MUTEX_INITIALIZER; lock and unlock
    // pair up around `f`, and nothing in `f` allocates through this allocator again.
    unsafe {
        libc::pthread_mutex_lock(HEAP.lock.get());
        let out = f(&mut *HEAP.dl.get());
        libc::pthread_mutex_unlock(HEAP.lock.get());
        out
    }
}

// SAFETY: dlmalloc honours size and alignment, every call to it is serialised by the lock, and
// a process sends all its pointers to the one allocator it chose before its first.
unsafe impl GlobalAlloc for Dl {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !uses_dlmalloc() {
            // SAFETY: as GlobalAlloc::alloc's contract.
            return unsafe { System.alloc(layout) };
        }
        // SAFETY: as GlobalAlloc::alloc's contract.
        with(|dl| unsafe { dl.malloc(layout.size(), layout.align()) })
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !uses_dlmalloc() {
            // SAFETY: `ptr` came from System with `layout`.
            return unsafe { System.dealloc(ptr, layout) };
        }
        // SAFETY: `ptr` came from this heap with `layout`.
        with(|dl| unsafe { dl.free(ptr, layout.size(), layout.align()) })
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !uses_dlmalloc() {
            // SAFETY: as GlobalAlloc::alloc_zeroed's contract.
            return unsafe { System.alloc_zeroed(layout) };
        }
        // SAFETY: as GlobalAlloc::alloc_zeroed's contract.
        with(|dl| unsafe { dl.calloc(layout.size(), layout.align()) })
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !uses_dlmalloc() {
            // SAFETY: `ptr` came from System with `layout`; new_size is non-zero.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // SAFETY: `ptr` came from this heap with `layout`; new_size is non-zero.
        with(|dl| unsafe { dl.realloc(ptr, layout.size(), layout.align(), new_size) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_helpers_keep_the_systems_allocator_and_the_rest_use_dlmalloc() {
        assert_eq!(choice_for(b"/usr/bin/mcqemu\0watch\0--state\0/s\0"), SYSTEM);
        assert_eq!(choice_for(b"mcqemu\0supervise\0x\0"), SYSTEM);
        assert_eq!(choice_for(b"mcqemu\0fs-serve\0"), SYSTEM);
        assert_eq!(choice_for(b"mcqemu\0egress-proxy\0"), SYSTEM);
        assert_eq!(choice_for(b"mcqemu\0"), DLMALLOC, "serve, the default");
        assert_eq!(choice_for(b"mcqemu\0call\0list_vms\0"), DLMALLOC);
        assert_eq!(choice_for(b"mcqemu\0watcher\0"), DLMALLOC);
        assert_eq!(choice_for(b""), DLMALLOC);
    }

    /// The heap on its own (the tests run on the system allocator): what it hands out is
    /// aligned, keeps its bytes across a realloc, and comes back zeroed when asked.
    #[test]
    fn the_heap_allocates_aligns_reallocates_and_zeroes() {
        // SAFETY: sizes and alignments are valid and non-zero; every pointer is freed with them.
        unsafe {
            let p = with(|dl| dl.malloc(100, 64));
            assert!(!p.is_null() && (p as usize).is_multiple_of(64));
            p.write_bytes(7, 100);
            let q = with(|dl| dl.realloc(p, 100, 64, 1 << 20));
            assert_eq!(*q.add(99), 7);
            with(|dl| dl.free(q, 1 << 20, 64));
            let z = with(|dl| dl.calloc(4096, 8));
            assert!((0..4096).all(|i| *z.add(i) == 0));
            with(|dl| dl.free(z, 4096, 8));
        }
    }
}
