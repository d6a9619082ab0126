//! The guest's own facts and clock, and powering it off: `guest-get-osinfo`, `guest-set-time`,
//! `guest-get-time`, `guest-shutdown`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::json::Json;

/// `guest-get-osinfo` in qemu-ga's field names: /etc/os-release (or /usr/lib/os-release) and
/// uname.
pub fn os_info() -> Json {
    let mut m: Vec<(String, Json)> = Vec::new();
    // SAFETY: uname fills a zeroed utsname it is given a valid pointer to.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::uname(&mut u) } == 0 {
        let field = |f: &[libc::c_char]| {
            let bytes: Vec<u8> = f
                .iter()
                .take_while(|c| **c != 0)
                .map(|c| *c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        m.push(("kernel-release".into(), Json::str(field(&u.release))));
        m.push(("kernel-version".into(), Json::str(field(&u.version))));
        m.push(("machine".into(), Json::str(field(&u.machine))));
    }
    let text = std::fs::read_to_string("/etc/os-release")
        .or_else(|_| std::fs::read_to_string("/usr/lib/os-release"))
        .unwrap_or_default();
    for (key, name) in [
        ("ID", "id"),
        ("NAME", "name"),
        ("PRETTY_NAME", "pretty-name"),
        ("VERSION", "version"),
        ("VERSION_ID", "version-id"),
        ("VARIANT", "variant"),
        ("VARIANT_ID", "variant-id"),
    ] {
        if let Some(v) = os_release_value(&text, key) {
            m.push((name.into(), Json::str(v)));
        }
    }
    Json::Obj(m)
}

/// One KEY=value of an os-release text, its quotes taken off.
fn os_release_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let v = l.trim().strip_prefix(key)?.strip_prefix('=')?;
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .or_else(|| v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
            .unwrap_or(v);
        Some(v.replace("\\\"", "\""))
    })
}

/// The guest's wall clock, in ns since the epoch.
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Sets the wall clock to `ns` since the epoch, or, without it, from the RTC (qemu-ga runs
/// `hwclock -s` for that; this reads /dev/rtc0 itself, so a root with no hwclock works).
pub fn set_time(ns: Option<i64>) -> Result<(), String> {
    let ns = match ns {
        Some(ns) if ns >= 0 => ns,
        Some(_) => return Err("Invalid parameter 'time'".into()),
        None => rtc_ns()?,
    };
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: clock_settime with a valid timespec.
    if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) } != 0 {
        return Err(format!(
            "Failed to set time to guest: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// The RTC's time (UTC), in ns since the epoch.
fn rtc_ns() -> Result<i64, String> {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::File::open("/dev/rtc0")
        .or_else(|_| std::fs::File::open("/dev/rtc"))
        .map_err(|e| format!("cannot read the RTC: {e}"))?;
    // SAFETY: a zeroed struct tm; RTC_RD_TIME fills its first nine ints (struct rtc_time).
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    const RTC_RD_TIME: libc::c_ulong = 0x8024_7009;
    // SAFETY: the ioctl writes a struct rtc_time (nine ints), which fits in struct tm.
    if unsafe { libc::ioctl(f.as_raw_fd(), RTC_RD_TIME as _, &mut tm) } != 0 {
        return Err(format!(
            "cannot read the RTC: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: timegm reads the struct tm it is given.
    let secs = unsafe { libc::timegm(&mut tm) };
    if secs < 0 {
        return Err("the RTC holds no valid time".into());
    }
    Ok(secs as i64 * 1_000_000_000)
}

/// How a shutdown ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Power off.
    Powerdown,
    /// Halt.
    Halt,
    /// Reboot.
    Reboot,
}

impl Mode {
    /// qemu-ga's mode names.
    pub fn parse(s: Option<&str>) -> Result<Mode, String> {
        match s.unwrap_or("powerdown") {
            "powerdown" => Ok(Mode::Powerdown),
            "halt" => Ok(Mode::Halt),
            "reboot" => Ok(Mode::Reboot),
            other => Err(format!(
                "Invalid parameter 'mode': {other:?} (powerdown, halt or reboot)"
            )),
        }
    }
}

/// Ends the guest as PID 1 does: every process asked to end (TERM, then KILL after a grace),
/// file systems synced, then the kernel powers off, halts or reboots. Returns only on failure.
pub fn end_as_init(mode: Mode, grace: Duration) -> String {
    // SAFETY: kill(-1) signals every process but this one (PID 1 is never signalled).
    unsafe { libc::kill(-1, libc::SIGTERM) };
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline {
        // SAFETY: WNOHANG reaping with no status pointer.
        let r = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
        if r < 0 {
            break; // no children left
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: as above.
    unsafe { libc::kill(-1, libc::SIGKILL) };
    halt(mode)
}

/// Syncs and asks the kernel to end the machine (no process is ended first); returns only on
/// failure, with why.
pub fn halt(mode: Mode) -> String {
    // SAFETY: sync takes no arguments.
    unsafe { libc::sync() };
    let cmd = match mode {
        Mode::Powerdown => libc::RB_POWER_OFF,
        Mode::Halt => libc::RB_HALT_SYSTEM,
        Mode::Reboot => libc::RB_AUTOBOOT,
    };
    // SAFETY: reboot(2) with one of its documented commands.
    unsafe { libc::reboot(cmd) };
    format!(
        "the kernel refused to {mode:?}: {}",
        std::io::Error::last_os_error()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_release_values_lose_their_quotes() {
        let t =
            "NAME=\"Debian GNU/Linux\"\nID=debian\nVERSION_ID='12'\nPRETTY_NAME=\"A \\\"q\\\"\"\n";
        assert_eq!(
            os_release_value(t, "NAME").as_deref(),
            Some("Debian GNU/Linux")
        );
        assert_eq!(os_release_value(t, "ID").as_deref(), Some("debian"));
        assert_eq!(os_release_value(t, "VERSION_ID").as_deref(), Some("12"));
        assert_eq!(
            os_release_value(t, "PRETTY_NAME").as_deref(),
            Some("A \"q\"")
        );
        assert_eq!(os_release_value(t, "VERSION"), None);
        assert!(matches!(os_info(), Json::Obj(m) if m.iter().any(|(k, _)| k == "kernel-release")));
        assert_eq!(Mode::parse(None), Ok(Mode::Powerdown));
        assert!(Mode::parse(Some("explode")).is_err());
    }
}
