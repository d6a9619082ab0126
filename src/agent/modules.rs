//! The kernel's modules in an image root: mcqemu attaches every module of the kernel it boots
//! on a read-only disk (an ext4 labelled `mcq-modules`, with the `modules.dep` and `modules.alias` depmod
//! would write), mounted here at `/lib/modules/RELEASE` unless the image brings its own. Most
//! images have no modprobe at all, so the kernel's own autoloader (`mount -t overlay`, an
//! nftables rule, a veth pair) is pointed at this program: as `modprobe` it loads a module and
//! what it needs from modules.dep, by name or by the alias the kernel asks for.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The label of the modules disk's file system (the host's `MODULES_LABEL`).
const LABEL: &str = "mcq-modules";
/// Where the kernel's autoloader finds this program.
pub const MODPROBE: &str = "/run/mcqemu/modprobe";
/// The longest wait for the modules disk to appear (it probes beside the root's disk).
const DEVICE_WAIT: Duration = Duration::from_secs(5);

fn log(msg: &str) {
    eprintln!("mcqemu-agent (modules): {msg}");
}

/// The running kernel's release (`uname -r`).
pub fn release() -> String {
    // SAFETY: utsname is plain data; zeroed is valid and uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: a valid utsname buffer.
    if unsafe { libc::uname(&mut u) } != 0 {
        return String::new();
    }
    // SAFETY: uname NUL-terminates release within the array.
    unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Mounts the modules disk when the command line says one is attached, and points the
/// kernel's autoloader here. Called by PID 1 once the root is `/` and `/run` is mounted.
pub fn setup(cmdline: &str) {
    if !cmdline.split_whitespace().any(|w| w == "mcqemu.modules=1") {
        return;
    }
    let dir = PathBuf::from("/lib/modules").join(release());
    if dir.join("modules.dep").exists() {
        log(&format!("the image brings {}; kept", dir.display()));
    } else {
        let Some(dev) = find_disk() else {
            return log(&format!(
                "no disk labelled {LABEL} appeared within {DEVICE_WAIT:?}"
            ));
        };
        if let Err(e) = std::fs::create_dir_all(&dir) {
            return log(&format!("cannot create {}: {e}", dir.display()));
        }
        let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
        if let Err(e) = super::root::mount(Some(&dev), &dir.to_string_lossy(), Some("ext4"), flags)
        {
            return log(&format!("mount {dev} at {}: {e}", dir.display()));
        }
    }
    let _ = std::fs::create_dir_all("/run/mcqemu");
    let _ = std::fs::remove_file(MODPROBE);
    // This program, which after the switch to the image's root has no path of its own.
    if let Err(e) = std::os::unix::fs::symlink("/proc/1/exe", MODPROBE) {
        return log(&format!("cannot place {MODPROBE}: {e}"));
    }
    if let Err(e) = std::fs::write("/proc/sys/kernel/modprobe", MODPROBE) {
        log(&format!("cannot set kernel.modprobe: {e}"));
    }
}

/// The read-only virtio disk whose ext4 label is [`LABEL`], waited for.
fn find_disk() -> Option<String> {
    let deadline = Instant::now() + DEVICE_WAIT;
    loop {
        if let Ok(d) = std::fs::read_dir("/sys/block") {
            for e in d.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let ro = std::fs::read_to_string(e.path().join("ro")).unwrap_or_default();
                let dev = format!("/dev/{name}");
                if name.starts_with("vd")
                    && ro.trim() == "1"
                    && label(&dev).as_deref() == Some(LABEL)
                {
                    return Some(dev);
                }
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The ext4 volume name of `dev` (`s_volume_name`, 120 bytes into the superblock at 1024).
fn label(dev: &str) -> Option<String> {
    use std::io::Read;
    let mut sb = [0u8; 2048];
    std::fs::File::open(dev).ok()?.read_exact(&mut sb).ok()?;
    (sb[1024 + 0x38..1024 + 0x3a] == [0x53, 0xef]).then_some(())?;
    let name = &sb[1024 + 0x78..1024 + 0x88];
    let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
    Some(String::from_utf8_lossy(&name[..end]).into_owned())
}

/// `modprobe [-q] [--] NAME...` when this program runs as modprobe (the kernel's autoloader,
/// or `mcqemu-agent modprobe NAME`); None otherwise.
pub fn main(argv0: &str, args: &[String]) -> Option<i32> {
    let as_modprobe = Path::new(argv0)
        .file_name()
        .is_some_and(|n| n == "modprobe");
    let args = match (as_modprobe, args.split_first()) {
        (true, _) => args,
        (false, Some((cmd, rest))) if cmd == "modprobe" => rest,
        _ => return None,
    };
    let quiet = args.iter().any(|a| a == "-q" || a == "--quiet");
    let names: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    if names.is_empty() {
        eprintln!("usage: modprobe [-q] [--] MODULE...");
        return Some(2);
    }
    let index = match Index::read(&PathBuf::from("/lib/modules").join(release())) {
        Ok(i) => i,
        Err(e) => {
            if !quiet {
                eprintln!("modprobe: {e}");
            }
            return Some(1);
        }
    };
    let mut code = 0;
    for n in names {
        if let Err(e) = index.load(n) {
            if !quiet {
                eprintln!("modprobe: {n}: {e}");
            }
            code = 1;
        }
    }
    Some(code)
}

/// A release's modules.dep, modules.alias and modules.builtin.
pub struct Index {
    dir: PathBuf,
    /// Module name → its path and the paths it needs (last loaded first).
    deps: HashMap<String, (String, Vec<String>)>,
    /// (pattern, module name).
    aliases: Vec<(String, String)>,
    builtin: Vec<String>,
}

impl Index {
    /// Reads the index of the modules in `dir`.
    pub fn read(dir: &Path) -> Result<Index, String> {
        let dep = std::fs::read_to_string(dir.join("modules.dep"))
            .map_err(|e| format!("{}/modules.dep: {e}", dir.display()))?;
        Ok(Index::parse(
            dir,
            &dep,
            &std::fs::read_to_string(dir.join("modules.alias")).unwrap_or_default(),
            &std::fs::read_to_string(dir.join("modules.builtin")).unwrap_or_default(),
        ))
    }

    fn parse(dir: &Path, dep: &str, alias: &str, builtin: &str) -> Index {
        let deps = dep
            .lines()
            .filter_map(|l| {
                let (path, needs) = l.split_once(':')?;
                let needs = needs.split_whitespace().map(str::to_string).collect();
                Some((name_of(path), (path.to_string(), needs)))
            })
            .collect();
        let aliases = alias
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                (w.next()? == "alias").then_some(())?;
                Some((w.next()?.to_string(), w.next()?.to_string()))
            })
            .collect();
        Index {
            dir: dir.to_path_buf(),
            deps,
            aliases,
            builtin: builtin.lines().map(name_of).collect(),
        }
    }

    /// The modules `name` means: itself, or those whose aliases match it.
    pub fn resolve(&self, name: &str) -> Vec<String> {
        let n = name.replace('-', "_");
        if self.deps.contains_key(&n) || self.builtin.contains(&n) {
            return vec![n];
        }
        let mut out: Vec<String> = self
            .aliases
            .iter()
            .filter(|(pat, _)| glob(pat.as_bytes(), name.as_bytes()))
            .map(|(_, m)| m.clone())
            .collect();
        out.dedup();
        out
    }

    /// Loads `name` and what it needs; a module already loaded or built in is no error.
    pub fn load(&self, name: &str) -> Result<(), String> {
        let mods = self.resolve(name);
        if mods.is_empty() {
            return Err(format!("not found in {}", self.dir.display()));
        }
        for m in mods {
            if self.builtin.contains(&m) {
                continue;
            }
            let Some((path, needs)) = self.deps.get(&m) else {
                continue;
            };
            for p in needs.iter().rev().chain(std::iter::once(path)) {
                insert(&self.dir.join(p))?;
            }
        }
        Ok(())
    }
}

/// A module's name from its path (dashes read as underscores).
fn name_of(path: &str) -> String {
    let base = path.trim().rsplit('/').next().unwrap_or(path);
    base.strip_suffix(".ko").unwrap_or(base).replace('-', "_")
}

/// Loads one module file; already loaded is fine.
fn insert(path: &Path) -> Result<(), String> {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let params = c"";
    // SAFETY: finit_module with an open module file and an empty parameter string.
    let r = unsafe { libc::syscall(libc::SYS_finit_module, f.as_raw_fd(), params.as_ptr(), 0) };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EEXIST) => Ok(()),
        _ => Err(format!("{}: {e}", path.display())),
    }
}

