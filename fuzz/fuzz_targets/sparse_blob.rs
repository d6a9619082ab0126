//! The packed-memory reader (`mcqemu::oci::sparse::unpack`): the fuzz bytes are a blob from a
//! registry, untrusted. It must never panic, never write past the length the blob declares,
//! and either refuse the blob or leave a file of exactly that length; the file it wrote
//! (up to 16 MiB) packs again and unpacks to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcqemu::oci::sparse;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("mcq-fuzz-sparse-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let out = dir.join("file");
    let mut src = data;
    if sparse::unpack(&mut src, &out).is_ok() {
        let declared = u64::from_le_bytes(data[16..24].try_into().unwrap());
        let len = std::fs::metadata(&out).unwrap().len();
        assert_eq!(len, declared, "the file is not the length the blob declares");
        if declared > 16 << 20 {
            let _ = std::fs::remove_file(&out);
            return;
        }
        let mut again = Vec::new();
        sparse::pack(&out, &mut again).unwrap();
        let mut back = again.as_slice();
        let out2 = dir.join("file2");
        sparse::unpack(&mut back, &out2).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&out2).unwrap());
    }
    let _ = std::fs::remove_file(&out);
});
