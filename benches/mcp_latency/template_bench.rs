//! One run of the templates section (`templates.rs` runs it per QEMU and compares): the
//! template_create of the test guest, sequential clones with their first command and clock,
//! four at once, takes from a warm pool, a clone's Pss, cold boots of the same guest.

use std::path::Path;
use std::time::{Duration, Instant};

use mcqemu::qemu::qga::Qga;
use serde_json::json;

use crate::clones::{
    checked_clone, clone_vm, cold_sandbox, destroy, first_command, smaps_kb, Cloned,
};
use crate::common::{Guest, Server, TempDir, VmKiller};
use crate::report::{Stats, Table};
use crate::templates::{Medians, QemuRun, MEMORY_MB, PREFIX};
use crate::{ms, newest, structured, Dirs, Res, ToolCalls};

/// Targets.
const CLONE_MEDIAN_TARGET: Duration = Duration::from_millis(150);
const CLONE_MEDIAN_GOAL: Duration = Duration::from_millis(100);
const CLONE_P95_TARGET: Duration = Duration::from_millis(250);
const FOUR_CLONES_TARGET: Duration = Duration::from_millis(500);
/// A clone's clock in its first command against the host's.
const CLOCK_SKEW_TARGET: Duration = Duration::from_secs(2);
const CLONE_PSS_TARGET_KB: u64 = 64 * 1024;
/// What the template's setup leaves in /root/marker.
const MARKER: &str = "bench-template-marker";
/// Longest wait for template_create (a boot of the test guest, its setup and the save).
const CREATE_TIMEOUT: Duration = Duration::from_secs(240);
/// The agent wait given to sandbox_vm (wait_agent_s), and the bound on its call.
const AGENT_WAIT_S: u64 = 60;
const CLONE_TIMEOUT: Duration = Duration::from_secs(AGENT_WAIT_S + 60);
/// Longest wait for sandbox_destroy, template_delete and guest_exec.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

pub struct TemplateBench<'a> {
    pub dirs: &'a Dirs,
    pub killer: &'a VmKiller,
    pub guest: &'a Guest,
    pub qemu: &'a QemuRun,
    pub clones: usize,
    pub rounds: usize,
    pub cold: usize,
}

