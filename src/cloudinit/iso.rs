//! A small ISO 9660 writer for cloud-init NoCloud seeds: one root folder of regular files, with
//! Joliet names (so every reader sees `user-data`, not `USER_DAT.;1`) and Rock Ridge entries
//! (POSIX modes and names for Linux). No genisoimage at run time: the image is built in memory,
//! a few kilobytes for a seed.
//!
//! Layout, in 2048-byte sectors: 0-15 system area, 16 primary volume descriptor, 17 Joliet
//! supplementary descriptor, 18 terminator, 19-22 the path tables (L and M for each tree),
//! then each tree's root folder, then the files, each starting on its own sector.

/// Bytes per logical sector.
pub const SECTOR: usize = 2048;
/// Most files in one image (each tree's root folder fits in one sector).
pub const MAX_FILES: usize = 8;
/// Longest file name accepted.
pub const MAX_NAME: usize = 64;
/// Largest file accepted.
pub const MAX_FILE_BYTES: usize = 16 * 1024 * 1024;

const PVD: usize = 16;
const SVD: usize = 17;
const TERMINATOR: usize = 18;
const L_PATH: usize = 19;
const M_PATH: usize = 20;
const JL_PATH: usize = 21;
const JM_PATH: usize = 22;
const ROOT: usize = 23;
const JROOT: usize = 24;
const FIRST_FILE: usize = 25;

/// Why an image could not be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IsoError {
    /// A name that is empty, too long, has a `/` or NUL, or is `.`/`..`.
    BadName(String),
    /// The same name twice.
    Duplicate(String),
    /// More than [`MAX_FILES`] files, or a file over [`MAX_FILE_BYTES`].
    TooLarge(String),
    /// A volume id that is empty or over 16 characters.
    BadVolumeId(String),
}

impl std::fmt::Display for IsoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IsoError::BadName(n) => write!(f, "invalid file name for the seed image: {n:?}"),
            IsoError::Duplicate(n) => write!(f, "the seed image names {n:?} twice"),
            IsoError::TooLarge(what) => write!(f, "the seed image is too large: {what}"),
            IsoError::BadVolumeId(v) => write!(f, "invalid volume id {v:?} (1-16 characters)"),
        }
    }
}

impl std::error::Error for IsoError {}

/// A date for the volume and every record (seconds since the epoch, UTC).
#[derive(Clone, Copy, Debug)]
struct Date {
    year: u32,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
}

impl Date {
    fn from_unix(secs: i64) -> Date {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        Date {
            year: year.clamp(1970, 2155) as u32,
            month: month as u32,
            day: day as u32,
            hour: (rem / 3600) as u32,
            minute: (rem % 3600 / 60) as u32,
            second: (rem % 60) as u32,
        }
    }

    /// The 7-byte form of directory records.
    fn short(self) -> [u8; 7] {
        [
            (self.year - 1900) as u8,
            self.month as u8,
            self.day as u8,
            self.hour as u8,
            self.minute as u8,
            self.second as u8,
            0,
        ]
    }

    /// The 17-byte form of volume descriptors.
    fn long(self) -> [u8; 17] {
        let text = format!(
            "{:04}{:02}{:02}{:02}{:02}{:02}00",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        );
        let mut out = [0u8; 17];
        out[..16].copy_from_slice(&text.as_bytes()[..16]);
        out
    }
}

fn both32(v: u32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&v.to_le_bytes());
    b[4..].copy_from_slice(&v.to_be_bytes());
    b
}

fn both16(v: u16) -> [u8; 4] {
    let mut b = [0u8; 4];
    b[..2].copy_from_slice(&v.to_le_bytes());
    b[2..].copy_from_slice(&v.to_be_bytes());
    b
}

/// An ISO 9660 level-1 name for `name`: upper-case d-characters, 8.3, `;1`, unique.
fn iso_name(name: &str, taken: &mut Vec<String>) -> String {
    let clean = |s: &str, max: usize| -> String {
        s.chars()
            .map(|c| c.to_ascii_uppercase())
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .take(max)
            .collect()
    };
    let (stem, ext) = match name.rsplit_once('.') {
        Some((s, e)) if !s.is_empty() => (s, e),
        _ => (name, ""),
    };
    let stem = clean(stem, 8);
    let ext = clean(ext, 3);
    let mut candidate = format!("{stem}.{ext};1");
    let mut n = 1;
    while taken.contains(&candidate) {
        let suffix = n.to_string();
        let cut: String = stem.chars().take(8 - suffix.len().min(7)).collect();
        candidate = format!("{cut}{suffix}.{ext};1");
        n += 1;
    }
    taken.push(candidate.clone());
    candidate
}

