//! Publishers' checksum files, in the formats they write:
//!
//! - GNU style, as `sha256sum`/`sha512sum` write it: `HEX  name`, or `HEX *name` in binary
//!   mode (Debian's `SHA512SUMS`, Ubuntu's `SHA256SUMS`);
//! - BSD style, `SHA256 (name) = HEX` (Fedora's `…-CHECKSUM`), with `# comment` lines, possibly
//!   inside a PGP clear-signed message (only the signed text is read; the signature is not
//!   checked here);
//! - one file per image holding its bare digest, `HEX` with optional whitespace and maybe the
//!   file name after it (Alpine's `<image>.sha512`).
//!
//! The algorithm is chosen by the hash's length (64 hex digits: SHA-256, 128: SHA-512); a BSD
//! line's algorithm name must agree with it.

use super::download::Algo;

/// Longest checksum file read.
pub const MAX_BYTES: usize = 4 * 1024 * 1024;

const PGP_SIGNED: &str = "-----BEGIN PGP SIGNED MESSAGE-----";
const PGP_SIGNATURE: &str = "-----BEGIN PGP SIGNATURE-----";

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `hex` as a digest: its algorithm (by length) and lower-case form.
fn digest(hex: &str) -> Option<(Algo, String)> {
    if !is_hex(hex) {
        return None;
    }
    Algo::from_hex_len(hex.len()).map(|algo| (algo, hex.to_ascii_lowercase()))
}

/// The lines of the text a checksum file vouches for. In a PGP clear-signed message (RFC 4880
/// 7.1) those are the lines after the armor headers and the blank line that ends them, up to
/// the signature, with dash-escaping (`- ` before a line starting with `-`) undone; anything
/// outside the message is ignored. Otherwise every line.
fn signed_lines(text: &str) -> Vec<&str> {
    let mut lines = text.lines();
    if !text.lines().any(|l| l.trim_end() == PGP_SIGNED) {
        return lines.collect();
    }
    lines.by_ref().find(|l| l.trim_end() == PGP_SIGNED);
    // Armor headers ("Hash: SHA256") up to the first blank line.
    lines.by_ref().find(|l| l.trim().is_empty());
    lines
        .take_while(|l| l.trim_end() != PGP_SIGNATURE)
        .map(|l| l.strip_prefix("- ").unwrap_or(l))
        .collect()
}

