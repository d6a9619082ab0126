//! mcqemu-agent's request reader and command arguments: the fuzz bytes are what the host side
//! of the agent's channel sends. They are cut into requests twice, whole and in pieces whose
//! sizes the first byte picks, and both cuts must give the same requests (a read may end
//! anywhere); every request is an object that writes back as JSON and parses to itself; and
//! every request the agent can answer without acting on the guest (sync, ping, info, status
//! of unknown programs, reads and seeks of unknown handles, unknown commands) gets exactly one
//! reply, `return` or `error`, that is JSON. Nothing may panic. Commands that act (exec, open,
//! set-time, shutdown) are only read, never run.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcqemu::agent::commands::{Agent, Outcome};
use mcqemu::agent::json::{self, Json};
use mcqemu::agent::reader::{Incoming, Reader};

/// Commands that only answer: safe to run on the fuzzing host.
const ANSWER_ONLY: &[&str] = &[
    "guest-sync-delimited",
    "guest-sync",
    "guest-ping",
    "guest-info",
    "guest-exec-status",
    "mcqemu-exec-output",
    "mcqemu-list-dir",
    "guest-file-read",
    "guest-file-write",
    "guest-file-seek",
    "guest-file-close",
    "guest-get-time",
    "guest-get-osinfo",
];

/// Commands that would act on the host running the fuzzer.
const ACTING: &[&str] = &[
    "guest-exec",
    "guest-file-open",
    "guest-set-time",
    "guest-shutdown",
];

fuzz_target!(|data: &[u8]| {
    let Some((&first, bytes)) = data.split_first() else {
        return;
    };
    let whole = Reader::new().push(bytes);
    let piece = usize::from(first % 31) + 1;
    let mut r = Reader::new();
    let cut: Vec<Incoming> = bytes.chunks(piece).flat_map(|c| r.push(c)).collect();
    assert_eq!(whole, cut, "the requests depend on where reads end");
    let mut agent = Agent::new(false);
    for inc in whole {
        let Incoming::Request(req) = inc else {
            continue;
        };
        assert!(matches!(req, Json::Obj(_)), "a request that is not an object");
        let again = json::parse(req.to_text().as_bytes()).expect("a request writes back as JSON");
        assert_eq!(again, req, "a request does not survive a round trip");
        let name = req.get("execute").and_then(Json::as_str).unwrap_or("");
        if ACTING.contains(&name) {
            continue;
        }
        if !ANSWER_ONLY.contains(&name) && name.starts_with("guest-") {
            // Unknown to this list: it must be unknown to the agent too.
            assert!(
                !mcqemu::agent::commands::COMMANDS
                    .iter()
                    .any(|(c, _)| *c == name),
                "{name} is in neither list"
            );
        }
        match agent.handle(&req) {
            Outcome::Reply { json: reply, .. } => {
                let Json::Obj(members) = &reply else {
                    panic!("a reply that is not an object");
                };
                assert_eq!(members.len(), 1, "{}", reply.to_text());
                assert!(matches!(members[0].0.as_str(), "return" | "error"));
                json::parse(reply.to_text().as_bytes()).expect("a reply is JSON");
            }
            Outcome::Shutdown(_) => panic!("only guest-shutdown shuts down"),
        }
    }
});
