//! The SeaBIOS an x86 QEMU loads, and whether the pair works: QEMU 8.2 and later with a SeaBIOS
//! older than 1.16.3 (Debian bookworm ships 1.16.2) waits about 32 s in the firmware on every
//! q35 boot, TCG and KVM alike. Which `bios-256k.bin` a QEMU loads is the first one on its data
//! path, which it prints itself (`-L help`: the `-L` folders a wrapper passes come first).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::binaries::Version;
use super::run;

/// The first QEMU version that needs [`FIXED`].
pub const QEMU_NEEDS_FIXED: Version = (8, 2, 0);
/// The first SeaBIOS that does not stall a q35 boot under QEMU >= 8.2.
pub const FIXED: Version = (1, 16, 3);
/// The BIOS file pc and q35 machines load (`bios.bin` only for machine types before 1.7).
pub const BIOS_FILE: &str = "bios-256k.bin";
/// Most bytes read of a BIOS file (bios-256k.bin is 256 KiB).
const READ_CAP: u64 = 4 * 1024 * 1024;

/// How a QEMU and its SeaBIOS go together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pairing {
    /// No known trouble.
    Fine,
    /// q35 boots wait ~32 s in the firmware.
    Stalls,
    /// The QEMU needs [`FIXED`] and the SeaBIOS version could not be read.
    Unknown,
}

/// Whether `qemu` with SeaBIOS `seabios` (None: unreadable) boots q35 without the stall.
pub fn pairing(qemu: Version, seabios: Option<Version>) -> Pairing {
    if qemu < QEMU_NEEDS_FIXED {
        return Pairing::Fine;
    }
    match seabios {
        Some(v) if v >= FIXED => Pairing::Fine,
        Some(_) => Pairing::Stalls,
        None => Pairing::Unknown,
    }
}

/// The SeaBIOS version inside a BIOS image: its version string, a NUL-terminated string of its
/// own (`1.16.2-debian-1.16.2-1`, `rel-1.16.3-0-g3d33c746`, `1.16.3-2.fc40`), or the banner
/// when a build has it spelled out (`SeaBIOS (version 1.16.2-...)`).
pub fn parse_version(bytes: &[u8]) -> Option<(Version, String)> {
    const BANNER: &str = "SeaBIOS (version ";
    bytes
        .split(|b| !(0x20..0x7f).contains(b))
        .filter_map(|s| std::str::from_utf8(s).ok())
        .find_map(|s| {
            let text = s.split_once(BANNER).map_or(s, |(_, v)| v);
            let text = text.trim_end_matches(')');
            version_of(text).map(|v| (v, text.to_string()))
        })
}

/// `X.Y.Z` at the start of a SeaBIOS version string (after an optional `rel-`), followed by
/// nothing or a separator; any other string is not one.
fn version_of(text: &str) -> Option<Version> {
    let rest = text.strip_prefix("rel-").unwrap_or(text);
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, tail) = rest.split_at(end);
    if !(tail.is_empty() || tail.starts_with(['-', '+', '~', '_'])) {
        return None;
    }
    let parts: Vec<u32> = number
        .split('.')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    match parts[..] {
        [a @ 1..=9, b, c] => Some((a, b, c)),
        _ => None,
    }
}

/// The folders `qemu` looks for firmware in, in order (`-L help`: one a line).
pub fn data_dirs(qemu: &Path) -> Vec<PathBuf> {
    run::run(
        Command::new(qemu).args(["-L", "help"]),
        Duration::from_secs(10),
        &|| false,
    )
    .ok()
    .filter(|o| o.status.success())
    .map(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with('/'))
            .map(PathBuf::from)
            .collect()
    })
    .unwrap_or_default()
}

/// The SeaBIOS a QEMU loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Its file.
    pub path: PathBuf,
    /// Its version, with the string it was read from (None: not found in the file).
    pub version: Option<(Version, String)>,
}

