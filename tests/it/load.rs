//! Load: tool calls beyond the workers wait in a FIFO queue, every one answered exactly once; a
//! queued call cancelled before it starts never runs and is never answered.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use crate::common::*;
use mcqemu::mcp::workers::MAX_WORKERS;
use serde_json::{json, Value};

/// Bound for a launch_vm call (QEMU start-up plus the first QMP session) on a loaded machine.
const LAUNCH: Duration = Duration::from_secs(120);

/// How many calls the pipelined burst sends.
const BURST: usize = 256;

#[test]
fn pipelined_calls_are_all_answered_once_and_successfully() {
    let lab = Lab::without_server("load", 1);
    let mut s = lab.spawn_server();
    let vm = lab.launch_on(
        &mut s,
        json!({"name": "loaded", "memory_mb": 64, "cpus": 1, "accel": "tcg", "no_net": true}),
        LAUNCH,
    );
    let pid = vm["pid"].as_i64().unwrap() as i32;
    let image = lab.dir.join("load.qcow2");
    let (ok, _, err) = run_tool(
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            image.to_str().unwrap(),
            "16M",
        ],
    );
    assert!(ok, "qemu-img create failed: {err}");

    // Send every call without waiting for any answer.
    let mut sent: BTreeMap<String, &str> = BTreeMap::new();
    let t0 = Instant::now();
    for i in 0..BURST {
        let id = format!("burst-{i}");
        let (tool, args) = match i % 3 {
            0 => ("list_vms", json!({})),
            1 => ("vm_info", json!({"name": "loaded"})),
            _ => ("image_info", json!({"path": image.to_str().unwrap()})),
        };
        s.send_request(
            &json!(id),
            "tools/call",
            json!({"name": tool, "arguments": args}),
        );
        sent.insert(id, tool);
    }

    // Every id answered, successfully, exactly once.
    let mut answers: BTreeMap<String, usize> = BTreeMap::new();
    let deadline = t0 + Duration::from_secs(240);
    while answers.len() < BURST {
        let left = deadline.saturating_duration_since(Instant::now());
        let Some(m) = s.recv(left) else {
            let missing: Vec<&String> = sent.keys().filter(|k| !answers.contains_key(*k)).collect();
            panic!(
                "{} of {BURST} calls unanswered after {:?}: {missing:?}; server stderr:\n{}",
                missing.len(),
                t0.elapsed(),
                s.stderr_text()
            );
        };
        if m.get("method").is_some() {
            continue; // a notification (log, progress)
        }
        let id = m["id"]
            .as_str()
            .unwrap_or_else(|| panic!("an answer with an unexpected id: {m}"))
            .to_string();
        let tool = *sent
            .get(&id)
            .unwrap_or_else(|| panic!("an answer to an id never sent: {m}"));
        *answers.entry(id.clone()).or_default() += 1;
        check_answer(tool, &m);
    }
    let elapsed = t0.elapsed();
    // Nothing more arrives: no call was answered twice.
    let late: Vec<Value> = s
        .collect_for(Duration::from_secs(1))
        .into_iter()
        .filter(|m| m.get("method").is_none())
        .collect();
    assert!(
        late.is_empty(),
        "answers after all {BURST} arrived: {late:?}"
    );
    let twice: Vec<(&String, &usize)> = answers.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "ids answered more than once: {twice:?}");
    eprintln!("{BURST} pipelined calls answered in {elapsed:?}");

    s.assert_alive();
    let st = s.call_ok("stop_vm", json!({"name": "loaded", "force": true}));
    assert_eq!(st["status"], "stopped", "{st}");
    assert!(wait_pid_dead(pid, Duration::from_secs(10)));
}

/// Checks one burst answer: a successful `CallToolResult` that is what `tool` returns.
fn check_answer(tool: &str, m: &Value) {
    let result = m
        .get("result")
        .unwrap_or_else(|| panic!("{tool}: a protocol error under load: {m}"));
    let out = tool_ok(result, &format!("{tool} under load"));
    match tool {
        "list_vms" => {
            let vms = out["vms"].as_array().expect("vms");
            assert!(
                vms.iter().any(|v| v["name"] == "loaded"),
                "list_vms lost the VM: {out}"
            );
        }
        "vm_info" => {
            assert_eq!(out["name"], "loaded", "{out}");
            assert!(out["record"].is_object(), "{out}");
        }
        _ => assert_eq!(out["format"], "qcow2", "{out}"),
    }
}