/// Shell-style pattern matching (`*`, `?`, `[...]`), as modules.alias patterns are written.
fn glob(pat: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while i < s.len() {
        if p < pat.len() && pat[p] == b'*' {
            star = Some(p);
            mark = i;
            p += 1;
            continue;
        }
        if p < pat.len() {
            if let Some((ok, next)) = one(&pat[p..], s[i]) {
                if ok {
                    p += next;
                    i += 1;
                    continue;
                }
            }
        }
        match star {
            Some(sp) => {
                p = sp + 1;
                mark += 1;
                i = mark;
            }
            None => return false,
        }
    }
    pat[p..].iter().all(|c| *c == b'*')
}

/// Whether the pattern's first element matches `c`, and its length.
fn one(pat: &[u8], c: u8) -> Option<(bool, usize)> {
    match pat.first()? {
        b'?' => Some((true, 1)),
        b'[' => {
            let end = pat.iter().skip(2).position(|b| *b == b']')? + 2;
            let (neg, set) = match pat.get(1) {
                Some(b'!') | Some(b'^') => (true, &pat[2..end]),
                _ => (false, &pat[1..end]),
            };
            let mut hit = false;
            let mut k = 0;
            while k < set.len() {
                if k + 2 < set.len() && set[k + 1] == b'-' {
                    hit |= (set[k]..=set[k + 2]).contains(&c);
                    k += 3;
                } else {
                    hit |= set[k] == c;
                    k += 1;
                }
            }
            Some((hit != neg, end + 1))
        }
        b => Some((*b == c, 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_aliases_resolve_and_patterns_match() {
        let i = Index::parse(
            Path::new("/lib/modules/6.1"),
            "kernel/fs/overlayfs/overlay.ko:\nkernel/net/bridge/br_netfilter.ko: \
             kernel/net/bridge/bridge.ko kernel/net/802/stp.ko kernel/net/llc/llc.ko\n\
             kernel/net/netfilter/nft_chain_nat.ko: kernel/net/netfilter/nf_nat.ko\n",
            "alias fs-overlay overlay\nalias nft-chain-*-nat nft_chain_nat\n\
             alias pci:v00001AF4d*sv*sd*bc01sc00i* virtio_blk\n",
            "kernel/fs/ext4/ext4.ko\n",
        );
        assert_eq!(i.resolve("overlay"), vec!["overlay"]);
        assert_eq!(i.resolve("fs-overlay"), vec!["overlay"]);
        assert_eq!(i.resolve("br-netfilter"), vec!["br_netfilter"]);
        assert_eq!(i.resolve("nft-chain-2-nat"), vec!["nft_chain_nat"]);
        assert_eq!(i.resolve("ext4"), vec!["ext4"]);
        assert!(i.resolve("nothing").is_empty());
        assert!(glob(
            b"pci:v00001AF4d*sv*sd*bc01sc00i*",
            b"pci:v00001AF4d00001001sv00001AF4sd00000002bc01sc00i00"
        ));
        assert!(glob(b"net-pf-[0-9]", b"net-pf-7"));
        assert!(!glob(b"net-pf-[!0-9]", b"net-pf-7"));
        assert!(!glob(b"fs-overlay", b"fs-overlay2"));
        assert!(i.load("ext4").is_ok(), "built in: nothing to load");
        assert!(i.load("nothing").unwrap_err().contains("not found"));
        assert_eq!(main("/sbin/init", &["x".to_string()]), None);
    }
}
