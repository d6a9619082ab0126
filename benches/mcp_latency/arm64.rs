//! The arm64 section (`arm64`): the aarch64 test guest (`build_guest.py --arch aarch64`:
//! Debian's arm64 kernel `Image`, busybox and qemu-guest-agent in an initramfs, console on
//! ttyAMA0) on QEMU's `virt` board under TCG (qemu-system-aarch64, `-cpu max` as the server
//! launches it), one vCPU and 256 MiB, all in one run on one server:
//!
//! 1. cold sandbox_vm boots (kernel boot on the bench's small empty qcow2) until the agent
//!    answers, each destroyed before the next but the last, which stays up for 3. and 4.;
//! 2. guest_exec `/bin/true` round trips on that running guest;
//! 3. vm_screenshot of its screen (virtio-gpu with the kernel's framebuffer console);
//! 4. template_create of the guest once, then sandbox_vm clones of it (one unmeasured warm-up
//!    clone first), each destroyed before the next.
//!
//! Knobs: `MCQEMU_BENCH_ARM_BOOTS` (default 3) cold boots, `MCQEMU_BENCH_ARM_CLONES` (default 5)
//! measured clones; 20 guest_exec and 10 vm_screenshot runs (after one warm-up each). SKIPPED
//! when qemu-system-aarch64 is not usable or the guest cannot be built; every sandbox and the
//! template are removed at the end (sandbox_destroy / template_delete, then SIGKILL by PID).

use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::clones::{cleanup, clone_vm, cold_sandbox, destroy, load_average};
use crate::common::{try_run, try_test_guest_arm64, Guest, Server, VmKiller};
use crate::report::{Bench, Stats, Table};
use crate::{
    env_count, first_line_of, ms, structured, Dirs, Res, ToolCalls, EXEC_TARGET, QEMU_IMG_TIMEOUT,
};

const PROGRAM: &str = "qemu-system-aarch64";
/// The guest memory of every VM of the section.
const MEMORY_MB: u64 = 256;
/// The agent wait given to sandbox_vm and template_create (wait_agent_s): an emulated arm64
/// boot takes several seconds, more on a loaded host.
const AGENT_WAIT_S: u64 = 120;
/// Bound on a sandbox_vm call (a boot, or a clone).
const BOOT_TIMEOUT: Duration = Duration::from_secs(AGENT_WAIT_S + 60);
/// Bound on template_create (a boot and the save).
const CREATE_TIMEOUT: Duration = Duration::from_secs(AGENT_WAIT_S + 180);
/// Bound on guest_exec and vm_screenshot.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);
/// Repetitions of the guest_exec and vm_screenshot rows.
const EXEC_N: usize = 20;
const SCREENSHOT_N: usize = 10;
/// The prefix of every VM this section starts (for the cleanup), and its template.
const PREFIX: &str = "bench-a64-";
const TEMPLATE: &str = "bench-a64-tpl";

/// The arm64 section; SKIPPED when qemu-system-aarch64 or the arm64 guest is missing, an ERROR
/// row when something fails. Every VM and the template are removed at the end.
pub fn arm64_rows(table: &mut Table, dirs: &Dirs, base_image: &Path) {
    table.section("arm64: the aarch64 test guest on the virt board (TCG, -cpu max)");
    let name = "arm64 section";
    if let Err(e) = try_run(PROGRAM, &[OsStr::new("--version")], QEMU_IMG_TIMEOUT) {
        table.skip_row(name, &format!("{PROGRAM} is not usable ({e})"));
        return;
    }
    let guest = match try_test_guest_arm64() {
        Ok(g) => g,
        Err(e) => {
            table.skip_row(
                name,
                &format!("the arm64 test guest could not be built: {e}"),
            );
            return;
        }
    };
    let killer = VmKiller::new(dirs.tmp.path());
    let ab = ArmBench {
        killer: &killer,
        guest: &guest,
        boots: env_count("MCQEMU_BENCH_ARM_BOOTS", 3),
        clones: env_count("MCQEMU_BENCH_ARM_CLONES", 5),
    };
    table.note(&format!(
        "{}; arm64 test guest, {MEMORY_MB} MiB, 1 vCPU; {} cold boots, {} clones (+1 warm-up), \
         {EXEC_N} guest_exec, {SCREENSHOT_N} screenshots; load average {} at the start",
        first_line_of(PROGRAM, &["--version"]),
        ab.boots,
        ab.clones,
        load_average()
    ));
    let outcome = dirs.server().and_then(|mut server| {
        let r = ab.rows(table, &mut server, base_image);
        cleanup(table, &mut server, PREFIX, TEMPLATE);
        server.try_close()?;
        r
    });
    table.or_error(name, outcome);
    let killed = killer.kill_all();
    if !killed.is_empty() {
        table.note(&format!("cleanup SIGKILLed left-over QEMU PIDs {killed:?}"));
    }
}

