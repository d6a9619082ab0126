//! What cloud-init says on the serial console, read without the guest agent: its final
//! message ("Cloud-init v. 22.4.2 finished at ... Datasource DataSourceNoCloud [seed=/dev/sr0]
//! ... Up 45.67 seconds") is printed by every cloud image that puts a console on the serial
//! port (`console=ttyS0`, as Debian, Ubuntu and Fedora do). It is how a wait for an agent that
//! a stock image does not have ends as soon as cloud-init is done, and how a seed the guest
//! never saw (`DataSourceNone`) is told apart from one it applied.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::final_message;

/// Most bytes one poll reads: the final message is one short line, and a console that wrote
/// more since the last poll has scrolled past anything older that matters.
const READ_CAP: u64 = 64 * 1024;

/// cloud-init's final message, as printed on the console.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    /// cloud-init's version.
    pub version: String,
    /// The datasource it used, as it names it (`DataSourceNoCloud [seed=/dev/sr0][dsmode=net]`,
    /// `DataSourceNone`).
    pub datasource: String,
    /// The guest's uptime when it finished, in seconds.
    pub uptime_s: Option<f64>,
}

impl Finished {
    /// True when cloud-init found no datasource: a seed that was attached was never seen.
    pub fn no_datasource(&self) -> bool {
        self.datasource.is_empty() || self.datasource.starts_with("DataSourceNone")
    }
}

/// The last cloud-init final message in `text`, if any.
pub fn finished(text: &str) -> Option<Finished> {
    text.split(['\n', '\r'])
        .rev()
        .find_map(|line| parse_line(line.trim()))
}

fn parse_line(line: &str) -> Option<Finished> {
    if let Some(f) = parse_marker(line) {
        return Some(f);
    }
    let at = line.find("Cloud-init v. ")?;
    let rest = &line[at + "Cloud-init v. ".len()..];
    let (version, rest) = rest.split_once(" finished at ")?;
    let datasource = rest
        .split_once("Datasource ")
        .map(|(_, d)| d)
        .map(|d| d.split_once(".  Up ").map_or(d, |(ds, _)| ds))
        .unwrap_or_default()
        .trim_end_matches('.')
        .trim()
        .to_string();
    let uptime_s = rest
        .rsplit_once(" Up ")
        .and_then(|(_, u)| u.trim().strip_suffix("seconds"))
        .and_then(|u| u.trim().parse().ok());
    Some(Finished {
        version: version.trim().to_string(),
        datasource,
        uptime_s,
    })
}

/// The line mcqemu adds after a caller's own `final_message`
/// (`MCQEMU-CLOUD-INIT-FINISHED v. VERSION | DATASOURCE | UPTIME`).
fn parse_marker(line: &str) -> Option<Finished> {
    let at = line.find(final_message::MARKER)?;
    let rest = line[at + final_message::MARKER.len()..].trim_start();
    let mut fields = rest.strip_prefix("v. ")?.split(final_message::SEP);
    let version = fields.next()?.trim().to_string();
    let datasource = fields.next()?.trim().to_string();
    let uptime_s = fields.next().and_then(|u| u.trim().parse().ok());
    Some(Finished {
        version,
        datasource,
        uptime_s,
    })
}

/// What the console says that ends any wait for the guest at once: the guest will not get
/// further without someone at its console.
#[derive(Debug, Clone, PartialEq)]
pub enum Fatal {
    /// systemd's emergency mode (a file system in fstab failed, or a unit it needs).
    Emergency,
    /// systemd's rescue mode.
    Rescue,
    /// A kernel panic, with its reason as printed.
    Panic(String),
}

impl Fatal {
    /// What happened, for the caller.
    pub fn describe(&self) -> String {
        match self {
            Fatal::Emergency => "the guest dropped to systemd's emergency mode (the console says \
                \"You are in emergency mode\"): a file system in its fstab or a unit it needs \
                failed at boot"
                .into(),
            Fatal::Rescue => "the guest dropped to systemd's rescue mode (the console says \
                \"You are in rescue mode\")"
                .into(),
            Fatal::Panic(why) => format!("the guest's kernel panicked: {why}"),
        }
    }
}

/// The first thing in `line` that ends a wait, if any.
pub fn fatal(line: &str) -> Option<Fatal> {
    if line.contains("You are in emergency mode") {
        return Some(Fatal::Emergency);
    }
    if line.contains("You are in rescue mode") {
        return Some(Fatal::Rescue);
    }
    if let Some(at) = line.find("Kernel panic - not syncing") {
        let why = line[at + "Kernel panic - not syncing".len()..]
            .trim_start_matches(':')
            .trim();
        return Some(Fatal::Panic(why.chars().take(200).collect()));
    }
    None
}

/// A cloud-init module that failed, as the console said it. Not a reason to give up on the
/// guest: a resize that cannot grow a whole-disk file system or a write_files entry that
/// cannot be written leaves a guest whose agent answers, and the caller needs that agent to
/// see what went wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct ModuleFailure {
    /// The module's name (`resizefs`, `write_files`, `scripts-user`); empty when cloud-init
    /// only said `status: error`.
    pub module: String,
    /// cloud-init's own line, as printed (cut to [`LINE_CAP`] characters).
    pub line: String,
}

