//! Templates and sandboxes that travel, in the templates section: template_push of the
//! section's template to Debian's docker-registry on 127.0.0.1, then once more (nothing left to
//! send), template_pull into a second state folder (a second host), and a clone of the pulled
//! template, whose ready time is set beside the local template's. Then a running sandbox (a
//! clone counting in the background) pushed, pushed again after a small change (the share of
//! the first it sends), and started on the second host from the reference, to its first
//! guest_exec.

use std::ffi::OsStr;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::clones::{clone_vm, destroy};
use crate::common::registry::Registry;
use crate::common::{try_run, Server, VmKiller};
use crate::report::{Stats, Table};
use crate::{newest, structured, Dirs, Res, ToolCalls};

/// Longest push or pull of the section's template.
const MOVE_TIMEOUT: Duration = Duration::from_secs(300);

/// The rows; `local_ready` is the local template's clone ready time (median).
pub fn travel_rows(
    table: &mut Table,
    server: &mut Server,
    template: &str,
    dirs: &Dirs,
    local_ready: Duration,
) -> Res<()> {
    let have = try_run(
        "sh",
        &[OsStr::new("-c"), OsStr::new("command -v docker-registry")],
        Duration::from_secs(10),
    );
    if have.is_err() {
        table.skip_row("template_push/pull", "docker-registry is not installed");
        return Ok(());
    }
    let reg = Registry::start(&dirs.tmp.path().join("travel-registry"));
    let reference = format!("{}/bench/{template}:v1", reg.addr);
    let one = |d: Duration| Stats::of(vec![d]);
    let mib = |b: u64| b as f64 / 1048576.0;

    let mut push = |label: &str| -> Res<(Duration, u64, u64)> {
        let t0 = Instant::now();
        let r = server.tool_within(
            "template_push",
            json!({"name": template, "reference": reference}),
            MOVE_TIMEOUT,
        )?;
        let took = t0.elapsed();
        let s = structured(&r)?;
        let (sent, held) = (
            s["uploaded"].as_u64().unwrap_or(0),
            s["skipped"].as_u64().unwrap_or(0),
        );
        table.time_row(label, 1, &one(took), None);
        Ok((took, sent, held))
    };
    let (_, sent, _) = push("template_push to a local registry (first)")?;
    let (_, again, held) = push("template_push again (nothing changed)")?;
    table.note(&format!(
        "first push sent {:.1} MiB (the 256 MiB memory packed without its zero runs, gzipped); the \
         second sent {:.1} MiB of {:.1} MiB",
        mib(sent),
        mib(again),
        mib(again + held)
    ));
    if again > sent / 10 {
        return Err(format!(
            "a second push of an unchanged template sent {again} bytes of {sent}"
        ));
    }

    // A second host: its own state and runtime folders, its own server.
    let other = dirs.tmp.path().join("host2");
    let (state, runtime) = (other.join("state"), other.join("runtime"));
    for d in [&state, &runtime] {
        std::fs::create_dir_all(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
    }
    let killer = VmKiller::new(&runtime);
    let mut far = Server::try_start_in(&state, &runtime)?;
    far.try_initialize(newest())?;
    let t0 = Instant::now();
    let r = far.tool_within(
        "template_pull",
        json!({"reference": reference, "name": template}),
        MOVE_TIMEOUT,
    )?;
    let took = t0.elapsed();
    let s = structured(&r)?;
    table.time_row("template_pull on a second host", 1, &one(took), None);
    table.note(&format!(
        "downloaded {:.1} MiB; every blob checked, memory unpacked sparse",
        mib(s["downloaded"].as_u64().unwrap_or(0))
    ));
    let mut ready = Vec::new();
    for i in 0..3 {
        let name = format!("bench-far-{i}");
        let c = clone_vm(&mut far, &killer, template, &name)?;
        ready.push(c.ready);
        destroy(&mut far, &name)?;
    }
    let stats = Stats::of(ready);
    table.time_row("clone of the pulled template, ready_ms", 3, &stats, None);
    table.diff_info_row(
        "  against the local template's clones",
        stats.median,
        local_ready,
    );
    sandbox_rows(table, server, &mut far, &killer, template, &reg.addr)
}

/// A running sandbox on `near` pushed twice and started on `far`.
fn sandbox_rows(
    table: &mut Table,
    near: &mut Server,
    far: &mut Server,
    killer: &VmKiller,
    template: &str,
    registry: &str,
) -> Res<()> {
    let one = |d: Duration| Stats::of(vec![d]);
    let mib = |b: u64| b as f64 / 1048576.0;
    let name = "bench-traveller";
    clone_vm(near, killer, template, name)?;
    near.tool(
        "guest_exec",
        json!({"name": name, "command": "sh", "background": true, "args": ["-c",
            "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done"]}),
    )?;
    std::thread::sleep(Duration::from_secs(1));
    let reference = format!("{registry}/bench/{name}:live");
    let (sent, whole, paused) = push(
        table,
        near,
        name,
        "sandbox_push of a running sandbox (first)",
        &reference,
    )?;
    near.tool(
        "guest_file_write",
        json!({"name": name, "path": "/tmp/small", "content": "a small change"}),
    )?;
    let second = format!("{registry}/bench/{name}:second");
    let (again, _, _) = push(
        table,
        near,
        name,
        "sandbox_push again after a small change",
        &second,
    )?;
    table.note(&format!(
        "the artifact is {:.1} MiB; the first push sent {:.1} MiB of it (paused the sandbox \
         {paused} ms; the rest the registry held or mounted from the template's repository), \
         the second {:.1} MiB: {:.1} % of the artifact (the issue's bound: 10 %)",
        mib(whole),
        mib(sent),
        mib(again),
        again as f64 * 100.0 / whole.max(1) as f64
    ));
    let t0 = Instant::now();
    let r = far.tool_within(
        "sandbox_vm",
        json!({"from": reference, "name": name}),
        MOVE_TIMEOUT,
    )?;
    let started = t0.elapsed();
    structured(&r)?;
    let r = far.tool(
        "guest_exec",
        json!({"name": name, "command": "cat", "args": ["/tmp/count"]}),
    )?;
    let first_exec = t0.elapsed();
    let count = structured(&r)?["stdout"]
        .as_str()
        .unwrap_or("")
        .trim()
        .to_string();
    if count.parse::<u64>().is_err() {
        return Err(format!("the started sandbox's counter reads {count:?}"));
    }
    table.time_row(
        "sandbox_vm {from} on the second host",
        1,
        &one(started),
        None,
    );
    table.time_row("  to its first guest_exec", 1, &one(first_exec), None);
    table.note(&format!("its counter read {count} on arrival"));
    destroy(far, name)?;
    destroy(near, name)?;
    Ok(())
}

/// One sandbox_push of `name` to `reference`, timed as a row: the bytes it sent, the
/// artifact's bytes (sent, held or mounted), and how long it paused the sandbox.
fn push(
    table: &mut Table,
    near: &mut Server,
    name: &str,
    label: &str,
    reference: &str,
) -> Res<(u64, u64, u64)> {
    let t0 = Instant::now();
    let r = near.tool_within(
        "sandbox_push",
        json!({"name": name, "reference": reference}),
        MOVE_TIMEOUT,
    )?;
    let took = t0.elapsed();
    let s = structured(&r)?;
    table.time_row(label, 1, &Stats::of(vec![took]), None);
    let n = |k: &str| s[k].as_u64().unwrap_or(0);
    Ok((
        n("uploaded"),
        n("uploaded") + n("skipped") + n("mounted"),
        n("paused_ms"),
    ))
}
