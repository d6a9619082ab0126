//! `disk_size`, taken by sandbox_vm, template_create and image_prepare: the overlay a guest
//! boots on is created this large, so a 2-3 GiB cloud image can hold real work (cloud-init's
//! growpart and resize2fs grow the root file system to fill it at the first boot). Never
//! smaller than the base (qemu-img would cut the guest's file system), and within a quota,
//! `MCQEMU_MAX_DISK_GB` (default 2048): an overlay is sparse, but a guest may fill it.

use crate::ops::error::OpError;
use crate::qemu::img;

/// The quota when `MCQEMU_MAX_DISK_GB` is not set.
pub const DEFAULT_MAX_DISK_GB: u64 = 2048;

fn max_bytes() -> u64 {
    std::env::var("MCQEMU_MAX_DISK_GB")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(DEFAULT_MAX_DISK_GB)
        .saturating_mul(1 << 30)
}

/// The `disk_size` parameter checked against the base's virtual size and the quota: None when
/// absent (the overlay keeps the base's size).
pub fn checked(text: Option<&str>, base_bytes: u64) -> Result<Option<u64>, OpError> {
    let Some(text) = text else {
        return Ok(None);
    };
    let bytes = img::parse_size(text)
        .map_err(|e| OpError::invalid(format!("parameter 'disk_size': {e}")))?;
    check(text, bytes, base_bytes, max_bytes()).map(Some)
}

fn check(text: &str, bytes: u64, base_bytes: u64, max: u64) -> Result<u64, OpError> {
    if bytes < base_bytes {
        return Err(OpError::invalid(format!(
            "parameter 'disk_size': {text:?} ({bytes} bytes) is smaller than the base image \
             ({base_bytes} bytes, {:.1} GiB); a disk cannot shrink under the guest's file \
             system: ask for at least that much, or leave disk_size out",
            base_bytes as f64 / (1u64 << 30) as f64
        )));
    }
    if bytes > max {
        return Err(OpError::refused(format!(
            "parameter 'disk_size': {text:?} is more than the {} GiB allowed \
             (MCQEMU_MAX_DISK_GB); ask for less, or ask the operator to raise MCQEMU_MAX_DISK_GB",
            max >> 30
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_smaller_than_base_and_over_quota_naming_the_parameter() {
        let g = 1u64 << 30;
        assert_eq!(check("20G", 20 * g, 2 * g, 100 * g).unwrap(), 20 * g);
        assert_eq!(check("2G", 2 * g, 2 * g, 100 * g).unwrap(), 2 * g);
        use crate::ops::error::ErrorKind;
        let small = check("1G", g, 2 * g, 100 * g).unwrap_err();
        assert_eq!(small.kind, ErrorKind::InvalidArgument);
        let small = small.msg;
        assert!(
            small.contains("disk_size") && small.contains("smaller"),
            "{small}"
        );
        let big = check("200G", 200 * g, 2 * g, 100 * g).unwrap_err();
        assert_eq!(big.kind, ErrorKind::Refused);
        let big = big.msg;
        assert!(
            big.contains("disk_size") && big.contains("MCQEMU_MAX_DISK_GB"),
            "{big}"
        );
    }
}