impl TemplateBench<'_> {
    /// A fresh, initialized server on the bench's folders, with the run's environment.
    pub fn server(&self) -> Res<Server> {
        let env: Vec<(&str, &str)> = self
            .qemu
            .env
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .collect();
        let own = TempDir::try_new("srv")?;
        let mut s = Server::try_start_with(own, &self.dirs.state, &self.dirs.runtime, &env)?;
        s.try_initialize(newest())?;
        Ok(s)
    }

    pub fn rows(&self, table: &mut Table, server: &mut Server, base_image: &Path) -> Res<Medians> {
        self.create_rows(table, server)?;
        let (clone_ready, clone_round_trip) = self.sequential_rows(table, server)?;
        crate::clones::mount_rows(
            table,
            server,
            self.killer,
            (
                self.qemu.template,
                &self.dirs.tmp.path().join("clone-share"),
            ),
            self.clones,
            clone_round_trip,
        )?;
        let four = self.concurrent_rows(table, server)?;
        crate::pools::pool_rows(table, server, self.killer, self.qemu.template, self.clones)?;
        // Travel on the system's QEMU only (the second host runs it too).
        if self.qemu.env.is_empty() {
            let moved = crate::travel::travel_rows(
                table,
                server,
                self.qemu.template,
                self.dirs,
                clone_ready,
            );
            table.or_error("template_push/pull", moved);
        }
        self.pss_row(table, server)?;
        crate::forks::fork_rows(
            table,
            server,
            self.killer,
            self.qemu.template,
            self.rounds,
            clone_ready,
        )?;
        let cold = self.cold_rows(table, server, base_image, clone_round_trip)?;
        Ok(Medians {
            clone_ready,
            clone_round_trip,
            four,
            cold,
        })
    }

    fn clone_vm(&self, server: &mut Server, name: &str) -> Res<Cloned> {
        clone_vm(server, self.killer, self.qemu.template, name)
    }

    // ---- template_create ----

    fn create_rows(&self, table: &mut Table, server: &mut Server) -> Res<()> {
        let g = self.guest;
        let t0 = Instant::now();
        let r = server.tool_within(
            "template_create",
            json!({
                "name": self.qemu.template,
                "kernel": g.kernel, "initrd": g.initrd, "append": g.append,
                "memory_mb": MEMORY_MB, "cpus": 1, "wait_agent_s": AGENT_WAIT_S,
                "setup": [{"command": "/bin/sh",
                           "args": ["-c", format!("echo {MARKER} > /root/marker")]}]
            }),
            CREATE_TIMEOUT,
        )?;
        let took = t0.elapsed();
        let s = structured(&r)?;
        let field = |k: &str| {
            s[k].as_u64()
                .ok_or_else(|| format!("template_create gave no {k}: {s}"))
        };
        let (duration, save, state) = (
            field("duration_ms")?,
            field("save_ms")?,
            field("state_bytes")?,
        );
        let one = |d: Duration| Stats::of(vec![d]);
        table.time_row("template_create (boot, setup, save)", 1, &one(took), None);
        table.time_row(
            "  duration_ms (server)",
            1,
            &one(Duration::from_millis(duration)),
            None,
        );
        table.time_row(
            "  save_ms (server)",
            1,
            &one(Duration::from_millis(save)),
            None,
        );
        table.note(&format!(
            "saved device state: {} KiB; guest RAM stays in the template's {MEMORY_MB} MiB file",
            state / 1024
        ));
        Ok(())
    }

    // ---- clones one after another ----

    /// The marker of the template's setup, read in a clone (untimed check).
    fn check_marker(&self, server: &mut Server, name: &str) -> Res<()> {
        let r = server.tool_within(
            "guest_exec",
            json!({"name": name, "command": "cat", "args": ["/root/marker"]}),
            STEP_TIMEOUT,
        )?;
        let s = structured(&r)?;
        if s["stdout"] != json!(format!("{MARKER}\n")) {
            return Err(format!(
                "clone {name} does not see the template's marker: {s}"
            ));
        }
        Ok(())
    }

    /// One warm-up clone, then `clones` measured ones, each destroyed (untimed) before the
    /// next; each clone's first command is timed and its clock checked. Returns the medians of
    /// ready_ms and of the round trips.
    fn sequential_rows(&self, table: &mut Table, server: &mut Server) -> Res<(Duration, Duration)> {
        let name = format!("{PREFIX}seq");
        let (mut ready, mut round_trip) = (Vec::new(), Vec::new());
        let (mut first, mut skews) = (Vec::new(), Vec::new());
        let mut steps: Vec<(String, Vec<f64>)> = Vec::new();
        for i in 0..=self.clones {
            let fail = |e: String| format!("sequential clone {i}: {e}");
            let c = self.clone_vm(server, &name).map_err(fail)?;
            let (cmd, skew) = first_command(server, &name).map_err(fail)?;
            if i > 0 {
                first.push(cmd);
                skews.push(skew);
            }
            if i == 1 {
                self.check_marker(server, &name).map_err(fail)?;
            }
            destroy(server, &name).map_err(fail)?;
            if i > 0 {
                ready.push(c.ready);
                round_trip.push(c.round_trip);
                for (k, ms) in &c.steps {
                    match steps.iter_mut().find(|(n, _)| n == k) {
                        Some((_, v)) => v.push(*ms),
                        None => steps.push((k.clone(), vec![*ms])),
                    }
                }
            }
        }
        let n = self.clones;
        let rows = |table: &mut Table, label: &str, v: &[Duration]| {
            let s = Stats::of(v.to_vec());
            table.time_row(label, n, &s, Some(CLONE_MEDIAN_TARGET));
            p95_row(table, n, v);
            s
        };
        let rd = rows(table, "clone: ready_ms (server)", &ready);
        let rt = rows(table, "clone: sandbox_vm round trip", &round_trip);
        table.note(&format!(
            "goal <= {} ms: {}",
            CLONE_MEDIAN_GOAL.as_millis(),
            if rd.median <= CLONE_MEDIAN_GOAL {
                "met"
            } else {
                "not yet"
            }
        ));
        table.time_row(
            "clone: its first guest_exec (adjtimex)",
            n,
            &Stats::of(first.clone()),
            None,
        );
        let worst = skews.iter().max().copied().unwrap_or_default();
        table.time_row(
            "  its clock off the host's (worst)",
            n,
            &Stats {
                median: worst,
                p90: worst,
                min: worst,
            },
            Some(CLOCK_SKEW_TARGET),
        );
        table.note(&format!(
            "the first command waits for the clock the server sets after the agent's first \
             answer; skews in ms: {}",
            skews
                .iter()
                .map(|d| format!("{:.0}", d.as_secs_f64() * 1000.0))
                .collect::<Vec<_>>()
                .join(" ")
        ));
        let list = |v: &[Duration]| {
            v.iter()
                .map(|d| d.as_millis().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        };
        table.note(&format!("ready_ms per clone: {}", list(&ready)));
        // Each step's median and its share of the median ready time.
        let total: f64 =
            ready.iter().map(|d| d.as_secs_f64() * 1000.0).sum::<f64>() / ready.len().max(1) as f64;
        let shares: Vec<String> = steps
            .iter_mut()
            .map(|(k, v)| {
                v.sort_by(f64::total_cmp);
                let med = v[v.len() / 2];
                format!("{k} {med:.1} ms ({:.0} %)", 100.0 * med / total.max(0.001))
            })
            .collect();
        table.note(&format!(
            "clone steps (median, share of the mean ready time): {}",
            shares.join(", ")
        ));
        Ok((rd.median, rt.median))
    }

    // ---- four clones at once ----

    /// `rounds` times: four sandbox_vm calls pipelined on the one server, timed from the first
    /// request until the last answer; then destroyed (untimed). In the last round, the Pss of
    /// each of the four is noted before they go. Returns the walls' median.
    fn concurrent_rows(&self, table: &mut Table, server: &mut Server) -> Res<Duration> {
        let mut walls = Vec::new();
        let mut slowest = Vec::new();
        for round in 1..=self.rounds {
            let fail = |e: String| format!("concurrent round {round}: {e}");
            let names: Vec<String> = (1..=4).map(|i| format!("{PREFIX}conc{i}")).collect();
            let t0 = Instant::now();
            let mut ids = Vec::new();
            for n in &names {
                let id = json!(server.fresh_id());
                server
                    .try_send_request(
                        &id,
                        "tools/call",
                        json!({"name": "sandbox_vm",
                               "arguments": {"template": self.qemu.template, "name": n,
                                             "port_forwards": [],
                                             "wait_agent_s": AGENT_WAIT_S}}),
                    )
                    .map_err(fail)?;
                ids.push(id);
            }
            // Every answer is read (and every QEMU tracked) before any is judged.
            let mut answers = Vec::new();
            for id in &ids {
                let (resp, others) = server.try_read_until_id(id, CLONE_TIMEOUT).map_err(fail)?;
                server.unread(
                    others
                        .into_iter()
                        .filter(|m| m.get("method").is_none())
                        .collect(),
                );
                if let Some(s) = resp.pointer("/result/structuredContent") {
                    self.killer.track(s);
                }
                answers.push(resp);
            }
            let wall = t0.elapsed();
            let mut clones = Vec::new();
            for (resp, n) in answers.iter().zip(&names) {
                if resp.pointer("/result/isError") != Some(&json!(false)) {
                    return Err(fail(format!("sandbox_vm {n} failed: {resp}")));
                }
                let s = resp
                    .pointer("/result/structuredContent")
                    .ok_or_else(|| fail(format!("no structuredContent: {resp}")))?;
                clones.push(checked_clone(self.killer, s, wall).map_err(fail)?);
            }
            walls.push(wall);
            slowest.push(clones.iter().map(|c| c.ready).max().unwrap_or_default());
            if round == self.rounds {
                let pss: Vec<String> = clones
                    .iter()
                    .map(|c| smaps_kb(c.pid, "Pss").map(|kb| format!("{:.1}", kb as f64 / 1024.0)))
                    .collect::<Res<_>>()
                    .map_err(fail)?;
                table.note(&format!(
                    "Pss of four concurrent clones, MiB: {}",
                    pss.join(", ")
                ));
            }
            for n in &names {
                destroy(server, n).map_err(fail)?;
            }
        }
        let n = self.rounds;
        let wall = Stats::of(walls);
        table.time_row(
            "4 concurrent clones: all ready (wall)",
            n,
            &wall,
            Some(FOUR_CLONES_TARGET),
        );
        table.time_row(
            "  slowest ready_ms of the four (server)",
            n,
            &Stats::of(slowest),
            None,
        );
        Ok(wall.median)
    }

    // ---- one clone: its clock setting and its memory ----

    /// On one 256 MiB clone that has run a command: what guest-set-time costs, and the
    /// clone's proportional set size.
    fn pss_row(&self, table: &mut Table, server: &mut Server) -> Res<()> {
        let name = format!("{PREFIX}pss");
        let c = self.clone_vm(server, &name)?;
        self.check_marker(server, &name)?;
        // What setting the clock costs a clone's readiness: guest-set-time straight on its
        // agent (qemu-ga runs hwclock in the guest for it).
        let sock = c.qga.ok_or("sandbox_vm gave no qga_socket")?;
        let mut agent = Qga::connect(Path::new(&sock), STEP_TIMEOUT)
            .map_err(|e| format!("the clone's agent on {sock}: {e}"))?;
        let mut set_time = Vec::new();
        for _ in 0..5 {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            let t0 = Instant::now();
            agent
                .execute_within(
                    "guest-set-time",
                    Some(json!({ "time": now.as_nanos() as u64 })),
                    STEP_TIMEOUT,
                )
                .map_err(|e| format!("guest-set-time: {e}"))?;
            set_time.push(t0.elapsed());
        }
        drop(agent);
        table.time_row(
            "  ref: guest-set-time on a clone's agent",
            set_time.len(),
            &Stats::of(set_time),
            None,
        );
        std::thread::sleep(Duration::from_secs(1));
        let others = other_qemus(c.pid);
        let pss = smaps_kb(c.pid, "Pss")?;
        let rss = smaps_kb(c.pid, "Rss")?;
        let anon = smaps_kb(c.pid, "Pss_Anon")?;
        let file = smaps_kb(c.pid, "Pss_File")?;
        destroy(server, &name)?;
        table.rss_info_row(&format!("clone Pss ({MEMORY_MB} MiB guest)"), pss);
        let verdict = if pss <= CLONE_PSS_TARGET_KB {
            "ok"
        } else {
            "MISSED"
        };
        let mib = |kb: u64| kb as f64 / 1024.0;
        table.note(&format!(
            "target <= {} MiB: {verdict}; of it Pss_Anon {:.1} MiB (the clone's own pages), \
             Pss_File {:.1} MiB (template RAM pages it maps, shared with other clones at their \
             share, and QEMU's binary and libraries, ~27 MiB shared with every other QEMU); Rss \
             {:.1} MiB (/proc/PID/smaps_rollup); {} other QEMU process(es) running, so \
             'alone' counts the binary's pages {}",
            CLONE_PSS_TARGET_KB / 1024,
            mib(anon),
            mib(file),
            mib(rss),
            others,
            if others == 0 { "whole" } else { "at a share" }
        ));
        Ok(())
    }

    // ---- cold boots ----

    /// `cold` sandbox_vm boots of the same guest (256 MiB, on the bench's qcow2), each
    /// destroyed before the next, next to the clones' numbers. Returns their median.
    fn cold_rows(
        &self,
        table: &mut Table,
        server: &mut Server,
        base_image: &Path,
        clone_median: Duration,
    ) -> Res<Duration> {
        let g = self.guest;
        let name = format!("{PREFIX}cold");
        let mut times = Vec::new();
        let mut pss = 0;
        for i in 1..=self.cold {
            let fail = |e: String| format!("cold boot {i}: {e}");
            let (s, took) = cold_sandbox(
                server,
                self.killer,
                json!({
                    "base_image": base_image, "name": name, "memory_mb": MEMORY_MB,
                    "cpus": 1, "port_forwards": [], "wait_agent_s": AGENT_WAIT_S,
                    "kernel": g.kernel, "initrd": g.initrd, "append": g.append
                }),
                CLONE_TIMEOUT,
            )
            .map_err(fail)?;
            if i == self.cold {
                if let Some(pid) = s["pid"].as_i64() {
                    pss = smaps_kb(pid as i32, "Pss").map_err(fail)?;
                }
            }
            destroy(server, &name).map_err(fail)?;
            times.push(took);
        }
        let s = Stats::of(times);
        table.time_row("cold sandbox_vm (boot), round trip", self.cold, &s, None);
        table.note(&format!(
            "a clone is ready {:.0}x sooner than a cold boot (round-trip medians {} ms vs {} \
             ms); a booted {MEMORY_MB} MiB guest's Pss: {:.1} MiB",
            s.median.as_secs_f64() / clone_median.as_secs_f64().max(1e-6),
            ms(clone_median),
            ms(s.median),
            pss as f64 / 1024.0
        ));
        Ok(s.median)
    }
}

/// A p95 row (nearest rank) under the row of the same samples: the p95 fills the columns, so
/// that the target is checked against it.
fn p95_row(table: &mut Table, n: usize, samples: &[Duration]) {
    let mut v = samples.to_vec();
    v.sort();
    let p95 = v[(v.len() * 95).div_ceil(100).max(1) - 1];
    let s = Stats {
        median: p95,
        p90: p95,
        min: p95,
    };
    table.time_row("  p95 (all columns)", n, &s, Some(CLONE_P95_TARGET));
}

/// QEMU processes running besides `pid`: they share the binary's and libraries' pages, so a
/// clone's Pss "alone" depends on them.
fn other_qemus(pid: i32) -> usize {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy() != pid.to_string())
                .filter(|e| {
                    std::fs::read_to_string(e.path().join("comm"))
                        .is_ok_and(|c| c.starts_with("qemu-system"))
                })
                .count()
        })
        .unwrap_or(0)
}
