//! The cloud-init seed's ISO 9660 writer: arbitrary names and contents never panic, and every
//! image it accepts is well formed: whole sectors, both volume descriptors, each root folder's
//! records inside its sector with lengths that chain exactly, and each file's bytes at the
//! extent its Joliet record names.
#![no_main]

use libfuzzer_sys::{fuzz_target, Corpus};
use mcqemu::cloudinit::iso::{write, SECTOR};

fn le32(b: &[u8]) -> usize {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
}

fuzz_target!(|data: &[u8]| -> Corpus {
    if data.len() > 32 * 1024 {
        return Corpus::Reject;
    }
    // Input: files separated by 0xFF; in each, the name ends at the first 0x00.
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for part in data.split(|b| *b == 0xFF).take(10) {
        let (name, body) = match part.iter().position(|b| *b == 0) {
            Some(i) => (&part[..i], &part[i + 1..]),
            None => (part, &[][..]),
        };
        files.push((String::from_utf8_lossy(name).into_owned(), body.to_vec()));
    }
    let refs: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice()))
        .collect();
    let Ok(img) = write("cidata", &refs, 1_764_547_200) else {
        return Corpus::Keep;
    };
    assert_eq!(img.len() % SECTOR, 0);
    assert_eq!(&img[16 * SECTOR + 1..16 * SECTOR + 6], b"CD001");
    assert_eq!(img[16 * SECTOR], 1);
    assert_eq!(img[17 * SECTOR], 2);
    assert_eq!(img[18 * SECTOR], 255);
    let total = le32(&img[16 * SECTOR + 80..]);
    assert_eq!(total * SECTOR, img.len());
    for root_sector in [
        le32(&img[16 * SECTOR + 158..]),
        le32(&img[17 * SECTOR + 158..]),
    ] {
        let dir = &img[root_sector * SECTOR..(root_sector + 1) * SECTOR];
        let mut at = 0;
        let mut seen = 0;
        while at < SECTOR && dir[at] != 0 {
            let len = dir[at] as usize;
            assert!(
                len >= 34 && at + len <= SECTOR,
                "record at {at} of length {len}"
            );
            let id_len = dir[at + 32] as usize;
            assert!(33 + id_len <= len);
            let extent = le32(&dir[at + 2..]);
            let size = le32(&dir[at + 10..]);
            assert!((extent * SECTOR + size) <= img.len());
            at += len;
            seen += 1;
        }
        assert_eq!(
            seen,
            files.len() + 2,
            "every file has a record, plus . and .."
        );
    }
    // The Joliet names map back to the files, with their bytes at their extents.
    let jroot = le32(&img[17 * SECTOR + 158..]);
    let dir = &img[jroot * SECTOR..(jroot + 1) * SECTOR];
    let mut at = dir[0] as usize + dir[dir[0] as usize] as usize;
    for (name, body) in &files {
        let len = dir[at] as usize;
        let id_len = dir[at + 32] as usize;
        let units: Vec<u16> = dir[at + 33..at + 33 + id_len]
            .chunks(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(&String::from_utf16_lossy(&units), name);
        let extent = le32(&dir[at + 2..]);
        assert_eq!(
            &img[extent * SECTOR..extent * SECTOR + body.len()],
            body.as_slice()
        );
        at += len;
    }
    Corpus::Keep
});
