//! A tiny static Linux program that reseeds a guest kernel's random number generator from bytes
//! the host chose, for clones of one template: they resume with the same CRNG state, and a board
//! without vmgenid (aarch64 `virt`) gives the kernel no sign that it was forked. Writing to
//! /dev/urandom only mixes into the input pool (the CRNG draws from it on its own interval, up
//! to 60 s), so the program also forces the reseed with the RNDRESEEDCRNG ioctl (root only).
//!
//! It does `fd = openat(AT_FDCWD, "/dev/urandom", O_WRONLY)`, `write(fd, seed, 64)`,
//! `ioctl(fd, RNDRESEEDCRNG, 0)` and exits with 0, or with `step << 6 | errno` (errno capped
//! at 63, 0 for a short write): step 1 the open, 2 the write, 3 the ioctl (see [`explain`]).
//!
//! The machine code was written in assembly (beside each constant) and assembled once with GNU
//! as (`aarch64-linux-gnu-as` / `as`, then `objcopy -O binary -j .text`); the bytes are kept
//! here so no build needs a cross assembler. The ELF is one read+execute PT_LOAD segment mapping
//! the whole file: headers, code, the path, then the 64 seed bytes at [`seed_offset`].

/// Where the file is mapped in the guest (above any mmap_min_addr).
const BASE: u64 = 0x40_0000;
/// ELF header plus one program header: the code starts here.
const HEADERS: usize = 64 + 56;
/// The file the program writes to, NUL-terminated.
const PATH: &[u8] = b"/dev/urandom\0";
/// Bytes of host randomness the program writes.
pub const SEED_LEN: usize = 64;

/// The aarch64 code (EM_AARCH64), one word per instruction; `adr` is PC-relative, so the path
/// must sit at code offset 0x78 and the seed at 0x88:
///
/// ```text
/// _start: mov   x0, #-100          // AT_FDCWD
///         adr   x1, path
///         mov   x2, #1             // O_WRONLY
///         mov   x3, #0
///         mov   x8, #56            // openat
///         svc   #0
///         mov   x9, #64            // step 1: open
///         tbnz  x0, #63, fail
///         mov   x10, x0            // fd
///         adr   x1, seed
///         mov   x2, #64
///         mov   x8, #64            // write
///         svc   #0
///         mov   x9, #128           // step 2: write
///         cmp   x0, #64
///         b.ne  fail
///         mov   x0, x10
///         mov   x1, #0x5207        // RNDRESEEDCRNG = _IO('R', 0x07)
///         mov   x2, #0
///         mov   x8, #29            // ioctl
///         svc   #0
///         mov   x9, #192           // step 3: ioctl
///         cbnz  x0, fail
///         mov   x9, #0
/// fail:   cmp   x0, #0
///         csneg x0, xzr, x0, ge    // errno, or 0 for a short write / success
///         and   x0, x0, #63
///         orr   x0, x0, x9         // exit status: step << 6 | errno
///         mov   x8, #93            // exit
///         svc   #0
///         .balign 8, 0
/// path:   .asciz "/dev/urandom"    // at 0x78
///         .balign 8, 0
/// seed:   .space 64                // at 0x88
/// ```
const AARCH64_CODE: [u32; 30] = [
    0x92800c60, 0x100003a1, 0xd2800022, 0xd2800003, 0xd2800708, 0xd4000001, 0xd2800809, 0xb7f80220,
    0xaa0003ea, 0x10000321, 0xd2800802, 0xd2800808, 0xd4000001, 0xd2801009, 0xf101001f, 0x54000121,
    0xaa0a03e0, 0xd28a40e1, 0xd2800002, 0xd28003a8, 0xd4000001, 0xd2801809, 0xb5000040, 0xd2800009,
    0xf100001f, 0xda80a7e0, 0x92401400, 0xaa090000, 0xd2800ba8, 0xd4000001,
];

