//! Copies of files QEMU will write (UEFI variable stores): made private to their owner, never
//! through a symlink, and on disk before they are used.

use std::path::Path;

/// Copies `from` to `to` as a file only its owner can read and write (a variable store QEMU
/// writes, whatever the mode of the file it came from).
pub fn private(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut src = std::fs::File::open(from)?;
    let _ = std::fs::remove_file(to);
    let mut dst = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(to)?;
    std::io::copy(&mut src, &mut dst)?;
    dst.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    dst.sync_all()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_read_only_source_gives_a_private_writable_copy() {
        let dir = std::env::temp_dir().join(format!("mcqemu-copy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("VARS.fd");
        std::fs::write(&src, b"vars").unwrap();
        std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o444)).unwrap();
        let dst = dir.join("copy.fd");
        super::private(&src, &dst).unwrap();
        let mode = std::fs::metadata(&dst).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(std::fs::read(&dst).unwrap(), b"vars");
        // Replacing a symlink never writes through it.
        let target = dir.join("target");
        std::fs::write(&target, b"keep").unwrap();
        std::fs::remove_file(&dst).unwrap();
        std::os::unix::fs::symlink(&target, &dst).unwrap();
        super::private(&src, &dst).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
