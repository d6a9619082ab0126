//! Mounts (section `mounts`): a host folder mounted into a sandbox whose root is Debian with
//! git (an OCI root from mmdebstrap, the cloud kernel, its own ext4 disk), beside guest_copy_in
//! of the same data in the same run. Reading a 256 MiB file from the mount against the data
//! channel's copy-in rate (goal: at least half); `find | wc -l` over a 10,000-file tree and
//! `git status` in a 5,000-file repository on the mount against the same trees on the guest's
//! own disk, caches dropped and at once again (goal: at most 3x); and launch_vm's time (the
//! test guest) with one mount against none (goal: at most 50 ms more).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use std::ffi::OsStr;

use crate::common::{try_run, try_test_guest, Server, VmKiller};
use crate::report::{Stats, Table};
use crate::{structured, Dirs, Res, ToolCalls};

const VM: &str = "bench-mounts";
const BOOT_TIMEOUT: Duration = Duration::from_secs(200);
const STEP: Duration = Duration::from_secs(600);
const BIG_MIB: usize = 256;

/// The mounts section; an ERROR row when something fails. Its VMs are destroyed.
pub fn mount_rows(table: &mut Table, dirs: &Dirs) {
    table.section("mounts: a host folder in the guest vs guest_copy_in and the guest's own disk");
    let killer = VmKiller::new(dirs.tmp.path());
    let outcome = dirs.server().and_then(|mut s| {
        let r = rows(table, &mut s, &killer, dirs.tmp.path());
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

fn rows(table: &mut Table, s: &mut Server, killer: &VmKiller, tmp: &Path) -> Res<()> {
    let g = try_test_guest()?;
    let share = tmp.join("share");
    std::fs::create_dir_all(&share).map_err(|e| e.to_string())?;
    let big = share.join("big.bin");
    let data: Vec<u8> = (0..BIG_MIB << 20)
        .map(|i| (i * 7 + i / 4093) as u8)
        .collect();
    std::fs::write(&big, &data).map_err(|e| e.to_string())?;
    tree(&share.join("tree"), 10_000)?;
    let repo = share.join("repo");
    tree(&repo, 5_000)?;
    for args in [
        &["init", "-q"][..],
        &["add", "."],
        &[
            "-c",
            "user.email=b@b",
            "-c",
            "user.name=b",
            "commit",
            "-qm",
            "5,000 files",
        ],
        &["gc", "-q"],
    ] {
        let mut a = vec![OsStr::new("-C"), repo.as_os_str()];
        a.extend(args.iter().map(OsStr::new));
        try_run("git", &a, STEP)?;
    }
    launch_rows(table, s, killer, &g, &share)?;
    // A Debian root with git (mmdebstrap), on its own ext4 disk under the cloud kernel.
    let layout = tmp.join("debian");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oci/build_layout.py");
    try_run(
        "python3",
        &[
            script.as_os_str(),
            layout.as_os_str(),
            OsStr::new("v1"),
            OsStr::new("--debian"),
        ],
        STEP,
    )?;
    let r = s.tool_within(
        "sandbox_vm",
        json!({"name": VM, "oci": format!("oci:{}:v1", layout.display()), "memory_mb": 1536,
               "cpus": 1, "wait_agent_s": 150, "disk_size": "4G",
               "mounts": [{"host": share, "guest": "/mnt"}]}),
        BOOT_TIMEOUT,
    )?;
    let sb = structured(&r)?;
    killer.track(sb);
    read_rows(table, s, &big)?;
    // The same trees on the guest's own disk (ext4): the tree over the data channel, the
    // repository cloned from the mount (guest_copy_in leaves out hidden names such as .git).
    s.tool_within(
        "guest_copy_in",
        json!({"name": VM, "host_path": share.join("tree"), "guest_path": "/root/tree"}),
        STEP,
    )?;
    timed(s, "git clone -q /mnt/repo /root/repo && sync")?;
    walk_rows(
        table,
        s,
        "find | wc -l, 10,000 files",
        "find /mnt/tree | wc -l",
        "find /root/tree | wc -l",
    )?;
    walk_rows(
        table,
        s,
        "git status, 5,000 files",
        "cd /mnt/repo && git status --porcelain | wc -l",
        "cd /root/repo && git status --porcelain | wc -l",
    )
}

/// Reading the big file from the mount against guest_copy_in of the same file.
fn read_rows(table: &mut Table, s: &mut Server, big: &Path) -> Res<()> {
    let t = Instant::now();
    s.tool_within(
        "guest_copy_in",
        json!({"name": VM, "host_path": big, "guest_path": "/root/big.bin"}),
        STEP,
    )?;
    let copy_in = t.elapsed();
    timed(s, "rm /root/big.bin")?;
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
    Ok(())
}

/// A walk on the mount and on the guest's own disk: cold (the guest's caches dropped) and at
/// once again; the outputs must agree.
fn walk_rows(table: &mut Table, s: &mut Server, what: &str, mount: &str, own: &str) -> Res<()> {
    let drop = "sync; echo 3 > /proc/sys/vm/drop_caches";
    let mut rows = Vec::new();
    for (place, script) in [("mount", mount), ("own disk", own)] {
        timed(s, drop)?;
        let (cold, out) = timed(s, script)?;
        let (again, out2) = timed(s, script)?;
        if out != out2 {
            return Err(format!("{what} on the {place}: {out:?} then {out2:?}"));
        }
        rows.push((place, cold, again, out));
    }
    if rows[0].3 != rows[1].3 {
        return Err(format!(
            "{what}: the mount gave {:?}, the own disk {:?}",
            rows[0].3, rows[1].3
        ));
    }
    for (place, cold, again, _) in &rows {
        table.time_row(
            &format!("{what}: {place}, cold"),
            1,
            &Stats::of(vec![*cold]),
            None,
        );
        table.time_row(
            &format!("{what}: {place}, again"),
            1,
            &Stats::of(vec![*again]),
            None,
        );
    }
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    table.note(&format!(
        "{what}: the mount takes {:.1}x the own disk cold, {:.1}x again (goal <= 3x)",
        ratio(rows[0].1, rows[1].1),
        ratio(rows[0].2, rows[1].2)
    ));
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
        s.tool_within(
            "stop_vm",
            json!({"name": name, "force": true}),
            BOOT_TIMEOUT,
        )?;
        let _: Value = s.tool_within("forget_vm", json!({"name": name}), BOOT_TIMEOUT)?;
    }
    let [without, with] = times;
    let (a, b) = (Stats::of(without), Stats::of(with));
    table.time_row("launch_vm, no mount", 3, &a, None);
    table.time_row("launch_vm, one mount", 3, &b, None);
    table.diff_row(
        "launch_vm: one mount's extra time",
        b.median,
        a.median,
        Duration::from_millis(50),
    );
    Ok(())
}
