//! The built-in catalog of distribution cloud images, as Lima pins them: each entry has a
//! pinned source (a dated URL and the digest recorded for that build, `sha256:` or
//! `sha512:`) and, where the publisher keeps one, a moving source (an undated "latest" URL and
//! the checksum file that lists it). image_pull tries the pinned URL first and verifies it
//! against the pinned digest; publishers remove dated folders after a few months, so when the
//! pinned URL answers HTTP 404 or 410 it pulls the moving URL and verifies it against the
//! checksum file fetched at pull time. The digests pin one build: a catalog update moves them
//! to a newer one.
//!
//! The URLs, digests and checksum file layouts come from the project's reference notes on
//! cloud images (gathered from Lima's templates): Debian's `SHA512SUMS` beside each image
//! (GNU style), Ubuntu's `SHA256SUMS` in the release folder (GNU style, `*` binary marker),
//! Fedora's `Fedora-Cloud-<N>-<build>-<arch>-CHECKSUM` beside the image (BSD style), Alpine's
//! `<image>.sha512` per file (a bare digest). Rocky, AlmaLinux, CentOS Stream and Arch Linux
//! publish checksum files whose names and formats were not checked: their entries carry the
//! pinned digest only, and their moving URL without a checksum file (not pulled by name).
//!
//! `MCQEMU_CATALOG_MIRROR=URL` fetches every catalog URL `https://HOST/PATH` as
//! `URL/HOST/PATH` instead (a local mirror laid out by host; the tests' HTTP server). The
//! pinned digests still apply.

use super::download::Algo;

/// Where a mirror of the catalog's hosts is, when the operator has one.
pub const MIRROR_ENV: &str = "MCQEMU_CATALOG_MIRROR";

/// A dated URL and the digest recorded for that build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pinned {
    /// The dated (or versioned) image, which the publisher does not replace.
    pub url: &'static str,
    /// `sha256:HEX` or `sha512:HEX`: what a pull by name checks the image against.
    pub digest: &'static str,
    /// The publisher's checksum file listing `url`, when its name is known (for reference:
    /// a pull of the pinned URL needs only the digest).
    pub checksums_url: Option<&'static str>,
}

impl Pinned {
    /// The digest's algorithm and lower-case hex (None for a malformed table entry, which a
    /// unit test rules out).
    pub fn algo_and_hex(&self) -> Option<(Algo, String)> {
        parse_digest(self.digest)
    }
}

/// `sha256:HEX` (64 digits) or `sha512:HEX` (128 digits) as its algorithm and lower-case hex.
pub fn parse_digest(digest: &str) -> Option<(Algo, String)> {
    let (algo, hex) = digest.split_once(':')?;
    let want = match algo {
        "sha256" => Algo::Sha256,
        "sha512" => Algo::Sha512,
        _ => return None,
    };
    let ok = hex.bytes().all(|b| b.is_ascii_hexdigit());
    (ok && Algo::from_hex_len(hex.len()) == Some(want)).then(|| (want, hex.to_ascii_lowercase()))
}

/// An undated URL the publisher replaces with each build, and the checksum file listing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Latest {
    /// The moving image.
    pub url: &'static str,
    /// The publisher's checksum file listing it; None when its name and format were not
    /// checked (then this URL is shown, not pulled by name).
    pub checksums_url: Option<&'static str>,
}

/// One catalog entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The name image_pull takes (`image`).
    pub name: &'static str,
    /// What it is.
    pub title: &'static str,
    /// Architecture.
    pub arch: &'static str,
    /// How it boots: "bios" or "uefi". aarch64 images and Alpine's `uefi` builds need UEFI;
    /// the other x86_64 images are marked "bios" (Debian's, Ubuntu's and Fedora's boot with
    /// UEFI too).
    pub firmware: &'static str,
    /// The dated URL and its digest, tried first.
    pub pinned: Option<Pinned>,
    /// The moving URL and its checksum file, pulled when the pinned URL is gone.
    pub latest: Option<Latest>,
}

