//! A day's work in a sandbox, over MCP against the built binary, real QEMU (TCG) and the test
//! guest: guest_exec's env and cwd, its live output in progress notifications, background
//! processes read by offsets across a server restart and killed with their children, and
//! forwards added to and removed from a running VM; folder listings and reads by offset.

use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{json, Value};

const CALL: Duration = Duration::from_secs(120);

/// Launches the test guest `name` on the lab's server and waits for its agent.
fn boot(lab: &mut Lab, name: &str, extra: Value) -> Value {
    let g = test_guest();
    let mut args = json!({
        "name": name, "kernel": g.kernel, "initrd": g.initrd, "append": g.append,
        "memory_mb": 256, "cpus": 1
    });
    if let Value::Object(m) = extra {
        for (k, v) in m {
            args[k] = v;
        }
    }
    let l = lab.launch(args, CALL);
    let s = lab.srv();
    let deadline = Instant::now() + Duration::from_secs(120);
    while s
        .try_call_ok_within("guest_ping", json!({"name": name}), Duration::from_secs(10))
        .is_err()
    {
        assert!(Instant::now() < deadline, "the agent never answered");
        std::thread::sleep(Duration::from_millis(200));
    }
    l
}

fn exec_sh(s: &mut Server, vm: &str, script: &str) -> Value {
    s.call_ok_within(
        "guest_exec",
        json!({"name": vm, "command": "sh", "args": ["-c", script]}),
        CALL,
    )
}