struct ArmBench<'a> {
    killer: &'a VmKiller,
    guest: &'a Guest,
    boots: usize,
    clones: usize,
}

impl ArmBench<'_> {
    fn rows(&self, table: &mut Table, server: &mut Server, base_image: &Path) -> Res<()> {
        let running = format!("{PREFIX}cold");
        let cold = self.cold_rows(table, server, base_image, &running)?;
        self.exec_row(table, server, &running)?;
        self.screenshot_row(table, server, &running)?;
        destroy(server, &running)?;
        self.template_rows(table, server, cold)
    }

    /// The guest's launch arguments (arch, kernel, initrd, append, memory, one vCPU) plus
    /// `extra`.
    fn args(&self, extra: Value) -> Value {
        let g = self.guest;
        let mut v = json!({
            "arch": "aarch64", "kernel": g.kernel, "initrd": g.initrd, "append": g.append,
            "memory_mb": MEMORY_MB, "cpus": 1, "wait_agent_s": AGENT_WAIT_S,
        });
        if let (Some(m), Some(e)) = (v.as_object_mut(), extra.as_object()) {
            m.extend(e.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        v
    }

    // ---- cold boots ----

    /// `boots` cold sandbox_vm boots named `name`; every one but the last is destroyed before
    /// the next, the last is left running. Returns the round trips' median.
    fn cold_rows(
        &self,
        table: &mut Table,
        server: &mut Server,
        base_image: &Path,
        name: &str,
    ) -> Res<Duration> {
        let (mut round_trip, mut ready) = (Vec::new(), Vec::new());
        for i in 1..=self.boots {
            let fail = |e: String| format!("cold boot {i}: {e}");
            let (s, took) = cold_sandbox(
                server,
                self.killer,
                self.args(json!({"base_image": base_image, "name": name,
                                     "port_forwards": []})),
                BOOT_TIMEOUT,
            )
            .map_err(fail)?;
            if let Some(r) = s["ready_ms"].as_u64() {
                ready.push(Duration::from_millis(r));
            }
            if i < self.boots {
                destroy(server, name).map_err(fail)?;
            }
            round_trip.push(took);
        }
        let s = Stats::of(round_trip.clone());
        table.time_row(
            "arm64 cold sandbox_vm (boot), round trip",
            self.boots,
            &s,
            None,
        );
        if ready.len() == self.boots {
            table.time_row("  ready_ms (server)", self.boots, &Stats::of(ready), None);
        }
        table.note(&format!("round trip per boot, ms: {}", list(&round_trip)));
        Ok(s.median)
    }

    // ---- on the running guest ----

    fn exec_row(&self, table: &mut Table, server: &mut Server, name: &str) -> Res<()> {
        let bench = Bench {
            n: EXEC_N,
            warmup: 1,
        };
        bench.time(
            table,
            "arm64 guest_exec /bin/true",
            Some(EXEC_TARGET),
            || {
                let r = server.tool_within(
                    "guest_exec",
                    json!({"name": name, "command": "/bin/true"}),
                    STEP_TIMEOUT,
                )?;
                let s = structured(&r)?;
                match s["exitcode"].as_i64() {
                    Some(0) => Ok(()),
                    _ => Err(format!("/bin/true did not exit 0: {s}")),
                }
            },
        )?;
        Ok(())
    }

    fn screenshot_row(&self, table: &mut Table, server: &mut Server, name: &str) -> Res<()> {
        let first = server.tool_within("vm_screenshot", json!({ "name": name }), STEP_TIMEOUT)?;
        let s = structured(&first)?;
        let (w, h) = match (s["width"].as_u64(), s["height"].as_u64()) {
            (Some(w), Some(h)) if w > 0 && h > 0 => (w, h),
            _ => return Err(format!("vm_screenshot gave no size: {s}")),
        };
        let png_bytes = s["bytes"].as_u64().unwrap_or(0);
        let bench = Bench {
            n: SCREENSHOT_N,
            warmup: 1,
        };
        bench.time(
            table,
            &format!("arm64 vm_screenshot inline PNG, {w}x{h}"),
            None,
            || {
                let r =
                    server.tool_within("vm_screenshot", json!({ "name": name }), STEP_TIMEOUT)?;
                let has_image = r["content"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == json!("image") && c["data"].as_str().is_some());
                if has_image {
                    Ok(())
                } else {
                    Err(format!("vm_screenshot returned no inline image: {r}"))
                }
            },
        )?;
        table.note(&format!(
            "virtio-gpu screen {w}x{h} with the kernel's console ({png_bytes} PNG bytes); the \
             x86 row's 10 ms target is for 1024x768 on VGA, so none here"
        ));
        Ok(())
    }

    // ---- a template and its clones ----

    fn template_rows(&self, table: &mut Table, server: &mut Server, cold: Duration) -> Res<()> {
        let t0 = Instant::now();
        let r = server.tool_within(
            "template_create",
            self.args(json!({ "name": TEMPLATE })),
            CREATE_TIMEOUT,
        )?;
        let took = t0.elapsed();
        let s = structured(&r)?;
        let one = |d: Duration| Stats::of(vec![d]);
        table.time_row("arm64 template_create (boot, save)", 1, &one(took), None);
        if let Some(save) = s["save_ms"].as_u64() {
            table.time_row(
                "  save_ms (server)",
                1,
                &one(Duration::from_millis(save)),
                None,
            );
        }
        if let Some(state) = s["state_bytes"].as_u64() {
            table.note(&format!("saved device state: {} KiB", state / 1024));
        }

        let name = format!("{PREFIX}clone");
        let (mut ready, mut round_trip) = (Vec::new(), Vec::new());
        for i in 0..=self.clones {
            let fail = |e: String| format!("clone {i}: {e}");
            let c = clone_vm(server, self.killer, TEMPLATE, &name).map_err(fail)?;
            destroy(server, &name).map_err(fail)?;
            if i > 0 {
                ready.push(c.ready);
                round_trip.push(c.round_trip);
            }
        }
        let rd = Stats::of(ready.clone());
        table.time_row("arm64 clone: ready_ms (server)", self.clones, &rd, None);
        let rt = Stats::of(round_trip);
        table.time_row("arm64 clone: sandbox_vm round trip", self.clones, &rt, None);
        table.note(&format!(
            "ready_ms per clone: {}; a clone is ready {:.1}x sooner than a cold boot \
             (round-trip medians {} ms vs {} ms)",
            list(&ready),
            cold.as_secs_f64() / rt.median.as_secs_f64().max(1e-6),
            ms(rt.median),
            ms(cold)
        ));
        Ok(())
    }
}

/// Whole milliseconds, space separated.
fn list(v: &[Duration]) -> String {
    v.iter()
        .map(|d| d.as_millis().to_string())
        .collect::<Vec<_>>()
        .join(" ")
}
