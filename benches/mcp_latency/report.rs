//! Timing and reporting: a row's statistics, the repetition loop, and the printed table.

use std::time::{Duration, Instant};

use crate::{Res, RSS_TARGET_KB};

/// Summary of one row's samples.
#[derive(Clone, Copy, Debug)]
pub struct Stats {
    pub median: Duration,
    pub p90: Duration,
    pub min: Duration,
}

impl Stats {
    pub fn of(mut samples: Vec<Duration>) -> Stats {
        samples.sort();
        let n = samples.len();
        let median = if n % 2 == 1 {
            samples[n / 2]
        } else {
            (samples[n / 2 - 1] + samples[n / 2]) / 2
        };
        // Nearest-rank 90th percentile.
        let p90 = samples[(n * 9).div_ceil(10).max(1) - 1];
        Stats {
            median,
            p90,
            min: samples[0],
        }
    }
}

/// Runs a closure `warmup` times unmeasured, then `n` times measured, and prints a row.
pub struct Bench {
    pub n: usize,
    pub warmup: usize,
}

impl Bench {
    /// Times each whole call of `f`.
    pub fn time<F: FnMut() -> Res<()>>(
        &self,
        table: &mut Table,
        name: &str,
        target: Option<Duration>,
        mut f: F,
    ) -> Res<Stats> {
        self.measure(table, name, target, || {
            let t0 = Instant::now();
            f()?;
            Ok(t0.elapsed())
        })
    }

    /// Like `time`, but `f` returns the duration it measured (so setup and teardown inside
    /// it stay out of the number).
    pub fn measure<F: FnMut() -> Res<Duration>>(
        &self,
        table: &mut Table,
        name: &str,
        target: Option<Duration>,
        mut f: F,
    ) -> Res<Stats> {
        for _ in 0..self.warmup {
            f().map_err(|e| format!("{name} (warm-up): {e}"))?;
        }
        let mut samples = Vec::with_capacity(self.n);
        for i in 0..self.n {
            samples.push(f().map_err(|e| format!("{name} (run {}): {e}", i + 1))?);
        }
        let stats = Stats::of(samples);
        table.time_row(name, self.n, &stats, target);
        Ok(stats)
    }
}

/// The printed table; counts targets met and missed, rows skipped, and rows or sections that
/// failed.
pub struct Table {
    met: usize,
    missed: usize,
    skipped: usize,
    /// Rows and sections that failed.
    pub errors: usize,
}

const NAME_W: usize = 40;

impl Table {
    pub fn new() -> Table {
        Table {
            met: 0,
            missed: 0,
            skipped: 0,
            errors: 0,
        }
    }

    pub fn header(&self) {
        let cols = ["median".into(), "p90".into(), "min".into()];
        self.print("metric", "n", cols, "target", "result");
        println!("{}", "-".repeat(NAME_W + 4 + 3 * 11 + 3 + 13 + 6));
    }

