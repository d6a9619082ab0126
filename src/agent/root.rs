//! A container image's root, for the agent as PID 1 of an initrd: the disk named by
//! `mcqemu.root=` on the kernel command line is mounted and made `/` (after the initrd's modules
//! are loaded), then the image's config that mcqemu wrote into it ([`CONFIG`]) is applied, so
//! guest_exec runs programs with the image's Env, WorkingDir and User, as a container would.

use std::ffi::CString;
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The image's config in the root: lines `env NAME=value`, `workdir PATH`, `user UID GID`.
pub const CONFIG: &str = "/.mcqemu/image";
/// Where the root is mounted before it becomes `/`.
const NEW_ROOT: &str = "/newroot";
/// The longest wait for the root's disk to appear (its driver probes after the module loads).
const DEVICE_WAIT: Duration = Duration::from_secs(20);

/// The user programs run as when the image names one (uid, gid).
static USER: OnceLock<(u32, u32)> = OnceLock::new();

/// The image's user, when it is not root.
pub fn user() -> Option<(u32, u32)> {
    USER.get().copied()
}

/// The root device asked for on a kernel command line.
pub fn device(cmdline: &str) -> Option<&str> {
    cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix("mcqemu.root="))
        .filter(|d| d.starts_with("/dev/") && !d.contains(".."))
}