#[test]
fn env_cwd_live_output_and_background_processes() {
    let mut lab = {
        test_guest();
        Lab::new("work")
    };
    boot(&mut lab, "w", json!({}));
    let s = lab.srv();

    // env is added to the environment (PATH stays), cwd is the program's folder.
    exec_sh(s, "w", "mkdir -p /srv/proj");
    let r = s.call_ok_within(
        "guest_exec",
        json!({"name": "w", "command": "sh", "cwd": "/srv/proj",
               "env": {"MCQ_A": "one two", "MCQ_B": "$HOME 'q'"},
               "args": ["-c", "pwd; echo \"$MCQ_A|$MCQ_B\"; command -v ls >/dev/null && echo path-ok"]}),
        CALL,
    );
    assert_eq!(r["exitcode"], json!(0), "{r}");
    assert_eq!(
        r["stdout"],
        json!("/srv/proj\none two|$HOME 'q'\npath-ok\n"),
        "{r}"
    );
    // A missing cwd: an error naming cwd, and nothing ran.
    let err = s.call_err_within(
        "guest_exec",
        json!({"name": "w", "command": "touch", "args": ["/tmp/ran"], "cwd": "/no/such"}),
        CALL,
    );
    assert!(err.contains("cwd") && err.contains("/no/such"), "{err}");
    assert_eq!(
        exec_sh(s, "w", "test -e /tmp/ran; echo $?")["stdout"],
        json!("1\n")
    );
    let err = s.call_err(
        "guest_exec",
        json!({"name": "w", "command": "true", "cwd": "rel"}),
    );
    assert!(err.contains("cwd"), "{err}");
    let err = s.call_err(
        "guest_exec",
        json!({"name": "w", "command": "true", "env": {"1BAD": "x"}}),
    );
    assert!(err.contains("env") && err.contains("1BAD"), "{err}");

    // A progress token without live: heartbeats only (the time it ran, at most one a
    // second, none in the first second), no wrapper and no spool files in the guest.
    let (r, took, progress) = s
        .try_call_with_token(
            "guest_exec",
            json!({"name": "w", "command": "sh",
                   "args": ["-c", "for i in 1 2 3; do echo beat-$i; sleep 1; done"]}),
            CALL,
        )
        .unwrap();
    let out = tool_ok(&r, "the 3-second program");
    assert_eq!(out["stdout"], json!("beat-1\nbeat-2\nbeat-3\n"), "{out}");
    eprintln!("3 s program without live: {took:?}, {progress:?}");
    assert!(!progress.is_empty(), "no heartbeat in {took:?}");
    assert!(progress.len() <= 4, "{progress:?}");
    for p in &progress {
        let m = p["params"]["message"].as_str().unwrap_or_default();
        assert!(
            m.contains("running in the guest") && !m.contains("beat-"),
            "{p}"
        );
    }
    let quick = s
        .try_call_with_token("guest_exec", json!({"name": "w", "command": "true"}), CALL)
        .unwrap();
    assert!(
        quick.2.is_empty(),
        "a fast call sent progress: {:?}",
        quick.2
    );
    assert_eq!(
        exec_sh(s, "w", "test -e /tmp/.mcqemu-exec; echo $?")["stdout"],
        json!("1\n"),
        "a run without live made spool files"
    );

    // Live output: a 12-second program printing a line a second.
    let (r, took, progress) = s
        .try_call_with_token(
            "guest_exec",
            json!({"name": "w", "command": "sh", "timeout": 60, "live": true,
                   "args": ["-c", "for i in $(seq 1 12); do echo line-$i; sleep 1; done; echo bye >&2"]}),
            CALL,
        )
        .unwrap();
    let out = tool_ok(&r, "the 12-second program");
    let expected: String = (1..=12).map(|i| format!("line-{i}\n")).collect();
    assert_eq!(out["stdout"], json!(expected), "{out}");
    assert_eq!(out["stderr"], json!("bye\n"), "{out}");
    let carrying: Vec<&Value> = progress
        .iter()
        .filter(|p| {
            p["params"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("line-"))
        })
        .collect();
    eprintln!(
        "12 s program: {took:?}, {} notifications, {} with its lines",
        progress.len(),
        carrying.len()
    );
    assert!(carrying.len() >= 4, "{progress:?}");
    // Lines arrive in order and none twice across notifications.
    let seen: Vec<u32> = carrying
        .iter()
        .flat_map(|p| {
            p["params"]["message"]
                .as_str()
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.strip_prefix("line-").and_then(|n| n.parse().ok()))
                .collect::<Vec<u32>>()
        })
        .collect();
    assert!(seen.windows(2).all(|w| w[1] > w[0]), "{seen:?}");
    if agent_variant().unwrap().is_some() {
        // mcqemu-agent hands out every line as it comes: none is skipped.
        assert_eq!(seen, (1..=12).collect::<Vec<u32>>(), "{progress:?}");
    }
    // The run's spool files are emptied (kept for the next run to reuse).
    assert_eq!(
        exec_sh(
            s,
            "w",
            "for f in /tmp/.mcqemu-exec/*; do [ -s \"$f\" ] && echo \"$f\"; done; true"
        )["stdout"],
        json!("")
    );

    // Quick live runs with a token read their slot's files in the poll that sees them end: each
    // gets its own output (none of the run before), and one past the early read's 64 KiB
    // is read whole by path.
    let quick = |s: &mut Server, script: &str| {
        let (r, _, _) = s
            .try_call_with_token(
                "guest_exec",
                json!({"name": "w", "command": "sh", "live": true, "args": ["-c", script]}),
                CALL,
            )
            .unwrap();
        tool_ok(&r, script)
    };
    let one = quick(s, "echo one; echo e1 >&2; exit 4");
    assert_eq!(
        (one["stdout"].clone(), one["stderr"].clone()),
        (json!("one\n"), json!("e1\n"))
    );
    assert_eq!(one["exitcode"], json!(4), "{one}");
    let two = quick(s, "echo two");
    assert_eq!(
        (two["stdout"].clone(), two["stderr"].clone()),
        (json!("two\n"), json!(""))
    );
    let big = quick(s, "head -c 100000 /dev/zero | tr '\\0' a");
    assert_eq!(
        big["stdout"].as_str().map(str::len),
        Some(100_000),
        "{}",
        big["stderr"]
    );
    let after = quick(s, "true");
    assert_eq!(
        (after["stdout"].clone(), after["stderr"].clone()),
        (json!(""), json!(""))
    );
    // On mcqemu-agent, env, cwd and live output need no wrapper: no spool file was made.
    if agent_variant().unwrap().is_some() {
        assert_eq!(
            exec_sh(s, "w", "test -e /tmp/.mcqemu-exec; echo $?")["stdout"],
            json!("1\n"),
            "mcqemu-agent's runs made spool files"
        );
    }

    // A background process: a handle at once; output by offsets, stderr apart.
    let t = Instant::now();
    let started = s.call_ok(
        "guest_exec",
        json!({"name": "w", "command": "sh", "background": true, "cwd": "/srv/proj",
               "args": ["-c", "i=0; while true; do i=$((i+1)); echo out-$i; echo err-$i >&2; sleep 0.3; done"]}),
    );
    let started_in = t.elapsed();
    let handle = started["handle"].as_str().unwrap().to_string();
    assert!(started["pid"].as_i64().unwrap() > 0, "{started}");
    eprintln!("background start round trip: {started_in:?}");
    // The two streams are read one after the other, so a wait that ends on the first output
    // may see one stream's first line before the other's: read on by offsets until both.
    let (mut first_out, mut first_err) = (String::new(), String::new());
    let (mut o, mut e) = (0, 0);
    let give_up = Instant::now() + Duration::from_secs(30);
    while first_out.is_empty() || first_err.is_empty() {
        assert!(Instant::now() < give_up, "{first_out:?} {first_err:?}");
        let st = status(s, &handle, o, e, 5.0);
        assert_eq!(st["running"], json!(true), "{st}");
        first_out.push_str(st["stdout"].as_str().unwrap());
        first_err.push_str(st["stderr"].as_str().unwrap());
        (o, e) = offsets(&st);
    }
    assert!(first_out.starts_with("out-1\n"), "{first_out:?}");
    assert!(!first_out.contains("err-"), "{first_out:?}");
    assert!(first_err.starts_with("err-1\n"), "{first_err:?}");
    std::thread::sleep(Duration::from_millis(800));
    let st2 = status(s, &handle, o, e, 5.0);
    let next = st2["stdout"].as_str().unwrap();
    assert!(!next.is_empty(), "{st2}");
    let last_seen = last_n(&first_out);
    assert_eq!(
        first_n(next),
        last_seen + 1,
        "output repeated or lost: {first_out:?} then {next:?}"
    );
    let info = s.call_ok("vm_info", json!({"name": "w"}));
    assert!(
        info["background"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["handle"] == json!(handle) && p["running"] == json!(true)),
        "{}",
        info["background"]
    );

    // The server is restarted: the handle still works.
    let (o, e) = offsets(&st2);
    let mut s2 = lab.spawn_server();
    let st3 = status(&mut s2, &handle, o, e, 5.0);
    assert_eq!(st3["running"], json!(true), "{st3}");
    let cont = st3["stdout"].as_str().unwrap();
    assert_eq!(
        first_n(cont),
        last_n(st2["stdout"].as_str().unwrap()) + 1,
        "{st3}"
    );
    // Unknown handles and handles of nothing are clear errors.
    let err = s2.call_err(
        "guest_exec_status",
        json!({"name": "w", "handle": "bg-nope"}),
    );
    assert!(
        err.contains("no background process") && err.contains("vm_info"),
        "{err}"
    );
    // Kill ends it and its children (its sleep).
    let pid = started["pid"].as_i64().unwrap();
    let k = s2.call_ok_within(
        "guest_exec_kill",
        json!({"name": "w", "handle": handle}),
        CALL,
    );
    assert_eq!(k["signalled"], json!(true), "{k}");
    assert!(k["signal"] == json!(15) || k["exitcode"].is_number(), "{k}");
    let left = exec_sh(
        &mut s2,
        "w",
        &format!("ps -o pid,ppid,pgid,args 2>/dev/null | awk '$3 == {pid}' | grep -v awk || true"),
    );
    assert_eq!(left["stdout"], json!(""), "processes left: {left}");
    let done = status(&mut s2, &handle, 0, 0, 0.0);
    assert_eq!(done["running"], json!(false), "{done}");
    let k2 = s2.call_ok_within(
        "guest_exec_kill",
        json!({"name": "w", "handle": handle}),
        CALL,
    );
    assert_eq!(k2["signalled"], json!(false), "{k2}");
    s2.try_close().unwrap();
}

