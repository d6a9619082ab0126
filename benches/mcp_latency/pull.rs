//! The image_pull rows: a raw image (256 MiB unless `MCQEMU_BENCH_PULL_MB` says otherwise)
//! pulled from the tests' local HTTP server on 127.0.0.1, against `curl` fetching the same file
//! from the same server. The pull does more than curl: it fetches the checksum file first,
//! hashes the body (SHA-256), syncs the file to disk before renaming it into place, and checks
//! the image with qemu-img; curl only writes into the page cache. So there are also rows of
//! curl followed by an fsync of the file, and by `sha256sum` and an fsync (the same work done
//! by hand, one step after the other).
//!
//! `MCQEMU_BENCH_PULL_N` runs per row (default min(N, 5)), after one warm-up run. A missing
//! curl prints SKIPPED rows; a failure prints an ERROR line and the bench goes on.

use std::ffi::OsStr;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{pseudo_random, sha256_hex, try_run, HttpServer, Route, Server};
use crate::report::{Bench, Stats, Table};
use crate::{env_count, structured, Dirs, Res, ToolCalls};

/// Longest wait for one pull or one curl run.
const PULL_TIMEOUT: Duration = Duration::from_secs(300);
/// How much longer than curl (a fraction of curl's median) image_pull may take.
const OVER_CURL: f64 = 0.10;

/// The image_pull section.
pub fn pull_rows(n: usize, table: &mut Table, dirs: &Dirs) {
    let mb = env_count("MCQEMU_BENCH_PULL_MB", 256);
    table.section(&format!(
        "image_pull against curl: {mb} MiB raw image from a local HTTP server (127.0.0.1)"
    ));
    let name = format!("curl -o, {mb} MiB");
    if let Err(e) = try_run("curl", &[OsStr::new("--version")], PULL_TIMEOUT) {
        table.skip_row(&name, &format!("curl is not usable: {e}"));
        table.skip_row(&format!("image_pull, {mb} MiB"), "no curl to compare with");
        return;
    }
    let bench = Bench {
        n: env_count("MCQEMU_BENCH_PULL_N", n.min(5)),
        warmup: 1,
    };
    let outcome = PullBench::new(dirs, mb).and_then(|mut pb| pb.rows(&bench, table));
    table.or_error("image_pull section", outcome);
}

/// The served image, the server, and where both copies go.
struct PullBench {
    data_len: usize,
    /// The image's SHA-256.
    digest: String,
    http: HttpServer,
    server: Server,
    folder: PathBuf,
    mb: usize,
}

impl PullBench {
    fn new(dirs: &Dirs, mb: usize) -> Res<PullBench> {
        let data = pseudo_random(mb << 20, 0x5eed);
        let digest = sha256_hex(&data);
        let sums = format!("{digest}  bench.img\n");
        let data_len = data.len();
        let http = HttpServer::start(vec![
            ("bench.img", Route::body(data)),
            ("SHA256SUMS", Route::body(sums.into_bytes())),
        ]);
        Ok(PullBench {
            data_len,
            digest,
            http,
            server: dirs.server()?,
            folder: dirs.tmp.try_subdir("pull")?,
            mb,
        })
    }

    fn rows(&mut self, bench: &Bench, table: &mut Table) -> Res<()> {
        let mb = self.mb;
        let curl_file = self.folder.join("curl.img");
        let url = self.http.url("bench.img");
        let curl = bench.measure(table, &format!("curl -o, {mb} MiB"), None, || {
            self.curl_timed(&url, &curl_file, false, false)
        })?;
        let curl_sync =
            bench.measure(table, &format!("curl -o + fsync, {mb} MiB"), None, || {
                self.curl_timed(&url, &curl_file, false, true)
            })?;
        let name = format!("curl -o + sha256sum + fsync, {mb} MiB");
        let curl_all = bench.measure(table, &name, None, || {
            self.curl_timed(&url, &curl_file, true, true)
        })?;
        remove(&curl_file)?;

        let dest = self.folder.join("bench.img");
        let args = json!({
            "url": url, "checksums_url": self.http.url("SHA256SUMS"),
            "path": dest, "overwrite": true
        });
        let want = self.data_len;
        let server = &mut self.server;
        let pull = bench.time(table, &format!("image_pull, {mb} MiB"), None, || {
            let r = server.tool_within("image_pull", args.clone(), PULL_TIMEOUT)?;
            let out = structured(&r)?;
            if out["bytes"] != json!(want) || out["verified"] != Value::Bool(true) {
                return Err(format!("unexpected image_pull result: {out}"));
            }
            Ok(())
        })?;
        remove(&dest)?;

        let target = curl.median.mul_f64(OVER_CURL);
        table.diff_row(
            "image_pull - curl -o (median)",
            pull.median,
            curl.median,
            target,
        );
        table.diff_info_row(
            "image_pull - (curl + sha256sum + fsync)",
            pull.median,
            curl_all.median,
        );
        let bytes = self.data_len;
        let rate = |s: &Stats| bytes as f64 / s.median.as_secs_f64().max(1e-9) / 1e6;
        table.note(&format!(
            "medians: curl {:.0} MB/s, curl + fsync {:.0} MB/s, curl + sha256sum + fsync {:.0} \
             MB/s, image_pull {:.0} MB/s; image_pull / curl = {:.2} (target <= {:.2})",
            rate(&curl),
            rate(&curl_sync),
            rate(&curl_all),
            rate(&pull),
            pull.median.as_secs_f64() / curl.median.as_secs_f64().max(1e-9),
            1.0 + OVER_CURL
        ));
        Ok(())
    }

    /// One curl run into a fresh `file` (removed first, untimed), then optionally `sha256sum`
    /// of the file (checked against the served data) and an fsync of it; returns the time of
    /// all that.
    fn curl_timed(&self, url: &str, file: &Path, hash: bool, sync: bool) -> Res<Duration> {
        remove(file)?;
        let t0 = Instant::now();
        curl_get(url, file)?;
        if hash {
            let out = try_run("sha256sum", &[file.as_os_str()], PULL_TIMEOUT)?;
            let text = String::from_utf8_lossy(&out);
            if text.split_whitespace().next() != Some(self.digest.as_str()) {
                return Err(format!("sha256sum of the curl copy: {text}"));
            }
        }
        if sync {
            File::open(file)
                .and_then(|f| f.sync_all())
                .map_err(|e| format!("fsync {}: {e}", file.display()))?;
        }
        let took = t0.elapsed();
        self.check_len(file)?;
        Ok(took)
    }

    fn check_len(&self, path: &Path) -> Res<()> {
        let len = std::fs::metadata(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .len();
        if len as usize != self.data_len {
            return Err(format!(
                "curl wrote {len} bytes, not {} ({})",
                self.data_len,
                path.display()
            ));
        }
        Ok(())
    }
}

/// `curl -sS --fail -o file url`, bounded.
fn curl_get(url: &str, file: &Path) -> Res<()> {
    let os = OsStr::new;
    try_run(
        "curl",
        &[os("-sS"), os("--fail"), os("-o"), file.as_os_str(), os(url)],
        PULL_TIMEOUT,
    )
    .map(|_| ())
}

/// Removes `path` if it is there.
fn remove(path: &Path) -> Res<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot remove {}: {e}", path.display())),
    }
}
