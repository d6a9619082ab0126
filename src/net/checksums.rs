//! Publishers' checksum files: GNU style (`HEX  name`, `HEX *name`) and BSD style
//! (`SHA256 (name) = HEX`, as Fedora writes, possibly inside a PGP-signed message). The
//! algorithm is chosen by the hash's length (64 hex digits: SHA-256, 128: SHA-512).

use super::download::Algo;

/// Longest checksum file read.
pub const MAX_BYTES: usize = 4 * 1024 * 1024;

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The entry for `file_name` in a checksum file: its algorithm and lower-case hex digest.
/// None when the file names no such file with a SHA-256 or SHA-512 hash.
pub fn find(text: &str, file_name: &str) -> Option<(Algo, String)> {
    let wanted = |name: &str| {
        let name = name.trim();
        let name = name.strip_prefix("./").unwrap_or(name);
        name == file_name
    };
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // BSD: ALGO (name) = HEX
        if let Some((left, hex)) = line.rsplit_once(") = ") {
            if let Some((_, name)) = left.split_once(" (") {
                let hex = hex.trim();
                if wanted(name) && is_hex(hex) {
                    if let Some(algo) = Algo::from_hex_len(hex.len()) {
                        return Some((algo, hex.to_ascii_lowercase()));
                    }
                }
            }
            continue;
        }
        // GNU: HEX  name, or HEX *name (binary mode)
        if let Some((hex, name)) = line.split_once(char::is_whitespace) {
            let name = name.trim_start();
            let name = name.strip_prefix('*').unwrap_or(name);
            if is_hex(hex) && wanted(name) {
                if let Some(algo) = Algo::from_hex_len(hex.len()) {
                    return Some((algo, hex.to_ascii_lowercase()));
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const H256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn gnu_and_bsd_styles_and_both_lengths() {
        let h512 = "a".repeat(128);
        let gnu = format!("{H256}  other.img\n{H256} *disk.qcow2\n");
        assert_eq!(
            find(&gnu, "disk.qcow2"),
            Some((Algo::Sha256, H256.to_string()))
        );
        let gnu512 = format!("{}  ./disk.qcow2\n", h512.to_uppercase());
        assert_eq!(
            find(&gnu512, "disk.qcow2"),
            Some((Algo::Sha512, h512.clone()))
        );
        let bsd = format!(
            "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\n# Fedora-Cloud 43\n\
             SHA256 (Fedora-Cloud.qcow2) = {H256}\n-----BEGIN PGP SIGNATURE-----\nxyz\n"
        );
        assert_eq!(
            find(&bsd, "Fedora-Cloud.qcow2"),
            Some((Algo::Sha256, H256.to_string()))
        );
        assert_eq!(find(&bsd, "other.qcow2"), None);
        // MD5 or SHA-1 lines are not taken.
        assert_eq!(
            find(
                "d41d8cd98f00b204e9800998ecf8427e  disk.qcow2\n",
                "disk.qcow2"
            ),
            None
        );
        // A name is matched whole, not as a prefix or suffix.
        assert_eq!(
            find(&format!("{H256}  disk.qcow2.sig\n"), "disk.qcow2"),
            None
        );
    }
}