/// Every entry, by distribution and release, x86_64 before aarch64. Checksum file URLs follow
/// each publisher's layout from the image URL; Fedora's CHECKSUM name is derived from the
/// image's (`Fedora-Cloud-Base-Generic-<N>-<build>.<arch>.qcow2` is listed in
/// `Fedora-Cloud-<N>-<build>-<arch>-CHECKSUM` in the same folder), not copied from a listing.
/// Debian 13's moving URLs are its daily builds (`trixie/daily/latest/`), as Lima has them.
pub const ENTRIES: &[Entry] = &[
    Entry {
        name: "debian-12",
        title: "Debian 12 (bookworm) genericcloud",
        arch: "x86_64",
        firmware: "bios",
        pinned: Some(Pinned {
            url: "https://cloud.debian.org/images/cloud/bookworm/20260712-2537/debian-12-genericcloud-amd64-20260712-2537.qcow2",
            digest: "sha512:6c2607f1846ee86040830c87d0b723f0967da3e884ea4673d9db4aa8eee13a4b7c663524bfa42082c16fc6919f3aa1bf425c004d07ff06c53a319ad0c42647bb",
            checksums_url: Some("https://cloud.debian.org/images/cloud/bookworm/20260712-2537/SHA512SUMS"),
        }),
        latest: Some(Latest {
            url: "https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-genericcloud-amd64.qcow2",
            checksums_url: Some("https://cloud.debian.org/images/cloud/bookworm/latest/SHA512SUMS"),
        }),
    },
    Entry {
        name: "debian-12-arm64",
        title: "Debian 12 (bookworm) genericcloud",
        arch: "aarch64",
        firmware: "uefi",
        pinned: Some(Pinned {
            url: "https://cloud.debian.org/images/cloud/bookworm/20260712-2537/debian-12-genericcloud-arm64-20260712-2537.qcow2",
            digest: "sha512:52eb678130e85a9bf9f3cf4f7181e060fa60a5db45373717474c5ff9305645c5e6cab8b05ca042bcfa7921d2ca29cf9fd2e815f75abe2d168557ad7207af127b",
            checksums_url: Some("https://cloud.debian.org/images/cloud/bookworm/20260712-2537/SHA512SUMS"),
        }),
        latest: Some(Latest {
            url: "https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-genericcloud-arm64.qcow2",
            checksums_url: Some("https://cloud.debian.org/images/cloud/bookworm/latest/SHA512SUMS"),
        }),
    },
    Entry {
        name: "debian-12-nocloud",
        title: "Debian 12 (bookworm) nocloud",
        arch: "x86_64",
        firmware: "bios",
        pinned: Some(Pinned {
            url: "https://cloud.debian.org/images/cloud/bookworm/20260712-2537/debian-12-nocloud-amd64-20260712-2537.qcow2",
            digest: "sha512:5032f18a6bf53680978e8aebd381a167be725a2ac0f36fa5f6a4263f0b91a1c704d3ac66698b562828c9cf25062972550d584dca9e12e95fd3608c3f8344291d",
            checksums_url: Some("https://cloud.debian.org/images/cloud/bookworm/20260712-2537/SHA512SUMS"),
        }),
        latest: Some(Latest {
            url: "https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-nocloud-amd64.qcow2",
            checksums_url: Some("https://cloud.debian.org/images/cloud/bookworm/latest/SHA512SUMS"),
        }),
    },
    Entry {
        name: "debian-12-nocloud-arm64",
        title: "Debian 12 (bookworm) nocloud",
        arch: "aarch64",
        firmware: "uefi",
        pinned: Some(Pinned {
            url: "https://cloud.debian.org/images/cloud/bookworm/20260712-2537/debian-12-nocloud-arm64-20260712-2537.qcow2",
            digest: "sha512:65ccfc2fb71ce071f2f53fc3eec4f57161fca430a0a6725bb4ff03b500b8c8e65b25f14fd1a93d81c10a3736c913f91e35848d6a2c10ca105a2c2e475aae7e71",
            checksums_url: Some("https://cloud.debian.org/images/cloud/bookworm/20260712-2537/SHA512SUMS"),
        }),
        latest: Some(Latest {
            url: "https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-nocloud-arm64.qcow2",
            checksums_url: Some("https://cloud.debian.org/images/cloud/bookworm/latest/SHA512SUMS"),
        }),
    },
    Entry {
        name: "debian-13",
        title: "Debian 13 (trixie) genericcloud",
        arch: "x86_64",
        firmware: "bios",
        pinned: Some(Pinned {
            url: "https://cloud.debian.org/images/cloud/trixie/20260712-2537/debian-13-genericcloud-amd64-20260712-2537.qcow2",
            digest: "sha512:7ae53e9dbee282bfc16f289dec483dde3a8598769c38a267948310f7a2a52c662620198603bc52c142627efba379863d16079698a10b34102d55bcedd40e8d32",
            checksums_url: Some("https://cloud.debian.org/images/cloud/trixie/20260712-2537/SHA512SUMS"),
        }),
        latest: Some(Latest {
            url: "https://cloud.debian.org/images/cloud/trixie/daily/latest/debian-13-genericcloud-amd64-daily.qcow2",
            checksums_url: Some("https://cloud.debian.org/images/cloud/trixie/daily/latest/SHA512SUMS"),
        }),
    },
    Entry {
        name: "debian-13-arm64",
        title: "Debian 13 (trixie) genericcloud",
        arch: "aarch64",
        firmware: "uefi",
        pinned: Some(Pinned {
            url: "https://cloud.debian.org/images/cloud/trixie/20260712-2537/debian-13-genericcloud-arm64-20260712-2537.qcow2",
            digest: "sha512:8543d795f2fde630eb66c492f245a8c1da19dedc636e0a8e7b3d0f95920e1a05aa911ef2d82d177d41cc53ced5fccbd2a3945d07fa5e15018914c4d864bb07ed",
            checksums_url: Some("https://cloud.debian.org/images/cloud/trixie/20260712-2537/SHA512SUMS"),
        }),
        latest: Some(Latest {
            url: "https://cloud.debian.org/images/cloud/trixie/daily/latest/debian-13-genericcloud-arm64-daily.qcow2",
            checksums_url: Some("https://cloud.debian.org/images/cloud/trixie/daily/latest/SHA512SUMS"),
        }),
    },
    Entry {
        name: "debian-13-nocloud",
        title: "Debian 13 (trixie) nocloud",
        arch: "x86_64",
        firmware: "bios",
        pinned: Some(Pinned {
            url: "https://cloud.debian.org/images/cloud/trixie/20260712-2537/debian-13-nocloud-amd64-20260712-2537.qcow2",
            digest: "sha512:c661c2c9cfd15e54124e2984fe94d2a9c76c0c4a8629cf5248919acac934bc8c502777c675947f090a67e93281b0364095d1ab0e77e13da31929f615ca4a3788",
            checksums_url: Some("https://cloud.debian.org/images/cloud/trixie/20260712-2537/SHA512SUMS"),
        }),
        latest: Some(Latest {
            url: "https://cloud.debian.org/images/cloud/trixie/daily/latest/debian-13-nocloud-amd64-daily.qcow2",
            checksums_url: Some("https://cloud.debian.org/images/cloud/trixie/daily/latest/SHA512SUMS"),
        }),
    },
    Entry {
        name: "debian-13-nocloud-arm64",
        title: "Debian 13 (trixie) nocloud",
        arch: "aarch64",
        firmware: "uefi",
        pinned: Some(Pinned {
            url: "https://cloud.debian.org/images/cloud/trixie/20260712-2537/debian-13-nocloud-arm64-20260712-2537.qcow2",
            digest: "sha512:42379617831e2c620b12937ecbac6c12852ae8390fef475e8851ae374b9727e973a43535795d4b1795ce5e1fb7d81265dd11e9a38c524c815f79e6b38449bdf8",
            checksums_url: Some("https://cloud.debian.org/images/cloud/trixie/20260712-2537/SHA512SUMS"),
        }),
        latest: Some(Latest {
            url: "https://cloud.debian.org/images/cloud/trixie/daily/latest/debian-13-nocloud-arm64-daily.qcow2",
            checksums_url: Some("https://cloud.debian.org/images/cloud/trixie/daily/latest/SHA512SUMS"),
        }),
    },
    Entry {
        name: "ubuntu-22.04",
        title: "Ubuntu 22.04 LTS (jammy) server cloud image",
        arch: "x86_64",
        firmware: "bios",
        pinned: Some(Pinned {
            url: "https://cloud-images.ubuntu.com/releases/jammy/release-20260705/ubuntu-22.04-server-cloudimg-amd64.img",
            digest: "sha256:ec3cdc1bf496078f645ccc8ac823e17609658753477ebc4e5fb730729ac5b434",
            checksums_url: Some("https://cloud-images.ubuntu.com/releases/jammy/release-20260705/SHA256SUMS"),
        }),
        latest: Some(Latest {
            url: "https://cloud-images.ubuntu.com/releases/jammy/release/ubuntu-22.04-server-cloudimg-amd64.img",
            checksums_url: Some("https://cloud-images.ubuntu.com/releases/jammy/release/SHA256SUMS"),
        }),
    },
    Entry {
        name: "ubuntu-22.04-arm64",
        title: "Ubuntu 22.04 LTS (jammy) server cloud image",
        arch: "aarch64",
        firmware: "uefi",
        pinned: Some(Pinned {
            url: "https://cloud-images.ubuntu.com/releases/jammy/release-20260705/ubuntu-22.04-server-cloudimg-arm64.img",
            digest: "sha256:9c2ddc65079f9a285ca7c9efabdee6d58ff7dd2b08a130114426d2020506db7a",
            checksums_url: Some("https://cloud-images.ubuntu.com/releases/jammy/release-20260705/SHA256SUMS"),
        }),
        latest: Some(Latest {
            url: "https://cloud-images.ubuntu.com/releases/jammy/release/ubuntu-22.04-server-cloudimg-arm64.img",
            checksums_url: Some("https://cloud-images.ubuntu.com/releases/jammy/release/SHA256SUMS"),
        }),
    },
    Entry {
        name: "ubuntu-24.04",
        title: "Ubuntu 24.04 LTS (noble) server cloud image",
        arch: "x86_64",
        firmware: "bios",
        pinned: Some(Pinned {
            url: "https://cloud-images.ubuntu.com/releases/noble/release-20260705/ubuntu-24.04-server-cloudimg-amd64.img",
            digest: "sha256:ffe6203da54deeb6db5d2a98a83f9ec8e55f149d3f7ba622e1abe5fa966ee3d6",
            checksums_url: Some("https://cloud-images.ubuntu.com/releases/noble/release-20260705/SHA256SUMS"),
        }),
        latest: Some(Latest {
            url: "https://cloud-images.ubuntu.com/releases/noble/release/ubuntu-24.04-server-cloudimg-amd64.img",
            checksums_url: Some("https://cloud-images.ubuntu.com/releases/noble/release/SHA256SUMS"),
        }),
    },
    Entry {
        name: "ubuntu-24.04-arm64",
        title: "Ubuntu 24.04 LTS (noble) server cloud image",
        arch: "aarch64",
        firmware: "uefi",
        pinned: Some(Pinned {
            url: "https://cloud-images.ubuntu.com/releases/noble/release-20260705/ubuntu-24.04-server-cloudimg-arm64.img",
            digest: "sha256:7df0201546f75b8bcc1044594c806c35749421ad3c9bc1be2a3ab806cfae39cc",
            checksums_url: Some("https://cloud-images.ubuntu.com/releases/noble/release-20260705/SHA256SUMS"),
        }),
        latest: Some(Latest {
            url: "https://cloud-images.ubuntu.com/releases/noble/release/ubuntu-24.04-server-cloudimg-arm64.img",
            checksums_url: Some("https://cloud-images.ubuntu.com/releases/noble/release/SHA256SUMS"),
        }),
    },
    Entry {
        name: "ubuntu-26.04",
        title: "Ubuntu 26.04 LTS (resolute) server cloud image",
        arch: "x86_64",
        firmware: "bios",
        pinned: Some(Pinned {
            url: "https://cloud-images.ubuntu.com/releases/resolute/release-20260720/ubuntu-26.04-server-cloudimg-amd64.img",
            digest: "sha256:117816726abbdefc5ef3e38902e81a76f1c76c3610e709999d0885f9d5d9b477",
            checksums_url: Some("https://cloud-images.ubuntu.com/releases/resolute/release-20260720/SHA256SUMS"),
        }),
        latest: Some(Latest {
            url: "https://cloud-images.ubuntu.com/releases/resolute/release/ubuntu-26.04-server-cloudimg-amd64.img",
            checksums_url: Some("https://cloud-images.ubuntu.com/releases/resolute/release/SHA256SUMS"),
        }),
    },
    Entry {
        name: "ubuntu-26.04-arm64",
        title: "Ubuntu 26.04 LTS (resolute) server cloud image",
        arch: "aarch64",
        firmware: "uefi",
        pinned: Some(Pinned {
            url: "https://cloud-images.ubuntu.com/releases/resolute/release-20260720/ubuntu-26.04-server-cloudimg-arm64.img",
            digest: "sha256:7bcf159e29ad0000bfed9c57875908c39268f5ed1257f4958fa6a9f5f60edd54",
            checksums_url: Some("https://cloud-images.ubuntu.com/releases/resolute/release-20260720/SHA256SUMS"),
        }),
        latest: Some(Latest {
            url: "https://cloud-images.ubuntu.com/releases/resolute/release/ubuntu-26.04-server-cloudimg-arm64.img",
            checksums_url: Some("https://cloud-images.ubuntu.com/releases/resolute/release/SHA256SUMS"),
        }),
    },
    Entry {
        name: "fedora-43",
        title: "Fedora Cloud Base 43 (generic)",
        arch: "x86_64",
        firmware: "bios",
        pinned: Some(Pinned {
            url: "https://download.fedoraproject.org/pub/fedora/linux/releases/43/Cloud/x86_64/images/Fedora-Cloud-Base-Generic-43-1.6.x86_64.qcow2",
            digest: "sha256:846574c8a97cd2d8dc1f231062d73107cc85cbbbda56335e264a46e3a6c8ab2f",
            checksums_url: Some("https://download.fedoraproject.org/pub/fedora/linux/releases/43/Cloud/x86_64/images/Fedora-Cloud-43-1.6-x86_64-CHECKSUM"),
        }),
        latest: None,
    },
    Entry {
        name: "fedora-43-arm64",
        title: "Fedora Cloud Base 43 (generic)",
        arch: "aarch64",
        firmware: "uefi",
        pinned: Some(Pinned {
            url: "https://download.fedoraproject.org/pub/fedora/linux/releases/43/Cloud/aarch64/images/Fedora-Cloud-Base-Generic-43-1.6.aarch64.qcow2",
            digest: "sha256:66031aea9ec61e6d0d5bba12b9454e80ca94e8a79c913d37ded4c60311705b8b",
            checksums_url: Some("https://download.fedoraproject.org/pub/fedora/linux/releases/43/Cloud/aarch64/images/Fedora-Cloud-43-1.6-aarch64-CHECKSUM"),
        }),
        latest: None,
    },
    Entry {
        name: "fedora-44",
        title: "Fedora Cloud Base 44 (generic)",
        arch: "x86_64",
        firmware: "bios",
        pinned: Some(Pinned {
            url: "https://download.fedoraproject.org/pub/fedora/linux/releases/44/Cloud/x86_64/images/Fedora-Cloud-Base-Generic-44-1.7.x86_64.qcow2",
            digest: "sha256:28680fe5b371a5a82ebf43a31926e086a168e59949d03969c5093e7071f90b7f",
            checksums_url: Some("https://download.fedoraproject.org/pub/fedora/linux/releases/44/Cloud/x86_64/images/Fedora-Cloud-44-1.7-x86_64-CHECKSUM"),
        }),
        latest: None,
    },
    Entry {
        name: "fedora-44-arm64",
        title: "Fedora Cloud Base 44 (generic)",
        arch: "aarch64",
        firmware: "uefi",
        pinned: Some(Pinned {
            url: "https://download.fedoraproject.org/pub/fedora/linux/releases/44/Cloud/aarch64/images/Fedora-Cloud-Base-Generic-44-1.7.aarch64.qcow2",
            digest: "sha256:55c60a3b80d3616a08705afd0459e75fe9f03c54aba7a46e4002a41a72fa0d5b",
            checksums_url: Some("https://download.fedoraproject.org/pub/fedora/linux/releases/44/Cloud/aarch64/images/Fedora-Cloud-44-1.7-aarch64-CHECKSUM"),
        }),
        latest: None,
    },
    Entry {
        name: "alpine-3.22",
        title: "Alpine Linux 3.22.4 nocloud (cloud-init, UEFI)",
        arch: "x86_64",
        firmware: "uefi",
        pinned: Some(Pinned {
            url: "https://dl-cdn.alpinelinux.org/alpine/v3.22/releases/cloud/nocloud_alpine-3.22.4-x86_64-uefi-cloudinit-r0.qcow2",
            digest: "sha512:1b8743fccfd92d8b690e5a75972bebe5d6826b2ea94bc7c71ede3a2a39a5535cbb4e49a6a3f42852d1e05d63076c6f1fbc29ddbb63d766101eaa9dadcaebbb1f",
            checksums_url: Some("https://dl-cdn.alpinelinux.org/alpine/v3.22/releases/cloud/nocloud_alpine-3.22.4-x86_64-uefi-cloudinit-r0.qcow2.sha512"),
        }),
        latest: None,
    },
    Entry {
        name: "alpine-3.22-arm64",
        title: "Alpine Linux 3.22.4 nocloud (cloud-init, UEFI)",
        arch: "aarch64",
        firmware: "uefi",
        pinned: Some(Pinned {
            url: "https://dl-cdn.alpinelinux.org/alpine/v3.22/releases/cloud/nocloud_alpine-3.22.4-aarch64-uefi-cloudinit-r0.qcow2",
            digest: "sha512:a53620902f99b1fd4591125d348e4385f036d590607f4fa90d6f85fea0248007ec763cc81d025f347ede5bd746b3726cf5eddd461b6c94c35376f71cb7558317",
            checksums_url: Some("https://dl-cdn.alpinelinux.org/alpine/v3.22/releases/cloud/nocloud_alpine-3.22.4-aarch64-uefi-cloudinit-r0.qcow2.sha512"),
        }),
        latest: None,
    },
    Entry {
        name: "alpine-3.23",
        title: "Alpine Linux 3.23.4 nocloud (cloud-init, UEFI)",
        arch: "x86_64",
        firmware: "uefi",
        pinned: Some(Pinned {
            url: "https://dl-cdn.alpinelinux.org/alpine/v3.23/releases/cloud/nocloud_alpine-3.23.4-x86_64-uefi-cloudinit-r0.qcow2",
            digest: "sha512:849196e26640b33fb1f106d46cebdf341c715f7f49363564eacece8097464b6af7041618e94c4eb1a006394663252a86c0fb3158fee5d0ffb094899730679a71",
            checksums_url: Some("https://dl-cdn.alpinelinux.org/alpine/v3.23/releases/cloud/nocloud_alpine-3.23.4-x86_64-uefi-cloudinit-r0.qcow2.sha512"),
        }),
        latest: None,
    },
    Entry {
        name: "alpine-3.23-arm64",
        title: "Alpine Linux 3.23.4 nocloud (cloud-init, UEFI)",
        arch: "aarch64",
        firmware: "uefi",
        pinned: Some(Pinned {
            url: "https://dl-cdn.alpinelinux.org/alpine/v3.23/releases/cloud/nocloud_alpine-3.23.4-aarch64-uefi-cloudinit-r0.qcow2",
            digest: "sha512:737b0eb365944ffcf6da477c059c105bbde222942fd5a8380c07db088365b18dbc60a0f2824ea9a3904d57e194e0d05a7074302c3ebc104d0aecb6ddc6ffd91c",
            checksums_url: Some("https://dl-cdn.alpinelinux.org/alpine/v3.23/releases/cloud/nocloud_alpine-3.23.4-aarch64-uefi-cloudinit-r0.qcow2.sha512"),
        }),
        latest: None,
    },
    Entry {
        name: "rocky-10",
        title: "Rocky Linux 10.2 GenericCloud Base",
        arch: "x86_64",
        firmware: "bios",
        pinned: Some(Pinned {
            url: "https://dl.rockylinux.org/pub/rocky/10.2/images/x86_64/Rocky-10-GenericCloud-Base-10.2-20260525.0.x86_64.qcow2",
            digest: "sha256:9fc9e9ff16888bb68ac39b0392e25c9c92684d50c85f1cce6ab549363bbc4b48",
            checksums_url: None,
        }),
        latest: Some(Latest {
            url: "https://dl.rockylinux.org/pub/rocky/10/images/x86_64/Rocky-10-GenericCloud-Base.latest.x86_64.qcow2",
            checksums_url: None,
        }),
    },
    Entry {
        name: "rocky-10-arm64",
        title: "Rocky Linux 10.2 GenericCloud Base",
        arch: "aarch64",
        firmware: "uefi",
        pinned: Some(Pinned {
            url: "https://dl.rockylinux.org/pub/rocky/10.2/images/aarch64/Rocky-10-GenericCloud-Base-10.2-20260525.0.aarch64.qcow2",
            digest: "sha256:457c8375e19496f43a25c4a6169fa11237536c53cef6f85a20ea3c5a751aa0f5",
            checksums_url: None,
        }),
        latest: Some(Latest {
            url: "https://dl.rockylinux.org/pub/rocky/10/images/aarch64/Rocky-10-GenericCloud-Base.latest.aarch64.qcow2",
            checksums_url: None,
        }),
    },
    Entry {
        name: "almalinux-10",
        title: "AlmaLinux 10.2 GenericCloud",
        arch: "x86_64",
        firmware: "bios",
        pinned: Some(Pinned {
            url: "https://repo.almalinux.org/almalinux/10.2/cloud/x86_64/images/AlmaLinux-10-GenericCloud-10.2-20260526.0.x86_64.qcow2",
            digest: "sha256:47f2218668dd4776be140dd92fa3bea700be1766e2c7d88bdfd6a4b50f477b4d",
            checksums_url: None,
        }),
        latest: Some(Latest {
            url: "https://repo.almalinux.org/almalinux/10/cloud/x86_64/images/AlmaLinux-10-GenericCloud-latest.x86_64.qcow2",
            checksums_url: None,
        }),
    },
    Entry {
        name: "almalinux-10-arm64",
        title: "AlmaLinux 10.2 GenericCloud",
        arch: "aarch64",
        firmware: "uefi",
        pinned: Some(Pinned {
            url: "https://repo.almalinux.org/almalinux/10.2/cloud/aarch64/images/AlmaLinux-10-GenericCloud-10.2-20260526.0.aarch64.qcow2",
            digest: "sha256:336c6861fe0ba9115af00f557ed1b09385a3525612dd0cb9cce7e0486f8e74a4",
            checksums_url: None,
        }),
        latest: Some(Latest {
            url: "https://repo.almalinux.org/almalinux/10/cloud/aarch64/images/AlmaLinux-10-GenericCloud-latest.aarch64.qcow2",
            checksums_url: None,
        }),
    },
    Entry {
        name: "centos-stream-10",
        title: "CentOS Stream 10 GenericCloud",
        arch: "x86_64",
        firmware: "bios",
        pinned: Some(Pinned {
            url: "https://cloud.centos.org/centos/10-stream/x86_64/images/CentOS-Stream-GenericCloud-10-20260720.0.x86_64.qcow2",
            digest: "sha256:93796945df5e54952be21ca85067f0c9f3b11a2dd6ee2163154fd9748c4c41d7",
            checksums_url: None,
        }),
        latest: Some(Latest {
            url: "https://cloud.centos.org/centos/10-stream/x86_64/images/CentOS-Stream-GenericCloud-10-latest.x86_64.qcow2",
            checksums_url: None,
        }),
    },
    Entry {
        name: "centos-stream-10-arm64",
        title: "CentOS Stream 10 GenericCloud",
        arch: "aarch64",
        firmware: "uefi",
        pinned: Some(Pinned {
            url: "https://cloud.centos.org/centos/10-stream/aarch64/images/CentOS-Stream-GenericCloud-10-20260720.0.aarch64.qcow2",
            digest: "sha256:e7922ec8c52fb1ba6faa0ba0d92ef0e89a4b0922294781c9564b8c721eb445a8",
            checksums_url: None,
        }),
        latest: Some(Latest {
            url: "https://cloud.centos.org/centos/10-stream/aarch64/images/CentOS-Stream-GenericCloud-10-latest.aarch64.qcow2",
            checksums_url: None,
        }),
    },
    Entry {
        name: "archlinux",
        title: "Arch Linux cloud image",
        arch: "x86_64",
        firmware: "bios",
        pinned: Some(Pinned {
            url: "https://geo.mirror.pkgbuild.com/images/v20260715.556894/Arch-Linux-x86_64-cloudimg-20260715.556894.qcow2",
            digest: "sha256:f419d4e29aebfc017ad4c9de330a3be0d7eefba710b269108b116aaca1122926",
            checksums_url: None,
        }),
        latest: Some(Latest {
            url: "https://geo.mirror.pkgbuild.com/images/latest/Arch-Linux-x86_64-cloudimg.qcow2",
            checksums_url: None,
        }),
    },
];

