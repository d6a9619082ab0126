//! Warm pools, in the templates section: template_pool keeps clones of the section's template
//! started, and sandbox_vm {template} takes one. Each take is timed from a full pool (the bench
//! waits for the refill in between, untimed), and must say `pooled`.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::clones::{checked_clone, destroy};
use crate::common::{Server, VmKiller};
use crate::report::{Stats, Table};
use crate::{structured, Res, ToolCalls};

/// The target for a take from a warm pool (issue 19).
const TAKE_TARGET: Duration = Duration::from_millis(20);
/// Clones the pool keeps.
const POOL: u64 = 2;
/// Longest wait for the pool to fill.
const FILL_TIMEOUT: Duration = Duration::from_secs(60);

/// `takes` sandbox_vm calls that each take a pooled clone of `template`; the pool is ended
/// afterwards. Returns the takes' median round trip.
pub fn pool_rows(
    table: &mut Table,
    server: &mut Server,
    killer: &VmKiller,
    template: &str,
    takes: usize,
) -> Res<Duration> {
    server.tool("template_pool", json!({"name": template, "size": POOL}))?;
    let result = takes_from_full(table, server, killer, template, takes);
    let ended = server.tool("template_pool", json!({"name": template, "size": 0}));
    let median = result?;
    ended?;
    Ok(median)
}

fn takes_from_full(
    table: &mut Table,
    server: &mut Server,
    killer: &VmKiller,
    template: &str,
    takes: usize,
) -> Res<Duration> {
    let (mut round_trips, mut fills) = (Vec::new(), Vec::new());
    for i in 0..takes {
        fills.push(wait_full(server, template)?);
        let name = format!("bench-pool-{i}");
        let t0 = Instant::now();
        let r = server.tool_within(
            "sandbox_vm",
            json!({"template": template, "name": name}),
            Duration::from_secs(120),
        )?;
        let round_trip = t0.elapsed();
        let s = structured(&r)?;
        checked_clone(killer, s, round_trip)?;
        if s["pooled"] != json!(true) {
            return Err(format!(
                "sandbox_vm from a full pool took no pooled clone: {s}"
            ));
        }
        round_trips.push(round_trip);
        destroy(server, &name)?;
    }
    let stats = Stats::of(round_trips.clone());
    table.time_row(
        "sandbox_vm from a warm pool, round trip",
        takes,
        &stats,
        Some(TAKE_TARGET),
    );
    let refill = Stats::of(fills[1..].to_vec());
    table.note(&format!(
        "pool of {POOL}; before each take the bench waits (untimed) until the pool is full \
         again: the refill after a take took {:.0} ms median (a fresh clone and its clock)",
        refill.median.as_secs_f64() * 1000.0
    ));
    Ok(stats.median)
}

/// Waits until template_list shows the pool of `template` full; returns how long that took.
fn wait_full(server: &mut Server, template: &str) -> Res<Duration> {
    let t0 = Instant::now();
    loop {
        let r = server.tool("template_list", json!({}))?;
        let ready = structured(&r)?["templates"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["name"] == template)
            .and_then(|t| t["pool_ready"].as_u64())
            .unwrap_or(0);
        if ready >= POOL {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > FILL_TIMEOUT {
            return Err(format!(
                "the pool of {template} had {ready} of {POOL} clones ready after {FILL_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
