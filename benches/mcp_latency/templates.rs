//! The templates section: template_create of the test guest once, then sandbox_vm clones of it
//! one after another (each with its first command and its clock) and four at once, takes from a
//! warm pool of it (`mcp_latency/pools.rs`), a clone's memory (Pss), and, in the same run, cold
//! sandbox_vm boots of the same guest to compare with.
//!
//! The section runs twice: on the system's QEMU (7.2 on the CI hosts), then with a server whose
//! `MCQEMU_QEMU_DIR` points at QEMU 10.0 (`common::qemu10`, unpacked by `.ci/fetch-qemu10`), on
//! the same guest and with the same knobs; a last block compares the two runs' medians (the
//! issue's target: a cold sandbox under 10.0 within 1.5x of 7.2). Each run has its own template
//! (both share the bench's state folder).
//!
//! Knobs: `MCQEMU_BENCH_CLONES` (default 20) sequential clones, after one unmeasured warm-up
//! clone; `MCQEMU_BENCH_CLONE_ROUNDS` (default 5) rounds of four concurrent clones;
//! `MCQEMU_BENCH_COLD_BOOTS` (default 3) cold sandbox_vm boots; each applies to both runs.
//!
//! One run's rows are in `mcp_latency/template_bench.rs`; the clone helpers it shares with the
//! stock and arm64 sections are in `mcp_latency/clones.rs`.

use std::ffi::OsStr;
use std::path::Path;
use std::time::Duration;

use crate::clones::{cleanup, load_average};
use crate::common::{try_run, try_test_guest, VmKiller};
use crate::report::Table;
use crate::template_bench::TemplateBench;
use crate::{env_count, first_line_of, ms, Dirs, Res, QEMU_IMG_TIMEOUT};

/// Target: a cold sandbox under QEMU 10.0 against one under the system's QEMU, same guest,
/// same run.
const COLD_RATIO_TARGET: f64 = 1.5;

/// The guest memory of the templates and the cold boots.
pub const MEMORY_MB: u64 = 256;
/// The prefix of every VM this section starts (for the cleanup).
pub const PREFIX: &str = "bench-t-";

