//! Copies (section `copies`): guest_copy_in and guest_copy_out over mcqemu's data channel on
//! the test guest, beside the guest agent's own guest-file-write and guest-file-read rates
//! measured in the same run: 64 MiB and 1 GiB each way (checked byte for byte on the host), a
//! 1,000-file tree each way, and the server's peak RSS after the 1 GiB copies (a copy streams;
//! nothing holds a whole file). The goals: in ≥ 3x the agent's write rate, out ≥ 4x its read
//! rate, the tree within 2 s both ways. `MCQEMU_BENCH_COPY_GIB=0` leaves out the 1 GiB rows.

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use mcqemu::b64;
use mcqemu::qemu::qga::Qga;
use serde_json::{json, Value};

use crate::common::{try_test_guest, Server, VmKiller};
use crate::report::{Stats, Table};
use crate::{env_count, peak_rss_kb, structured, Dirs, Res, ToolCalls};

const VM: &str = "bench-copies";
const BOOT_TIMEOUT: Duration = Duration::from_secs(200);
/// A 1 GiB copy takes about a minute each way here; far more means something is wrong.
const COPY_TIMEOUT: Duration = Duration::from_secs(900);
const MIB: usize = 1 << 20;
/// The tree rows' file count and each file's size.
const TREE_FILES: usize = 1000;
const TREE_FILE_BYTES: usize = 2048;

/// The copies section; an ERROR row when something fails. The sandbox is destroyed.
pub fn copy_rows(table: &mut Table, dirs: &Dirs, base_image: &Path) {
    table.section("copies: guest_copy_in/out over the data channel vs the agent's own rates (TCG)");
    let killer = VmKiller::new(dirs.tmp.path());
    let outcome = dirs.server().and_then(|mut s| {
        let r = rows(table, &mut s, &killer, base_image, dirs.tmp.path());
        let _ = s.tool_within("sandbox_destroy", json!({"name": VM}), BOOT_TIMEOUT);
        r
    });
    table.or_error("copies section", outcome);
    killer.kill_all();
}

fn rows(table: &mut Table, s: &mut Server, killer: &VmKiller, base: &Path, tmp: &Path) -> Res<()> {
    let g = try_test_guest()?;
    // /tmp in the test guest is a tmpfs of half its memory: room for the 1 GiB file.
    let r = s.tool_within(
        "sandbox_vm",
        json!({"name": VM, "base_image": base, "kernel": g.kernel, "initrd": g.initrd,
               "append": g.append, "memory_mb": 2560, "cpus": 1, "wait_agent_s": 150}),
        BOOT_TIMEOUT,
    )?;
    let sb = structured(&r)?;
    killer.track(sb);
    let sock = sb["qga_socket"]
        .as_str()
        .ok_or_else(|| format!("sandbox_vm gave no qga_socket: {sb}"))?
        .to_string();
    let (write, read) = agent_rates(Path::new(&sock), 64 * MIB)?;
    let mbps = |bytes: usize, d: Duration| bytes as f64 / d.as_secs_f64() / 1e6;
    let (aw, ar) = (mbps(64 * MIB, write), mbps(64 * MIB, read));
    table.note(&format!(
        "the agent's own rates, 64 MiB in 1 MiB pieces: guest-file-write {aw:.1} MB/s, \
         guest-file-read {ar:.1} MB/s"
    ));
    sized_rows(table, s, tmp, 64, (aw, ar))?;
    if env_count("MCQEMU_BENCH_COPY_GIB", 1) > 0 {
        sized_rows(table, s, tmp, 1024, (aw, ar))?;
        let kb = peak_rss_kb(s)?;
        table.rss_row("server peak RSS after the 1 GiB copies", kb);
    }
    tree_rows(table, s, tmp)
}

/// One file of `mib` MiB in, then out again: both rates against the goals, the copy checked.
fn sized_rows(
    table: &mut Table,
    s: &mut Server,
    tmp: &Path,
    mib: usize,
    (agent_write, agent_read): (f64, f64),
) -> Res<()> {
    let (src, back) = (
        tmp.join(format!("in-{mib}")),
        tmp.join(format!("out-{mib}")),
    );
    write_pseudo_random(&src, mib)?;
    let guest = format!("/tmp/copy-{mib}");
    let t = Instant::now();
    let r = s.tool_within(
        "guest_copy_in",
        json!({"name": VM, "host_path": src, "guest_path": guest}),
        COPY_TIMEOUT,
    )?;
    let cin = t.elapsed();
    via_channel(&r)?;
    let t = Instant::now();
    let r = s.tool_within(
        "guest_copy_out",
        json!({"name": VM, "guest_path": guest, "host_path": back}),
        COPY_TIMEOUT,
    )?;
    let cout = t.elapsed();
    via_channel(&r)?;
    same_bytes(&src, &back)?;
    let bytes = mib * MIB;
    table.rate_row(
        &format!("guest_copy_in {mib} MiB (>= 3x the agent's write)"),
        1,
        bytes,
        &Stats::of(vec![cin]),
        round1(3.0 * agent_write),
    );
    table.rate_row(
        &format!("guest_copy_out {mib} MiB (>= 4x the agent's read)"),
        1,
        bytes,
        &Stats::of(vec![cout]),
        round1(4.0 * agent_read),
    );
    for f in [&src, &back] {
        let _ = std::fs::remove_file(f);
    }
    s.tool(
        "guest_exec",
        json!({"name": VM, "command": "rm", "args": ["-f", guest]}),
    )?;
    Ok(())
}

