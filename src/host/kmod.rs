//! What `depmod` would write for a kernel's modules, computed in-process from each `.ko`'s
//! `.modinfo` section, so the modules disk mcqemu builds for an image kernel needs no kmod on
//! the host: `modules.dep` (each module's path and every module it needs, the last to be
//! loaded first, as busybox's and mcqemu-agent's modprobe read it) and `modules.alias` (the
//! names the kernel asks for when it loads a module itself: `fs-overlay`, `net-pf-16-...`).

use std::collections::{BTreeMap, BTreeSet};

/// One module as its `.modinfo` describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModInfo {
    /// The modules it needs (`depends=`), by name.
    pub depends: Vec<String>,
    /// The names it answers to (`alias=`).
    pub aliases: Vec<String>,
}

/// A module's name from its file name: `nf_tables.ko` → `nf_tables`, `8021q.ko` → `8021q`
/// (dashes read as underscores, as the kernel does).
pub fn name_of(file: &str) -> String {
    let base = file.rsplit('/').next().unwrap_or(file);
    base.strip_suffix(".ko").unwrap_or(base).replace('-', "_")
}

/// The `.modinfo` section of a little-endian ELF64 `.ko`, read; None when it is not one.
pub fn modinfo(ko: &[u8]) -> Option<ModInfo> {
    if ko.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let u16_at = |o: usize| -> Option<usize> {
        Some(u16::from_le_bytes(ko.get(o..o + 2)?.try_into().ok()?) as usize)
    };
    let u64_at = |o: usize| -> Option<usize> {
        usize::try_from(u64::from_le_bytes(ko.get(o..o + 8)?.try_into().ok()?)).ok()
    };
    let u32_at = |o: usize| -> Option<usize> {
        Some(u32::from_le_bytes(ko.get(o..o + 4)?.try_into().ok()?) as usize)
    };
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(0x28)?, u16_at(0x3a)?, u16_at(0x3c)?, u16_at(0x3e)?);
    let section = |i: usize| -> Option<(usize, usize, usize)> {
        let h = shoff.checked_add(i.checked_mul(shentsize)?)?;
        Some((u32_at(h)?, u64_at(h + 0x18)?, u64_at(h + 0x20)?))
    };
    let (_, str_off, str_size) = section(shstrndx)?;
    let names = ko.get(str_off..str_off.checked_add(str_size)?)?;
    let (off, size) = (0..shnum).find_map(|i| {
        let (name, off, size) = section(i)?;
        let n = names.get(name..)?;
        (n.split(|b| *b == 0).next()? == b".modinfo").then_some((off, size))
    })?;
    let data = ko.get(off..off.checked_add(size)?)?;
    let mut info = ModInfo::default();
    for field in data.split(|b| *b == 0).map(String::from_utf8_lossy) {
        if let Some(d) = field.strip_prefix("depends=") {
            info.depends.extend(
                d.split(',')
                    .filter(|n| !n.is_empty())
                    .map(|n| n.replace('-', "_")),
            );
        } else if let Some(a) = field.strip_prefix("alias=") {
            info.aliases.push(a.to_string());
        }
    }
    Some(info)
}

