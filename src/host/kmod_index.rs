//! kmod's binary index (`modules.dep.bin`, `modules.alias.bin`, `modules.builtin.bin`), as
//! depmod writes it: kmod's `modprobe`, which an image may bring, reads only these, while
//! busybox's and mcqemu-agent's read the text files. The format (kmod's libkmod-index.c): a
//! header (magic `0xB007F457`, version 2.1, the root node's offset), then a trie of nodes, each
//! an optional NUL-terminated prefix, optional children (first and last byte, then one offset
//! per byte between them), and optional values (a count, then priority and NUL-terminated
//! string each); integers big-endian, offsets carrying what their node holds in their top bits.

use std::collections::BTreeMap;

const MAGIC: u32 = 0xB007_F457;
const VERSION: u32 = 0x0002_0001;
const PREFIX: u32 = 0x8000_0000;
const VALUES: u32 = 0x4000_0000;
const CHILDS: u32 = 0x2000_0000;

/// A key (or what is left of it below a node) and its values.
type Entry<'a> = (&'a [u8], &'a [(u32, String)]);

/// An index of `entries` (key, then its values as (priority, text)); keys are ASCII (kmod's
/// children are indexed by 7-bit characters), a key with another byte is left out.
pub fn write(entries: &BTreeMap<String, Vec<(u32, String)>>) -> Vec<u8> {
    let keys: Vec<Entry> = entries
        .iter()
        .filter(|(k, _)| k.is_ascii() && !k.as_bytes().contains(&0))
        .map(|(k, v)| (k.as_bytes(), v.as_slice()))
        .collect();
    let mut out = vec![0u8; 12];
    let root = node(&keys, &mut out);
    out[..4].copy_from_slice(&MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&VERSION.to_be_bytes());
    out[8..12].copy_from_slice(&root.to_be_bytes());
    out
}

/// Writes the node for `keys` (sorted suffixes below it), its children first; its offset
/// with its flags.
fn node(keys: &[Entry], out: &mut Vec<u8>) -> u32 {
    let prefix_len = match keys {
        [] => 0,
        [(only, _)] => only.len(),
        [(first, _), .., (last, _)] => first.iter().zip(*last).take_while(|(a, b)| a == b).count(),
    };
    let prefix = keys.first().map_or(&[][..], |(k, _)| &k[..prefix_len]);
    let mut values: Vec<&(u32, String)> = Vec::new();
    let mut groups: BTreeMap<u8, Vec<Entry>> = BTreeMap::new();
    for (k, v) in keys {
        match k.get(prefix_len) {
            None => values.extend(v.iter()),
            Some(c) => groups
                .entry(*c)
                .or_default()
                .push((&k[prefix_len + 1..], v)),
        }
    }
    values.sort_by_key(|(p, _)| *p);
    let children: BTreeMap<u8, u32> = groups.iter().map(|(c, sub)| (*c, node(sub, out))).collect();
    let at = out.len() as u32;
    let mut flags = 0;
    if !prefix.is_empty() {
        flags |= PREFIX;
        out.extend_from_slice(prefix);
        out.push(0);
    }
    if let (Some((&first, _)), Some((&last, _))) =
        (children.first_key_value(), children.last_key_value())
    {
        flags |= CHILDS;
        out.push(first);
        out.push(last);
        for c in first..=last {
            out.extend_from_slice(&children.get(&c).copied().unwrap_or(0).to_be_bytes());
        }
    }
    if !values.is_empty() {
        flags |= VALUES;
        out.extend_from_slice(&(values.len() as u32).to_be_bytes());
        for (priority, text) in values {
            out.extend_from_slice(&priority.to_be_bytes());
            out.extend_from_slice(text.as_bytes());
            out.push(0);
        }
    }
    at | flags
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kmod's exact lookup, as libkmod-index.c does it, over an index this module wrote.
    fn lookup(idx: &[u8], key: &str) -> Option<String> {
        let be = |o: usize| u32::from_be_bytes(idx[o..o + 4].try_into().unwrap());
        assert_eq!(be(0), MAGIC);
        let mut off = be(8);
        let key = key.as_bytes();
        let mut i = 0;
        loop {
            let mut p = (off & 0x0FFF_FFFF) as usize;
            if off & PREFIX != 0 {
                while idx[p] != 0 {
                    if key.get(i) != Some(&idx[p]) {
                        return None;
                    }
                    i += 1;
                    p += 1;
                }
                p += 1;
            }
            let (mut first, mut last, kids) = (128u8, 0u8, p + 2);
            if off & CHILDS != 0 {
                first = idx[p];
                last = idx[p + 1];
                p = kids + 4 * (last as usize + 1 - first as usize);
            }
            if i == key.len() {
                if off & VALUES == 0 {
                    return None;
                }
                let end = idx[p + 8..].iter().position(|b| *b == 0).unwrap();
                return Some(String::from_utf8(idx[p + 8..p + 8 + end].to_vec()).unwrap());
            }
            let c = key[i];
            if c < first || c > last {
                return None;
            }
            off = be(kids + 4 * (c - first) as usize);
            if off == 0 {
                return None;
            }
            i += 1;
        }
    }

    #[test]
    fn every_key_is_found_with_its_value_and_no_other() {
        let mut m = BTreeMap::new();
        for (k, v) in [
            (
                "bridge",
                "kernel/net/bridge/bridge.ko: kernel/net/802/stp.ko",
            ),
            (
                "br_netfilter",
                "kernel/net/bridge/br_netfilter.ko: kernel/net/bridge/bridge.ko",
            ),
            ("overlay", "kernel/fs/overlayfs/overlay.ko:"),
            ("over", "a key that is another's prefix"),
            ("tun", "kernel/drivers/net/tun.ko:"),
        ] {
            m.insert(k.to_string(), vec![(0, v.to_string())]);
        }
        let idx = write(&m);
        for (k, v) in &m {
            assert_eq!(lookup(&idx, k).as_deref(), Some(v[0].1.as_str()), "{k}");
        }
        for missing in ["b", "bridg", "bridges", "overlay2", "x", ""] {
            assert_eq!(lookup(&idx, missing), None, "{missing}");
        }
        assert_eq!(write(&BTreeMap::new()).len(), 12);
    }
}
