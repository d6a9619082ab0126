//! `mcqemu ps`: the VMs as a table for the person at the terminal: name, state, CPU, memory,
//! disk, deadline, idle clock and why each ended. CPU is measured over a quarter second.

use std::io::Write;
use std::time::Duration;

use crate::ops::vm::inspect::{self, Listed};

/// Prints the table; 0, or 2 on a usage error.
pub fn main(args: &[String]) -> i32 {
    if let Some(a) = args.first() {
        return super::usage(&format!("ps takes no arguments (got {a:?})"));
    }
    // The first look starts each QEMU's CPU clock; the second reads it a moment later.
    let _ = inspect::list();
    std::thread::sleep(Duration::from_millis(250));
    let list = inspect::list();
    let mut out = std::io::stdout().lock();
    for w in &list.registry_warnings {
        eprintln!("mcqemu: {w}");
    }
    let rows: Vec<[String; 8]> = list.vms.iter().map(row).collect();
    let head = [
        "NAME", "STATE", "CPU%", "MEM", "DISK", "DEADLINE", "IDLE", "ENDED",
    ]
    .map(String::from);
    let mut width = head.clone().map(|h| h.len());
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    for r in std::iter::once(&head).chain(&rows) {
        let line: Vec<String> = r
            .iter()
            .zip(width)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        // A closed pipe (`mcqemu ps | head`) ends the table, not the process.
        if writeln!(out, "{}", line.join("  ").trim_end()).is_err() {
            break;
        }
    }
    0
}

/// One VM's row.
fn row(v: &Listed) -> [String; 8] {
    let m = &v.metrics;
    let dash = || "-".to_string();
    let l = v.lifetime.as_ref();
    [
        v.name.clone(),
        v.status.to_string(),
        m.cpu_pct.map_or_else(dash, |c| format!("{c:.1}")),
        m.pss_bytes.or(m.rss_bytes).map_or_else(dash, bytes),
        m.disk_allocated_bytes.map_or_else(dash, bytes),
        l.and_then(|l| l.expires_in_s)
            .map_or_else(dash, |s| format!("in {}", span(s))),
        l.and_then(|l| Some((l.idle_for_s?, l.idle_s?)))
            .map_or_else(dash, |(f, i)| {
                format!("{}/{}", span(f as i64), span(i as i64))
            }),
        v.end
            .as_ref()
            .and_then(|e| e.reason.clone())
            .unwrap_or_else(dash),
    ]
}

/// Bytes in the largest unit that keeps a number ≥ 1.
fn bytes(b: u64) -> String {
    let units = ["B", "K", "M", "G", "T"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b}B")
    } else {
        format!("{v:.1}{}", units[u])
    }
}

/// Seconds as 45s, 12m, 3h, 2d (negative: past).
fn span(s: i64) -> String {
    let (sign, a) = if s < 0 { ("-", -s) } else { ("", s) };
    let t = match a {
        0..=119 => format!("{a}s"),
        120..=7199 => format!("{}m", a / 60),
        7200..=172_799 => format!("{}h", a / 3600),
        _ => format!("{}d", a / 86_400),
    };
    format!("{sign}{t}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_read_at_a_glance() {
        assert_eq!(bytes(512), "512B");
        assert_eq!(bytes(3 << 20), "3.0M");
        assert_eq!(span(45), "45s");
        assert_eq!(span(900), "15m");
        assert_eq!(span(86_400), "24h");
        assert_eq!(span(-30), "-30s");
    }
}