/// The x86_64 code (EM_X86_64); `lea` is RIP-relative, so the path must sit at code offset 0x88
/// and the seed at 0x98 (x86 clones also get a fresh vmgenid; this is for guests without the
/// vmgenid driver):
///
/// ```text
/// _start: mov  $-100, %rdi         # AT_FDCWD
///         lea  path(%rip), %rsi
///         mov  $1, %edx            # O_WRONLY
///         xor  %r10d, %r10d
///         mov  $257, %eax          # openat
///         syscall
///         mov  $64, %ebx           # step 1: open
///         test %rax, %rax
///         js   fail
///         mov  %rax, %r12          # fd
///         mov  %rax, %rdi
///         lea  seed(%rip), %rsi
///         mov  $64, %edx
///         mov  $1, %eax            # write
///         syscall
///         mov  $128, %ebx          # step 2: write
///         cmp  $64, %rax
///         jne  fail
///         mov  %r12, %rdi
///         mov  $0x5207, %esi       # RNDRESEEDCRNG
///         xor  %edx, %edx
///         mov  $16, %eax           # ioctl
///         syscall
///         mov  $192, %ebx          # step 3: ioctl
///         test %rax, %rax
///         jnz  fail
///         xor  %ebx, %ebx
/// fail:   mov  %rax, %rdi
///         neg  %rdi                # errno when the call failed
///         test %rax, %rax
///         jns  1f
///         and  $63, %edi
///         jmp  2f
/// 1:      xor  %edi, %edi          # a short write or success: no errno
/// 2:      or   %ebx, %edi          # exit status: step << 6 | errno
///         mov  $60, %eax           # exit
///         syscall
///         .balign 8, 0
/// path:   .asciz "/dev/urandom"    # at 0x88
///         .balign 8, 0
/// seed:   .space 64                # at 0x98
/// ```
const X86_64_CODE: [u8; 131] = [
    0x48, 0xc7, 0xc7, 0x9c, 0xff, 0xff, 0xff, // mov $-100, %rdi
    0x48, 0x8d, 0x35, 0x7a, 0x00, 0x00, 0x00, // lea path(%rip), %rsi
    0xba, 0x01, 0x00, 0x00, 0x00, // mov $1, %edx
    0x45, 0x31, 0xd2, // xor %r10d, %r10d
    0xb8, 0x01, 0x01, 0x00, 0x00, // mov $257, %eax
    0x0f, 0x05, // syscall
    0xbb, 0x40, 0x00, 0x00, 0x00, // mov $64, %ebx
    0x48, 0x85, 0xc0, // test %rax, %rax
    0x78, 0x41, // js fail
    0x49, 0x89, 0xc4, // mov %rax, %r12
    0x48, 0x89, 0xc7, // mov %rax, %rdi
    0x48, 0x8d, 0x35, 0x64, 0x00, 0x00, 0x00, // lea seed(%rip), %rsi
    0xba, 0x40, 0x00, 0x00, 0x00, // mov $64, %edx
    0xb8, 0x01, 0x00, 0x00, 0x00, // mov $1, %eax
    0x0f, 0x05, // syscall
    0xbb, 0x80, 0x00, 0x00, 0x00, // mov $128, %ebx
    0x48, 0x83, 0xf8, 0x40, // cmp $64, %rax
    0x75, 0x1d, // jne fail
    0x4c, 0x89, 0xe7, // mov %r12, %rdi
    0xbe, 0x07, 0x52, 0x00, 0x00, // mov $0x5207, %esi
    0x31, 0xd2, // xor %edx, %edx
    0xb8, 0x10, 0x00, 0x00, 0x00, // mov $16, %eax
    0x0f, 0x05, // syscall
    0xbb, 0xc0, 0x00, 0x00, 0x00, // mov $192, %ebx
    0x48, 0x85, 0xc0, // test %rax, %rax
    0x75, 0x02, // jnz fail
    0x31, 0xdb, // xor %ebx, %ebx
    0x48, 0x89, 0xc7, // fail: mov %rax, %rdi
    0x48, 0xf7, 0xdf, // neg %rdi
    0x48, 0x85, 0xc0, // test %rax, %rax
    0x79, 0x05, // jns 1f
    0x83, 0xe7, 0x3f, // and $63, %edi
    0xeb, 0x02, // jmp 2f
    0x31, 0xff, // 1: xor %edi, %edi
    0x09, 0xdf, // 2: or %ebx, %edi
    0xb8, 0x3c, 0x00, 0x00, 0x00, // mov $60, %eax
    0x0f, 0x05, // syscall
];