/// Most characters of a console line kept in a [`ModuleFailure`].
const LINE_CAP: usize = 300;

/// A cloud-init failure in `line`: cloud-init logs WARNING and above to the console, a failed
/// module as "Running module runcmd (<module 'cloudinit.config.cc_runcmd' ...>) failed" (all
/// versions, after the module's own message: the script modules say "Failed to run module
/// scripts-user (scripts in /var/lib/cloud/instance/scripts)"); `cloud-init status` prints
/// "status: error" (a module name then is unknown: empty).
pub fn module_failure(line: &str) -> Option<ModuleFailure> {
    let failure = |module: &str| ModuleFailure {
        module: module.chars().take(64).collect(),
        line: line.trim().chars().take(LINE_CAP).collect(),
    };
    if let Some(at) = line.find("Failed to run module ") {
        let module = line[at + "Failed to run module ".len()..]
            .split_whitespace()
            .next()?;
        return Some(failure(module));
    }
    let trimmed = line.trim_end();
    if trimmed.ends_with("status: error") && trimmed.contains("cloud-init") {
        return Some(failure(""));
    }
    let at = line.find("Running module ")?;
    let rest = &line[at + "Running module ".len()..];
    if !rest.trim_end().ends_with(") failed") && !rest.trim_end().ends_with("failed") {
        return None;
    }
    Some(failure(rest.split_whitespace().next()?))
}

/// What one poll of the console found.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Seen {
    /// cloud-init's final message, if it came.
    pub finished: Option<Finished>,
    /// Something that ends the wait at once, if it came (the first of them).
    pub fatal: Option<Fatal>,
    /// cloud-init modules that failed, in the order the console named them.
    pub failures: Vec<ModuleFailure>,
}

/// Follows a VM's serial log from a point on, for cloud-init's final message.
#[derive(Debug)]
pub struct Watch {
    path: PathBuf,
    offset: u64,
    /// The unfinished last line of the previous read.
    carry: String,
}

impl Watch {
    /// Watches `path` from its current end: what an earlier boot of the VM logged is not
    /// looked at.
    pub fn from_end(path: &Path) -> Watch {
        let offset = std::fs::metadata(path).map_or(0, |m| m.len());
        Watch {
            path: path.to_path_buf(),
            offset,
            carry: String::new(),
        }
    }

    /// Reads what the console wrote since the last poll (at most [`READ_CAP`] bytes of it)
    /// and returns cloud-init's final message if it came.
    pub fn poll(&mut self) -> Option<Finished> {
        self.poll_all().finished
    }

    /// Reads what the console wrote since the last poll (at most [`READ_CAP`] bytes of it):
    /// cloud-init's final message and anything that ends a wait at once.
    pub fn poll_all(&mut self) -> Seen {
        let Some(done) = self.read_new() else {
            return Seen::default();
        };
        Seen {
            finished: finished(&done),
            fatal: done.split(['\n', '\r']).find_map(fatal),
            failures: done
                .split(['\n', '\r'])
                .filter_map(module_failure)
                .collect(),
        }
    }