    fn verdict(&mut self, ok: Option<bool>) -> &'static str {
        match ok {
            None => "",
            Some(true) => {
                self.met += 1;
                "ok"
            }
            Some(false) => {
                self.missed += 1;
                "MISSED"
            }
        }
    }

    fn print(&self, name: &str, n: &str, cols: [String; 3], target: &str, verdict: &str) {
        let line = format!(
            "{name:<NAME_W$} {n:>4} {:>10} {:>10} {:>10}   {target:<12} {verdict}",
            cols[0], cols[1], cols[2]
        );
        println!("{}", line.trim_end());
    }

    pub fn time_row(&mut self, name: &str, n: usize, s: &Stats, target: Option<Duration>) {
        let verdict = self.verdict(target.map(|t| s.median <= t));
        let target = target.map_or(String::new(), |t| format!("<= {}", fmt_target(t)));
        let cols = [fmt_dur(s.median), fmt_dur(s.p90), fmt_dur(s.min)];
        self.print(name, &n.to_string(), cols, &target, verdict);
    }

    pub fn diff_row(&mut self, name: &str, a: Duration, b: Duration, target: Duration) {
        let (sign, d) = if a >= b { ("+", a - b) } else { ("-", b - a) };
        let verdict = self.verdict(Some(a <= b + target));
        let cols = [format!("{sign}{}", fmt_dur(d)), "-".into(), "-".into()];
        self.print(
            name,
            "",
            cols,
            &format!("<= {}", fmt_target(target)),
            verdict,
        );
    }

    /// A difference of medians without a target.
    pub fn diff_info_row(&mut self, name: &str, a: Duration, b: Duration) {
        let (sign, d) = if a >= b { ("+", a - b) } else { ("-", b - a) };
        let cols = [format!("{sign}{}", fmt_dur(d)), "-".into(), "-".into()];
        self.print(name, "", cols, "", "");
    }

    pub fn rss_row(&mut self, name: &str, kb: u64) {
        let verdict = self.verdict(Some(kb <= RSS_TARGET_KB));
        let cols = [fmt_kb(kb), "-".into(), "-".into()];
        let target = format!("<= {} MB", RSS_TARGET_KB / 1024);
        self.print(name, "1", cols, &target, verdict);
    }

    /// A row measured elsewhere whose result is a rate: `bytes` moved in each sample's time.
    /// Columns: the rate at the median, p90 and min time (MB = 10^6 bytes).
    pub fn rate_row(&mut self, name: &str, n: usize, bytes: usize, s: &Stats, target_mbps: f64) {
        let rate = |d: Duration| bytes as f64 / d.as_secs_f64().max(1e-9) / 1e6;
        let verdict = self.verdict(Some(rate(s.median) >= target_mbps));
        let cols = [s.median, s.p90, s.min].map(|d| format!("{:.1} MB/s", rate(d)));
        let target = format!(">= {target_mbps} MB/s");
        self.print(name, &n.to_string(), cols, &target, verdict);
    }

    /// A peak-RSS row without a target.
    pub fn rss_info_row(&mut self, name: &str, kb: u64) {
        let cols = [fmt_kb(kb), "-".into(), "-".into()];
        self.print(name, "1", cols, "", "");
    }

    pub fn skip_row(&mut self, name: &str, why: &str) {
        self.skipped += 1;
        let cols = ["-".into(), "-".into(), "-".into()];
        self.print(name, "", cols, "", &format!("SKIPPED: {why}"));
    }

    pub fn error_row(&mut self, name: &str, err: &str) {
        self.errors += 1;
        println!("{name}: ERROR: {err}");
    }

    /// The value of a row or section that worked; for one that failed, an ERROR line (counted,
    /// so the bench exits non-zero) and None, and the bench goes on.
    pub fn or_error<T>(&mut self, name: &str, outcome: Res<T>) -> Option<T> {
        outcome.map_err(|e| self.error_row(name, &e)).ok()
    }

    pub fn section(&self, title: &str) {
        println!();
        println!("{title}");
    }

    /// An indented line of detail under the row above it.
    pub fn note(&self, text: &str) {
        println!("    {text}");
    }

    pub fn footer(&self) {
        println!();
        println!(
            "targets: {} met, {} missed (time targets compare the median; RSS is VmHWM in \
             /proc/PID/status, KiB)",
            self.met, self.missed
        );
        if self.skipped > 0 || self.errors > 0 {
            println!(
                "rows skipped: {}; rows or sections failed: {}",
                self.skipped, self.errors
            );
        }
    }
}

fn fmt_dur(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.1} us")
    } else {
        format!("{:.3} ms", us / 1000.0)
    }
}

/// A target: whole milliseconds without decimals.
fn fmt_target(d: Duration) -> String {
    if d.as_micros().is_multiple_of(1000) {
        format!("{} ms", d.as_millis())
    } else {
        fmt_dur(d)
    }
}

fn fmt_kb(kb: u64) -> String {
    if kb < 1024 {
        format!("{kb} KB")
    } else {
        format!("{:.2} MB", kb as f64 / 1024.0)
    }
}
