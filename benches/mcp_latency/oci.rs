//! The container-image rows (section `oci`): an image of five layers (~100 MiB: the oci tests'
//! two layers and three of 33 MiB random bytes), pushed by skopeo to Debian's docker-registry
//! on 127.0.0.1, then
//! - pulled and built by image_pull (a fresh store each run), against the same work by hand:
//!   `skopeo copy` to a layout, `umoci raw unpack`, `mke2fs -d`;
//! - a second sandbox of it (0 bytes downloaded) booted cold to its first guest_exec, beside
//!   the floor: the same image kernel booted by hand with a static `/init` that prints one
//!   line, to that line on the serial console (goal: the sandbox within 1.3x of it);
//! - clones of a template made with `template_create {"oci"}`;
//! - the server's peak RSS after pulling an image with a 1 GiB layer (of zeros: small to
//!   download, 1 GiB to unpack).
//!
//! `MCQEMU_BENCH_OCI_N` runs per row (default 3 pulls, 5 boots, 10 clones).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::clones::destroy;
use crate::common::registry::Registry;
use crate::common::{try_run, Server, VmKiller};
use crate::report::{Stats, Table};
use crate::{env_count, peak_rss_kb, structured, Dirs, Res, ToolCalls};

const CALL: Duration = Duration::from_secs(600);
/// How much longer than the same work by hand the pull and build may take.
const OVER_HAND: f64 = 0.5;
const COLD_TARGET: Duration = Duration::from_millis(2500);
const CLONE_TARGET: Duration = Duration::from_millis(100);
/// How far above the hand-booted kernel a cold image sandbox may be.
const FLOOR_RATIO: f64 = 1.3;

/// The image kernel booted by hand (q35, TCG, 1 vCPU, 256 MiB, the ELF through PVH as mcqemu
/// boots it) with a static `/init` (built here with gcc) that prints one line: how long to
/// that line on the serial console, `n` times.
fn floor(work: &Path, kernel: &Path, n: usize) -> Res<Stats> {
    let src = work.join("floor-init.c");
    std::fs::write(
        &src,
        "#include <fcntl.h>\n#include <unistd.h>\nint main(void) { int f = \
         open(\"/dev/console\", O_WRONLY); write(f, \"FLOOR-READY\\n\", 12); for (;;) \
         pause(); }\n",
    )
    .map_err(|e| format!("{}: {e}", src.display()))?;
    let init = work.join("floor-init");
    try_run(
        "gcc",
        &[
            OsStr::new("-static"),
            OsStr::new("-Os"),
            OsStr::new("-o"),
            init.as_os_str(),
            src.as_os_str(),
        ],
        CALL,
    )?;
    let mut c = mcqemu::host::cpio::Cpio::new();
    c.dir("dev");
    c.chardev("dev/console", 5, 1);
    c.file(
        "init",
        &std::fs::read(&init).map_err(|e| format!("{}: {e}", init.display()))?,
        0o755,
    );
    let initrd = work.join("floor.cpio");
    std::fs::write(&initrd, c.finish()).map_err(|e| format!("{}: {e}", initrd.display()))?;
    let mut times = Vec::new();
    for _ in 0..n {
        use std::io::BufRead;
        let t = Instant::now();
        let mut q = std::process::Command::new("qemu-system-x86_64")
            .args([
                "-machine", "q35", "-accel", "tcg", "-cpu", "max", "-m", "256", "-smp", "1",
            ])
            .args(["-nographic", "-no-reboot", "-kernel"])
            .arg(kernel)
            .arg("-initrd")
            .arg(&initrd)
            .args([
                "-append",
                "console=ttyS0 panic=-1 loglevel=4 cryptomgr.notests",
            ])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("qemu-system-x86_64: {e}"))?;
        let out = q.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if line.contains("FLOOR-READY") {
                    let _ = tx.send(());
                    return;
                }
            }
        });
        let seen = rx.recv_timeout(Duration::from_secs(120));
        let took = t.elapsed();
        let _ = q.kill();
        let _ = q.wait();
        seen.map_err(|_| "the hand-booted kernel printed no line within 120 s".to_string())?;
        times.push(took);
    }
    Ok(Stats::of(times))
}

