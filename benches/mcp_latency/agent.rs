//! mcqemu-agent beside qemu-ga (section `agent`), in one run on the same test guest built both
//! ways (qemu-ga started by its init; mcqemu-agent as its PID 1): guest_exec `/bin/true`
//! without a progress token, with one, and with one and `live: true`; how soon the first line
//! of a program printing one every 100 ms reaches the client's progress; a clone's ready time
//! from a template of each; 64 MiB each way over the data channel (played by sh and tar with
//! qemu-ga, by mcqemu-agent itself with ours); the agent's memory in the guest. The goals:
//! ours ≤ 0.7x qemu-ga's time for `/bin/true`, a token within 1.3x + 5 ms of none, the first
//! line within 300 ms, clones not slower, copies at least at the shell's rates (the last
//! issue's 76 MB/s out, 20 MB/s in).

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{try_test_guest_with, Server, VmKiller};
use crate::report::{Stats, Table};
use crate::{structured, Dirs, Res, ToolCalls};

const BOOT_TIMEOUT: Duration = Duration::from_secs(200);
const CALL: Duration = Duration::from_secs(60);
/// Calls per row.
const N: usize = 15;
/// Clones per agent.
const CLONES: usize = 4;

/// One agent's measurements.
#[derive(Default)]
struct Measured {
    plain: Duration,
    token: Duration,
    live: Duration,
    first_line: Duration,
    ready: Duration,
}

/// The agent section; an ERROR row when something fails. Every VM is destroyed.
pub fn agent_rows(table: &mut Table, dirs: &Dirs) {
    table.section("agent: mcqemu-agent (PID 1) vs qemu-ga on the same test guest (TCG)");
    let killer = VmKiller::new(dirs.tmp.path());
    let outcome = dirs.server().and_then(|mut s| {
        let ga = measure(table, &mut s, &killer, "qemu-ga", None);
        let ours = measure(table, &mut s, &killer, "mcqemu-agent", Some("init"));
        compare(table, &ga?, &ours?);
        Ok(())
    });
    table.or_error("agent section", outcome);
    killer.kill_all();
}

fn measure(
    table: &mut Table,
    s: &mut Server,
    killer: &VmKiller,
    label: &str,
    mode: Option<&str>,
) -> Res<Measured> {
    let g = try_test_guest_with(mode)?;
    let vm = format!("bench-agent-{}", if mode.is_some() { "ours" } else { "ga" });
    let base = crate::common::TempDir::try_new("agent-base")?;
    let disk = base.join("base.img");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(1 << 20))
        .map_err(|e| format!("the base image: {e}"))?;
    let r = s.tool_within(
        "sandbox_vm",
        json!({"name": vm, "base_image": disk, "kernel": g.kernel, "initrd": g.initrd,
               "append": g.append, "memory_mb": 256, "cpus": 1, "wait_agent_s": 150}),
        BOOT_TIMEOUT,
    )?;
    killer.track(structured(&r)?);
    let result = rows(table, s, &vm, label).and_then(|m| {
        copies(table, s, &vm, label, base.path())?;
        Ok(m)
    });
    let _ = s.tool_within("sandbox_destroy", json!({"name": vm}), BOOT_TIMEOUT);
    let mut m = result?;
    m.ready = clone_ready(table, s, killer, label, &g)?;
    Ok(m)
}

fn rows(table: &mut Table, s: &mut Server, vm: &str, label: &str) -> Res<Measured> {
    let args = json!({"name": vm, "command": "/bin/true"});
    let live_args = json!({"name": vm, "command": "/bin/true", "live": true});
    s.tool_within("guest_exec", args.clone(), CALL)?;
    let (mut plain, mut token, mut live) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..N {
        let t = Instant::now();
        s.tool_within("guest_exec", args.clone(), CALL)?;
        plain.push(t.elapsed());
        token.push(s.try_call_with_token("guest_exec", args.clone(), CALL)?.1);
        live.push(
            s.try_call_with_token("guest_exec", live_args.clone(), CALL)?
                .1,
        );
    }
    let (plain, token, live) = (Stats::of(plain), Stats::of(token), Stats::of(live));
    table.time_row(&format!("{label}: guest_exec /bin/true"), N, &plain, None);
    table.time_row(
        &format!("{label}: guest_exec /bin/true, progress token"),
        N,
        &token,
        None,
    );
    table.diff_row(
        &format!("  -> {label}: a token's cost"),
        token.median,
        plain.median,
        plain.median.mul_f64(0.3) + Duration::from_millis(5),
    );
    table.time_row(
        &format!("{label}: guest_exec /bin/true, token and live"),
        N,
        &live,
        None,
    );
    let mut firsts = Vec::new();
    for _ in 0..3 {
        firsts.push(first_line(s, vm)?);
    }
    let firsts = Stats::of(firsts);
    table.time_row(
        &format!("{label}: first live line of a line every 100 ms"),
        3,
        &firsts,
        Some(Duration::from_millis(300)),
    );
    let rss = s.tool_within(
        "guest_exec",
        json!({"name": vm, "command": "sh", "args": ["-c",
            "for p in /proc/[0-9]*; do c=$(cat $p/comm 2>/dev/null); \
             case $c in qemu-ga|init|mcqemu-agent) grep VmRSS $p/status;; esac; done"]}),
        CALL,
    )?;
    let text = structured(&rss)?["stdout"]
        .as_str()
        .unwrap_or("")
        .to_string();
    table.note(&format!(
        "{label}: its RSS in the guest: {}",
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    ));
    Ok(Measured {
        plain: plain.median,
        token: token.median,
        live: live.median,
        first_line: firsts.median,
        ready: Duration::ZERO,
    })
}

