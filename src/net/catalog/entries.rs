//! The catalog's entries: publishers' URLs and digests from the project's reference notes on
//! cloud images (`shared/reference/cloud-images.md`), never from memory; the types and the
//! look-ups are in `catalog.rs`.

use super::{Entry, Latest, Pinned};

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