/// The oci section.
pub fn oci_rows(table: &mut Table, dirs: &Dirs) {
    table.section(
        "oci: a 5-layer ~100 MiB image from docker-registry on 127.0.0.1; TCG boots and clones",
    );
    for tool in ["skopeo", "umoci", "docker-registry"] {
        if try_run(
            "sh",
            &[OsStr::new("-c"), OsStr::new(&format!("command -v {tool}"))],
            CALL,
        )
        .is_err()
        {
            table.skip_row("oci section", &format!("{tool} is not installed"));
            return;
        }
    }
    let outcome = run(table, dirs);
    table.or_error("oci section", outcome);
}

fn layout(dir: &Path, extra: &[&str]) -> Res<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oci/build_layout.py");
    let mut args: Vec<&OsStr> = vec![script.as_os_str(), dir.as_os_str(), OsStr::new("v1")];
    args.extend(extra.iter().map(OsStr::new));
    args.push(OsStr::new("--bootable"));
    try_run("python3", &args, CALL).map(|_| ())
}

fn push(dir: &Path, reg: &Registry, name: &str) -> Res<()> {
    let src = format!("oci:{}:v1", dir.display());
    let dest = format!("docker://{}/{name}:v1", reg.addr);
    let args = ["copy", "--dest-tls-verify=false", &src, &dest].map(OsStr::new);
    try_run("skopeo", &args, CALL).map(|_| ())
}