/// 64 MiB in and back out over the data channel, checked byte for byte.
fn copies(
    table: &mut Table,
    s: &mut Server,
    vm: &str,
    label: &str,
    tmp: &std::path::Path,
) -> Res<()> {
    const MIB: usize = 64;
    let (src, back) = (tmp.join("copy-in"), tmp.join("copy-out"));
    crate::copies::write_pseudo_random(&src, MIB)?;
    let t = Instant::now();
    let r = s.tool_within(
        "guest_copy_in",
        json!({"name": vm, "host_path": src, "guest_path": "/tmp/copy"}),
        CALL,
    )?;
    let cin = t.elapsed();
    crate::copies::via_channel(&r)?;
    let t = Instant::now();
    let r = s.tool_within(
        "guest_copy_out",
        json!({"name": vm, "guest_path": "/tmp/copy", "host_path": back}),
        CALL,
    )?;
    let cout = t.elapsed();
    crate::copies::via_channel(&r)?;
    crate::copies::same_bytes(&src, &back)?;
    let bytes = MIB << 20;
    table.rate_row(
        &format!("{label}: guest_copy_in {MIB} MiB"),
        1,
        bytes,
        &Stats::of(vec![cin]),
        20.0,
    );
    table.rate_row(
        &format!("{label}: guest_copy_out {MIB} MiB"),
        1,
        bytes,
        &Stats::of(vec![cout]),
        76.0,
    );
    for f in [&src, &back] {
        let _ = std::fs::remove_file(f);
    }
    Ok(())
}

/// The time from the call to the first progress notification carrying the program's output.
fn first_line(s: &mut Server, vm: &str) -> Res<Duration> {
    let id = json!(s.fresh_id());
    let script = "for i in 1 2 3 4 5 6 7 8 9 10; do echo line-$i; sleep 0.1; done";
    let params = json!({"name": "guest_exec", "_meta": {"progressToken": "first"},
        "arguments": {"name": vm, "command": "sh", "args": ["-c", script], "live": true}});
    let t0 = Instant::now();
    s.try_send_request(&id, "tools/call", params)?;
    let mut first = None;
    loop {
        let left = CALL.saturating_sub(t0.elapsed());
        let Some(msg) = s.try_recv(left)? else {
            return Err("no answer to the live call".into());
        };
        if msg.get("id") == Some(&id) && msg.get("method").is_none() {
            break;
        }
        let carries = msg["method"] == "notifications/progress"
            && msg["params"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("line-"));
        if carries && first.is_none() {
            first = Some(t0.elapsed());
        }
    }
    first.ok_or_else(|| "no progress notification carried a line".to_string())
}

/// A template of the guest, then `CLONES` clones one after another: their ready times.
fn clone_ready(
    table: &mut Table,
    s: &mut Server,
    killer: &VmKiller,
    label: &str,
    g: &crate::common::Guest,
) -> Res<Duration> {
    let template = format!("bench-agent-t-{}", label.replace(' ', "-"));
    s.tool_within(
        "template_create",
        json!({"name": template, "kernel": g.kernel, "initrd": g.initrd, "append": g.append,
               "memory_mb": 256, "cpus": 1, "wait_agent_s": 150, "setup": []}),
        BOOT_TIMEOUT,
    )?;
    let mut ready = Vec::new();
    for i in 0..CLONES {
        let name = format!("{template}-{i}");
        let r = s.tool_within(
            "sandbox_vm",
            json!({"name": name, "template": template}),
            BOOT_TIMEOUT,
        )?;
        let sb = structured(&r)?.clone();
        killer.track(&sb);
        let ms = sb["ready_ms"].as_u64().unwrap_or(0);
        ready.push(Duration::from_millis(ms));
        let _ = s.tool_within("sandbox_destroy", json!({"name": name}), BOOT_TIMEOUT);
    }
    let _ = s.tool_within("template_delete", json!({"name": template}), CALL);
    let stats = Stats::of(ready);
    table.time_row(
        &format!("{label}: a clone's ready_ms"),
        CLONES,
        &stats,
        None,
    );
    Ok(stats.median)
}

fn compare(table: &mut Table, ga: &Measured, ours: &Measured) {
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
    table.note(&format!(
        "mcqemu-agent / qemu-ga: /bin/true {:.2}x (goal <= 0.7x), with a token {:.2}x, with \
         token and live {:.2}x; first live line {} vs {} ms; clone ready {} vs {} ms (goal: not \
         slower)",
        ratio(ours.plain, ga.plain),
        ratio(ours.token, ga.token),
        ratio(ours.live, ga.live),
        ours.first_line.as_millis(),
        ga.first_line.as_millis(),
        ours.ready.as_millis(),
        ga.ready.as_millis()
    ));
}