/// One architecture's program: its ELF machine, code, and where the code expects its data.
struct Layout {
    machine: u16,
    code: Vec<u8>,
    path_at: usize,
    seed_at: usize,
}

fn layout(arch: &str) -> Option<Layout> {
    match arch {
        "aarch64" => Some(Layout {
            machine: 183, // EM_AARCH64
            code: AARCH64_CODE.iter().flat_map(|w| w.to_le_bytes()).collect(),
            path_at: 0x78,
            seed_at: 0x88,
        }),
        "x86_64" => Some(Layout {
            machine: 62, // EM_X86_64
            code: X86_64_CODE.to_vec(),
            path_at: 0x88,
            seed_at: 0x98,
        }),
        _ => None,
    }
}

/// Where the seed sits in [`program`]'s file for `arch` (None: no program for it).
pub fn seed_offset(arch: &str) -> Option<usize> {
    layout(arch).map(|l| HEADERS + l.seed_at)
}

/// The static ELF executable for Linux on `arch` ("aarch64", "x86_64") that writes `seed` into
/// the kernel's input pool and forces a CRNG reseed; None for an architecture without one.
pub fn program(arch: &str, seed: &[u8; SEED_LEN]) -> Option<Vec<u8>> {
    let l = layout(arch)?;
    let size = HEADERS + l.seed_at + SEED_LEN;
    let mut f = Vec::with_capacity(size);
    // ELF header: 64-bit, little-endian, version 1, System V ABI.
    f.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    f.extend_from_slice(&l.machine.to_le_bytes());
    f.extend_from_slice(&1u32.to_le_bytes()); // EV_CURRENT
    f.extend_from_slice(&(BASE + HEADERS as u64).to_le_bytes()); // entry: the code
    f.extend_from_slice(&64u64.to_le_bytes()); // program headers right after this one
    f.extend_from_slice(&0u64.to_le_bytes()); // no section headers
    f.extend_from_slice(&0u32.to_le_bytes()); // flags
    for half in [64u16, 56, 1, 0, 0, 0] {
        // ehsize, phentsize, phnum, shentsize, shnum, shstrndx
        f.extend_from_slice(&half.to_le_bytes());
    }
    // One PT_LOAD, read + execute, mapping the whole file at BASE.
    f.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    f.extend_from_slice(&5u32.to_le_bytes()); // PF_R | PF_X
    f.extend_from_slice(&0u64.to_le_bytes()); // offset
    f.extend_from_slice(&BASE.to_le_bytes()); // vaddr
    f.extend_from_slice(&BASE.to_le_bytes()); // paddr
    f.extend_from_slice(&(size as u64).to_le_bytes()); // filesz
    f.extend_from_slice(&(size as u64).to_le_bytes()); // memsz
    f.extend_from_slice(&0x1000u64.to_le_bytes()); // align
    f.extend_from_slice(&l.code);
    f.resize(HEADERS + l.path_at, 0);
    f.extend_from_slice(PATH);
    f.resize(HEADERS + l.seed_at, 0);
    f.extend_from_slice(seed);
    Some(f)
}

