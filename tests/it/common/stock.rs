//! The stock-shaped test cloud image: Debian 12 built by `tests/cloud/build_stock.py` the way
//! Debian publishes its genericcloud image, so that a test proves the whole journey on a
//! real-shaped disk: firmware, GRUB, a GPT disk whose root partition cloud-init grows, the
//! *cloud* kernel flavour with a stock initramfs, and no guest agent until cloud-init installs
//! one.
//!
//! - GPT like Debian's: partition 14 BIOS boot, 15 EFI system (FAT, `/EFI/BOOT/BOOTX64.EFI`,
//!   mounted on `/boot/efi`), 1 the ext4 root (last on the disk). UEFI (OVMF) boots it, and so
//!   does SeaBIOS. GRUB finds the root by its file-system UUID and boots
//!   `root=UUID=... ro console=tty0 console=ttyS0,115200`; no menu.
//! - linux-image-cloud-amd64 has no AHCI driver: a seed CD-ROM on q35's default AHCI is
//!   invisible and cloud-init ends with `Datasource DataSourceNone`. Put the seed on
//!   virtio-scsi (`-device virtio-scsi-pci` + `scsi-cd`): the initramfs (MODULES=most) has
//!   virtio_scsi, sr_mod and isofs, `/dev/sr0` is there ~4 s into the boot, cloud-init's local
//!   stage finds it ("found local data from DataSourceNoCloud", dsmode=net) and the network
//!   stage applies it.
//! - No qemu-guest-agent: [`StockImage::repo`] is a flat apt repository holding it and the
//!   packages it needs that the image lacks (libglib2.0-0, libnuma1, liburing2). Serve it over
//!   HTTP on the host's loopback and give the guest [`StockImage::apt_source`] as its only
//!   source (user-mode networking's 10.0.2.2 is the host); `apt-get install -y
//!   qemu-guest-agent` then needs no other network.
//! - Root has no password (serial console login); the apt timers are masked, as in
//!   `tests/cloud/build_cloud.py`'s image. systemd-firstboot is not: as in Debian's images,
//!   `/etc/machine-id` is present and empty, which is not a first boot, and there is no
//!   `/etc/locale.conf` (a first boot would prompt for a locale on the console).
//!
//! Measured by hand under TCG (q35, 1 GiB, 1 vCPU, a NIC, a 4 GiB overlay; 2 cores with load
//! ~2 from other tests), from launch: login prompt 33 s with UEFI (OVMF and GRUB take ~5 s of
//! it) and 34 s with SeaBIOS; cloud-init finished 34 s with the seed on AHCI (DataSourceNone)
//! and 38 s with it on virtio-scsi (root grown from 1.9 to 3.8 GiB); the agent installed from
//! the repository by the seed's runcmd answered `guest-ping` at 55 s. Under load ~5 these were
//! 34-39 s, 41-55 s and 64 s. Wait for the agent or for
//! `/var/lib/cloud/instance/boot-finished`, not for a fixed time.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// Longest wait for the stock-image build, its lock included (about 1-2 minutes when nothing
/// is cached; another test binary may be building it).
pub const STOCK_BUILD_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The stock test image built by `tests/cloud/build_stock.py`. Its files are shared by every
/// test (and cached across runs): boot a copy-on-write overlay of `disk`, never `disk` itself,
/// and make the overlay bigger than 2 GiB to see the root grow.
#[derive(Clone, Debug)]
pub struct StockImage {
    /// The whole disk: qcow2, 2 GiB virtual, GPT. `manifest.json` next to it lists the package
    /// versions, the partitions and the build times.
    pub disk: PathBuf,
    /// The flat apt repository (`Packages`, `Packages.gz`, `Release` and the .debs) to serve
    /// at the root of an HTTP server.
    pub repo: PathBuf,
    /// `manifest.json`.
    pub manifest: PathBuf,
    /// The firmware to boot it with: `uefi`.
    pub firmware: String,
    /// Whether SeaBIOS boots it too (GRUB's boot.img and core.img are installed).
    pub bios: bool,
    /// The root file system's UUID (the kernel's `root=UUID=...`, and the fstab's).
    pub root_uuid: String,
    /// The kernel command line GRUB passes, to check what the guest booted with.
    pub append: String,
}

impl StockImage {
    /// The one apt source line a guest under user-mode networking needs when [`Self::repo`] is
    /// served on the host's loopback at `port`: `deb [trusted=yes] http://10.0.2.2:PORT/ ./`.
    pub fn apt_source(&self, port: u16) -> String {
        format!("deb [trusted=yes] http://10.0.2.2:{port}/ ./")
    }
}

/// The stock test image, built once per process (see [`try_test_stock_image`]); fails the test
/// when it cannot be built.
pub fn test_stock_image() -> StockImage {
    try_test_stock_image().unwrap_or_else(|e| panic!("{e}"))
}

/// Builds the stock test image once per process into `<workspace>/target/test-stock/<key>/`
/// (cached there across runs, keyed by the builder scripts and the package versions); later
/// calls return the first call's outcome. Locked and bounded by [`STOCK_BUILD_TIMEOUT`] like
/// [`try_test_cloud_image`].
///
/// An `Err` (never a skip) when it cannot be built, e.g. when a tool is missing (the message
/// says to run `.ci/setup-host`) or when not running as root.
///
/// [`try_test_cloud_image`]: super::cloud::try_test_cloud_image
pub fn try_test_stock_image() -> Result<StockImage, String> {
    static IMAGE: OnceLock<Result<StockImage, String>> = OnceLock::new();
    IMAGE.get_or_init(build).clone()
}

fn build() -> Result<StockImage, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = root.join("target").join("test-stock");
    let script = root.join("tests").join("cloud").join("build_stock.py");
    let v = super::cli::run_locked_builder("stock test image", &script, &out, STOCK_BUILD_TIMEOUT)?;
    let field = |k: &str| {
        v[k].as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("build_stock.py output lacks {k}: {v}"))
    };
    let image = StockImage {
        disk: field("disk")?.into(),
        repo: field("repo")?.into(),
        manifest: field("manifest")?.into(),
        firmware: field("firmware")?,
        bios: v["bios"].as_bool().unwrap_or(false),
        root_uuid: field("root_uuid")?,
        append: field("append")?,
    };
    for f in [&image.disk, &image.manifest, &image.repo.join("Packages")] {
        if !f.is_file() {
            return Err(format!(
                "build_stock.py reported {} but it is missing",
                f.display()
            ));
        }
    }
    Ok(image)
}

/// `MCQEMU_ROOTS` for a server that boots the stock image: [`test_roots`] plus the stock image
/// cache (`target/test-stock`).
///
/// [`test_roots`]: super::server::test_roots
pub fn stock_roots() -> String {
    let stock = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("test-stock");
    let _ = std::fs::create_dir_all(&stock);
    format!("{}:{}", super::server::test_roots(), stock.display())
}