fn ucs2(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(|u| u.to_be_bytes()).collect()
}

/// A directory record. `id` is the identifier bytes; `su` the system-use area.
fn record(extent: usize, size: usize, dir: bool, date: Date, id: &[u8], su: &[u8]) -> Vec<u8> {
    let pad = usize::from(id.len().is_multiple_of(2));
    let su_pad = su.len() % 2;
    let len = 33 + id.len() + pad + su.len() + su_pad;
    let mut r = Vec::with_capacity(len);
    r.push(len as u8);
    r.push(0);
    r.extend_from_slice(&both32(extent as u32));
    r.extend_from_slice(&both32(size as u32));
    r.extend_from_slice(&date.short());
    r.push(if dir { 0x02 } else { 0x00 });
    r.push(0);
    r.push(0);
    r.extend_from_slice(&both16(1));
    r.push(id.len() as u8);
    r.extend_from_slice(id);
    r.extend(std::iter::repeat_n(0, pad));
    r.extend_from_slice(su);
    r.extend(std::iter::repeat_n(0, su_pad));
    r
}

/// Rock Ridge PX: POSIX mode, links, uid, gid (RRIP 1.09 form, 36 bytes).
fn px(mode: u32, links: u32) -> Vec<u8> {
    let mut e = vec![b'P', b'X', 36, 1];
    for v in [mode, links, 0, 0] {
        e.extend_from_slice(&both32(v));
    }
    e
}

/// Rock Ridge NM: the file's real name.
fn nm(name: &str) -> Vec<u8> {
    let mut e = vec![b'N', b'M', (5 + name.len()) as u8, 1, 0];
    e.extend_from_slice(name.as_bytes());
    e
}

/// SUSP SP (marks the use of SUSP) and ER (names the Rock Ridge extension), for the root's
/// own record.
fn sp_er() -> Vec<u8> {
    let mut e = vec![b'S', b'P', 7, 1, 0xBE, 0xEF, 0];
    let (id, des, src) = (&b"RRIP_1991A"[..], &b"ROCK RIDGE 1.09"[..], &b"MCQEMU"[..]);
    e.extend_from_slice(&[
        b'E',
        b'R',
        (8 + id.len() + des.len() + src.len()) as u8,
        1,
        id.len() as u8,
        des.len() as u8,
        src.len() as u8,
        1,
    ]);
    e.extend_from_slice(id);
    e.extend_from_slice(des);
    e.extend_from_slice(src);
    e
}

fn put(img: &mut [u8], at: usize, bytes: &[u8]) {
    img[at..at + bytes.len()].copy_from_slice(bytes);
}

fn padded(text: &str, len: usize, joliet: bool) -> Vec<u8> {
    let mut out = if joliet {
        ucs2(text)
    } else {
        text.as_bytes().to_vec()
    };
    out.truncate(len);
    while out.len() < len {
        if joliet && out.len() + 1 < len {
            out.extend_from_slice(&[0x00, 0x20]);
        } else {
            out.push(b' ');
        }
    }
    out
}

fn check_name(name: &str) -> Result<(), IsoError> {
    let bad = name.is_empty()
        || name.len() > MAX_NAME
        || name == "."
        || name == ".."
        || name.contains('/')
        || name.contains('\0')
        || name.chars().any(char::is_control);
    if bad {
        Err(IsoError::BadName(name.to_string()))
    } else {
        Ok(())
    }
}

/// Writes an image holding `files` (name, contents) in its root folder, labelled `volume_id`,
/// dated `unix_time`.
pub fn write(
    volume_id: &str,
    files: &[(&str, &[u8])],
    unix_time: i64,
) -> Result<Vec<u8>, IsoError> {
    check_inputs(volume_id, files)?;
    let date = Date::from_unix(unix_time);
    // Where each file's data starts.
    let mut extents = Vec::with_capacity(files.len());
    let mut next = FIRST_FILE;
    for (_, data) in files {
        extents.push(next);
        next += data.len().div_ceil(SECTOR).max(1);
    }
    let total = next;
    let mut img = vec![0u8; total * SECTOR];
    let (root, jroot) = root_folders(files, &extents, date)?;
    put(&mut img, ROOT * SECTOR, &root);
    put(&mut img, JROOT * SECTOR, &jroot);
    path_tables(&mut img);
    for (sector, joliet) in [(PVD, false), (SVD, true)] {
        let d = volume_descriptor(joliet, volume_id, total, date);
        put(&mut img, sector * SECTOR, &d);
    }
    let term = TERMINATOR * SECTOR;
    img[term] = 255;
    img[term + 1..term + 6].copy_from_slice(b"CD001");
    img[term + 6] = 1;

    for ((_, data), extent) in files.iter().zip(&extents) {
        put(&mut img, extent * SECTOR, data);
    }
    Ok(img)
}