/// What the program's exit status `code` says, for an error message.
pub fn explain(code: i64) -> String {
    let errno = code & 63;
    let detail = |what: &str| match errno {
        0 => format!("{what} (exit status {code})"),
        1 => format!("{what}: EPERM, not root / no CAP_SYS_ADMIN (exit status {code})"),
        61 => format!("{what}: ENODATA, the CRNG is not initialised yet (exit status {code})"),
        e => format!("{what}: errno {e} (exit status {code})"),
    };
    match code {
        0 => "reseeded".into(),
        64..=127 => detail("opening /dev/urandom failed"),
        128..=191 => detail("writing the seed to /dev/urandom failed or was short"),
        192..=255 => detail("the RNDRESEEDCRNG ioctl failed"),
        _ => format!("the program did not run as expected (exit status {code})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed() -> [u8; SEED_LEN] {
        std::array::from_fn(|i| (i as u8).wrapping_mul(37).wrapping_add(1))
    }

    fn u16_at(f: &[u8], at: usize) -> u16 {
        u16::from_le_bytes([f[at], f[at + 1]])
    }

    fn u64_at(f: &[u8], at: usize) -> u64 {
        let mut b = [0; 8];
        b.copy_from_slice(&f[at..at + 8]);
        u64::from_le_bytes(b)
    }

    #[test]
    fn headers_describe_one_executable_segment_over_the_whole_file() {
        for (arch, machine, size) in [
            ("aarch64", 183, 120 + 0x88 + 64),
            ("x86_64", 62, 120 + 0x98 + 64),
        ] {
            let f = program(arch, &seed()).expect(arch);
            assert_eq!(f.len(), size, "{arch}");
            assert_eq!(&f[..8], &[0x7f, b'E', b'L', b'F', 2, 1, 1, 0], "{arch}");
            assert_eq!(u16_at(&f, 16), 2, "ET_EXEC");
            assert_eq!(u16_at(&f, 18), machine, "{arch}");
            assert_eq!(u64_at(&f, 24), BASE + 120, "entry");
            assert_eq!(u64_at(&f, 32), 64, "phoff");
            assert_eq!((u16_at(&f, 54), u16_at(&f, 56)), (56, 1), "one phdr");
            assert_eq!(u16_at(&f, 60), 0, "no sections");
            assert_eq!(&f[64..72], &[1, 0, 0, 0, 5, 0, 0, 0], "PT_LOAD, R+X");
            assert_eq!(u64_at(&f, 72), 0, "offset");
            assert_eq!(u64_at(&f, 80), BASE, "vaddr");
            assert_eq!(u64_at(&f, 96), size as u64, "filesz");
            assert_eq!(u64_at(&f, 104), size as u64, "memsz");
        }
    }

    #[test]
    fn the_seed_ends_the_file_at_its_offset_and_the_path_precedes_it() {
        for arch in ["aarch64", "x86_64"] {
            let f = program(arch, &seed()).expect(arch);
            let at = seed_offset(arch).expect(arch);
            assert_eq!(&f[at..], &seed()[..], "{arch}");
            let l = layout(arch).expect(arch);
            assert_eq!(&f[HEADERS + l.path_at..][..PATH.len()], PATH, "{arch}");
            let other = program(arch, &[0xAA; SEED_LEN]).expect(arch);
            assert_eq!(f[..at], other[..at], "only the seed differs ({arch})");
        }
        assert!(program("riscv64", &seed()).is_none());
        assert!(seed_offset("s390x").is_none());
    }

    /// The target of an aarch64 `adr` at byte `pc` of the code.
    fn adr_target(pc: usize) -> usize {
        let w = AARCH64_CODE[pc / 4];
        assert_eq!(w & 0x9f00_0000, 0x1000_0000, "adr at {pc:#x}");
        let imm = (((w >> 5) & 0x7_ffff) << 2) | ((w >> 29) & 3);
        pc + imm as usize
    }

    /// The target of an x86_64 `lea disp32(%rip)` at byte `pc` of the code.
    fn lea_target(pc: usize) -> usize {
        assert_eq!(
            &X86_64_CODE[pc..pc + 3],
            &[0x48, 0x8d, 0x35],
            "lea at {pc:#x}"
        );
        let mut d = [0; 4];
        d.copy_from_slice(&X86_64_CODE[pc + 3..pc + 7]);
        pc + 7 + i32::from_le_bytes(d) as usize
    }

    #[test]
    fn the_code_points_at_the_path_and_the_seed_where_they_are_placed() {
        let a = layout("aarch64").expect("aarch64");
        assert_eq!((adr_target(0x04), adr_target(0x24)), (a.path_at, a.seed_at));
        assert!(a.code.len() <= a.path_at);
        let x = layout("x86_64").expect("x86_64");
        assert_eq!((lea_target(0x07), lea_target(0x2d)), (x.path_at, x.seed_at));
        assert!(x.code.len() <= x.path_at);
    }

    #[test]
    fn exit_statuses_name_the_failing_step() {
        assert_eq!(explain(0), "reseeded");
        assert!(explain(64 + 2).starts_with("opening /dev/urandom failed: errno 2"));
        assert!(explain(128).contains("short"));
        assert!(explain(192 + 1).contains("EPERM"));
        assert!(explain(192 + 61).contains("ENODATA"));
        assert!(explain(300).contains("did not run"));
    }
}
