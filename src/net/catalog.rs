//! The built-in catalog of distribution cloud images: where each publisher keeps its image and
//! its checksum file. It holds no hashes: publishers replace their "latest" images, and the
//! checksum file fetched at pull time is the authority. Version-numbered publishers (Fedora,
//! Alpine) are named by their current release and need a bump when it moves on.

/// One catalog entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The name image_pull takes (`image`).
    pub name: &'static str,
    /// What it is.
    pub title: &'static str,
    /// Architecture.
    pub arch: &'static str,
    /// The image.
    pub url: &'static str,
    /// The publisher's checksum file listing it.
    pub checksums_url: &'static str,
    /// How it boots: "bios" or "uefi".
    pub firmware: &'static str,
}

macro_rules! at {
    (DEBIAN, $path:literal) => {
        concat!("https://cloud.debian.org/images/cloud", $path)
    };
    (UBUNTU, $path:literal) => {
        concat!("https://cloud-images.ubuntu.com/releases", $path)
    };
    (FEDORA, $path:literal) => {
        concat!(
            "https://download.fedoraproject.org/pub/fedora/linux/releases/43/Cloud",
            $path
        )
    };
    (ALPINE, $path:literal) => {
        concat!(
            "https://dl-cdn.alpinelinux.org/alpine/v3.22/releases/cloud",
            $path
        )
    };
}

macro_rules! entry {
    ($name:expr, $title:expr, $arch:expr, $firmware:expr, $url:expr, $sums:expr) => {
        Entry {
            name: $name,
            title: $title,
            arch: $arch,
            firmware: $firmware,
            url: $url,
            checksums_url: $sums,
        }
    };
}

/// Every entry, x86_64 first.
pub const ENTRIES: &[Entry] = &[
    entry!(
        "debian-12",
        "Debian 12 (bookworm) genericcloud",
        "x86_64",
        "bios",
        at!(
            DEBIAN,
            "/bookworm/latest/debian-12-genericcloud-amd64.qcow2"
        ),
        at!(DEBIAN, "/bookworm/latest/SHA512SUMS")
    ),
    entry!(
        "debian-12-arm64",
        "Debian 12 (bookworm) genericcloud",
        "aarch64",
        "uefi",
        at!(
            DEBIAN,
            "/bookworm/latest/debian-12-genericcloud-arm64.qcow2"
        ),
        at!(DEBIAN, "/bookworm/latest/SHA512SUMS")
    ),
    entry!(
        "debian-13",
        "Debian 13 (trixie) genericcloud",
        "x86_64",
        "bios",
        at!(DEBIAN, "/trixie/latest/debian-13-genericcloud-amd64.qcow2"),
        at!(DEBIAN, "/trixie/latest/SHA512SUMS")
    ),
    entry!(
        "debian-13-arm64",
        "Debian 13 (trixie) genericcloud",
        "aarch64",
        "uefi",
        at!(DEBIAN, "/trixie/latest/debian-13-genericcloud-arm64.qcow2"),
        at!(DEBIAN, "/trixie/latest/SHA512SUMS")
    ),
    entry!(
        "ubuntu-22.04",
        "Ubuntu 22.04 LTS (jammy) cloud image",
        "x86_64",
        "bios",
        at!(
            UBUNTU,
            "/22.04/release/ubuntu-22.04-server-cloudimg-amd64.img"
        ),
        at!(UBUNTU, "/22.04/release/SHA256SUMS")
    ),
    entry!(
        "ubuntu-22.04-arm64",
        "Ubuntu 22.04 LTS (jammy) cloud image",
        "aarch64",
        "uefi",
        at!(
            UBUNTU,
            "/22.04/release/ubuntu-22.04-server-cloudimg-arm64.img"
        ),
        at!(UBUNTU, "/22.04/release/SHA256SUMS")
    ),
    entry!(
        "ubuntu-24.04",
        "Ubuntu 24.04 LTS (noble) cloud image",
        "x86_64",
        "bios",
        at!(
            UBUNTU,
            "/24.04/release/ubuntu-24.04-server-cloudimg-amd64.img"
        ),
        at!(UBUNTU, "/24.04/release/SHA256SUMS")
    ),
    entry!(
        "ubuntu-24.04-arm64",
        "Ubuntu 24.04 LTS (noble) cloud image",
        "aarch64",
        "uefi",
        at!(
            UBUNTU,
            "/24.04/release/ubuntu-24.04-server-cloudimg-arm64.img"
        ),
        at!(UBUNTU, "/24.04/release/SHA256SUMS")
    ),
    entry!(
        "fedora-cloud",
        "Fedora Cloud Base 43 (generic)",
        "x86_64",
        "bios",
        at!(
            FEDORA,
            "/x86_64/images/Fedora-Cloud-Base-Generic-43-1.6.x86_64.qcow2"
        ),
        at!(FEDORA, "/x86_64/images/Fedora-Cloud-43-1.6-x86_64-CHECKSUM")
    ),
    entry!(
        "fedora-cloud-arm64",
        "Fedora Cloud Base 43 (generic)",
        "aarch64",
        "uefi",
        at!(
            FEDORA,
            "/aarch64/images/Fedora-Cloud-Base-Generic-43-1.6.aarch64.qcow2"
        ),
        at!(
            FEDORA,
            "/aarch64/images/Fedora-Cloud-43-1.6-aarch64-CHECKSUM"
        )
    ),
    entry!(
        "alpine-cloud",
        "Alpine Linux 3.22 cloud (cloud-init, BIOS)",
        "x86_64",
        "bios",
        at!(
            ALPINE,
            "/generic_alpine-3.22.2-x86_64-bios-cloudinit-r0.qcow2"
        ),
        at!(
            ALPINE,
            "/generic_alpine-3.22.2-x86_64-bios-cloudinit-r0.qcow2.sha512"
        )
    ),
    entry!(
        "alpine-cloud-arm64",
        "Alpine Linux 3.22 cloud (cloud-init, UEFI)",
        "aarch64",
        "uefi",
        at!(
            ALPINE,
            "/generic_alpine-3.22.2-aarch64-uefi-cloudinit-r0.qcow2"
        ),
        at!(
            ALPINE,
            "/generic_alpine-3.22.2-aarch64-uefi-cloudinit-r0.qcow2.sha512"
        )
    ),
];

/// Finds an entry by name.
pub fn find(name: &str) -> Option<&'static Entry> {
    ENTRIES.iter().find(|e| e.name == name)
}

/// The names, for messages and the schema.
pub fn names() -> Vec<&'static str> {
    ENTRIES.iter().map(|e| e.name).collect()
}