/// Finds an entry by name.
pub fn find(name: &str) -> Option<&'static Entry> {
    ENTRIES.iter().find(|e| e.name == name)
}

/// The names, for messages and the schema.
pub fn names() -> Vec<&'static str> {
    ENTRIES.iter().map(|e| e.name).collect()
}

/// The URL a catalog URL is fetched from: itself, or under `$MCQEMU_CATALOG_MIRROR`.
pub fn fetch_url(url: &str) -> String {
    match std::env::var(MIRROR_ENV) {
        Ok(mirror) if !mirror.trim().is_empty() => mirrored(mirror.trim(), url),
        _ => url.to_string(),
    }
}

/// `https://HOST/PATH` under `mirror`: `MIRROR/HOST/PATH`.
fn mirrored(mirror: &str, url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    format!("{}/{rest}", mirror.trim_end_matches('/'))
}

/// The name of the CHECKSUM file that lists a Fedora Cloud image:
/// `Fedora-Cloud-Base-Generic-44-1.7.x86_64.qcow2` → `Fedora-Cloud-44-1.7-x86_64-CHECKSUM`.
#[cfg(test)]
fn fedora_checksum_name(image: &str) -> Option<String> {
    let rest = image
        .strip_prefix("Fedora-Cloud-Base-Generic-")?
        .strip_suffix(".qcow2")?;
    let (version, arch) = rest.rsplit_once('.')?;
    let (release, build) = version.split_once('-')?;
    let ok = !release.is_empty()
        && release.bytes().all(|b| b.is_ascii_digit())
        && !build.is_empty()
        && build.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    ok.then(|| format!("Fedora-Cloud-{release}-{build}-{arch}-CHECKSUM"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(url: &str) -> &str {
        url.rsplit_once('/').unwrap().0
    }

    fn file(url: &str) -> &str {
        url.rsplit_once('/').unwrap().1
    }

    #[test]
    fn names_are_unique_and_every_entry_is_pullable() {
        let mut names = names();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "duplicate names");
        for e in ENTRIES {
            assert!(["x86_64", "aarch64"].contains(&e.arch), "{}", e.name);
            assert!(["bios", "uefi"].contains(&e.firmware), "{}", e.name);
            if e.arch == "aarch64" {
                assert_eq!(e.firmware, "uefi", "{}", e.name);
                assert!(e.name.ends_with("-arm64"), "{}", e.name);
            }
            let latest_pullable = e.latest.is_some_and(|l| l.checksums_url.is_some());
            assert!(
                e.pinned.is_some() || latest_pullable,
                "{}: nothing to pull",
                e.name
            );
            let urls = e
                .pinned
                .iter()
                .flat_map(|p| [Some(p.url), p.checksums_url])
                .chain(e.latest.iter().flat_map(|l| [Some(l.url), l.checksums_url]))
                .flatten();
            for url in urls {
                assert!(url.starts_with("https://"), "{}: {url}", e.name);
                assert!(!file(url).is_empty(), "{}: {url}", e.name);
            }
        }
    }

    #[test]
    fn pinned_digests_are_well_formed() {
        for e in ENTRIES {
            let Some(p) = e.pinned else { continue };
            let (algo, hex) = p.algo_and_hex().unwrap_or_else(|| panic!("{}", e.name));
            assert_eq!(format!("{}:{hex}", algo.name()), p.digest, "{}", e.name);
        }
        let h256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(
            parse_digest(&format!("sha256:{}", h256.to_uppercase())),
            Some((Algo::Sha256, h256.to_string()))
        );
        assert_eq!(parse_digest(h256), None);
        assert_eq!(parse_digest(&format!("sha512:{h256}")), None);
        assert_eq!(parse_digest(&format!("md5:{h256}")), None);
        assert_eq!(parse_digest("sha256:zz"), None);
    }

    #[test]
    fn checksum_files_follow_each_publishers_layout() {
        for e in ENTRIES {
            let p = e.pinned.unwrap();
            let sums = p.checksums_url;
            let latest = e.latest;
            match e.name.split('-').next().unwrap() {
                "debian" => {
                    // SHA512SUMS beside the image, in the dated and the latest folder.
                    assert_eq!(sums.unwrap(), format!("{}/SHA512SUMS", folder(p.url)));
                    let l = latest.unwrap();
                    assert_eq!(
                        l.checksums_url.unwrap(),
                        format!("{}/SHA512SUMS", folder(l.url))
                    );
                    assert!(p.digest.starts_with("sha512:"), "{}", e.name);
                }
                "ubuntu" => {
                    // SHA256SUMS in release-YYYYMMDD/ and release/; one file name in both.
                    assert!(folder(p.url).contains("/release-"), "{}", p.url);
                    assert_eq!(sums.unwrap(), format!("{}/SHA256SUMS", folder(p.url)));
                    let l = latest.unwrap();
                    assert!(folder(l.url).ends_with("/release"), "{}", l.url);
                    assert_eq!(
                        l.checksums_url.unwrap(),
                        format!("{}/SHA256SUMS", folder(l.url))
                    );
                    assert_eq!(file(p.url), file(l.url));
                    assert!(p.digest.starts_with("sha256:"), "{}", e.name);
                }
                "fedora" => {
                    let want = fedora_checksum_name(file(p.url)).unwrap();
                    assert_eq!(sums.unwrap(), format!("{}/{want}", folder(p.url)));
                    assert!(latest.is_none(), "{}", e.name);
                }
                "alpine" => {
                    assert_eq!(sums.unwrap(), format!("{}.sha512", p.url));
                    assert!(file(p.url).contains("-uefi-"), "{}", p.url);
                    assert_eq!(e.firmware, "uefi", "{}", e.name);
                    assert!(latest.is_none(), "{}", e.name);
                    assert!(p.digest.starts_with("sha512:"), "{}", e.name);
                }
                _ => {
                    // Checksum files not checked for these publishers.
                    assert_eq!(sums, None, "{}", e.name);
                    assert_eq!(latest.and_then(|l| l.checksums_url), None, "{}", e.name);
                }
            }
        }
    }

    #[test]
    fn fedora_checksum_names_are_derived_from_the_image_name() {
        assert_eq!(
            fedora_checksum_name("Fedora-Cloud-Base-Generic-44-1.7.x86_64.qcow2").as_deref(),
            Some("Fedora-Cloud-44-1.7-x86_64-CHECKSUM")
        );
        assert_eq!(
            fedora_checksum_name("Fedora-Cloud-Base-Generic-43-1.6.aarch64.qcow2").as_deref(),
            Some("Fedora-Cloud-43-1.6-aarch64-CHECKSUM")
        );
        assert_eq!(
            fedora_checksum_name("Fedora-Cloud-Base-43-1.6.x86_64.raw.xz"),
            None
        );
    }

    #[test]
    fn the_catalog_has_the_releases_asked_for() {
        for name in [
            "debian-12",
            "debian-12-arm64",
            "debian-13",
            "debian-13-arm64",
            "ubuntu-22.04",
            "ubuntu-24.04-arm64",
            "ubuntu-26.04",
            "ubuntu-26.04-arm64",
            "fedora-43",
            "fedora-44",
            "fedora-44-arm64",
            "alpine-3.22",
            "alpine-3.23",
            "alpine-3.23-arm64",
        ] {
            assert!(find(name).is_some(), "{name} missing");
        }
        assert!(find("fedora-cloud").is_none());
        let u = find("ubuntu-26.04-arm64").unwrap();
        assert_eq!(u.arch, "aarch64");
        assert!(u
            .pinned
            .unwrap()
            .url
            .contains("/resolute/release-20260720/"));
    }

    #[test]
    fn a_mirror_keeps_host_and_path() {
        assert_eq!(
            mirrored(
                "http://127.0.0.1:8080/",
                "https://cloud.debian.org/images/a.qcow2"
            ),
            "http://127.0.0.1:8080/cloud.debian.org/images/a.qcow2"
        );
        assert_eq!(
            mirrored("http://m/base", "https://h/x"),
            "http://m/base/h/x"
        );
    }
}
