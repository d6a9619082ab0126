//! Forks and suspends, in the templates section: a clone of the section's template (a running
//! 256 MiB sandbox) is forked four ways (parent paused, first and last copy ready, the
//! capture's steps, each copy's Pss beside a clone's), then suspended and resumed (times, the
//! saved state's size on disk). Goals (issue 26): four copies ready within 1.5 s with the
//! parent paused at most 200 ms; a resume within 2x a fresh clone's ready time.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::clones::{clone_vm, destroy, smaps_kb};
use crate::common::{Server, VmKiller};
use crate::report::{Stats, Table};
use crate::{structured, Res, ToolCalls};

/// Bound on one fork, suspend or resume.
const STEP: Duration = Duration::from_secs(180);
/// Goals.
const ALL_FOUR: Duration = Duration::from_millis(1500);
const PAUSED: Duration = Duration::from_millis(200);

/// The fork and suspend rows; `clone_ready` is the section's median clone ready_ms.
pub fn fork_rows(
    table: &mut Table,
    server: &mut Server,
    killer: &VmKiller,
    template: &str,
    rounds: usize,
    clone_ready: Duration,
) -> Res<()> {
    let parent = "bench-fork-parent";
    let p = clone_vm(server, killer, template, parent)?;
    let clone_pss = smaps_kb(p.pid, "Pss")?;
    let result = fork_rounds(table, server, killer, parent, rounds, clone_pss)
        .and_then(|()| suspend_rounds(table, server, killer, parent, rounds, clone_ready));
    let cleaned = destroy(server, parent);
    result?;
    cleaned
}

fn fork_rounds(
    table: &mut Table,
    server: &mut Server,
    killer: &VmKiller,
    parent: &str,
    rounds: usize,
    clone_pss: u64,
) -> Res<()> {
    let (mut paused, mut first, mut all, mut trips) = (vec![], vec![], vec![], vec![]);
    let mut notes = Vec::new();
    for round in 0..rounds {
        let t0 = Instant::now();
        let r = server.tool_within("sandbox_fork", json!({"name": parent, "count": 4}), STEP)?;
        trips.push(t0.elapsed());
        let s = structured(&r)?.clone();
        let copies: Vec<Value> = s["copies"].as_array().cloned().unwrap_or_default();
        copies.iter().for_each(|c| killer.track(c));
        let ms = |k: &str| Duration::from_millis(s[k].as_u64().unwrap_or(0));
        paused.push(ms("parent_paused_ms"));
        first.push(ms("first_ready_ms"));
        all.push(ms("all_ready_ms"));
        if round + 1 == rounds {
            let pss: Vec<String> = copies
                .iter()
                .filter_map(|c| c["pid"].as_i64())
                .map(|pid| {
                    smaps_kb(pid as i32, "Pss")
                        .map(|kb| format!("{:.1}", kb as f64 / 1024.0))
                        .unwrap_or_else(|e| e)
                })
                .collect();
            notes.push(format!(
                "last round: capture steps {}, frozen memory {:.1} MiB on disk, device state \
                 {} KiB; Pss of the four copies {} MiB, of a clone alone {:.1} MiB",
                s["capture_steps_ms"],
                s["ram_bytes"].as_f64().unwrap_or(0.0) / 1048576.0,
                s["state_bytes"].as_u64().unwrap_or(0) / 1024,
                pss.join(", "),
                clone_pss as f64 / 1024.0
            ));
        }
        for c in &copies {
            destroy(server, c["name"].as_str().unwrap_or_default())?;
        }
    }
    table.time_row(
        "sandbox_fork x4: parent paused",
        rounds,
        &Stats::of(paused),
        Some(PAUSED),
    );
    table.time_row("  first copy ready", rounds, &Stats::of(first), None);
    table.time_row("  all four ready", rounds, &Stats::of(all), Some(ALL_FOUR));
    table.time_row("  round trip", rounds, &Stats::of(trips), None);
    notes.iter().for_each(|n| table.note(n));
    Ok(())
}

fn suspend_rounds(
    table: &mut Table,
    server: &mut Server,
    killer: &VmKiller,
    name: &str,
    rounds: usize,
    clone_ready: Duration,
) -> Res<()> {
    let (mut suspends, mut resumes, mut sizes) = (vec![], vec![], vec![]);
    for _ in 0..rounds {
        let r = server.tool_within("sandbox_suspend", json!({"name": name}), STEP)?;
        let s = structured(&r)?;
        suspends.push(Duration::from_millis(s["suspend_ms"].as_u64().unwrap_or(0)));
        sizes.push(s["ram_bytes"].as_u64().unwrap_or(0) + s["state_bytes"].as_u64().unwrap_or(0));
        let r = server.tool_within("sandbox_resume", json!({"name": name}), STEP)?;
        let s = structured(&r)?;
        killer.track(s);
        if s["agent_ready"] != json!(true) {
            return Err(format!("a resumed sandbox's agent was not ready: {s}"));
        }
        resumes.push(Duration::from_millis(s["resume_ms"].as_u64().unwrap_or(0)));
    }
    table.time_row(
        "sandbox_suspend (256 MiB)",
        rounds,
        &Stats::of(suspends),
        None,
    );
    table.time_row(
        "sandbox_resume, ready",
        rounds,
        &Stats::of(resumes),
        Some(clone_ready * 2),
    );
    let mib = sizes.iter().sum::<u64>() as f64 / sizes.len().max(1) as f64 / 1048576.0;
    table.note(&format!(
        "a suspended sandbox takes {mib:.1} MiB on disk (its touched memory and device state); \
         the resume's target is 2x this run's clone ready_ms median ({} ms)",
        clone_ready.as_millis()
    ));
    Ok(())
}
