//! The stock section: the journey on the stock-shaped test image (`common::stock`: Debian 12
//! as the genericcloud image ships, UEFI, the cloud kernel, no guest agent), in one run and
//! under TCG:
//!
//! 1. image_prepare of the stock image (UEFI, 1024 MiB, 1 vCPU), which installs
//!    qemu-guest-agent from the image's flat apt repository, served by the bench over HTTP on
//!    the loopback (10.0.2.2 to the guest) as the only apt source: its duration;
//! 2. cold sandbox_vm boots of the prepared image until its agent answers (no
//!    wait_cloud_init): the server's agent_wait_ms and the round trip;
//! 3. template_create from the prepared image (UEFI) and sandbox_vm clones of it: ready_ms.
//!
//! Knobs: `MCQEMU_BENCH_STOCK_BOOTS` (default 2) cold boots, `MCQEMU_BENCH_STOCK_CLONES`
//! (default 5) clones. The section prints SKIPPED when QEMU is missing or the stock image
//! cannot be built (it needs root, and the tools of `.ci/setup-host`). Every sandbox and the
//! template are removed at the end, then any QEMU left is SIGKILLed, and the prepared image
//! is deleted.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::clones::{cleanup, clone_vm, cold_sandbox, destroy, load_average, smaps_kb};
use crate::common::stock::{stock_roots, try_test_stock_image, StockImage};
use crate::common::{try_run, HttpServer, Route, Server, TempDir, VmKiller};
use crate::report::{Stats, Table};
use crate::{env_count, ms, newest, structured, Dirs, Res, ToolCalls, QEMU_IMG_TIMEOUT};

/// The template's name, and the prefix of every VM the section starts (for the cleanup).
const TEMPLATE: &str = "bench-stock-tpl";
const PREFIX: &str = "bench-s-";
/// Guest memory, as the stock image's test boots it.
const MEMORY_MB: u64 = 1024;
/// image_prepare's timeout_s (for the agent, and for cloud-init, each) and the bound on its call.
const PREPARE_TIMEOUT_S: u64 = 1200;
const PREPARE_CALL: Duration = Duration::from_secs(2 * PREPARE_TIMEOUT_S + 120);
/// wait_agent_s of a cold boot and of template_create, and the bound on those calls.
const BOOT_WAIT_S: u64 = 600;
const BOOT_CALL: Duration = Duration::from_secs(BOOT_WAIT_S + 120);

/// The stock section. Prints SKIPPED when QEMU or the stock image is missing, an ERROR row
/// when a part fails (a failed image_prepare ends the section; the cold boots and the template
/// fail apart from each other).
pub fn stock_rows(table: &mut Table, dirs: &Dirs) {
    table.section(
        "stock: Debian 12 genericcloud-shaped image (UEFI, cloud kernel, agent from a local \
         apt repository), TCG",
    );
    let name = "stock section";
    if let Err(e) = try_run(
        "qemu-system-x86_64",
        &[OsStr::new("--version")],
        QEMU_IMG_TIMEOUT,
    ) {
        table.skip_row(name, &format!("qemu-system-x86_64 is not usable ({e})"));
        return;
    }
    let image = match try_test_stock_image() {
        Ok(i) => i,
        Err(e) => {
            table.skip_row(name, &format!("the stock image could not be built: {e}"));
            return;
        }
    };
    let Some(http) = table.or_error(name, repo_server(&image)) else {
        return;
    };
    let killer = VmKiller::new(dirs.tmp.path());
    let sb = StockBench {
        dirs,
        killer: &killer,
        image: &image,
        prepared: dirs.tmp.path().join("stock-prepared.qcow2"),
        boots: env_count("MCQEMU_BENCH_STOCK_BOOTS", 2),
        clones: env_count("MCQEMU_BENCH_STOCK_CLONES", 5),
    };
    table.note(&format!(
        "{MEMORY_MB} MiB, 1 vCPU, UEFI; {} cold boots, {} clones; apt repository served at \
         {}; load average {} at the start",
        sb.boots,
        sb.clones,
        http.url("/"),
        load_average()
    ));
    let outcome = sb.server().and_then(|mut server| {
        let r = sb.rows(table, &mut server, &http);
        cleanup(table, &mut server, PREFIX, TEMPLATE);
        server.try_close()?;
        r
    });
    table.or_error(name, outcome);
    let killed = killer.kill_all();
    if !killed.is_empty() {
        table.note(&format!("cleanup SIGKILLed left-over QEMU PIDs {killed:?}"));
    }
    if sb.prepared.exists() {
        if let Err(e) = std::fs::remove_file(&sb.prepared) {
            table.note(&format!(
                "cleanup problem: cannot remove {}: {e}",
                sb.prepared.display()
            ));
        }
    }
}