/// Mounts `dev` (ext4) and makes it `/`, moving /dev, /proc and /sys into it.
pub fn switch(dev: &str) -> Result<(), String> {
    let deadline = Instant::now() + DEVICE_WAIT;
    while !Path::new(dev).exists() {
        if Instant::now() >= deadline {
            return Err(format!("{dev} did not appear within {DEVICE_WAIT:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::create_dir_all(NEW_ROOT).map_err(|e| format!("{NEW_ROOT}: {e}"))?;
    mount(Some(dev), NEW_ROOT, Some("ext4"), 0).map_err(|e| format!("mount {dev}: {e}"))?;
    for m in ["/dev", "/proc", "/sys"] {
        let to = format!("{NEW_ROOT}{m}");
        let _ = std::fs::create_dir_all(&to);
        mount(Some(m), &to, None, libc::MS_MOVE).map_err(|e| format!("move {m}: {e}"))?;
    }
    std::env::set_current_dir(NEW_ROOT).map_err(|e| format!("cd {NEW_ROOT}: {e}"))?;
    mount(Some("."), "/", None, libc::MS_MOVE).map_err(|e| format!("move the root: {e}"))?;
    let dot = c".";
    // SAFETY: chroot with a NUL-terminated path.
    if unsafe { libc::chroot(dot.as_ptr()) } != 0 {
        return Err(format!("chroot: {}", std::io::Error::last_os_error()));
    }
    std::env::set_current_dir("/").map_err(|e| format!("cd /: {e}"))
}

/// `EXT4_IOC_RESIZE_FS`: `_IOW('f', 16, __u64)`.
const EXT4_IOC_RESIZE_FS: libc::c_ulong = 0x4008_6610;

/// Grows the root's file system (ext4, mounted at `/`) to the size of its disk `dev`, online:
/// a sandbox's `disk_size` is room in the root. The size in blocks it now has, or None when
/// the disk is no larger.
pub fn grow(dev: &str) -> Result<Option<u64>, String> {
    let name = dev.trim_start_matches("/dev/");
    let sectors: u64 = std::fs::read_to_string(format!("/sys/class/block/{name}/size"))
        .map_err(|e| format!("the size of {dev}: {e}"))?
        .trim()
        .parse()
        .map_err(|e| format!("the size of {dev}: {e}"))?;
    let root = std::fs::File::open("/").map_err(|e| format!("open /: {e}"))?;
    use std::os::unix::io::AsRawFd;
    // SAFETY: statfs is plain data; zeroed is a valid value, and fstatfs fills it.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: an open descriptor and a statfs buffer.
    if unsafe { libc::fstatfs(root.as_raw_fd(), &mut st) } != 0 {
        return Err(format!("statfs /: {}", std::io::Error::last_os_error()));
    }
    let block = st.f_bsize as u64;
    let want = sectors * 512 / block.max(1);
    // f_blocks leaves out the file system's own overhead, so it is below the real count:
    // a disk only a little larger is left alone.
    if want <= st.f_blocks as u64 + (64 << 20) / block.max(1) {
        return Ok(None);
    }
    // SAFETY: the ioctl reads one u64 block count from a valid pointer.
    if unsafe { libc::ioctl(root.as_raw_fd(), EXT4_IOC_RESIZE_FS as _, &want) } != 0 {
        return Err(format!("resize: {}", std::io::Error::last_os_error()));
    }
    Ok(Some(want))
}

/// mount(2) with no data; the error as text.
pub(super) fn mount(
    what: Option<&str>,
    target: &str,
    fstype: Option<&str>,
    flags: u64,
) -> Result<(), String> {
    let c = |s: &str| CString::new(s).map_err(|e| e.to_string());
    let w = what.map(c).transpose()?;
    let t = c(target)?;
    let f = fstype.map(c).transpose()?;
    let ptr = |o: &Option<CString>| o.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: mount(2) with NUL-terminated strings (or null) that outlive the call.
    let r = unsafe { libc::mount(ptr(&w), t.as_ptr(), ptr(&f), flags, std::ptr::null()) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().to_string())
    }
}

/// The config's parts.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// `NAME=value` pairs.
    pub env: Vec<(String, String)>,
    /// The working folder.
    pub workdir: Option<String>,
    /// uid and gid.
    pub user: Option<(u32, u32)>,
}

/// Reads the config's lines; a line it does not know is ignored (an older agent in a newer root).
pub fn parse(text: &str) -> Config {
    let mut c = Config::default();
    for line in text.lines() {
        let (key, rest) = line.split_once(' ').unwrap_or((line, ""));
        match key {
            "env" => {
                if let Some((k, v)) = rest.split_once('=').filter(|(k, _)| !k.is_empty()) {
                    c.env.push((k.to_string(), v.to_string()));
                }
            }
            "workdir" if rest.starts_with('/') => c.workdir = Some(rest.to_string()),
            "user" => {
                let mut n = rest.split(' ').map(str::parse::<u32>);
                if let (Some(Ok(u)), Some(Ok(g))) = (n.next(), n.next()) {
                    c.user = Some((u, g));
                }
            }
            _ => {}
        }
    }
    c
}

/// Applies the root's config to the agent itself, before any thread starts: its environment
/// and working folder are what programs inherit; the user is taken by each program it starts.
pub fn apply() -> Result<(), String> {
    let text = match std::fs::read_to_string(CONFIG) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("{CONFIG}: {e}")),
    };
    let c = parse(&text);
    for (k, v) in &c.env {
        std::env::set_var(k, v);
    }
    if let Some(dir) = &c.workdir {
        let _ = std::fs::create_dir_all(dir);
        std::env::set_current_dir(dir).map_err(|e| format!("workdir {dir}: {e}"))?;
    }
    if let Some(u) = c.user.filter(|&(u, g)| u != 0 || g != 0) {
        let _ = USER.set(u);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_and_the_root_device_are_read() {
        let c = parse(
            "env PATH=/usr/bin:/bin\nenv A=b=c\nenv =x\nworkdir /app\nuser 1000 100\nnew thing\n",
        );
        assert_eq!(
            c.env,
            vec![
                ("PATH".to_string(), "/usr/bin:/bin".to_string()),
                ("A".to_string(), "b=c".to_string())
            ]
        );
        assert_eq!(c.workdir.as_deref(), Some("/app"));
        assert_eq!(c.user, Some((1000, 100)));
        assert_eq!(parse("workdir rel\nuser x 1").workdir, None);
        assert_eq!(
            device("quiet mcqemu.root=/dev/vda panic=-1"),
            Some("/dev/vda")
        );
        assert_eq!(device("mcqemu.root=/etc/passwd"), None);
        assert_eq!(device("mcqemu.root=/dev/../etc"), None);
    }
}