    /// The whole lines written since the last read.
    fn read_new(&mut self) -> Option<String> {
        let mut f = std::fs::File::open(&self.path).ok()?;
        let len = f.metadata().ok()?.len();
        if len < self.offset {
            self.offset = 0;
        }
        let start = self.offset.max(len.saturating_sub(READ_CAP));
        f.seek(SeekFrom::Start(start)).ok()?;
        let mut buf = Vec::new();
        f.take(len - start).read_to_end(&mut buf).ok()?;
        self.offset = start + buf.len() as u64;
        let text = std::mem::take(&mut self.carry) + &String::from_utf8_lossy(&buf);
        let (done, partial) = text.rsplit_once('\n').unwrap_or(("", &text));
        self.carry = partial
            .chars()
            .rev()
            .take(4096)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        Some(done.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOCLOUD: &str = "[   45.123456] cloud-init[612]: Cloud-init v. 22.4.2 finished at Tue, \
        01 Dec 2026 10:00:00 +0000. Datasource DataSourceNoCloud [seed=/dev/sr0][dsmode=net].  \
        Up 45.67 seconds";
    const NONE: &str = "[   50.5] cloud-init[598]: Cloud-init v. 22.4.2 finished at Tue, 01 Dec \
        2026 10:00:00 +0000. Datasource DataSourceNone.  Up 50.12 seconds";

    #[test]
    fn reads_the_datasource_and_uptime_of_the_final_message() {
        let f = finished(&format!("boot\r\n{NOCLOUD}\r\nlogin: ")).unwrap();
        assert_eq!(f.version, "22.4.2");
        assert_eq!(
            f.datasource,
            "DataSourceNoCloud [seed=/dev/sr0][dsmode=net]"
        );
        assert_eq!(f.uptime_s, Some(45.67));
        assert!(!f.no_datasource());
        let n = finished(NONE).unwrap();
        assert_eq!(n.datasource, "DataSourceNone");
        assert!(n.no_datasource());
        assert_eq!(
            finished("Cloud-init v. 22.4.2 running 'modules:final'"),
            None
        );
        assert_eq!(finished(""), None);
    }

    #[test]
    fn emergency_rescue_and_panics_end_a_wait_and_failed_modules_do_not() {
        assert_eq!(
            fatal("You are in emergency mode. After logging in, type \"journalctl -xb\""),
            Some(Fatal::Emergency)
        );
        assert_eq!(
            fatal("You are in rescue mode. After logging in"),
            Some(Fatal::Rescue)
        );
        assert_eq!(
            fatal("[    1.2] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown"),
            Some(Fatal::Panic(
                "VFS: Unable to mount root fs on unknown".into()
            ))
        );
        let generic = "[   40.1] cloud-init[612]: 2026-12-01 10:00:00,000 - util.py[WARNING]: \
            Running module scripts-user (<module 'cloudinit.config.cc_scripts_user' from \
            '/usr/lib/python3/dist-packages/cloudinit/config/cc_scripts_user.py'>) failed";
        assert_eq!(fatal(generic), None);
        assert_eq!(module_failure(generic).unwrap().module, "scripts-user");
        assert_eq!(
            module_failure("Running module runcmd (<module ...>) ok"),
            None
        );
        assert_eq!(fatal("Reached target emergency.target"), None);
        assert_eq!(fatal(NOCLOUD), None);
    }

    #[test]
    fn the_marker_line_after_a_custom_final_message_is_the_end_of_cloud_init() {
        // A real console (Debian 12's cloud-init 22.4.2, final_message "custom done after
        // $UPTIME s" in verbatim user-data): the caller's text, then mcqemu's line.
        let console = "[  114.014945] cloud-init[538]: custom done after 114.00 s\r\n\
            [  114.018664] cloud-init[538]: MCQEMU-CLOUD-INIT-FINISHED v. 22.4.2 | \
            DataSourceNoCloud [seed=/dev/sr0][dsmode=net] | 114.00\r\n";
        let f = finished(console).unwrap();
        assert_eq!(f.version, "22.4.2");
        assert_eq!(
            f.datasource,
            "DataSourceNoCloud [seed=/dev/sr0][dsmode=net]"
        );
        assert_eq!(f.uptime_s, Some(114.0));
        let none =
            finished("cloud-init[5]: MCQEMU-CLOUD-INIT-FINISHED v. 23.1 | DataSourceNone | 9.5")
                .unwrap();
        assert!(none.no_datasource());
    }

    #[test]
    fn a_failed_module_or_status_error_is_noted_with_its_line() {
        // cc_scripts_user's own warning comes first, before the generic one (a real console:
        // cloud-init 22.4.2, runcmd `exit 3`).
        let own = "[  113.739406] cloud-init[538]: 2026-12-02 00:59:01,327 - cc_scripts_user.py\
            [WARNING]: Failed to run module scripts-user (scripts in \
            /var/lib/cloud/instance/scripts)";
        let f = module_failure(own).unwrap();
        assert_eq!(f.module, "scripts-user");
        assert_eq!(f.line, own.trim());
        assert_eq!(
            module_failure(
                "[   41.0] cloud-init[612]: 2026-12-01 10:00:00,000 - cc_scripts_per_once.py\
                 [WARNING]: Failed to run module scripts-per-once (per-once in \
                 /var/lib/cloud/scripts/per-once)"
            )
            .unwrap()
            .module,
            "scripts-per-once"
        );
        assert_eq!(
            module_failure("[   60.2] cloud-init[700]: status: error")
                .unwrap()
                .module,
            ""
        );
        assert!(
            module_failure(&format!("cloud-init status: error{}", " ".repeat(1000)))
                .unwrap()
                .line
                .chars()
                .count()
                <= LINE_CAP
        );
        assert_eq!(module_failure("sshd[700]: status: error reading key"), None);
        assert_eq!(module_failure("cloud-init[700]: status: done"), None);
    }

    #[test]
    fn a_watch_sees_only_what_came_after_it_started_even_split_across_polls() {
        let dir = std::env::temp_dir().join(format!("mcqemu-console-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("serial.log");
        std::fs::write(&log, format!("{NONE}\n")).unwrap();
        let mut w = Watch::from_end(&log);
        assert_eq!(
            w.poll(),
            None,
            "an earlier boot's message is not this boot's"
        );
        let (a, b) = NOCLOUD.split_at(40);
        let append = |s: &str| {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
            f.write_all(s.as_bytes()).unwrap();
        };
        append(a);
        assert_eq!(w.poll(), None);
        append(&format!("{b}\n"));
        assert_eq!(
            w.poll().unwrap().datasource,
            "DataSourceNoCloud [seed=/dev/sr0][dsmode=net]"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