/// An HTTP server with the stock image's flat apt repository at its root.
fn repo_server(image: &StockImage) -> Res<HttpServer> {
    let dir = &image.repo;
    let list = std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut routes: Vec<(String, Route)> = Vec::new();
    for entry in list {
        let p = entry
            .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
            .path();
        let file = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let data = std::fs::read(&p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
        let body = Route::body(data);
        // apt asks a flat repository `URI ./` for `URI/./NAME`, with `+` sent as `%2b`.
        let quoted = file.replace('+', "%2b");
        for path in [format!("/./{quoted}"), format!("/{quoted}")] {
            routes.push((path, body.clone()));
        }
    }
    let borrowed = routes
        .iter()
        .map(|(p, r)| (p.as_str(), r.clone()))
        .collect();
    Ok(HttpServer::start(borrowed))
}

/// The cloud_init that makes `http` the guest's only apt source.
fn local_mirror(image: &StockImage, http: &HttpServer) -> Res<Value> {
    let url = http.url("/");
    let port = url
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .and_then(|p| p.parse::<u16>().ok())
        .ok_or_else(|| format!("no port in {url}"))?;
    Ok(json!({
        "write_files": [{
            "path": "/etc/apt/sources.list",
            "content": format!("{}\n", image.apt_source(port))
        }],
        "runcmd": ["rm -f /etc/apt/sources.list.d/debian.sources"]
    }))
}

struct StockBench<'a> {
    dirs: &'a Dirs,
    killer: &'a VmKiller,
    image: &'a StockImage,
    /// image_prepare's dest, in the bench's temp folder.
    prepared: PathBuf,
    boots: usize,
    clones: usize,
}

