//! Mounts (section `mounts`): a host folder mounted into the test guest, beside guest_copy_in
//! of the same data in the same run. Reading a 256 MiB file from the mount against the data
//! channel's copy-in rate (goal: at least half); `find | wc -l` over a 10,000-file tree and
//! `ls -lR` over a 5,000-file tree (what `git status` does to a work tree: a stat of every
//! file; the test guest has no git) on the mount against the same trees on the guest's own
//! tmpfs (goal: at most 3x); and launch_vm's time with one mount against none (goal: at most
//! 50 ms more).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{try_test_guest, Server, VmKiller};
use crate::report::{Stats, Table};
use crate::{structured, Dirs, Res, ToolCalls};

const VM: &str = "bench-mounts";
const BOOT_TIMEOUT: Duration = Duration::from_secs(200);
const STEP: Duration = Duration::from_secs(600);
const BIG_MIB: usize = 256;

/// The mounts section; an ERROR row when something fails. Its VMs are destroyed.
pub fn mount_rows(table: &mut Table, dirs: &Dirs, base_image: &Path) {
    table.section("mounts: a host folder in the guest vs guest_copy_in and the guest's own disk");
    let killer = VmKiller::new(dirs.tmp.path());
    let outcome = dirs.server().and_then(|mut s| {
        let r = rows(table, &mut s, &killer, base_image, dirs.tmp.path());
        let _ = s.tool_within("sandbox_destroy", json!({"name": VM}), BOOT_TIMEOUT);
        r
    });
    table.or_error("mounts section", outcome);
    killer.kill_all();
}