/// The label, the number of files, their names (8.3-able, unique) and sizes.
fn check_inputs(volume_id: &str, files: &[(&str, &[u8])]) -> Result<(), IsoError> {
    if volume_id.is_empty() || volume_id.chars().count() > 16 || !volume_id.is_ascii() {
        return Err(IsoError::BadVolumeId(volume_id.to_string()));
    }
    if files.len() > MAX_FILES {
        return Err(IsoError::TooLarge(format!(
            "{} files (at most {MAX_FILES})",
            files.len()
        )));
    }
    for (i, (name, data)) in files.iter().enumerate() {
        check_name(name)?;
        if files[..i].iter().any(|(n, _)| n == name) {
            return Err(IsoError::Duplicate(name.to_string()));
        }
        if data.len() > MAX_FILE_BYTES {
            return Err(IsoError::TooLarge(format!(
                "{name} is {} bytes",
                data.len()
            )));
        }
    }
    Ok(())
}

/// The two root folders (ISO 9660 with Rock Ridge, and Joliet), one record per file at its
/// extent; an error when they do not fit one sector each.
fn root_folders(
    files: &[(&str, &[u8])],
    extents: &[usize],
    date: Date,
) -> Result<(Vec<u8>, Vec<u8>), IsoError> {
    let mut taken = Vec::new();
    let mut root = Vec::new();
    let mut jroot = Vec::new();
    root.extend(record(
        ROOT,
        SECTOR,
        true,
        date,
        &[0],
        &[sp_er(), px(0o40755, 2)].concat(),
    ));
    root.extend(record(ROOT, SECTOR, true, date, &[1], &px(0o40755, 2)));
    jroot.extend(record(JROOT, SECTOR, true, date, &[0], &[]));
    jroot.extend(record(JROOT, SECTOR, true, date, &[1], &[]));
    for ((name, data), extent) in files.iter().zip(extents) {
        let iso = iso_name(name, &mut taken);
        let su = [px(0o100644, 1), nm(name)].concat();
        root.extend(record(
            *extent,
            data.len(),
            false,
            date,
            iso.as_bytes(),
            &su,
        ));
        jroot.extend(record(*extent, data.len(), false, date, &ucs2(name), &[]));
    }
    if root.len() > SECTOR || jroot.len() > SECTOR {
        return Err(IsoError::TooLarge(
            "the file names do not fit one folder sector".into(),
        ));
    }
    Ok((root, jroot))
}

/// The path tables: one entry each, the root.
fn path_tables(img: &mut [u8]) {
    for (at, extent, big) in [
        (L_PATH, ROOT, false),
        (M_PATH, ROOT, true),
        (JL_PATH, JROOT, false),
        (JM_PATH, JROOT, true),
    ] {
        let loc = if big {
            (extent as u32).to_be_bytes()
        } else {
            (extent as u32).to_le_bytes()
        };
        let parent = if big {
            1u16.to_be_bytes()
        } else {
            1u16.to_le_bytes()
        };
        let entry = [&[1u8, 0][..], &loc, &parent, &[0, 0]].concat();
        put(img, at * SECTOR, &entry);
    }
}