fn status(s: &mut Server, handle: &str, o: u64, e: u64, wait: f64) -> Value {
    s.call_ok_within(
        "guest_exec_status",
        json!({"name": "w", "handle": handle, "stdout_offset": o, "stderr_offset": e,
               "wait_s": wait}),
        CALL,
    )
}

fn offsets(st: &Value) -> (u64, u64) {
    (
        st["stdout_next_offset"].as_u64().unwrap(),
        st["stderr_next_offset"].as_u64().unwrap(),
    )
}

/// The number of the first `out-N` line.
fn first_n(text: &str) -> u64 {
    text.lines()
        .next()
        .and_then(|l| l.strip_prefix("out-"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no out-N line first in {text:?}"))
}

/// The number of the last `out-N` line.
fn last_n(text: &str) -> u64 {
    text.lines()
        .last()
        .and_then(|l| l.strip_prefix("out-"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no out-N line last in {text:?}"))
}

#[test]
fn folders_listed_files_read_by_offset_and_forwards_changed_live() {
    let mut lab = {
        test_guest();
        Lab::new("fwd")
    };
    boot(&mut lab, "w", json!({"port_forwards": ["auto:22"]}));
    let s = lab.srv();

    // guest_list_dir: types, sizes, modes.
    exec_sh(
        s,
        "w",
        "mkdir -p /srv/d/sub && printf 12345 > /srv/d/five && chmod 0751 /srv/d/five && \
         ln -s five /srv/d/link && printf x > '/srv/d/.hidden file' && mkfifo /srv/d/pipe",
    );
    let l = s.call_ok("guest_list_dir", json!({"name": "w", "path": "/srv/d"}));
    let entries = l["entries"].as_array().unwrap();
    let find = |n: &str| {
        entries
            .iter()
            .find(|e| e["name"] == json!(n))
            .unwrap_or_else(|| panic!("{n} not listed: {l}"))
            .clone()
    };
    assert_eq!(entries.len(), 5, "{l}");
    assert_eq!(find("five")["type"], json!("file"));
    assert_eq!(find("five")["size"], json!(5));
    assert_eq!(find("five")["mode"], json!("0751"));
    assert_eq!(find("sub")["type"], json!("dir"));
    assert_eq!(find("link")["type"], json!("symlink"));
    assert_eq!(find(".hidden file")["type"], json!("file"));
    assert_eq!(find("pipe")["type"], json!("fifo"));
    assert!(find("five")["mtime"].as_i64().unwrap() > 1_600_000_000);
    let cut = s.call_ok(
        "guest_list_dir",
        json!({"name": "w", "path": "/srv/d", "max_entries": 2}),
    );
    assert_eq!(cut["truncated"], json!(true), "{cut}");
    assert_eq!(cut["entries"].as_array().unwrap().len(), 2);
    let err = s.call_err(
        "guest_list_dir",
        json!({"name": "w", "path": "/srv/d/five"}),
    );
    assert!(err.contains("not a folder"), "{err}");

    // guest_file_read by offset: the exact slice, and the file's size.
    exec_sh(s, "w", "seq 1 20000 > /srv/big.txt");
    let whole = exec_sh(s, "w", "cat /srv/big.txt")["stdout"]
        .as_str()
        .unwrap()
        .to_string();
    let r = s.call_ok(
        "guest_file_read",
        json!({"name": "w", "path": "/srv/big.txt", "offset": 50000, "max_bytes": 1000}),
    );
    assert_eq!(r["file_size"], json!(whole.len()), "{r}");
    assert_eq!(r["content"].as_str().unwrap(), &whole[50000..51000]);
    assert_eq!(r["truncated"], json!(true));
    let tail = s.call_ok(
        "guest_file_read",
        json!({"name": "w", "path": "/srv/big.txt", "offset": whole.len() - 10}),
    );
    assert_eq!(
        tail["content"].as_str().unwrap(),
        &whole[whole.len() - 10..]
    );
    assert_eq!(tail["truncated"], json!(false));

    // A server started later (busybox httpd in the background), reached through a forward
    // added live, then removed: the port closes.
    exec_sh(
        s,
        "w",
        "mkdir -p /srv/www && echo mcq-page > /srv/www/index.html",
    );
    let bg = s.call_ok(
        "guest_exec",
        json!({"name": "w", "command": "httpd", "args": ["-f", "-p", "8080", "-h", "/srv/www"],
               "background": true}),
    );
    let added = s.call_ok(
        "vm_port_forward",
        json!({"name": "w", "add": ["auto:8080"]}),
    );
    let port = added["added"][0]["host"].as_u64().unwrap() as u16;
    assert_eq!(
        added["port_forwards"].as_array().unwrap().len(),
        2,
        "{added}"
    );
    let page = http_get(port);
    assert!(page.contains("mcq-page"), "{page}");
    let info = s.call_ok("vm_info", json!({"name": "w"}));
    assert!(
        info["port_forwards"]
            .to_string()
            .contains(&port.to_string()),
        "{info}"
    );
    let again = s.call_err(
        "vm_port_forward",
        json!({"name": "w", "add": [format!("{port}:80")]}),
    );
    assert!(again.contains("already forwarded"), "{again}");
    let removed = s.call_ok(
        "vm_port_forward",
        json!({"name": "w", "remove": [port.to_string()]}),
    );
    assert_eq!(removed["removed"][0]["host"], json!(port), "{removed}");
    assert_eq!(removed["port_forwards"].as_array().unwrap().len(), 1);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "port {port} still open after the forward was removed"
    );
    // A restarted server sees the current set.
    let mut s2 = lab.spawn_server();
    let info = s2.call_ok("vm_info", json!({"name": "w"}));
    assert_eq!(info["port_forwards"].as_array().unwrap().len(), 1, "{info}");
    s2.call_ok_within(
        "guest_exec_kill",
        json!({"name": "w", "handle": bg["handle"]}),
        CALL,
    );
    s2.try_close().unwrap();
}

/// GET / from 127.0.0.1:port (bounded), the whole reply as text.
fn http_get(port: u16) -> String {
    use std::io::{Read, Write};
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let attempt = (|| -> std::io::Result<String> {
            let mut c = std::net::TcpStream::connect(("127.0.0.1", port))?;
            c.set_read_timeout(Some(Duration::from_secs(10)))?;
            c.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")?;
            let mut out = String::new();
            c.read_to_string(&mut out)?;
            Ok(out)
        })();
        match attempt {
            Ok(t) if t.contains("200") => return t,
            other => {
                assert!(
                    Instant::now() < deadline,
                    "no page on port {port}: {other:?}"
                );
                std::thread::sleep(Duration::from_millis(300));
            }
        }
    }
}