/// One run of the section: which QEMU its server launches every VM with.
pub struct QemuRun {
    /// `QEMU 7.2.x`, from `qemu-system-x86_64 --version`.
    pub label: String,
    /// The server's extra environment (empty for the system's QEMU).
    pub env: Vec<(&'static str, String)>,
    /// The run's template.
    pub template: &'static str,
}

/// The medians of one run, for the comparison of the two.
#[derive(Clone, Copy)]
pub struct Medians {
    pub clone_ready: Duration,
    pub clone_round_trip: Duration,
    pub four: Duration,
    pub cold: Duration,
}

/// The templates section, on the system's QEMU and then on QEMU 10.0, and the comparison.
/// Each run prints SKIPPED when its QEMU or the test guest is missing, an ERROR row when
/// something fails; every clone, cold sandbox and template is removed at the end of its run.
pub fn template_rows(table: &mut Table, dirs: &Dirs, base_image: &Path) {
    let system = QemuRun {
        label: qemu_label("qemu-system-x86_64"),
        env: Vec::new(),
        template: "bench-tpl",
    };
    let first = run_section(table, dirs, base_image, "qemu-system-x86_64", &system);
    let second = match qemu10_env() {
        Ok((bin, env)) => {
            let program = Path::new(&bin).join("qemu-system-x86_64");
            let program = program.to_string_lossy();
            let q10 = QemuRun {
                label: qemu_label(&program),
                env,
                template: "bench-tpl-q10",
            };
            run_section(table, dirs, base_image, &program, &q10).map(|m| (q10.label, m))
        }
        Err(e) => {
            table.section("templates under QEMU 10.0");
            let why = format!("QEMU 10.0 could not be unpacked (.ci/fetch-qemu10): {e}");
            table.skip_row("templates under QEMU 10.0 section", &why);
            None
        }
    };
    if let (Some(a), Some((label, b))) = (first, second) {
        compare_rows(table, &system.label, &label, &a, &b);
    }
}

/// `QEMU 7.2.15` from `PROGRAM --version`, or `QEMU (PROGRAM)` when it says nothing usable.
fn qemu_label(program: &str) -> String {
    let line = first_line_of(program, &["--version"]);
    match line
        .split_whitespace()
        .skip_while(|w| *w != "version")
        .nth(1)
    {
        Some(v) => format!("QEMU {v}"),
        None => format!("QEMU ({program})"),
    }
}

/// The folder of QEMU 10's wrappers and the server environment that selects it; unpacked at
/// the first call. `common::qemu10::qemu10` panics when it cannot be had (what a test wants):
/// that panic is caught here, quietly, and becomes the message.
fn qemu10_env() -> Res<(String, Vec<(&'static str, String)>)> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let got = std::panic::catch_unwind(crate::common::qemu10::qemu10);
    std::panic::set_hook(hook);
    match got {
        Ok(q) => Ok((q.bin.display().to_string(), q.env())),
        Err(p) => Err(p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "it panicked".into())),
    }
}

/// One run of the section on `qemu`'s QEMU (`program` is its qemu-system-x86_64); its medians
/// when every row worked.
fn run_section(
    table: &mut Table,
    dirs: &Dirs,
    base_image: &Path,
    program: &str,
    qemu: &QemuRun,
) -> Option<Medians> {
    table.section(&format!(
        "templates under {}: sandbox_vm from a saved template vs a cold boot (TCG)",
        qemu.label
    ));
    let name = format!("templates under {} section", qemu.label);
    if let Err(e) = try_run(program, &[OsStr::new("--version")], QEMU_IMG_TIMEOUT) {
        table.skip_row(&name, &format!("{program} is not usable ({e})"));
        return None;
    }
    let guest = match try_test_guest() {
        Ok(g) => g,
        Err(e) => {
            table.skip_row(&name, &format!("the test guest could not be built: {e}"));
            return None;
        }
    };
    let killer = VmKiller::new(dirs.tmp.path());
    let tb = TemplateBench {
        dirs,
        killer: &killer,
        guest: &guest,
        qemu,
        clones: env_count("MCQEMU_BENCH_CLONES", 20),
        rounds: env_count("MCQEMU_BENCH_CLONE_ROUNDS", 5),
        cold: env_count("MCQEMU_BENCH_COLD_BOOTS", 3),
    };
    let how = match qemu.env.first() {
        Some((k, v)) => format!("server with {k}={v}"),
        None => "the system's QEMU".into(),
    };
    table.note(&format!(
        "{how}; test guest, {MEMORY_MB} MiB, 1 vCPU; {} sequential clones (+1 warm-up), {} \
         rounds of 4 concurrent clones, {} cold boots; load average {} at the start",
        tb.clones,
        tb.rounds,
        tb.cold,
        load_average()
    ));
    let outcome = tb.server().and_then(|mut server| {
        let r = tb.rows(table, &mut server, base_image);
        cleanup(table, &mut server, PREFIX, qemu.template);
        server.try_close()?;
        r
    });
    let medians = table.or_error(&name, outcome);
    let killed = killer.kill_all();
    if !killed.is_empty() {
        table.note(&format!("cleanup SIGKILLed left-over QEMU PIDs {killed:?}"));
    }
    medians
}

/// QEMU 10.0 against the system's QEMU: the ratios of the two runs' medians, and the cold
/// sandbox against the 1.5x target (as a difference of medians, whose target is half of the
/// system QEMU's median).
fn compare_rows(table: &mut Table, base: &str, other: &str, a: &Medians, b: &Medians) {
    table.section(&format!(
        "templates: {other} against {base}, same guest, same run (ratio of medians)"
    ));
    ratio_row("clone: ready_ms (server)", a.clone_ready, b.clone_ready, "");
    ratio_row(
        "clone: sandbox_vm round trip",
        a.clone_round_trip,
        b.clone_round_trip,
        "",
    );
    ratio_row("4 concurrent clones: all ready (wall)", a.four, b.four, "");
    let target = format!("<= {COLD_RATIO_TARGET}x");
    ratio_row(
        "cold sandbox_vm (boot), round trip",
        a.cold,
        b.cold,
        &target,
    );
    table.diff_row(
        "  cold: median - median",
        b.cold,
        a.cold,
        a.cold.mul_f64(COLD_RATIO_TARGET - 1.0),
    );
    table.note(&format!(
        "cold sandbox_vm medians: {} ms under {other}, {} ms under {base}; the difference's \
         target is {}x the {base} median, i.e. the ratio's {COLD_RATIO_TARGET}x",
        ms(b.cold),
        ms(a.cold),
        COLD_RATIO_TARGET - 1.0
    ));
}

/// A row of the ratio `b / a` in the table's columns (the layout of report.rs's rows: a
/// 40-character name, n, three value columns, the target); no verdict of its own.
fn ratio_row(name: &str, a: Duration, b: Duration, target: &str) {
    let ratio = b.as_secs_f64() / a.as_secs_f64().max(1e-9);
    let line = format!(
        "{name:<40} {:>4} {:>10} {:>10} {:>10}   {target:<12}",
        "",
        format!("{ratio:.2}x"),
        "-",
        "-"
    );
    println!("{}", line.trim_end());
}