/// The first [`BIOS_FILE`] in `dirs`, with its version.
pub fn find_in(dirs: &[PathBuf]) -> Option<Found> {
    use std::io::Read;
    let path = dirs
        .iter()
        .map(|d| d.join(BIOS_FILE))
        .find(|p| p.is_file())?;
    let mut bytes = Vec::new();
    let read = std::fs::File::open(&path)
        .and_then(|f| f.take(READ_CAP).read_to_end(&mut bytes))
        .is_ok();
    Some(Found {
        version: read.then(|| parse_version(&bytes)).flatten(),
        path,
    })
}

/// The SeaBIOS `qemu` loads (None: it names no data folder with one).
pub fn probe(qemu: &Path) -> Option<Found> {
    find_in(&data_dirs(qemu))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BIOS-like buffer: code bytes, then NUL-terminated strings.
    fn image(strings: &[&str]) -> Vec<u8> {
        let mut b = vec![0x55, 0xaa, 0xfa, 0xeb, 0x00];
        for s in strings {
            b.extend_from_slice(s.as_bytes());
            b.push(0);
            b.extend_from_slice(&[0x90, 0xc3, 0x01]);
        }
        b
    }

    #[test]
    fn reads_the_version_string_out_of_a_bios_image() {
        // Around the version: strings real images have (bookworm's bios-256k.bin).
        let debian = image(&[
            "0.1         ",
            "SeaBIOS (version %s)",
            "1.16.2-debian-1.16.2-1",
            "3.4>4",
        ]);
        assert_eq!(
            parse_version(&debian),
            Some(((1, 16, 2), "1.16.2-debian-1.16.2-1".into()))
        );
        let backport = image(&["1.16.3-debian-1.16.3-2~bpo12+1"]);
        assert_eq!(parse_version(&backport).map(|v| v.0), Some((1, 16, 3)));
        let upstream = image(&["rel-1.16.3-0-g3d33c746"]);
        assert_eq!(parse_version(&upstream).map(|v| v.0), Some((1, 16, 3)));
        let banner = image(&["SeaBIOS (version 1.15.0-1)"]);
        assert_eq!(parse_version(&banner).map(|v| v.0), Some((1, 15, 0)));
        assert_eq!(parse_version(&image(&["0.1  ", "3.4>4", "10.0"])), None);
    }

    #[test]
    fn qemu_8_2_and_later_need_seabios_1_16_3() {
        assert_eq!(pairing((10, 0, 2), Some((1, 16, 2))), Pairing::Stalls);
        assert_eq!(pairing((8, 2, 0), Some((1, 15, 0))), Pairing::Stalls);
        assert_eq!(pairing((10, 0, 2), Some((1, 16, 3))), Pairing::Fine);
        assert_eq!(pairing((9, 1, 0), Some((1, 17, 0))), Pairing::Fine);
        assert_eq!(pairing((7, 2, 22), Some((1, 16, 2))), Pairing::Fine);
        assert_eq!(pairing((8, 1, 5), Some((1, 14, 0))), Pairing::Fine);
        assert_eq!(pairing((10, 0, 0), None), Pairing::Unknown);
        assert_eq!(pairing((7, 2, 0), None), Pairing::Fine);
    }

    #[test]
    fn the_first_bios_on_the_data_path_is_the_one() {
        let root = std::env::temp_dir().join(format!("mcqemu-seabios-{}", std::process::id()));
        let (newer, older) = (root.join("newer"), root.join("older"));
        for (dir, v) in [
            (&newer, "rel-1.16.3-0-gabc"),
            (&older, "1.16.2-debian-1.16.2-1"),
        ] {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(dir.join(BIOS_FILE), image(&[v])).unwrap();
        }
        let empty = root.join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let found = find_in(&[empty.clone(), newer.clone(), older.clone()]).unwrap();
        assert_eq!(found.path, newer.join(BIOS_FILE));
        assert_eq!(found.version.map(|v| v.0), Some((1, 16, 3)));
        assert_eq!(find_in(&[empty]), None);
        std::fs::remove_dir_all(root).unwrap();
    }
}
