//! Reseeding a clone's kernel random number generator from the host. Clones of one template
//! resume with the same CRNG state; on x86 a fresh vmgenid makes Linux reseed at once, but the
//! aarch64 `virt` board has no vmgenid, so two clones would read the same /dev/urandom bytes
//! until the kernel's own reseed interval (up to 60 s) passes. A clone is therefore handed out
//! only after [`reseed`] ran [`crate::qemu::reseed_elf`]'s program in it with fresh host bytes.
//!
//! The program travels as the standard input of one guest-exec of `sh`, which writes it under
//! umask 077 to a random path in /tmp, runs it and removes it: one agent round trip to start
//! it (plus status polls), and the file is never open to other guest users (qemu-ga's own
//! guest-file-open creates files mode 0666, whatever the umask).

use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::b64;
use crate::ops::error::OpError;
use crate::qemu::agent_calls::{self, ExecRequest, ExecStatus};
use crate::qemu::qga::{self, Qga, QgaError};
use crate::qemu::reseed_elf::{self, SEED_LEN};

/// Run by `sh -c` with the program's path as `$0` and the program on stdin: exits 1 when it
/// cannot be written, 2 when it cannot be made executable, else with the program's status
/// (sh's own 126/127 when it cannot run it). The file is removed in every case.
const WRAPPER: &str = "umask 077; cat > \"$0\" || { rm -f \"$0\"; exit 1; }; \
                       chmod 700 \"$0\" || { rm -f \"$0\"; exit 2; }; \
                       \"$0\"; s=$?; rm -f \"$0\"; exit $s";

/// Reseeds the kernel CRNG of the guest whose agent is on `qga_socket` (a Linux guest of `arch`,
/// the agent running as root) with 64 bytes from the host's /dev/urandom, all within `budget`.
pub fn reseed(qga_socket: &Path, arch: &str, budget: Duration) -> Result<(), OpError> {
    let deadline = Instant::now() + budget;
    let fail = |why: String| {
        OpError::guest(format!(
            "the guest's random number generator was not reseeded from the host: {why}"
        ))
    };
    let sync = qga::SYNC_TIMEOUT.min(budget.max(Duration::from_millis(100)));
    match qga::with_agent(qga_socket, sync, |q| reseed_on(q, arch, deadline)) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(why)) => Err(fail(why)),
        Err(e) => Err(fail(format!("the guest agent failed: {e}"))),
    }
}

/// [`reseed`] on an agent session already synced (for a caller holding one): the outer error is
/// the agent's, the inner one says what went wrong in the guest.
pub fn reseed_on(
    q: &mut Qga,
    arch: &str,
    deadline: Instant,
) -> Result<Result<(), String>, QgaError> {
    let mut seed = [0u8; SEED_LEN];
    let mut tag = [0u8; 8];
    if let Err(e) = host_random(&mut seed).and_then(|()| host_random(&mut tag)) {
        return Ok(Err(e));
    }
    let Some(elf) = reseed_elf::program(arch, &seed) else {
        return Ok(Err(format!(
            "mcqemu has no reseed program for {arch} guests"
        )));
    };
    let path = format!("/tmp/.mcqemu-reseed-{}", hex(&tag));
    let mut req = ExecRequest::captured("/bin/sh", &["-c".into(), WRAPPER.into(), path.clone()]);
    req.input_data = Some(b64::encode(&elf));
    let status = match wait_exit(q, &req, deadline)? {
        Ok(status) => status,
        Err(why) => return Ok(Err(why)),
    };
    let stderr = String::from_utf8_lossy(&status.stderr()).trim().to_string();
    Ok(judge(status.exitcode, &path, &stderr))
}