/// A 1,000-file tree in, then out: each direction's time, and both together against 2 s.
fn tree_rows(table: &mut Table, s: &mut Server, tmp: &Path) -> Res<()> {
    let tree = tmp.join("tree");
    for i in 0..TREE_FILES {
        let dir = tree.join(format!("d{}", i / 50));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let body = crate::common::pseudo_random(TREE_FILE_BYTES, i as u64 + 1);
        std::fs::write(dir.join(format!("f{i}")), body).map_err(|e| e.to_string())?;
    }
    let back = tmp.join("tree.out");
    let t = Instant::now();
    via_channel(&s.tool_within(
        "guest_copy_in",
        json!({"name": VM, "host_path": tree, "guest_path": "/tmp/tree"}),
        COPY_TIMEOUT,
    )?)?;
    let cin = t.elapsed();
    let t = Instant::now();
    via_channel(&s.tool_within(
        "guest_copy_out",
        json!({"name": VM, "guest_path": "/tmp/tree", "host_path": back}),
        COPY_TIMEOUT,
    )?)?;
    let cout = t.elapsed();
    for i in (0..TREE_FILES).step_by(97) {
        let rel = format!("d{}/f{i}", i / 50);
        same_bytes(&tree.join(&rel), &back.join(&rel))?;
    }
    let name = format!("{TREE_FILES}-file tree: in");
    table.time_row(&name, 1, &Stats::of(vec![cin]), None);
    table.time_row(
        &format!("{TREE_FILES}-file tree: out"),
        1,
        &Stats::of(vec![cout]),
        None,
    );
    table.time_row(
        &format!("{TREE_FILES}-file tree: in + out"),
        1,
        &Stats::of(vec![cin + cout]),
        Some(Duration::from_secs(2)),
    );
    Ok(())
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

pub(crate) fn via_channel(r: &Value) -> Res<()> {
    let out = structured(r)?;
    match out["via"].as_str() {
        Some("channel") => Ok(()),
        _ => Err(format!("the copy did not go over the data channel: {out}")),
    }
}

/// `mib` MiB of pseudo-random bytes, written a MiB at a time (the bench holds no 1 GiB buffer).
pub(crate) fn write_pseudo_random(path: &Path, mib: usize) -> Res<()> {
    let mut f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    for i in 0..mib {
        f.write_all(&crate::common::pseudo_random(MIB, i as u64 * 7 + 3))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// Whether two files hold the same bytes, compared a MiB at a time.
pub(crate) fn same_bytes(a: &Path, b: &Path) -> Res<()> {
    let open = |p: &Path| std::fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()));
    let (mut fa, mut fb) = (open(a)?, open(b)?);
    let (mut ba, mut bb) = (vec![0u8; MIB], vec![0u8; MIB]);
    let mut at = 0u64;
    loop {
        let na = read_full(&mut fa, &mut ba)?;
        let nb = read_full(&mut fb, &mut bb)?;
        if na != nb || ba[..na] != bb[..nb] {
            return Err(format!(
                "{} differs from {} in the MiB at byte {at}",
                b.display(),
                a.display()
            ));
        }
        if na == 0 {
            return Ok(());
        }
        at += na as u64;
    }
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> Res<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]).map_err(|e| e.to_string())? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// The agent's own guest-file-write then guest-file-read of `len` bytes in 1 MiB pieces, over
/// a connection of the bench's own (the server's idle one closes after 2 s).
fn agent_rates(sock: &Path, len: usize) -> Res<(Duration, Duration)> {
    std::thread::sleep(Duration::from_secs(3));
    let mut q = Qga::connect(sock, Duration::from_secs(10)).map_err(|e| e.to_string())?;
    let mut run = |cmd: &str, args: Value| q.execute(cmd, Some(args)).map_err(|e| e.to_string());
    let piece = crate::common::pseudo_random(MIB - 1, 5);
    let t = Instant::now();
    let h = run("guest-file-open", json!({"path": "/tmp/raw", "mode": "w"}))?;
    let mut sent = 0;
    while sent < len {
        let n = piece.len().min(len - sent);
        run(
            "guest-file-write",
            json!({"handle": h, "buf-b64": b64::encode(&piece[..n])}),
        )?;
        sent += n;
    }
    run("guest-file-close", json!({"handle": h}))?;
    let write = t.elapsed();
    let t = Instant::now();
    let h = run("guest-file-open", json!({"path": "/tmp/raw", "mode": "r"}))?;
    let mut got = 0;
    loop {
        let r = run(
            "guest-file-read",
            json!({"handle": h, "count": piece.len()}),
        )?;
        got += b64::decode(r["buf-b64"].as_str().unwrap_or(""))
            .map_err(|e| format!("guest-file-read gave bad base64: {e}"))?
            .len();
        if r["eof"] == json!(true) {
            break;
        }
    }
    run("guest-file-close", json!({"handle": h}))?;
    let read = t.elapsed();
    run("guest-exec", json!({"path": "rm", "arg": ["/tmp/raw"]}))?;
    if got != len {
        return Err(format!("guest-file-read gave {got} bytes of {len}"));
    }
    Ok((write, read))
}