/// What depmod would write for `mods` (each module's path relative to the release's folder,
/// and what its `.modinfo` says) and the release's `modules.builtin`: file names and bytes.
pub fn depmod(mods: &BTreeMap<String, ModInfo>, builtin: &str) -> Vec<(&'static str, Vec<u8>)> {
    let by_name: BTreeMap<String, &String> = mods.keys().map(|p| (name_of(p), p)).collect();
    let mut dep = String::new();
    let mut alias = String::from("# Aliases extracted from modules themselves.\n");
    let mut dep_bin = BTreeMap::new();
    let mut alias_bin: BTreeMap<String, Vec<(u32, String)>> = BTreeMap::new();
    for (i, (path, info)) in mods.iter().enumerate() {
        let mut order = Vec::new();
        let mut seen = BTreeSet::new();
        load_order(&name_of(path), mods, &by_name, &mut seen, &mut order);
        order.pop();
        let mut line = format!("{path}:");
        for d in order.iter().rev() {
            line.push(' ');
            line.push_str(d);
        }
        dep.push_str(&line);
        dep.push('\n');
        dep_bin.insert(name_of(path), vec![(i as u32, line)]);
        for a in &info.aliases {
            alias.push_str(&format!("alias {a} {}\n", name_of(path)));
            alias_bin
                .entry(normalized(a))
                .or_default()
                .push((i as u32, name_of(path)));
        }
    }
    let builtin_bin = builtin
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| (name_of(l), vec![(0, String::new())]))
        .collect();
    vec![
        ("modules.dep", dep.into_bytes()),
        ("modules.alias", alias.into_bytes()),
        ("modules.dep.bin", super::kmod_index::write(&dep_bin)),
        ("modules.alias.bin", super::kmod_index::write(&alias_bin)),
        (
            "modules.builtin.bin",
            super::kmod_index::write(&builtin_bin),
        ),
    ]
}