/// The primary (`joliet` false) or Joliet supplementary volume descriptor.
fn volume_descriptor(joliet: bool, volume_id: &str, total: usize, date: Date) -> Vec<u8> {
    let mut d = vec![0u8; SECTOR];
    d[0] = if joliet { 2 } else { 1 };
    d[1..6].copy_from_slice(b"CD001");
    d[6] = 1;
    d[8..40].copy_from_slice(&padded("LINUX", 32, joliet));
    d[40..72].copy_from_slice(&padded(volume_id, 32, joliet));
    d[80..88].copy_from_slice(&both32(total as u32));
    if joliet {
        d[88..91].copy_from_slice(b"%/E");
    }
    d[120..124].copy_from_slice(&both16(1));
    d[124..128].copy_from_slice(&both16(1));
    d[128..132].copy_from_slice(&both16(SECTOR as u16));
    d[132..140].copy_from_slice(&both32(10));
    let (l, m, r) = if joliet {
        (JL_PATH, JM_PATH, JROOT)
    } else {
        (L_PATH, M_PATH, ROOT)
    };
    d[140..144].copy_from_slice(&(l as u32).to_le_bytes());
    d[148..152].copy_from_slice(&(m as u32).to_be_bytes());
    let root_rec = record(r, SECTOR, true, date, &[0], &[]);
    d[156..156 + 34].copy_from_slice(&root_rec[..34]);
    for (from, to) in [(190, 318), (318, 446), (446, 574), (574, 702)] {
        d[from..to].copy_from_slice(&padded("", to - from, joliet));
    }
    d[574..702].copy_from_slice(&padded("MCQEMU", 128, joliet));
    for (from, to) in [(702, 739), (739, 776), (776, 813)] {
        d[from..to].copy_from_slice(&padded("", to - from, joliet));
    }
    d[813..830].copy_from_slice(&date.long());
    d[830..847].copy_from_slice(&date.long());
    d[847..863].copy_from_slice(b"0000000000000000");
    d[864..880].copy_from_slice(b"0000000000000000");
    d[881] = 1;
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the Joliet root folder back: (name, extent, size) of each file.
    fn joliet_files(img: &[u8]) -> Vec<(String, usize, usize)> {
        let root = &img[JROOT * SECTOR..(JROOT + 1) * SECTOR];
        let mut out = Vec::new();
        let mut at = 0;
        while at < root.len() && root[at] != 0 {
            let len = root[at] as usize;
            let r = &root[at..at + len];
            let id_len = r[32] as usize;
            let id = &r[33..33 + id_len];
            if id != [0] && id != [1] {
                let units: Vec<u16> = id
                    .chunks(2)
                    .map(|c| u16::from_be_bytes([c[0], c[1]]))
                    .collect();
                let extent = u32::from_le_bytes([r[2], r[3], r[4], r[5]]) as usize;
                let size = u32::from_le_bytes([r[10], r[11], r[12], r[13]]) as usize;
                out.push((String::from_utf16_lossy(&units), extent, size));
            }
            at += len;
        }
        out
    }

    #[test]
    fn files_land_on_their_own_sectors_with_their_names() {
        let files: Vec<(&str, &[u8])> = vec![
            ("user-data", b"#cloud-config\nhostname: a\n"),
            ("meta-data", b"instance-id: i-1\n"),
            ("network-config", &[7u8; 5000]),
        ];
        let img = write("cidata", &files, 1_764_547_200).unwrap_or_default();
        assert_eq!(img.len() % SECTOR, 0);
        assert_eq!(&img[PVD * SECTOR + 1..PVD * SECTOR + 6], b"CD001");
        assert_eq!(&img[PVD * SECTOR + 40..PVD * SECTOR + 46], b"cidata");
        let listed = joliet_files(&img);
        assert_eq!(listed.len(), 3);
        for ((name, data), (lname, extent, size)) in files.iter().zip(&listed) {
            assert_eq!(name, lname);
            assert_eq!(*size, data.len());
            assert_eq!(&img[extent * SECTOR..extent * SECTOR + size], *data);
        }
    }

    #[test]
    fn bad_names_duplicates_and_sizes_are_refused() {
        for bad in ["", ".", "..", "a/b", "nul\0", &"x".repeat(65)] {
            assert!(matches!(
                write("cidata", &[(bad, b"")], 0),
                Err(IsoError::BadName(_))
            ));
        }
        assert!(matches!(
            write("cidata", &[("a", b""), ("a", b"")], 0),
            Err(IsoError::Duplicate(_))
        ));
        assert!(matches!(write("", &[], 0), Err(IsoError::BadVolumeId(_))));
        let many: Vec<(&str, &[u8])> = ["a", "b", "c", "d", "e", "f", "g", "h", "i"]
            .iter()
            .map(|n| (*n, &b""[..]))
            .collect();
        assert!(matches!(
            write("cidata", &many, 0),
            Err(IsoError::TooLarge(_))
        ));
    }

    #[test]
    fn iso_names_are_unique_8_3() {
        let mut taken = Vec::new();
        assert_eq!(iso_name("user-data", &mut taken), "USER_DAT.;1");
        assert_eq!(iso_name("user-data-2", &mut taken), "USER_DA1.;1");
        assert_eq!(iso_name("a.tar.gz", &mut taken), "A_TAR.GZ;1");
    }

    #[test]
    fn dates_convert() {
        let d = Date::from_unix(1_764_547_200); // 2025-12-01 00:00:00
        assert_eq!((d.year, d.month, d.day, d.hour), (2025, 12, 1, 0));
        assert_eq!(&d.long()[..14], b"20251201000000");
    }
}