/// The entry for `file_name` in a checksum file: its algorithm and lower-case hex digest.
/// None when the file names no such file with a SHA-256 or SHA-512 hash. A file that holds
/// nothing but one bare digest (a per-file checksum, as Alpine publishes) names no file: its
/// digest is taken for whichever file the checksum file was given for.
pub fn find(text: &str, file_name: &str) -> Option<(Algo, String)> {
    let wanted = |name: &str| {
        let name = name.trim();
        let name = name.strip_prefix("./").unwrap_or(name);
        name == file_name
    };
    let lines: Vec<&str> = signed_lines(text)
        .into_iter()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    for line in &lines {
        // BSD: ALGO (name) = HEX
        if let Some((left, hex)) = line.rsplit_once(") = ") {
            if let Some((algo, name)) = left.split_once(" (") {
                if let Some((got, hex)) = digest(hex.trim()) {
                    let agrees = algo.trim().eq_ignore_ascii_case(got.name())
                        || algo
                            .trim()
                            .eq_ignore_ascii_case(&got.name().replace("sha", "sha-"));
                    if wanted(name) && agrees {
                        return Some((got, hex));
                    }
                }
            }
            continue;
        }
        // GNU: HEX  name, or HEX *name (binary mode)
        if let Some((hex, name)) = line.split_once(char::is_whitespace) {
            let name = name.trim_start();
            let name = name.strip_prefix('*').unwrap_or(name);
            if wanted(name) {
                if let Some(found) = digest(hex) {
                    return Some(found);
                }
            }
        }
    }
    // A bare digest: the file's only line, one hex word.
    match lines.as_slice() {
        [only] => digest(only),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    /// Debian's `SHA512SUMS` in a dated folder (`bookworm/20260712-2537/`), GNU style as
    /// `sha512sum` writes it: the hex digest, two spaces, the file name. Digests from the
    /// reference notes.
    #[test]
    fn debian_sha512sums_gnu_style() {
        let generic_amd64 = "6c2607f1846ee86040830c87d0b723f0967da3e884ea4673d9db4aa8eee13a4b\
                             7c663524bfa42082c16fc6919f3aa1bf425c004d07ff06c53a319ad0c42647bb";
        let generic_arm64 = "52eb678130e85a9bf9f3cf4f7181e060fa60a5db45373717474c5ff9305645c5\
                             e6cab8b05ca042bcfa7921d2ca29cf9fd2e815f75abe2d168557ad7207af127b";
        let nocloud_amd64 = "5032f18a6bf53680978e8aebd381a167be725a2ac0f36fa5f6a4263f0b91a1c7\
                             04d3ac66698b562828c9cf25062972550d584dca9e12e95fd3608c3f8344291d";
        let sums = format!(
            "{generic_amd64}  debian-12-genericcloud-amd64-20260712-2537.qcow2\n\
             {generic_arm64}  debian-12-genericcloud-arm64-20260712-2537.qcow2\n\
             {nocloud_amd64}  debian-12-nocloud-amd64-20260712-2537.qcow2\n"
        );
        assert_eq!(
            find(&sums, "debian-12-genericcloud-arm64-20260712-2537.qcow2"),
            Some((Algo::Sha512, generic_arm64.to_string()))
        );
        assert_eq!(
            find(&sums, "debian-12-nocloud-amd64-20260712-2537.qcow2"),
            Some((Algo::Sha512, nocloud_amd64.to_string()))
        );
        // The moving name is not in a dated folder's list, and a name matches whole.
        assert_eq!(find(&sums, "debian-12-genericcloud-amd64.qcow2"), None);
        assert_eq!(find(&sums, "debian-12-nocloud-amd64-20260712-2537"), None);
    }

    /// Ubuntu's `SHA256SUMS` in `releases/noble/release-20260705/`: GNU style with the binary
    /// marker, `HEX *name`. Digests from the reference notes.
    #[test]
    fn ubuntu_sha256sums_gnu_style_with_binary_marker() {
        let amd64 = "ffe6203da54deeb6db5d2a98a83f9ec8e55f149d3f7ba622e1abe5fa966ee3d6";
        let arm64 = "7df0201546f75b8bcc1044594c806c35749421ad3c9bc1be2a3ab806cfae39cc";
        let sums = format!(
            "{amd64} *ubuntu-24.04-server-cloudimg-amd64.img\n\
             {arm64} *ubuntu-24.04-server-cloudimg-arm64.img\n"
        );
        assert_eq!(
            find(&sums, "ubuntu-24.04-server-cloudimg-amd64.img"),
            Some((Algo::Sha256, amd64.to_string()))
        );
        assert_eq!(
            find(&sums, "ubuntu-24.04-server-cloudimg-arm64.img"),
            Some((Algo::Sha256, arm64.to_string()))
        );
        assert_eq!(find(&sums, "*ubuntu-24.04-server-cloudimg-arm64.img"), None);
        // With CRLF line ends, upper-case hex and a `./` prefix too.
        let crlf = format!("{}  ./disk.img\r\n", amd64.to_uppercase());
        assert_eq!(
            find(&crlf, "disk.img"),
            Some((Algo::Sha256, amd64.to_string()))
        );
    }

    /// Fedora's `Fedora-Cloud-44-1.7-x86_64-CHECKSUM`: BSD style with `# name: N bytes`
    /// comments, clear-signed with PGP. Digest from the reference notes.
    #[test]
    fn fedora_checksum_bsd_style_pgp_clear_signed() {
        let qcow2 = "28680fe5b371a5a82ebf43a31926e086a168e59949d03969c5093e7071f90b7f";
        let sums = format!(
            "-----BEGIN PGP SIGNED MESSAGE-----\n\
             Hash: SHA256\n\
             \n\
             # Fedora-Cloud-Base-Generic-44-1.7.x86_64.qcow2: 524288000 bytes\n\
             SHA256 (Fedora-Cloud-Base-Generic-44-1.7.x86_64.qcow2) = {qcow2}\n\
             # Fedora-Cloud-Base-Generic-44-1.7.x86_64.raw.xz: 400000000 bytes\n\
             SHA256 (Fedora-Cloud-Base-Generic-44-1.7.x86_64.raw.xz) = {H256}\n\
             -----BEGIN PGP SIGNATURE-----\n\
             \n\
             iQIzBAEBCAAdFiEEhyNVLWYzUyqQ2TIdmSQB8i0vP40FAmZ\n\
             =abcd\n\
             -----END PGP SIGNATURE-----\n"
        );
        assert_eq!(
            find(&sums, "Fedora-Cloud-Base-Generic-44-1.7.x86_64.qcow2"),
            Some((Algo::Sha256, qcow2.to_string()))
        );
        assert_eq!(
            find(&sums, "Fedora-Cloud-Base-Generic-44-1.7.x86_64.raw.xz"),
            Some((Algo::Sha256, H256.to_string()))
        );
        assert_eq!(
            find(&sums, "Fedora-Cloud-Base-Generic-44-1.7.aarch64.qcow2"),
            None
        );
        // Unsigned, the same lines read the same.
        let unsigned =
            format!("SHA256 (Fedora-Cloud-Base-Generic-44-1.7.x86_64.qcow2) = {qcow2}\n");
        assert_eq!(
            find(&unsigned, "Fedora-Cloud-Base-Generic-44-1.7.x86_64.qcow2"),
            Some((Algo::Sha256, qcow2.to_string()))
        );
    }

    /// Only the signed text counts: lines before the message, after the signature, or in the
    /// armor headers are not read; dash-escaped lines are.
    #[test]
    fn pgp_clear_signing_bounds_what_is_read() {
        let outside = format!(
            "SHA256 (a.qcow2) = {H256}\n\
             -----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\n\
             # nothing here\n\
             -----BEGIN PGP SIGNATURE-----\n\niQIz\n-----END PGP SIGNATURE-----\n\
             SHA256 (b.qcow2) = {H256}\n"
        );
        assert_eq!(find(&outside, "a.qcow2"), None);
        assert_eq!(find(&outside, "b.qcow2"), None);
        let escaped = format!(
            "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\n\
             - -name-with-dash.img (x) = y\n\
             {H256}  -dash.img\n\
             -----BEGIN PGP SIGNATURE-----\n=x\n-----END PGP SIGNATURE-----\n"
        );
        assert_eq!(
            find(&escaped, "-dash.img"),
            Some((Algo::Sha256, H256.to_string()))
        );
    }

    /// Alpine's `nocloud_alpine-3.23.4-x86_64-uefi-cloudinit-r0.qcow2.sha512`: the bare hex
    /// digest, with a trailing newline. Digest from the reference notes.
    #[test]
    fn alpine_per_file_bare_sha512() {
        let hex = "849196e26640b33fb1f106d46cebdf341c715f7f49363564eacece8097464b6a\
                   f7041618e94c4eb1a006394663252a86c0fb3158fee5d0ffb094899730679a71";
        let name = "nocloud_alpine-3.23.4-x86_64-uefi-cloudinit-r0.qcow2";
        let want = Some((Algo::Sha512, hex.to_string()));
        assert_eq!(find(&format!("{hex}\n"), name), want);
        assert_eq!(find(hex, name), want);
        assert_eq!(
            find(&format!("  {}  \r\n\n", hex.to_uppercase()), name),
            want
        );
        // The same digest followed by the file name (as sha512sum writes it).
        assert_eq!(find(&format!("{hex}  {name}\n"), name), want);
        // ... but not when it names another file.
        assert_eq!(find(&format!("{hex}  other.qcow2\n"), name), None);
        // Not a digest: too short, not hex, or two of them.
        assert_eq!(find(&hex[..100], name), None);
        assert_eq!(find(&format!("{}zz\n", &hex[..126]), name), None);
        assert_eq!(find(&format!("{hex}\n{hex}\n"), name), None);
        assert_eq!(find("", name), None);
    }

    #[test]
    fn other_hashes_and_near_misses_are_not_taken() {
        // MD5 or SHA-1 lines are not taken, nor a bare MD5.
        assert_eq!(
            find(
                "d41d8cd98f00b204e9800998ecf8427e  disk.qcow2\n",
                "disk.qcow2"
            ),
            None
        );
        assert_eq!(
            find("d41d8cd98f00b204e9800998ecf8427e\n", "disk.qcow2"),
            None
        );
        // A name is matched whole, not as a prefix or suffix.
        assert_eq!(
            find(&format!("{H256}  disk.qcow2.sig\n"), "disk.qcow2"),
            None
        );
        // A BSD line whose algorithm disagrees with the hash's length.
        let h512 = "a".repeat(128);
        assert_eq!(find(&format!("SHA256 (d.img) = {h512}\n"), "d.img"), None);
        assert_eq!(
            find(&format!("SHA512 (d.img) = {h512}\n"), "d.img"),
            Some((Algo::Sha512, h512.clone()))
        );
        // A single BSD or GNU line for another file is not a bare digest.
        assert_eq!(find(&format!("SHA256 (other) = {H256}\n"), "d.img"), None);
    }
}