impl StockBench<'_> {
    /// A fresh, initialized server on the bench's folders whose roots hold the stock image.
    fn server(&self) -> Res<Server> {
        let roots = stock_roots();
        let own = TempDir::try_new("srv")?;
        let env = [("MCQEMU_ROOTS", roots.as_str())];
        let mut s = Server::try_start_with(own, &self.dirs.state, &self.dirs.runtime, &env)?;
        s.try_initialize(newest())?;
        Ok(s)
    }

    fn rows(&self, table: &mut Table, server: &mut Server, http: &HttpServer) -> Res<()> {
        self.prepare_rows(table, server, http)?;
        let cold = self.cold_rows(table, server);
        let cold = table.or_error("stock: cold sandbox_vm", cold);
        let clones = self.template_rows(table, server);
        if let (Some(cold), Some(clone)) = (cold, table.or_error("stock: template", clones)) {
            table.note(&format!(
                "a clone is ready {:.0}x sooner than a cold boot of the prepared image \
                 (round-trip medians {} ms vs {} ms)",
                cold.as_secs_f64() / clone.as_secs_f64().max(1e-6),
                ms(clone),
                ms(cold)
            ));
        }
        Ok(())
    }

    // ---- image_prepare ----

    fn prepare_rows(&self, table: &mut Table, server: &mut Server, http: &HttpServer) -> Res<()> {
        let t0 = Instant::now();
        let r = server.tool_within(
            "image_prepare",
            json!({
                "source": self.image.disk, "dest": self.prepared, "firmware": "uefi",
                "memory_mb": MEMORY_MB, "cpus": 1, "timeout_s": PREPARE_TIMEOUT_S,
                "cloud_init": local_mirror(self.image, http)?,
            }),
            PREPARE_CALL,
        );
        let took = t0.elapsed();
        let r = r.map_err(|e| format!("image_prepare: {e}"))?;
        let s = structured(&r)?;
        let agent = s["agent_version"]
            .as_str()
            .ok_or_else(|| format!("image_prepare reported no agent version: {s}"))?;
        let one = |d: Duration| Stats::of(vec![d]);
        table.time_row(
            "image_prepare (boot, agent, clean, flatten)",
            1,
            &one(took),
            None,
        );
        if let Some(d) = s["duration_ms"].as_u64() {
            table.time_row(
                "  duration_ms (server)",
                1,
                &one(Duration::from_millis(d)),
                None,
            );
        }
        let fetched = http.hits().iter().filter(|h| h.contains(".deb")).count();
        table.note(&format!(
            "qemu-guest-agent {agent} on {} {}; {fetched} .deb(s) fetched from the bench's \
             repository; prepared image {:.0} MiB",
            s["os"]["id"].as_str().unwrap_or("?"),
            s["os"]["version-id"].as_str().unwrap_or(""),
            s["bytes"].as_u64().unwrap_or(0) as f64 / (1024.0 * 1024.0)
        ));
        Ok(())
    }

    // ---- cold boots of the prepared image ----

    /// `boots` sandbox_vm boots of the prepared image until the agent answers, each destroyed
    /// (untimed) before the next. Returns the round trips' median.
    fn cold_rows(&self, table: &mut Table, server: &mut Server) -> Res<Duration> {
        let name = format!("{PREFIX}cold");
        let (mut waits, mut trips) = (Vec::new(), Vec::new());
        for i in 1..=self.boots {
            let fail = |e: String| format!("cold boot {i}: {e}");
            let (s, took) = cold_sandbox(
                server,
                self.killer,
                json!({
                    "base_image": self.prepared, "name": name, "firmware": "uefi",
                    "memory_mb": MEMORY_MB, "cpus": 1, "port_forwards": [],
                    "wait_agent_s": BOOT_WAIT_S
                }),
                BOOT_CALL,
            )
            .map_err(fail)?;
            let wait = s["agent_wait_ms"]
                .as_u64()
                .ok_or_else(|| fail(format!("sandbox_vm gave no agent_wait_ms: {s}")))?;
            destroy(server, &name).map_err(fail)?;
            waits.push(Duration::from_millis(wait));
            trips.push(took);
        }
        let n = self.boots;
        table.time_row(
            "cold sandbox_vm: agent_wait_ms (server)",
            n,
            &Stats::of(waits),
            None,
        );
        let rt = Stats::of(trips.clone());
        table.time_row("cold sandbox_vm: round trip", n, &rt, None);
        table.note(&format!("round trip per boot, ms: {}", list(&trips)));
        Ok(rt.median)
    }

    // ---- a template of the prepared image, and its clones ----

    /// template_create from the prepared image (UEFI), then `clones` clones one after another,
    /// each destroyed (untimed) before the next. Returns the clones' round-trip median.
    fn template_rows(&self, table: &mut Table, server: &mut Server) -> Res<Duration> {
        let t0 = Instant::now();
        let r = server.tool_within(
            "template_create",
            json!({
                "name": TEMPLATE, "base_image": self.prepared, "firmware": "uefi",
                "memory_mb": MEMORY_MB, "cpus": 1, "wait_agent_s": BOOT_WAIT_S
            }),
            BOOT_CALL,
        )?;
        let took = t0.elapsed();
        let s = structured(&r)?;
        let one = |d: Duration| Stats::of(vec![d]);
        table.time_row("template_create (boot, save)", 1, &one(took), None);
        for (key, label) in [
            ("duration_ms", "  duration_ms (server)"),
            ("save_ms", "  save_ms (server)"),
        ] {
            if let Some(v) = s[key].as_u64() {
                table.time_row(label, 1, &one(Duration::from_millis(v)), None);
            }
        }
        let name = format!("{PREFIX}clone");
        let (mut ready, mut trips) = (Vec::new(), Vec::new());
        let mut pss = None;
        for i in 1..=self.clones {
            let fail = |e: String| format!("clone {i}: {e}");
            let c = clone_vm(server, self.killer, TEMPLATE, &name).map_err(fail)?;
            if i == self.clones {
                pss = smaps_kb(c.pid, "Pss").ok();
            }
            destroy(server, &name).map_err(fail)?;
            ready.push(c.ready);
            trips.push(c.round_trip);
        }
        let n = self.clones;
        table.time_row(
            "clone: ready_ms (server)",
            n,
            &Stats::of(ready.clone()),
            None,
        );
        let rt = Stats::of(trips);
        table.time_row("clone: sandbox_vm round trip", n, &rt, None);
        table.note(&format!(
            "ready_ms per clone: {}; the last clone's Pss right after it was ready: {}",
            list(&ready),
            pss.map_or("?".into(), |kb| format!("{:.1} MiB", kb as f64 / 1024.0))
        ));
        Ok(rt.median)
    }
}

/// Whole milliseconds, space separated.
fn list(v: &[Duration]) -> String {
    v.iter()
        .map(|d| d.as_millis().to_string())
        .collect::<Vec<_>>()
        .join(" ")
}
