//! The kernel unpacker behind PVH boot (`host::vmlinux`): the fuzz bytes become the LZ4 payload
//! of a minimal bzImage header, so every input reaches the legacy-frame and block decoders.
//! Nothing may panic; output stays within the decoder's caps.
#![no_main]

use libfuzzer_sys::fuzz_target;

/// Where the payload starts: setup_sects 0 means 4, plus the boot sector, in 512-byte sectors.
const START: usize = 5 * 512;

fuzz_target!(|data: &[u8]| {
    let mut image = vec![0u8; START];
    image[0x202..0x206].copy_from_slice(b"HdrS");
    image[0x24c..0x250].copy_from_slice(&(data.len() as u32).to_le_bytes());
    image.extend_from_slice(data);
    if let Some(elf) = mcqemu::host::vmlinux::extract(&image) {
        assert!(elf.starts_with(b"\x7fELF"));
        assert!(elf.len() <= 512 << 20);
    }
});