fn tree(dir: &Path, files: usize) -> Res<()> {
    for i in 0..files {
        let sub = dir.join(format!("d{:03}", i / 100));
        std::fs::create_dir_all(&sub).map_err(|e| e.to_string())?;
        std::fs::write(sub.join(format!("f{i:05}.txt")), format!("file {i}\n"))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// One guest command, timed as its guest_exec call (which must exit 0).
fn timed(s: &mut Server, script: &str) -> Res<(Duration, String)> {
    let t = Instant::now();
    let r = s.tool_within(
        "guest_exec",
        json!({"name": VM, "command": "sh", "args": ["-c", script], "timeout": 600}),
        STEP,
    )?;
    let took = t.elapsed();
    let sc = structured(&r)?;
    if sc["exitcode"] != json!(0) {
        return Err(format!("{script} failed: {sc}"));
    }
    Ok((took, sc["stdout"].as_str().unwrap_or_default().to_string()))
}

fn rows(table: &mut Table, s: &mut Server, killer: &VmKiller, base: &Path, tmp: &Path) -> Res<()> {
    let g = try_test_guest()?;
    let share = tmp.join("share");
    std::fs::create_dir_all(&share).map_err(|e| e.to_string())?;
    let big = share.join("big.bin");
    let data: Vec<u8> = (0..BIG_MIB << 20).map(|i| (i * 7 + i / 4093) as u8).collect();
    std::fs::write(&big, &data).map_err(|e| e.to_string())?;
    tree(&share.join("tree"), 10_000)?;
    tree(&share.join("repo"), 5_000)?;
    launch_rows(table, s, killer, &g, &share)?;
    let r = s.tool_within(
        "sandbox_vm",
        json!({"name": VM, "base_image": base, "kernel": g.kernel, "initrd": g.initrd,
               "append": g.append, "memory_mb": 1024, "cpus": 1, "wait_agent_s": 150,
               "mounts": [{"host": share, "guest": "/mnt"}]}),
        BOOT_TIMEOUT,
    )?;
    let sb = structured(&r)?;
    killer.track(sb);
    // The data channel's rate for the same bytes, into the guest's tmpfs.
    let t = Instant::now();
    s.tool_within(
        "guest_copy_in",
        json!({"name": VM, "host_path": big, "guest_path": "/tmp/big.bin"}),
        STEP,
    )?;
    let copy_in = t.elapsed();
    timed(s, "rm /tmp/big.bin")?;
    let (read, _) = timed(s, "cat /mnt/big.bin > /dev/null")?;
    let bytes = BIG_MIB << 20;
    let mbps = |d: Duration| bytes as f64 / d.as_secs_f64() / 1e6;
    table.note(&format!(
        "guest_copy_in of the {BIG_MIB} MiB file: {:.1} MB/s ({:.2} s)",
        mbps(copy_in),
        copy_in.as_secs_f64()
    ));
    table.rate_row(
        &format!("read {BIG_MIB} MiB from the mount (>= 50% of copy-in)"),
        1,
        bytes,
        &Stats::of(vec![read]),
        (mbps(copy_in) * 0.5 * 10.0).round() / 10.0,
    );
    // The trees: on the mount, then copied into the guest's tmpfs and again there.
    s.tool_within(
        "guest_copy_in",
        json!({"name": VM, "host_path": share.join("tree"), "guest_path": "/tmp/tree"}),
        STEP,
    )?;
    s.tool_within(
        "guest_copy_in",
        json!({"name": VM, "host_path": share.join("repo"), "guest_path": "/tmp/repo"}),
        STEP,
    )?;
    for (what, mount, local) in [
        ("find | wc -l, 10,000 files", "find /mnt/tree | wc -l", "find /tmp/tree | wc -l"),
        ("ls -lR, 5,000 files", "ls -lR /mnt/repo | wc -l", "ls -lR /tmp/repo | wc -l"),
    ] {
        let (m, mout) = timed(s, mount)?;
        let (l, lout) = timed(s, local)?;
        if mout.trim() != lout.trim() {
            return Err(format!("{what}: the mount listed {mout:?}, the copy {lout:?}"));
        }
        let (m2, _) = timed(s, mount)?;
        table.time_row(&format!("{what} on the mount, cold"), 1, &Stats::of(vec![m]), None);
        table.time_row(&format!("{what} on the mount, again"), 1, &Stats::of(vec![m2]), None);
        table.time_row(
            &format!("{what} on the guest's tmpfs"),
            1,
            &Stats::of(vec![l]),
            None,
        );
        table.note(&format!(
            "{what}: the mount takes {:.1}x the guest's own (cold; goal <= 3x), {:.1}x again",
            m.as_secs_f64() / l.as_secs_f64(),
            m2.as_secs_f64() / l.as_secs_f64()
        ));
    }
    Ok(())
}

/// launch_vm of the test guest without and with one mount, 3 each (stopped at once).
fn launch_rows(
    table: &mut Table,
    s: &mut Server,
    killer: &VmKiller,
    g: &crate::common::Guest,
    share: &Path,
) -> Res<()> {
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for i in 0..6 {
        let with = i % 2 == 1;
        let name = format!("bench-mount-launch-{i}");
        let mut args = json!({"name": name, "kernel": g.kernel, "initrd": g.initrd,
                              "append": g.append, "memory_mb": 128, "cpus": 1});
        if with {
            args["mounts"] = json!([{"host": share, "guest": "/mnt"}]);
        }
        let t = Instant::now();
        let r = s.tool_within("launch_vm", args, BOOT_TIMEOUT)?;
        times[with as usize].push(t.elapsed());
        killer.track(structured(&r)?);
        s.tool_within("stop_vm", json!({"name": name, "force": true}), BOOT_TIMEOUT)?;
        let _: Value = s.tool_within("forget_vm", json!({"name": name}), BOOT_TIMEOUT)?;
    }
    let [without, with] = times;
    let (a, b) = (Stats::of(without), Stats::of(with));
    table.time_row("launch_vm, no mount", 3, &a, None);
    table.time_row("launch_vm, one mount", 3, &b, None);
    table.diff_row(
        "launch_vm: one mount's extra time",
        a.median,
        b.median,
        Duration::from_millis(50),
    );
    Ok(())
}