/// Starts guest-exec request `req` and polls until it exits or `deadline` passes; returns its
/// final guest-exec-status.
fn wait_exit(
    q: &mut Qga,
    req: &ExecRequest,
    deadline: Instant,
) -> Result<Result<ExecStatus, String>, QgaError> {
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(50))
    };
    let pid = agent_calls::exec(q, req, left())?;
    let mut pause = Duration::from_millis(2);
    loop {
        let st = agent_calls::exec_status(q, pid, left())?;
        if st.exited {
            return Ok(Ok(st));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(Err(format!(
                "the reseed program (guest pid {pid}) did not finish in time"
            )));
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// What the wrapper's exit status `code` means; `stderr` is its error output.
fn judge(code: Option<i64>, path: &str, stderr: &str) -> Result<(), String> {
    let said = if stderr.is_empty() {
        String::new()
    } else {
        format!(" ({stderr})")
    };
    match code {
        Some(0) => Ok(()),
        Some(1) => Err(format!(
            "could not write {path} in the guest{said}; is /tmp full or read-only?"
        )),
        Some(2) => Err(format!("could not chmod {path} in the guest{said}")),
        Some(126) | Some(127) => Err(format!(
            "the guest could not run {path}{said}; is /tmp mounted noexec, or the guest not Linux?"
        )),
        Some(c) => Err(format!("{}{said}", reseed_elf::explain(c))),
        None => Err(format!("the reseed program was killed by a signal{said}")),
    }
}

/// Fills `buf` from the host's /dev/urandom.
fn host_random(buf: &mut [u8]) -> Result<(), String> {
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .map_err(|e| format!("cannot read the host's /dev/urandom: {e}"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;

    /// A fake agent on one end of a socket pair: answers the sync, checks the guest-exec it is
    /// sent (sh, the wrapper, a /tmp path, an aarch64 ELF on stdin), and reports `exitcode`.
    fn agent(exitcode: i64) -> (Qga, std::thread::JoinHandle<Vec<u8>>) {
        let (ours, theirs) = UnixStream::pair().expect("socket pair");
        let fake = std::thread::spawn(move || {
            let mut w = theirs.try_clone().expect("clone");
            let mut lines = BufReader::new(theirs);
            let mut stdin = Vec::new();
            let mut line = Vec::new();
            while lines.read_until(b'\n', &mut line).unwrap_or(0) > 0 {
                let text = String::from_utf8_lossy(&line)
                    .trim_start_matches('\u{FFFD}')
                    .to_string();
                line.clear();
                let Ok(msg) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                let reply = match msg["execute"].as_str() {
                    Some("guest-sync-delimited") => json!({"return": msg["arguments"]["id"]}),
                    Some("guest-exec") => {
                        let a = &msg["arguments"];
                        assert_eq!(a["path"], json!("/bin/sh"));
                        assert_eq!(a["arg"][1], json!(WRAPPER));
                        assert!(a["arg"][2]
                            .as_str()
                            .unwrap()
                            .starts_with("/tmp/.mcqemu-reseed-"));
                        stdin = b64::decode(a["input-data"].as_str().unwrap()).unwrap();
                        json!({"return": {"pid": 42}})
                    }
                    Some("guest-exec-status") => json!({"return": {
                        "exited": true, "exitcode": exitcode,
                        "err-data": b64::encode(b"from the guest")}}),
                    _ => json!({"error": {"class": "CommandNotFound", "desc": "no"}}),
                };
                let _ = w.write_all(format!("{reply}\n").as_bytes());
                if msg["execute"] == json!("guest-exec-status") {
                    break;
                }
            }
            stdin
        });
        (
            Qga::from_stream(ours, Duration::from_secs(5)).expect("sync"),
            fake,
        )
    }

    fn run(exitcode: i64) -> (Result<(), String>, Vec<u8>) {
        let (mut q, fake) = agent(exitcode);
        let deadline = Instant::now() + Duration::from_secs(5);
        let r = reseed_on(&mut q, "aarch64", deadline).expect("agent");
        (r, fake.join().expect("fake agent"))
    }

    #[test]
    fn a_zero_exit_is_success_and_the_program_carries_a_fresh_seed() {
        let (r1, elf1) = run(0);
        let (r2, elf2) = run(0);
        assert_eq!((r1, r2), (Ok(()), Ok(())));
        let at = reseed_elf::seed_offset("aarch64").expect("offset");
        assert_eq!(&elf1[..4], b"\x7fELF");
        assert_eq!(elf1.len(), at + SEED_LEN);
        assert_eq!(elf1[..at], elf2[..at]);
        assert_ne!(elf1[at..], elf2[at..], "each run gets its own host bytes");
    }

    #[test]
    fn failures_say_which_step_failed() {
        let eperm = run(192 + 1).0.expect_err("EPERM");
        assert!(
            eperm.contains("RNDRESEEDCRNG") && eperm.contains("EPERM"),
            "{eperm}"
        );
        assert!(eperm.contains("from the guest"), "{eperm}");
        assert!(run(126).0.expect_err("noexec").contains("noexec"));
        assert!(run(1).0.expect_err("write").contains("could not write"));
    }

    #[test]
    fn an_unknown_architecture_is_refused_before_anything_runs_in_the_guest() {
        let (mut q, fake) = agent(0);
        let r = reseed_on(&mut q, "s390x", Instant::now() + Duration::from_secs(5));
        assert!(r.expect("agent").expect_err("refused").contains("s390x"));
        drop(q);
        assert!(
            fake.join().expect("fake agent").is_empty(),
            "no guest-exec was sent"
        );
        assert!(judge(Some(300), "/tmp/x", "")
            .expect_err("odd")
            .contains("300"));
    }
}