/// An alias as kmod looks it up: dashes read as underscores, except inside `[...]`.
fn normalized(alias: &str) -> String {
    let mut depth = 0;
    alias
        .chars()
        .map(|c| {
            match c {
                '[' => depth += 1,
                ']' if depth > 0 => depth -= 1,
                _ => {}
            }
            if c == '-' && depth == 0 {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// Appends `name`'s dependencies, then its own path, to `order` (each once; a cycle or an
/// unknown name stops there).
fn load_order(
    name: &str,
    mods: &BTreeMap<String, ModInfo>,
    by_name: &BTreeMap<String, &String>,
    seen: &mut BTreeSet<String>,
    order: &mut Vec<String>,
) {
    let Some(path) = by_name.get(name) else {
        return;
    };
    if !seen.insert(name.to_string()) {
        return;
    }
    for d in mods.get(*path).map_or(&[][..], |i| &i.depends[..]) {
        load_order(d, mods, by_name, seen, order);
    }
    order.push((*path).clone());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 relocatable with a `.modinfo` section holding `info`.
    fn fake_ko(info: &[u8]) -> Vec<u8> {
        let strtab = b"\0.shstrtab\0.modinfo\0";
        let mut f = vec![0u8; 64];
        f[..6].copy_from_slice(b"\x7fELF\x02\x01");
        let info_off = f.len();
        f.extend_from_slice(info);
        let str_off = f.len();
        f.extend_from_slice(strtab);
        let shoff = f.len();
        let sh = |name: u32, off: usize, size: usize| {
            let mut h = vec![0u8; 64];
            h[..4].copy_from_slice(&name.to_le_bytes());
            h[0x18..0x20].copy_from_slice(&(off as u64).to_le_bytes());
            h[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
            h
        };
        let null = sh(0, 0, 0);
        let s1 = sh(1, str_off, strtab.len());
        let s2 = sh(11, info_off, info.len());
        f.extend(null.into_iter().chain(s1).chain(s2));
        f[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        f[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        f[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        f[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        f
    }

    #[test]
    fn modinfo_is_read_and_dependencies_are_listed_last_loaded_first() {
        let ko = fake_ko(b"license=GPL\0depends=bridge,llc\0alias=net-pf-7\0name=br_netfilter\0");
        let i = modinfo(&ko).unwrap();
        assert_eq!(i.depends, vec!["bridge", "llc"]);
        assert_eq!(i.aliases, vec!["net-pf-7"]);
        assert_eq!(modinfo(b"\x7fELF\x02\x01short"), None);
        assert_eq!(modinfo(b"MZ"), None);
        let mut m = BTreeMap::new();
        m.insert("kernel/net/bridge/br_netfilter.ko".to_string(), i);
        m.insert(
            "kernel/net/bridge/bridge.ko".to_string(),
            ModInfo {
                depends: vec!["stp".into(), "llc".into()],
                aliases: vec!["rtnl-link-bridge".into()],
            },
        );
        m.insert(
            "kernel/net/802/stp.ko".to_string(),
            ModInfo {
                depends: vec!["llc".into()],
                aliases: vec![],
            },
        );
        m.insert("kernel/net/llc/llc.ko".to_string(), ModInfo::default());
        m.insert(
            "kernel/fs/overlayfs/overlay.ko".to_string(),
            ModInfo {
                depends: vec![],
                aliases: vec!["fs-overlay".into()],
            },
        );
        let files: BTreeMap<&str, Vec<u8>> =
            depmod(&m, "kernel/fs/ext4/ext4.ko\n").into_iter().collect();
        let dep = String::from_utf8_lossy(&files["modules.dep"]).into_owned();
        let alias = String::from_utf8_lossy(&files["modules.alias"]).into_owned();
        assert!(files["modules.dep.bin"].starts_with(&[0xb0, 0x07, 0xf4, 0x57]));
        assert_eq!(normalized("net-pf-[0-9-]"), "net_pf_[0-9-]");
        assert!(
            dep.contains(
                "kernel/net/bridge/br_netfilter.ko: kernel/net/bridge/bridge.ko \
                 kernel/net/802/stp.ko kernel/net/llc/llc.ko\n"
            ),
            "{dep}"
        );
        assert!(dep.contains("kernel/fs/overlayfs/overlay.ko:\n"), "{dep}");
        assert!(alias.contains("alias fs-overlay overlay\n"), "{alias}");
        assert!(alias.contains("alias rtnl-link-bridge bridge\n"), "{alias}");
        assert_eq!(name_of("kernel/net/8021q/8021q.ko"), "8021q");
        assert_eq!(name_of("x/snd-hda.ko"), "snd_hda");
    }

    /// kmod's own modprobe (the host's, when it has one) reads the binary indexes: by name,
    /// with dependencies in load order, by alias, and a built-in module.
    #[test]
    fn kmod_s_modprobe_reads_the_indexes() {
        let Some(modprobe) = ["/usr/sbin/modprobe", "/sbin/modprobe"]
            .into_iter()
            .find(|p| std::path::Path::new(p).is_file())
        else {
            eprintln!("no kmod modprobe on this host: skipped");
            return;
        };
        let root = std::env::temp_dir().join(format!("mcq-kmod-{}", std::process::id()));
        let rel = root.join("lib/modules/9.9.9-test");
        let mods = [
            ("kernel/net/llc/llc.ko", "depends=\0"),
            ("kernel/net/802/stp.ko", "depends=llc\0"),
            (
                "kernel/net/bridge/bridge.ko",
                "depends=stp,llc\0alias=rtnl-link-bridge\0",
            ),
            ("kernel/net/bridge/br_netfilter.ko", "depends=bridge\0"),
            (
                "kernel/fs/overlayfs/overlay.ko",
                "depends=\0alias=fs-overlay\0",
            ),
        ];
        let mut m = BTreeMap::new();
        for (path, info) in mods {
            let ko = fake_ko(info.as_bytes());
            std::fs::create_dir_all(rel.join(path).parent().unwrap()).unwrap();
            std::fs::write(rel.join(path), &ko).unwrap();
            m.insert(path.to_string(), modinfo(&ko).unwrap());
        }
        for (name, bytes) in depmod(&m, "kernel/fs/ext4/ext4.ko\n") {
            std::fs::write(rel.join(name), bytes).unwrap();
        }
        let show = |what: &str| {
            let out = std::process::Command::new(modprobe)
                .args([
                    "-d",
                    root.to_str().unwrap(),
                    "-S",
                    "9.9.9-test",
                    "--show-depends",
                    what,
                ])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr)
        };
        let deps = show("br_netfilter");
        let order: Vec<&str> = deps
            .lines()
            .filter_map(|l| l.strip_prefix("insmod "))
            .map(|p| p.trim().rsplit('/').next().unwrap_or(p))
            .collect();
        assert_eq!(
            order,
            ["llc.ko", "stp.ko", "bridge.ko", "br_netfilter.ko"],
            "{deps}"
        );
        assert!(
            show("fs-overlay").contains("overlay.ko"),
            "{}",
            show("fs-overlay")
        );
        assert!(show("ext4").contains("builtin ext4"), "{}", show("ext4"));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