fn run(table: &mut Table, dirs: &Dirs) -> Res<()> {
    let work = dirs.tmp.path().join("oci-bench");
    let image = work.join("layout");
    layout(&image, &["--payload", "3:33"])?;
    let reg = Registry::start(&work.join("registry"));
    push(&image, &reg, "bench/app")?;
    let reference = format!("{}/bench/app:v1", reg.addr);
    let n = env_count("MCQEMU_BENCH_OCI_N", 3);

    let hand = by_hand(&work, &reference, n)?;
    table.time_row("skopeo copy + umoci unpack + mke2fs -d", n, &hand, None);

    // image_pull: a fresh store and root cache each run.
    let mut server = dirs.server()?;
    let oci_dir = dirs.state.join("oci");
    let mut pulls = Vec::new();
    for _ in 0..n {
        let _ = std::fs::remove_dir_all(oci_dir.join("store"));
        for e in std::fs::read_dir(&oci_dir).into_iter().flatten().flatten() {
            if e.file_name() != "boot" && e.path().is_dir() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let t = Instant::now();
        let r = server.tool_within("image_pull", json!({"oci": reference}), CALL)?;
        pulls.push(t.elapsed());
        let s = structured(&r)?;
        if s["cached"] != json!(false) || s["downloaded"].as_u64().unwrap_or(0) == 0 {
            return Err(format!("the pull did not download and build: {s}"));
        }
    }
    let pulls = Stats::of(pulls);
    let target = hand.median.mul_f64(1.0 + OVER_HAND);
    table.time_row("image_pull oci (download + build)", n, &pulls, Some(target));

    vm_rows(table, dirs, &mut server, &reference)?;
    server.tool("template_delete", json!({"name": "bench-oci-tpl"}))?;
    server.try_close()?;

    big_layer_rss(table, dirs, &work, &reg)
}

/// The same work by hand, `n` times: skopeo copy, umoci raw unpack, mke2fs -d.
fn by_hand(work: &Path, reference: &str, n: usize) -> Res<Stats> {
    let mut hand = Vec::new();
    for i in 0..n {
        let d = work.join(format!("hand{i}"));
        std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        let t = Instant::now();
        let src = format!("docker://{reference}");
        let dst = format!("oci:{}:v1", d.join("layout").display());
        try_run(
            "skopeo",
            &["copy", "--src-tls-verify=false", &src, &dst].map(OsStr::new),
            CALL,
        )?;
        let rootfs = d.join("rootfs");
        let (l, r) = (
            format!("{}:v1", d.join("layout").display()),
            rootfs.display().to_string(),
        );
        try_run(
            "umoci",
            &["raw", "unpack", "--rootless", "--image", &l, &r].map(OsStr::new),
            CALL,
        )?;
        let out = d.join("root.ext4").display().to_string();
        let mke2fs = if Path::new("/usr/sbin/mke2fs").exists() {
            "/usr/sbin/mke2fs"
        } else {
            "/sbin/mke2fs"
        };
        let size = "400M";
        try_run(
            mke2fs,
            &["-q", "-F", "-t", "ext4", "-d", &r, &out, size].map(OsStr::new),
            CALL,
        )?;
        hand.push(t.elapsed());
        let _ = std::fs::remove_dir_all(&d);
    }
    Ok(Stats::of(hand))
}

/// Cold sandboxes of the cached image to their first guest_exec, then clones of a template of
/// it.
fn vm_rows(table: &mut Table, dirs: &Dirs, server: &mut Server, reference: &str) -> Res<()> {
    // Cold sandboxes of the cached image, to their first guest_exec.
    let killer = VmKiller::new(dirs.tmp.path());
    let boots = env_count("MCQEMU_BENCH_OCI_N", 5);
    let mut cold = Vec::new();
    let mut downloaded = 0;
    // One unmeasured boot first: it fetches and unpacks the image kernel (the rows are of a
    // cached kernel, as every boot after a host's first).
    for i in 0..=boots {
        let name = format!("bench-oci-{i}");
        let t = Instant::now();
        let r = server.tool_within(
            "sandbox_vm",
            json!({"oci": reference, "name": name, "cpus": 1, "memory_mb": 512,
                   "port_forwards": [], "wait_agent_s": 120}),
            CALL,
        )?;
        killer.track(structured(&r)?);
        server.tool_within("guest_exec", json!({"name": name, "command": "id"}), CALL)?;
        if i > 0 {
            cold.push(t.elapsed());
        }
        let again = server.tool("image_pull", json!({"oci": reference}))?;
        downloaded += structured(&again)?["downloaded"]
            .as_u64()
            .unwrap_or(u64::MAX);
        destroy(server, &name)?;
    }
    table.time_row(
        "sandbox_vm oci (cached) -> first guest_exec",
        boots,
        &Stats::of(cold.clone()),
        Some(COLD_TARGET),
    );
    println!("  bytes downloaded by image_pull of the held image: {downloaded}");
    let cold = Stats::of(cold);
    let kernel = std::fs::read_dir(dirs.state.join("oci").join("boot"))
        .map_err(|e| format!("the kit cache: {e}"))?
        .flatten()
        .map(|e| e.path().join("vmlinux"))
        .find(|p| p.is_file())
        .ok_or("no image kernel in the kit cache")?;
    match floor(dirs.tmp.path(), &kernel, boots) {
        Ok(f) => {
            table.time_row(
                "floor: the image kernel by hand, static /init -> first serial line",
                boots,
                &f,
                None,
            );
            table.note(&format!(
                "cold sandbox / floor: {:.2}x (goal <= {FLOOR_RATIO}x)",
                cold.median.as_secs_f64() / f.median.as_secs_f64().max(1e-9)
            ));
        }
        Err(e) => table.skip_row("floor", &e),
    }

    // Clones of an oci template.
    server.tool_within(
        "template_create",
        json!({"name": "bench-oci-tpl", "oci": reference, "cpus": 1, "memory_mb": 512}),
        CALL,
    )?;
    let clones_n = env_count("MCQEMU_BENCH_OCI_N", 10);
    let mut clones = Vec::new();
    for i in 0..clones_n {
        let name = format!("bench-oci-c{i}");
        let t = Instant::now();
        let r = server.tool_within(
            "sandbox_vm",
            json!({"template": "bench-oci-tpl", "name": name, "port_forwards": []}),
            CALL,
        )?;
        clones.push(t.elapsed());
        killer.track(structured(&r)?);
        destroy(server, &name)?;
    }
    table.time_row(
        "clone of an oci template",
        clones_n,
        &Stats::of(clones),
        Some(CLONE_TARGET),
    );
    Ok(())
}

/// The peak RSS of a fresh server that pulled an image with a 1 GiB layer.
fn big_layer_rss(table: &mut Table, dirs: &Dirs, work: &Path, reg: &Registry) -> Res<()> {
    let mb = env_count("MCQEMU_BENCH_OCI_BIG_MB", 1024);
    let dir: PathBuf = work.join("big");
    layout(&dir, &["--zeros", &mb.to_string()])?;
    push(&dir, reg, "bench/big")?;
    let mut server: Server = dirs.server()?;
    let t = Instant::now();
    server.tool_within(
        "image_pull",
        json!({"oci": format!("{}/bench/big:v1", reg.addr)}),
        CALL,
    )?;
    let took = t.elapsed();
    let kb = peak_rss_kb(&server)?;
    server.try_close()?;
    println!(
        "  image_pull of a {mb} MiB layer: {:.1} s",
        took.as_secs_f64()
    );
    table.rss_row(&format!("peak RSS: image_pull with a {mb} MiB layer"), kb);
    Ok(())
}