#[test]
fn a_queued_call_cancelled_before_it_starts_never_runs() {
    // 2 MiB at 16 KiB per 50 ms: about 6.4 s per download, so every worker stays busy for
    // seconds while the queued call is cancelled.
    let http = HttpServer::start(vec![(
        "slow.img",
        Route::trickle(
            pseudo_random(2 << 20, 17),
            16 * 1024,
            Duration::from_millis(50),
        ),
    )]);
    let mut s = Server::ready();
    let dl = s.tmp.subdir("dl");
    let work = s.tmp.subdir("work");

    // Occupy every worker with a slow download, and wait until each is really running.
    let slow_ids: Vec<Value> = (0..MAX_WORKERS)
        .map(|i| json!(format!("slow-{i}")))
        .collect();
    for (i, id) in slow_ids.iter().enumerate() {
        s.send_request(
            id,
            "tools/call",
            json!({"name": "image_download",
                   "arguments": {"url": http.url("slow.img"),
                                 "path": dl.join(format!("slow-{i}.img")).to_str().unwrap()},
                   "_meta": {"progressToken": format!("tok-{i}")}}),
        );
    }
    let mut flowing = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while flowing.len() < MAX_WORKERS {
        let m = s
            .recv(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|| {
                panic!(
                    "only {} of {MAX_WORKERS} downloads started: {flowing:?}",
                    flowing.len()
                )
            });
        assert!(
            m.get("method").is_some(),
            "a download ended before the test could queue a call: {m}"
        );
        if m["method"] == "notifications/progress" && m["params"]["progress"].as_f64() > Some(0.0) {
            flowing.insert(m["params"]["progressToken"].to_string());
        }
    }

    // Call #17 waits for a worker; cancel it while it waits.
    let target = work.join("queued.qcow2");
    let queued = json!("queued");
    s.send_request(
        &queued,
        "tools/call",
        json!({"name": "image_create",
               "arguments": {"path": target.to_str().unwrap(), "size": "1M"}}),
    );
    s.notify(
        "notifications/cancelled",
        json!({"requestId": queued, "reason": "test"}),
    );
    // A call queued behind it: once it is answered, the cancelled one would have run too.
    let control_path = work.join("control.qcow2");
    let control = json!("control");
    s.send_request(
        &control,
        "tools/call",
        json!({"name": "image_create",
               "arguments": {"path": control_path.to_str().unwrap(), "size": "1M"}}),
    );
    // Requests that need no worker are still answered at once.
    let t = Instant::now();
    let others = s.assert_alive();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "ping waited {:?} behind busy workers",
        t.elapsed()
    );
    s.unread(others);

    // Let the downloads finish: each is answered, then the control call.
    let mut pending: HashSet<String> = slow_ids.iter().map(Value::to_string).collect();
    pending.insert(control.to_string());
    let deadline = Instant::now() + Duration::from_secs(120);
    while !pending.is_empty() {
        let m = s
            .recv(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|| panic!("still unanswered: {pending:?}"));
        if m.get("method").is_some() {
            continue;
        }
        assert_ne!(
            m["id"], queued,
            "the cancelled queued call was answered: {m}"
        );
        let id = m["id"].to_string();
        assert!(pending.remove(&id), "an unexpected or repeated answer: {m}");
        tool_ok(&m["result"], &format!("call {id}"));
    }
    assert!(control_path.is_file(), "the control call did not run");
    let later = s.collect_for(Duration::from_secs(2));
    assert!(
        later.iter().all(|m| m.get("id") != Some(&queued)),
        "the cancelled queued call was answered: {later:?}"
    );
    s.assert_alive();
    assert!(!target.exists(), "the cancelled queued call ran");
    assert_eq!(
        list_dir(&work),
        vec!["control.qcow2"],
        "the cancelled call left something behind"
    );
    // Its id is free again: no longer in flight.
    s.send_request(
        &queued,
        "tools/call",
        json!({"name": "image_info", "arguments": {"path": control_path.to_str().unwrap()}}),
    );
    let (resp, _) = s.read_until_id(&queued, RESPONSE_TIMEOUT);
    tool_ok(&resp["result"], "image_info reusing the cancelled id");
}
